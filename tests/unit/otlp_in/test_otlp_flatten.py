"""The flattener: every OTLP AnyValue kind on both encodings, where the event
name lives, timestamps, and structural garbage (OTLP spec, "JSON Protobuf
Encoding"; design record bridge-otlp-inbound-design.md)."""
from __future__ import annotations

import base64
import json
from datetime import datetime, timezone

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from bridges.otlp_in import flatten
from bridges.otlp_in.common import event_name, record_time, session_id
from bridges.otlp_in.flatten import NotOtlp


def _request(attrs: list[KeyValue], **lr_fields) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="s")))
    sl = rl.scope_logs.add()
    sl.scope.name = "codex_otel.log_only"
    lr = sl.log_records.add(**lr_fields)
    lr.attributes.extend(attrs)
    return req


ALL_KINDS = [
    KeyValue(key="s", value=AnyValue(string_value="x")),
    KeyValue(key="b", value=AnyValue(bool_value=True)),
    KeyValue(key="i", value=AnyValue(int_value=-(2 ** 63))),
    KeyValue(key="big", value=AnyValue(int_value=2 ** 63 - 1)),
    KeyValue(key="d", value=AnyValue(double_value=1.5)),
    KeyValue(key="nan", value=AnyValue(double_value=float("nan"))),
    KeyValue(key="inf", value=AnyValue(double_value=float("-inf"))),
    KeyValue(key="by", value=AnyValue(bytes_value=b"\x00\xffok")),
    KeyValue(key="arr", value=AnyValue(array_value=ArrayValue(values=[
        AnyValue(string_value="a"), AnyValue(int_value=2), AnyValue()]))),
    KeyValue(key="kv", value=AnyValue(kvlist_value=KeyValueList(values=[
        KeyValue(key="inner", value=AnyValue(bool_value=False))]))),
    KeyValue(key="empty", value=AnyValue()),
]
EXPECTED = {
    "s": "x", "b": True, "i": -(2 ** 63), "big": 2 ** 63 - 1, "d": 1.5, "nan": "NaN",
    "inf": "-Infinity", "by": base64.b64encode(b"\x00\xffok").decode(), "arr": ["a", 2, None],
    "kv": {"inner": False}, "empty": None,
}


def test_every_anyvalue_kind_protobuf():
    notes: list[str] = []
    (rec,) = flatten.records_from_proto(_request(ALL_KINDS), notes)
    assert rec["attributes"] == EXPECTED
    assert rec["resource"] == {"service.name": "s"}
    assert rec["scope"] == {"name": "codex_otel.log_only"}
    assert notes == []
    json.dumps(rec, allow_nan=False)  # stays strict JSON


def test_every_anyvalue_kind_json_encoding():
    # The protobuf library's own JSON encoding: int64 as decimal strings,
    # bytes base64, non-finite doubles as "NaN"/"-Infinity".
    doc = json.loads(json_format.MessageToJson(_request(ALL_KINDS)))
    assert doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["attributes"][2] == \
        {"key": "i", "value": {"intValue": str(-(2 ** 63))}}
    notes: list[str] = []
    (rec,) = flatten.records_from_json(doc, notes)
    assert rec["attributes"] == EXPECTED
    assert notes == []


def test_json_int64_as_number_and_snake_case_keys_accepted():
    doc = {"resource_logs": [{"scope_logs": [{"log_records": [{
        "attributes": [{"key": "n", "value": {"int_value": 7}},
                       {"key": "m", "value": {"intValue": "8"}},
                       {"key": "f", "value": {"doubleValue": "2.5"}}],
        "time_unix_nano": 1_700_000_000_000_000_000}]}]}]}
    (rec,) = flatten.records_from_json(doc, [])
    assert rec["attributes"] == {"n": 7, "m": 8, "f": 2.5}
    assert rec["time_unix_nano"] == 1_700_000_000_000_000_000


@pytest.mark.parametrize("value", [
    {"intValue": "12abc"}, {"intValue": True}, {"stringValue": 5}, {"boolValue": "yes"},
    {"doubleValue": "fast"}, {"arrayValue": {"values": "nope"}}, {"kvlistValue": 3},
    {"mystery": 1}, "not-an-object", 42, {"bytesValue": 9},
])
def test_unexpected_value_shapes_degrade_to_none_and_are_noted(value):
    doc = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{
        "attributes": [{"key": "k", "value": value}, {"key": "ok", "value": {"stringValue": "y"}}]
    }]}]}]}
    notes: list[str] = []
    (rec,) = flatten.records_from_json(doc, notes)
    assert rec["attributes"] == {"k": None, "ok": "y"}
    assert "otlp.value_unexpected" in notes


def test_deep_nesting_is_cut_not_recursed_forever():
    v: dict = {"stringValue": "bottom"}
    for _ in range(200):
        v = {"arrayValue": {"values": [v]}}
    doc = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{
        "attributes": [{"key": "deep", "value": v}]}]}]}]}
    notes: list[str] = []
    (rec,) = flatten.records_from_json(doc, notes)
    depth, x = 0, rec["attributes"]["deep"]
    while isinstance(x, list):
        depth, x = depth + 1, x[0]
    assert x is None and depth == flatten.MAX_DEPTH
    assert "otlp.value_too_deep" in notes


