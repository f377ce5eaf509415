"""The protocol vocabulary (bridges.core.aep), the exception-group walker
(bridges.core.errors) and the atomic write (bridges.core.paths), checked
against the registries and the event schema in shared/ (the law)."""
from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridges.core import aep
from bridges.core.errors import leaves, root_cause
from bridges.core.paths import write_atomic
from tests.support.shared import aep_dir


def _registry(name: str) -> dict:
    return json.loads((aep_dir() / "schemas" / "registry" / name).read_text())


def _schema() -> dict:
    return json.loads((aep_dir() / "schemas" / "aep-event.schema.json").read_text())


def test_the_orders_and_enums_are_the_registries():
    sev, cap = _registry("severity.json"), _registry("capture.json")
    assert list(aep.SEVERITIES) == sev["order"] and aep.DEFAULT_SEVERITY == sev["default"]
    assert list(aep.CAPTURE_LEVELS) == cap["order"] and aep.DEFAULT_CAPTURE == cap["default"]
    assert [aep.SEVERITY_RANK[s] for s in sev["order"]] == list(range(len(sev["order"])))
    assert [aep.capture_rank(c) for c in cap["order"]] == list(range(len(cap["order"])))
    assert list(aep.NACK_REASONS) == _registry("nack-reasons.json")["reasons"]
    assert aep.NOTICE_RANK == sev["order"].index("notice")


def test_the_version_is_the_schemas():
    assert _schema()["properties"]["aep"]["const"] == aep.AEP_VERSION
    assert aep.SUPPORTED_VERSIONS == (aep.AEP_VERSION,)


def test_capture_rank_refuses_what_is_not_a_level():
    for bad in ("FULL", "", None, ["full"]):
        with pytest.raises(ValueError, match="unknown capture level"):
            aep.capture_rank(bad)  # type: ignore[arg-type]


def _seqless_pattern() -> re.Pattern[str]:
    """The schema's foreign-event rule: the types that carry session, omit seq."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            p = node.get("pattern")
            if isinstance(p, str) and "attention\\.routed" in p:
                found.append(p)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(_schema())
    (pattern,) = set(found)
    return re.compile(pattern)


TYPES = ["control.cancel", "control.pause", "control.resume", "control.attention.respond",
         "x.opencode.control.abort", "x.a-b.control.x.y", "control.accepted", "control.rejected",
         "control.foo", "control.cancel.now", "control", "x.opencode.controls.abort",
         "tool.started", "attention.routed", "x.opencode.tool.control", "xcontrol.cancel"]


@pytest.mark.parametrize("type_", TYPES)
def test_the_command_rule_is_the_schemas_seqless_set(type_):
    """One rule for the relay and the uplink: the AEP-0004 §5 set plus
    x.{vendor}.control.* (an ack or an unregistered control verb is an
    ordinary sequenced event, never routed)."""
    schema_says = _seqless_pattern().match(type_) is not None and type_ != "attention.routed"
    assert aep.is_command_type(type_) is schema_says
    assert aep.is_command({"type": type_}) is schema_says
    assert aep.is_foreign(type_) is (schema_says or type_ == "attention.routed")


def test_acks_and_unregistered_verbs_are_not_commands_anywhere():
    from supervisor.delivery.uplink import is_command as uplink_rule
    from supervisor.relay.envelope import is_command_type as relay_rule
    for t in ("control.accepted", "control.rejected", "control.foo"):
        assert not relay_rule(t) and not uplink_rule({"type": t})
    assert relay_rule("control.cancel") and uplink_rule({"type": "control.cancel"})
    assert not aep.is_command_type(None) and not aep.is_command("control.cancel")


def test_dumps_is_compact_utf8_and_refuses_what_has_no_wire_form():
    assert aep.dumps({"a": "é", "b": [1, True, None]}) == '{"a":"é","b":[1,true,null]}'.encode()
    for bad in ({"s": "p\ud800"}, {"p\udfff": 1}, {"deep": [{"x": "\udc00"}]}):
        with pytest.raises(UnicodeEncodeError):
            aep.dumps(bad)
    with pytest.raises(ValueError):
        aep.dumps({"x": math.nan})
    with pytest.raises(TypeError):
        aep.dumps({"x": object()})


def test_scrub_makes_any_lone_surrogate_encodable():
    v = {"p\ud800": ["a\udfffb", {"k": "\ud800\ud800"}], "n": 1}
    assert json.loads(aep.dumps(aep.scrub_surrogates(v))) == {
        "p\ufffd": ["a\ufffdb", {"k": "\ufffd\ufffd"}], "n": 1}
    assert aep.scrub_surrogates("ok \U0001F600") == "ok \U0001F600"  # a real pair is kept


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20))
def test_scrubbed_json_always_round_trips(value):
    out = aep.scrub_surrogates(value)
    assert aep.loads(aep.dumps(out)) == out


def test_loads_is_strict_json():
    for bad in ("NaN", "[Infinity]", '{"x": -Infinity}', "[" * 100_000):
        with pytest.raises(ValueError):
            aep.loads(bad)
    assert aep.loads(b'{"a":[1]}') == {"a": [1]}


def test_leaves_and_root_cause_walk_nested_groups():
    a, b, c = KeyError("a"), OSError("b"), ValueError("c")
    eg = BaseExceptionGroup("x", [ExceptionGroup("y", [a, b]), c])
    assert leaves(eg) == [a, b, c] and root_cause(eg) is a
    assert leaves(c) == [c] and root_cause(c) is c


def test_write_atomic_replaces_whole_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "deep" / "state.json"
    write_atomic(path, '{"v": 1}')
    write_atomic(path, '{"v": 2}', fsync=True)
    assert json.loads(path.read_text()) == {"v": 2}
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]


def test_write_atomic_failure_keeps_the_old_document(tmp_path):
    path = tmp_path / "state.json"
    write_atomic(path, "old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "new \ud800")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=30)


@given(_json_values)
def test_dumps_is_the_json_module_s_compact_encoding(value):
    """``dumps`` writes exactly what ``json.dumps`` with the wire options
    writes (issue 11: orjson where its bytes are these, else the C encoder
    built once instead of per call)."""
    try:
        want = json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            aep.dumps(value)
        return
    assert aep.dumps(value) == want


def test_dumps_answers_a_cycle_or_absurd_nesting_with_value_error():
    loop: list = []
    loop.append(loop)
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    for bad in (loop, deep):
        with pytest.raises(ValueError):
            aep.dumps(bad)


def _refuse(name):
    raise ValueError(name)


def _decoded(text):
    try:
        return ("ok", json.loads(text, parse_constant=_refuse))
    except ValueError:
        return ("error",)


@given(st.one_of(_json_values.map(json.dumps), _json_values.map(lambda v: " " + json.dumps(v) + "\n"),
                 st.text(max_size=30), _json_values.map(lambda v: json.dumps(v) + "x")))
def test_loads_fast_path_answers_as_the_json_module(text):
    """The scanner called directly answers exactly what ``json.loads``
    (with the strict constants) answers: the value, or a ``ValueError``."""
    want = _decoded(text)
    try:
        got = ("ok", aep.loads(text))
    except ValueError:
        got = ("error",)
    assert got == want
