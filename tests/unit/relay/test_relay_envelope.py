"""The relay's compact envelope validator (AEP-0001 §5/§6, AEP-0004 §2.2)
agrees with the normative JSON Schema: on the golden corpus, on every
envelope case of ``invalid/cases.json``, and on fuzzed mutations of golden
events. jsonschema runs here only (tests), never at ingest."""
from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.relay.envelope import InvalidEvent, envelope_error, is_command_type, validate
from tests.support.shared import aep_dir, fixture

SCHEMA = json.loads((aep_dir() / "schemas" / "aep-event.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
GOLDEN = [json.loads(ln) for ln in
          (aep_dir() / "conformance/fixtures/golden/golden.jsonl").read_text().splitlines() if ln]
INVALID = fixture("invalid/cases.json")["cases"]
# single-event cases of envelope rules; payload-schema and stream (cross-event)
# cases are out of a relay's scope: it never parses data (AEP-0001 §5)
ENVELOPE_RULES = ("AEP-0001 §5", "AEP-0001 §6", "AEP-0001 §8", "AEP-0002 §3", "AEP-0004 §2.2")
ENVELOPE_CASES = [c for c in INVALID if "event" in c and c["rule"].startswith(ENVELOPE_RULES)]


def schema_ok(ev) -> bool:
    return VALIDATOR.is_valid(ev)


def test_golden_corpus_is_valid():
    assert len(GOLDEN) > 20
    for ev in GOLDEN:
        assert schema_ok(ev), ev["id"]
        assert envelope_error(ev) is None, (ev["id"], envelope_error(ev))


@pytest.mark.parametrize("case", ENVELOPE_CASES, ids=[c["name"] for c in ENVELOPE_CASES])
def test_invalid_corpus_is_refused(case):
    assert not schema_ok(case["event"])
    with pytest.raises(InvalidEvent):
        validate(case["event"])


def test_envelope_cases_cover_the_rules():
    # the selection above must not silently shrink to nothing
    assert len(ENVELOPE_CASES) >= 17


@pytest.mark.parametrize("t,cmd", [
    ("control.cancel", True), ("control.attention.respond", True), ("control.pause", True),
    ("control.resume", True), ("x.openhands.control.send_input", True),
    ("control.accepted", False), ("control.rejected", False), ("attention.routed", False),
    ("tool.completed", False), ("x.acme.tool.ran", False),
])
def test_command_classification(t, cmd):
    assert is_command_type(t) is cmd


@pytest.mark.parametrize("time_", ["2026-07-03T10:00:00Z", "2026-07-03t10:00:00.123456+02:00",
                                   "2024-02-29T00:00:00Z", "2026-12-31T23:59:60-00:30"])
def test_rfc3339_times_accepted(time_):
    ev = dict(GOLDEN[0], time=time_)
    assert envelope_error(ev) is None


@pytest.mark.parametrize("time_", ["2026-07-03", "2026-07-03 10:00:00Z", "2026-13-03T10:00:00Z",
                                   "2026-02-30T10:00:00Z", "2025-02-29T10:00:00Z",
                                   "2026-07-03T24:00:00Z", "2026-07-03T10:00:00", "yesterday"])
def test_bad_times_refused(time_):
    # the schema's `format: date-time` is an annotation jsonschema skips by
    # default; the relay asserts it (AEP-0001 §5.1 #5)
    assert envelope_error(dict(GOLDEN[0], time=time_)) is not None


@pytest.mark.parametrize("source,ok", [("aep://h/agent/a", True), ("urn:x", True),
                                       ("not a uri", False), ("/relative", False), ("h/agent", False)])
def test_source_is_absolute_uri(source, ok):
    assert (envelope_error(dict(GOLDEN[0], source=source)) is None) is ok


def test_float_positions_refused_strictly():
    # stricter than jsonschema (which counts 1.0 as an integer): a relay
    # would otherwise re-emit `"seq":1.0` and an `id: s:0:1.0` SSE position
    assert envelope_error(dict(GOLDEN[0], seq=1.0)) is not None


# -- differential fuzz against the schema ----------------------------------------
VALUES = st.sampled_from([
    None, "", "x", "0.1", "0.2", 0, -1, 7, True, False, 1.5, [], {}, {"k": 1}, ["a"],
    "tool.Completed", "agent.presence", "agent.heartbeat", "control.cancel", "control.accepted",
    "attention.routed", "x.acme.foo", "x.acme.tool.ran", "x.Acme.tool.ran", "banana.peeled",
    "run", "notice", "fatal", "full", "redacted", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
])
KEYS = st.sampled_from(["aep", "id", "type", "subject", "time", "source", "agent", "session", "run",
                        "step", "seq", "epoch", "cause", "traceparent", "severity", "capture",
                        "data", "acmeregion", "Acme", "acme_x", "a" * 21, "b" * 20, "x1"])


@st.composite
def mutated(draw):
    ev = copy.deepcopy(draw(st.sampled_from(GOLDEN)))
    for _ in range(draw(st.integers(1, 3))):
        k = draw(KEYS)
        if draw(st.booleans()) and k in ev:
            del ev[k]
            continue
        v = draw(VALUES)
        if k in ("time", "source") and isinstance(v, str):
            continue  # formats: covered by the explicit tests above
        if isinstance(v, float) and v.is_integer():
            continue
        ev[k] = v
    return ev


@settings(max_examples=600, deadline=None)
@given(mutated())
def test_validator_agrees_with_schema(ev):
    assert (envelope_error(ev) is None) == schema_ok(ev), (envelope_error(ev), ev)


def test_absurdly_nested_data_is_an_invalid_event():
    # ~980 levels parse with json.loads but blew the stack later, in
    # down-leveling, for every lower-ceiling subscriber (break-it review)
    from supervisor.relay.envelope import MAX_DATA_DEPTH, InvalidEvent, validate
    def nested(n):
        v = 1
        for _ in range(n):
            v = {"a": v}
        return v
    ev = {"aep": "0.1", "id": "x", "type": "tool.completed", "time": "2026-11-30T12:00:00Z",
          "source": "aep://h/agent/a/session/s", "agent": "a", "session": "s", "seq": 0}
    validate({**ev, "data": nested(MAX_DATA_DEPTH - 1)})
    with pytest.raises(InvalidEvent, match="deeper than"):
        validate({**ev, "data": nested(980)})
    with pytest.raises(InvalidEvent, match="deeper than"):
        validate({**ev, "data": {"l": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}})


# -- the hot path's one-pass check (issue 11) -------------------------------------
def _validate_ok(ev) -> bool:
    return envelope_error(ev) is None


def test_well_formed_passes_the_golden_corpus():
    from supervisor.relay.envelope import well_formed
    passed = [ev["id"] for ev in GOLDEN if well_formed(ev)]
    # the fast path must carry real traffic, or it is no fast path: every
    # golden event without a Feb 29 / leap-second time takes it
    assert len(passed) == len(GOLDEN), [ev["id"] for ev in GOLDEN if not well_formed(ev)]


@settings(max_examples=600, deadline=None)
@given(mutated(), st.booleans())
def test_well_formed_never_passes_what_validate_refuses(ev, shallow):
    from supervisor.relay.envelope import well_formed
    if well_formed(ev, shallow):
        assert _validate_ok(ev), (envelope_error(ev), ev)


@settings(max_examples=600, deadline=None)
@given(st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,3})?"
                     r"([Zz]|[+-][0-9]{2}:[0-9]{2})", fullmatch=True))
