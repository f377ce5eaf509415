"""Hypothesis fuzzing of the pure OTLP flattener and mappers: any JSON-shaped
input -> no exception, and every emission stamps into a schema-valid,
capture-honest envelope (issue 2 §7)."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.otlp_in import codex, flatten, vscode
from bridges.otlp_in.common import record_time, session_id
from bridges.otlp_in.flatten import NotOtlp
from bridges.otlp_in.profiles import PROFILES

try:
    from tests.support.schema import validate_event
except ImportError:  # pragma: no cover - the shared validator predates this file in CI
    import jsonschema

    from tests.support.shared import aep_dir

    def validate_event(ev):  # type: ignore[misc]
        jsonschema.validate(ev, json.loads(
            (aep_dir() / "schemas" / "aep-event.schema.json").read_text()))
        p = aep_dir() / "schemas" / "types" / f"{ev['type']}.schema.json"
        if p.exists():
            jsonschema.validate(ev.get("data", {}), json.loads(p.read_text()))


json_leaf = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4)
                          | st.dictionaries(st.text(max_size=12), c, max_size=4), max_leaves=25)

KNOWN = sorted(codex.EVENTS) + sorted(vscode.EVENTS)
KEYS = sorted({k for spec in list(codex.EVENTS.values()) + list(vscode.EVENTS.values())
               for k in spec.meta + spec.redacted + spec.full}
              | {"event.name", "conversation.id", "session.id", "prompt", "user.email",
                 "host.name", "tool_name", "gen_ai.tool.name", "success", "decision", "source",
                 "error", "error.type", "model", "event.timestamp"})

any_value_json = st.recursive(
    st.one_of(st.builds(lambda v: {"stringValue": v}, st.text(max_size=30) | json_leaf),
              st.builds(lambda v: {"intValue": v}, st.integers(-2 ** 64, 2 ** 64).map(str)
                        | json_leaf),
              st.builds(lambda v: {"boolValue": v}, json_leaf),
              st.builds(lambda v: {"doubleValue": v}, json_leaf),
              st.builds(lambda v: {"bytesValue": v}, json_leaf),
              json_value),
    lambda c: st.one_of(
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(c, max_size=3)),
        st.builds(lambda kvs: {"kvlistValue": {"values": [{"key": k, "value": v}
                                                          for k, v in kvs]}},
                  st.lists(st.tuples(st.text(max_size=8), c), max_size=3))),
    max_leaves=10)

key = st.sampled_from(KEYS) | st.text(max_size=15)
event_names = st.sampled_from(KNOWN) | st.text(max_size=30)
attribute = st.one_of(
    st.tuples(st.just("event.name"), event_names.map(lambda n: {"stringValue": n})),
    st.tuples(st.sampled_from(["conversation.id", "session.id"]),
              st.sampled_from(["c1", "01a22c8f-44ae-7553-a089-64df0aec38ac", "", "a b/c"])
              .map(lambda v: {"stringValue": v})),
    st.tuples(st.sampled_from(["success"]),
              st.sampled_from([{"stringValue": "true"}, {"stringValue": "false"},
                               {"boolValue": True}, {"boolValue": False}])),
    st.tuples(key, any_value_json))
record = st.fixed_dictionaries({}, optional={
    "attributes": st.lists(attribute.map(lambda kv: {"key": kv[0], "value": kv[1]}),
                           max_size=10),
    "timeUnixNano": st.integers(0, 2 ** 64).map(str) | json_leaf,
    "observedTimeUnixNano": st.integers(0, 2 ** 64) | json_leaf,
    "eventName": event_names | json_leaf,
    "body": any_value_json,
    "severityNumber": json_leaf,
})
otlp_doc = st.builds(
    lambda res, recs: {"resourceLogs": [{"resource": {"attributes": [
        {"key": k, "value": v} for k, v in res]}, "scopeLogs": [{"logRecords": recs}]}]},
    st.lists(st.tuples(st.sampled_from(["session.id", "host.name", "service.name"]) | key,
                       any_value_json), max_size=4),
    st.lists(record | json_value, max_size=5))

CEILINGS = ["none", "metadata", "redacted", "full"]


def _check_all_postures(rec):
    for profile in PROFILES.values():
        sess = session_id(profile.session_key(rec), [])
        for ceiling in CEILINGS:
            policy = CapturePolicy(ceiling=ceiling)
            stamper = Stamper(profile.agent, host="fuzz-host", policy=policy)
            for primary in (False, True):
                notes: list[str] = []
                out = profile.map_record(rec, Posture(mode="primary" if primary else "companion", policy=policy), notes)
                assert isinstance(out, list) and len(out) <= 1
                assert all(isinstance(n, str) and n.startswith("otlp.") for n in notes)
                for em in out:
                    if not primary:
                        assert em["type"].startswith(profile.namespace + ".")
                    else:
                        assert (em["type"].startswith(profile.namespace + ".")
                                or em["type"] in profile.primary_types)
                    json.dumps(em, allow_nan=False)
                    if sess is not None:
                        validate_event(stamper.stamp(sess, profile.stampable(em),
                                                     time=record_time(rec)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_value)
def test_flatten_json_never_raises_but_nototlp(doc):
    try:
        out = flatten.records_from_json(doc, [])
    except NotOtlp:
        return
    assert isinstance(out, list)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(otlp_doc)
def test_otlp_shaped_json_flattens_maps_and_validates(doc):
    notes: list[str] = []
    try:
        recs = flatten.records_from_json(doc, notes)
    except NotOtlp:
        return
    for rec in recs:
        if rec is None:
            continue
        json.dumps(rec, allow_nan=False)  # flattened records are strict JSON
        _check_all_postures(rec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({}, optional={"resource": json_value, "attributes": json_value,
                                           "event_name": json_value, "body": json_value,
                                           "time_unix_nano": json_value,
                                           "observed_time_unix_nano": json_value}))
def test_mappers_take_any_json_shaped_record(rec):
    _check_all_postures(rec)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({"event.name": st.sampled_from(KNOWN)},
                             optional={k: json_value for k in KEYS if k != "event.name"}))
def test_known_events_with_any_attribute_values(attributes):
    rec = {"resource": {"session.id": "s1", "host.name": "h"},
           "attributes": {"conversation.id": "c1", **attributes}}
    _check_all_postures(rec)
