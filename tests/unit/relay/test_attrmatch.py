"""attr-match (AEP-0003 §6): every case of the golden corpus
``conformance/fixtures/attr-match/cases.json``, plus the grammar edges the
corpus leaves implicit (exact JSON typing, pattern forms, defaults)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.relay.attrmatch import Filter, InvalidFilter, attr_match, validate_filter
from tests.support.shared import fixture

CASES = fixture("attr-match/cases.json")


@pytest.mark.parametrize("case", CASES["match"], ids=[c["name"] for c in CASES["match"]])
def test_corpus_match(case):
    validate_filter(case["filter"])  # `match` cases assume a valid filter
    assert Filter(case["filter"]).matches(case["event"]) is case["match"]


@pytest.mark.parametrize("case", CASES["invalid"], ids=[c["name"] for c in CASES["invalid"]])
def test_corpus_invalid_fails_closed(case):
    with pytest.raises(InvalidFilter):
        Filter(case["filter"])


def test_corpus_is_not_empty():
    assert len(CASES["match"]) >= 10 and len(CASES["invalid"]) >= 10


# -- beyond the corpus: rules stated in §6.1/§6.2 ------------------------------

def test_no_coercion_between_json_types():
    # "compares JSON values exactly (no coercion)": true is not 1, "0" is not 0
    assert not attr_match({"epoch": True}, {"epoch": 1})
    assert not attr_match({"epoch": 1}, {"epoch": True})
    assert not attr_match({"epoch": "0"}, {"type": "run.started"})
    assert attr_match({"acmeflag": True}, {"acmeflag": True})
    assert not attr_match({"acmeflag": 1}, {"acmeflag": True})


def test_type_pattern_needs_strict_prefix_and_dot():
    f = Filter({"type": "attention.*"})
    assert f.matches({"type": "attention.requested"})
    assert not f.matches({"type": "attention"})
    assert not f.matches({"type": "attentionx.requested"})
    assert Filter({"type": ["tool.*", "run.started"]}).matches({"type": "run.started"})
    assert Filter({"type": "x.acme.*"}).matches({"type": "x.acme.tool.ran"})


@pytest.mark.parametrize("bad", [
    {"type": "attention*"}, {"type": ".*"}, {"type": "a.*.b"}, {"type": ["tool.*", "*"]},
    {"session": ["a", ["b"]]}, {"session": None}, {"session": 1.5}, {"agent": {"gte": "x"}},
    {"severity": {}}, {"severity": {"gte": "loud"}}, {"severity": [{"gte": "info"}]},
    {"Type": "x"}, {"acme-region": "x"}, {"abcdefghijklmnopqrstu": "x"},
    [], "x", None, {"seq": [1]},
])
def test_more_invalid_filters(bad):
    with pytest.raises(InvalidFilter):
        validate_filter(bad)


def test_severity_band_and_defaults():
    band = Filter({"severity": {"gte": "notice", "lte": "error"}})
    assert band.matches({"severity": "warning"})
    assert band.matches({"severity": "error"})
    assert not band.matches({"severity": "critical"})
    assert not band.matches({})  # default info
    assert Filter({"severity": "info"}).matches({})
    assert Filter({"capture": "metadata"}).matches({})
    assert not Filter({"capture": "full"}).matches({})


def test_extension_key_is_legal_even_when_absent():
    f = Filter({"acmeregion": ["eu-1", "us-2"]})  # valid: whether events carry it is matching
    assert not f.matches({"type": "run.started"})
    assert f.matches({"acmeregion": "us-2"})


def test_filter_reports_pinned_sessions():
    assert Filter({"session": ["a", "b"]}).sessions == ("a", "b")
    assert Filter({"type": "run.started"}).sessions == ()


# -- issue 10 #5: bounded, compiled once -----------------------------------------

def test_a_filter_over_the_term_bound_is_refused_as_too_large():
    from supervisor.relay.attrmatch import FilterTooLarge
    with pytest.raises(FilterTooLarge):
        Filter({"type": [f"t{i}.*" for i in range(1025)]}, max_terms=1024)
    with pytest.raises(FilterTooLarge):
        Filter({"session": [f"s{i}" for i in range(600)], "agent": [f"a{i}" for i in range(600)]},
               max_terms=1024)
    assert Filter({"type": [f"t{i}.*" for i in range(1024)]}, max_terms=1024)


def test_many_type_patterns_match_exactly_like_one():
    flt = Filter({"type": [f"t{i}.*" for i in range(1000)] + ["tool.*", "run.step.*"]})
    assert flt.matches({"type": "tool.completed"})
    assert flt.matches({"type": "run.step.started"})
    assert flt.matches({"type": "t999.x"})
    assert not flt.matches({"type": "tool"})
    assert not flt.matches({"type": "run.step"})
    assert not flt.matches({"type": "run.started"})
    assert not flt.matches({"type": "toolx.completed"})


@settings(max_examples=500)
@given(patterns=st.lists(st.from_regex(r"[ab]{1,3}(\.[ab]{1,3}){0,2}", fullmatch=True), min_size=1,
                         max_size=3),
       type_=st.from_regex(r"[ab.]{0,14}", fullmatch=True))
def test_a_type_pattern_matches_as_its_definition_says(patterns, type_):
    """"p.*" matches a type that begins with "p." and is longer (the probe
    now stops at the longest pattern: the same answers)."""
    f = Filter({"type": [p + ".*" for p in patterns]})
    want = any(type_.startswith(p + ".") and len(type_) > len(p) + 1 for p in patterns)
    assert f.matches({"type": type_}) == want


def test_a_type_of_millions_of_dots_is_probed_only_as_far_as_the_patterns_reach():
    """Outside review of issue 25: a 300 KB type of dots posted once held the
    event loop 5.7 s per type-pattern subscriber (a slice at every "."), and
    a 4 MB one minutes; now the probe ends at the longest pattern, so this
    call returns at once (the old one would take hours)."""
    f = Filter({"type": ["attention.*", "tool.*"]})
    assert not f.matches({"type": "x." + "a." * 2_000_000 + "b"})
    assert Filter({"type": "x.a.*"}).matches({"type": "x." + "a." * 2_000_000 + "b"})


def test_a_type_pattern_is_at_most_max_type_pattern_characters():
    """A fourth outside attack on issue 25: a 320 KB pattern and one event of
    a matching type held the event loop 7.8 s (its probes are bounded by the
    pattern's length, so the pattern is bounded)."""
    from supervisor.relay.attrmatch import MAX_TYPE_PATTERN
    ok = "x." + "a." * ((MAX_TYPE_PATTERN - 4) // 2) + "*"
    assert len(ok) <= MAX_TYPE_PATTERN
    validate_filter({"type": ok})
    with pytest.raises(InvalidFilter, match="longer than"):
        validate_filter({"type": "x." + "a." * MAX_TYPE_PATTERN + "*"})