def test_well_formed_times_agree_with_validate(time_):
    from supervisor.relay.envelope import well_formed
    ev = dict(GOLDEN[0], time=time_)
    if well_formed(ev):
        assert _validate_ok(ev), time_


@pytest.mark.parametrize("time_", ["2026-11-30T12:00:00.000Z", "2026-01-31T23:59:59Z",
                                   "2026-04-30T00:00:00+05:30", "2026-12-31t10:00:00.5z"])
def test_well_formed_takes_common_times(time_):
    from supervisor.relay.envelope import well_formed
    assert well_formed(dict(GOLDEN[0], time=time_))


@pytest.mark.parametrize("time_", ["2026-04-31T00:00:00Z", "2026-02-29T00:00:00Z",
                                   "2026-02-30T00:00:00Z", "2026-12-31T23:59:60Z"])
def test_well_formed_leaves_hard_times_to_validate(time_):
    from supervisor.relay.envelope import well_formed
    assert not well_formed(dict(GOLDEN[0], time=time_))


def test_a_type_longer_than_max_type_is_refused_before_its_grammar():
    """A fourth outside attack on issue 25: a 15 MiB dotted type spent 2 s
    in the grammar on the event loop before its 400."""
    from supervisor.relay.envelope import MAX_TYPE, well_formed
    ev = {"aep": "0.1", "id": "01JX9YB4RQ0000000000000001", "time": "2026-12-07T12:00:00Z",
          "source": "aep://h/x", "agent": "x", "session": "s", "seq": 0}
    fine = {**ev, "type": "x.a" + ".b" * ((MAX_TYPE - 3) // 2)}
    assert len(fine["type"]) <= MAX_TYPE
    validate(fine)
    long_ = {**ev, "type": "x." + "a." * 2_000_000 + "b"}
    with pytest.raises(InvalidEvent, match="longer than"):
        validate(long_)
    assert not well_formed(long_)


# -- identifier lengths (a fifth outside attack on issue 25: a 4 MB id) ----------
_BOUNDED = {"id": "MAX_ID", "cause": "MAX_ID", "agent": "MAX_NAME", "session": "MAX_NAME",
            "run": "MAX_NAME", "step": "MAX_NAME", "subject": "MAX_NAME", "source": "MAX_SOURCE"}


def _bound(attr: str) -> int:
    from supervisor.relay import envelope
    return int(getattr(envelope, _BOUNDED[attr]))


def _sized(attr: str, n: int) -> dict:
    """A valid session-scoped event whose ``attr`` is ``n`` characters."""
    ev = {"aep": "0.1", "id": "01JX9YB4RQ0000000000000001", "type": "tool.completed",
          "time": "2026-12-07T12:00:00Z", "source": "aep://h/agent/a/session/s", "agent": "a",
          "session": "s", "seq": 0}
    prefix = "aep://h/x/" if attr == "source" else ""
    ev[attr] = prefix + "z" * (n - len(prefix))
    return ev


@pytest.mark.parametrize("attr", sorted(_BOUNDED))
def test_an_identifier_at_its_bound_passes_and_one_past_it_is_refused(attr):
    from supervisor.relay.envelope import to_entry, well_formed
    n = _bound(attr)
    at = _sized(attr, n)
    assert len(at[attr]) == n
    validate(at)
    assert well_formed(at), attr  # the hot path still carries it
    past = _sized(attr, n + 1)
    with pytest.raises(InvalidEvent, match=f"{attr} longer than {n} characters"):
        validate(past)
    assert not well_formed(past) and not well_formed(past, True)
    with pytest.raises(InvalidEvent, match="longer than"):
        to_entry(past)
    with pytest.raises(InvalidEvent, match="longer than"):
        to_entry(past, json.dumps(past))


def test_the_4mb_id_of_the_attack_is_refused_on_every_ingest_path():
    from supervisor.relay.envelope import MAX_ID, formed_entry, to_entry
    ev = _sized("id", 4 << 20)
    line = json.dumps(ev).encode()
    assert formed_entry(line) is None  # the fast path hands it to the long way, which refuses
    with pytest.raises(InvalidEvent, match=f"id longer than {MAX_ID}"):
        to_entry(json.loads(line), line.decode(), owned=True)
    assert "zzzz" not in envelope_error(ev)  # the detail never echoes the value


def test_a_time_with_a_long_fraction_is_refused_by_its_length_on_both_paths():
    # the pattern's fraction (\\.\\d+) had no bound: 4 MB of digits was a valid time
    from supervisor.relay.envelope import MAX_TIME, to_entry, well_formed
    nanos = "2026-12-07T12:00:00.123456789+01:00"
    ev = _sized("id", 26)
    validate({**ev, "time": nanos})
    assert well_formed({**ev, "time": nanos})
    at = {**ev, "time": "2026-12-07T12:00:00." + "1" * (MAX_TIME - 21) + "Z"}
    assert len(at["time"]) == MAX_TIME
    validate(at)
    for n in (MAX_TIME - 20, 4 << 20):
        past = {**ev, "time": "2026-12-07T12:00:00." + "1" * n + "Z"}
        with pytest.raises(InvalidEvent, match=f"time longer than {MAX_TIME} characters"):
            validate(past)
        assert not well_formed(past)
        with pytest.raises(InvalidEvent, match="longer than"):
            to_entry(past, json.dumps(past))


def test_the_bounds_hold_ulids_uuids_and_the_fleets_own_names():
    from supervisor.relay.envelope import MAX_ID, MAX_NAME, MAX_SOURCE
    assert MAX_ID >= 36 * 4  # a ULID (26), a UUID (36), with room for a prefix or two
    assert MAX_NAME >= 4096  # a file path as a subject (PATH_MAX)
    assert MAX_SOURCE >= 12 * MAX_NAME + 1024  # a MAX_NAME session percent-encoded, plus host+agent


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(_BOUNDED)), st.integers(0, 3), st.booleans())
def test_length_verdicts_agree_on_both_paths(attr, extra, shallow):
    """Either side of each bound, ``well_formed`` passes only what
    ``validate`` passes, and ``validate`` refuses exactly what is past it."""
    from supervisor.relay.envelope import well_formed
    n = _bound(attr)
    ev = _sized(attr, n - 1 + extra)  # n-1 .. n+2
    ok = len(ev[attr]) <= n
    assert _validate_ok(ev) is ok
    if well_formed(ev, shallow):
        assert ok
    elif ok:
        pytest.fail(f"{attr} of {len(ev[attr])} left the hot path")