def test_malformed_attribute_entries_skipped_and_noted():
    doc = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{
        "attributes": [{"value": {"stringValue": "keyless"}}, 7, {"key": "ok",
                                                                  "value": {"boolValue": False}}]
    }]}]}]}
    notes: list[str] = []
    (rec,) = flatten.records_from_json(doc, notes)
    assert rec["attributes"] == {"ok": False}
    assert notes.count("otlp.attribute_malformed") == 2


@pytest.mark.parametrize("doc", [
    [], "text", 3, None, {"resourceLogs": "x"}, {"resourceLogs": [5]},
    {"resourceLogs": [{"scopeLogs": {"logRecords": []}}]},
    {"resourceLogs": [{"scopeLogs": [{"logRecords": "many"}]}]},
    {"resourceLogs": [{"resource": "me"}]},
])
def test_json_that_is_not_an_export_request(doc):
    with pytest.raises(NotOtlp):
        flatten.records_from_json(doc, [])


def test_unknown_fields_are_ignored_and_non_object_records_yield_none():
    assert flatten.records_from_json({"hello": "world"}, []) == []
    notes: list[str] = []
    out = flatten.records_from_json(
        {"resourceLogs": [{"scopeLogs": [{"logRecords": [42, {"attributes": []}]}]}]}, notes)
    assert out[0] is None and out[1] == {"resource": {}, "attributes": {}}
    assert notes == ["otlp.record_malformed"]


# --------------------------------------------------------------------------- event name

def test_event_name_from_attribute_wins_over_callsite_event_name_field():
    # Codex 0.171: event_name carries the tracing callsite (tests/fixtures/
    # codex_otel_real/README.md); the attribute is the event name.
    req = _request([KeyValue(key="event.name", value=AnyValue(string_value="codex.tool_result"))],
                   event_name="event otel/src/tool_result.rs:54")
    (rec,) = flatten.records_from_proto(req, [])
    assert rec["event_name"] == "event otel/src/tool_result.rs:54"
    assert event_name(rec, []) == "codex.tool_result"


def test_event_name_from_the_logrecord_field_when_no_attribute():
    req = _request([], event_name="copilot_chat.tool.call")
    (rec,) = flatten.records_from_proto(req, [])
    assert event_name(rec, []) == "copilot_chat.tool.call"


def test_event_name_from_a_body_that_is_a_dotted_name():
    req = _request([], body=AnyValue(string_value="codex.user_prompt"))
    (rec,) = flatten.records_from_proto(req, [])
    assert event_name(rec, []) == "codex.user_prompt"


@pytest.mark.parametrize("rec", [
    {"resource": {}, "attributes": {}},
    {"resource": {}, "attributes": {}, "event_name": "event otel/src/x.rs:1"},
    {"resource": {}, "attributes": {}, "body": "a free text log line."},
    {"resource": {}, "attributes": {"event.name": 12}},
    {"resource": {}, "attributes": {"event.name": ""}},
])
def test_no_usable_event_name(rec):
    notes: list[str] = []
    assert event_name(rec, notes) is None
    assert "otlp.no_event_name" in notes


# --------------------------------------------------------------------------- time, session

def test_record_time_prefers_time_then_event_timestamp_then_observed():
    ns = 1_796_043_916_466_347_717
    assert record_time({"time_unix_nano": ns, "attributes": {
        "event.timestamp": "2020-01-01T00:00:00.000Z"}}) == datetime.fromtimestamp(
            ns / 1e9, tz=timezone.utc)
    # Codex 0.171: time_unix_nano unset, event.timestamp + observed set.
    assert record_time({"observed_time_unix_nano": ns, "attributes": {
        "event.timestamp": "2026-11-30T13:05:16.466Z"}}) == datetime(
            2026, 11, 30, 13, 5, 16, 466000, tzinfo=timezone.utc)
    assert record_time({"observed_time_unix_nano": ns, "attributes": {
        "event.timestamp": "yesterday"}}) == datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    assert record_time({"attributes": {}}) is None
    assert record_time({"time_unix_nano": 10 ** 30, "attributes": {}}) is None  # year > 9999


def test_session_ids():
    notes: list[str] = []
    assert session_id("01a22c8f-44ae-7553-a089-64df0aec38ac", notes) == \
        "01a22c8f-44ae-7553-a089-64df0aec38ac"
    assert session_id(None, notes) is None and session_id("", notes) is None
    assert session_id(True, notes) is None
    assert session_id(1234, notes) == "1234"
    assert notes == []
    odd = session_id("conv/../../etc passwd", notes)
    assert odd is not None and odd == session_id("conv/../../etc passwd", [])  # stable
    assert all(c.isalnum() or c in "._-" for c in odd) and odd[0].isalnum()
    assert odd != session_id("conv/../../etc_passwd", [])  # no collision by sanitizing
    assert notes == ["otlp.session_id_sanitized"]


def test_a_json_double_beyond_the_double_range_is_infinity_not_a_500():
    # OTLP/JSON carries doubleValue as a JSON number; an integer literal above
    # 1e308 made float() raise OverflowError (HTTP 500 + traceback per request)
    from bridges.otlp_in.flatten import _json_double
    assert _json_double(10 ** 400) == "Infinity"
    assert _json_double(-(10 ** 400)) == "-Infinity"
    assert _json_double(1.5) == 1.5