# -- sixth outside attack on issue 25 ---------------------------------------------
@pytest.mark.parametrize("attr", ["seq", "epoch"])
@pytest.mark.parametrize("value", [2**53, 10**400, 2**64])
def test_counts_past_the_json_safe_integers_are_refused_on_both_paths(attr, value):
    """``seq``/``epoch`` of 10**400 were accepted (a JS consumer reads
    ``Infinity``): both paths refuse past 2**53 - 1 and take it."""
    from supervisor.relay.envelope import MAX_COUNT, formed_entry, to_entry, well_formed
    ev = dict(GOLDEN[0])
    assert "seq" in ev
    top = {**ev, attr: MAX_COUNT}
    assert well_formed(top) and envelope_error(top) is None
    to_entry(top)
    big = {**ev, attr: value}
    assert not well_formed(big)
    assert envelope_error(big) == f"{attr} must be an integer from 0 to {MAX_COUNT}"
    with pytest.raises(InvalidEvent):
        to_entry(big)
    assert formed_entry(json.dumps(big).encode()) is None  # the long way answers (and refuses)


@pytest.mark.parametrize("source", [
    "aep://vm/agent/claude\u2010code", "aep://vm/agent/claude-cod\u0435", "aep://vm/agent/\uff43laude-code",
    "aep://vm/agent/claude-code\u202e", "aep://vm/agent/claude-\u200bcode", "aep://vm/agent/claude-code\t",
    "aep://vm/agent/claude code", "aep://v\u00e9/agent/x", "urn:\u00e9",
])
def test_a_source_must_be_an_ascii_uri(source):
    """RFC 3986: a URI is ASCII, no space or control character (non-ASCII
    percent-encoded, as the fleet and the SDK mint theirs): raw lookalikes,
    bidi and zero-width characters were accepted."""
    from supervisor.relay.envelope import well_formed
    ev = dict(GOLDEN[0], source=source)
    assert not well_formed(ev)
    assert envelope_error(ev) == "source must be an absolute URI"
    ok = dict(GOLDEN[0], source="aep://vm/agent/claude-cod%D0%B5/session/%E2%80%AE")
    assert well_formed(ok) and envelope_error(ok) is None
