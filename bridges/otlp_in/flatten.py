"""OTLP log payloads -> flattened records (pure: no I/O, no clocks).

A *flattened record* is the input shape of the mapping pins
(``mappings/codex-otel.json``, ``mappings/vscode-otel.json``)::

    {"resource":   {"service.name": "codex-app-server", ...},   # resource attributes
     "attributes": {"event.name": "codex.tool_result", ...},   # LogRecord attributes
     # present only when the record carries them:
     "event_name": "codex.tool_result",     # LogRecord.event_name (proto >= 1.5)
     "body": <value>,                        # LogRecord.body, flattened
     "time_unix_nano": 1700000000000000000,  # int, ns since the epoch
     "observed_time_unix_nano": ...,
     "severity_number": 9, "severity_text": "INFO",
     "scope": {"name": "codex_otel", "version": "..."}}

Attribute values (OTLP ``AnyValue``) flatten to plain JSON values: string ->
``str``, bool -> ``bool``, int -> ``int`` (OTLP/JSON sends int64 as a decimal
string; both forms are accepted), double -> ``float`` (non-finite values as
the strings ``"NaN"``/``"Infinity"``/``"-Infinity"`` so the output stays
JSON), bytes -> base64 ``str``, array -> ``list``, kvlist -> ``dict``, an
empty ``AnyValue`` -> ``None``. Keys stay the OTel attribute keys verbatim
(dotted, not nested), as in the pins.

Two sources, one output: :func:`records_from_proto` walks an
``ExportLogsServiceRequest`` message; :func:`records_from_json` walks the
OTLP/JSON encoding (OTLP spec, "JSON Protobuf Encoding": lowerCamelCase keys;
the proto field names are accepted too). Structural garbage raises
:class:`NotOtlp` (the transports answer 400 / ``INVALID_ARGUMENT``,
:mod:`bridges.otlp_in.status`); a malformed *record* inside a well-formed
request is yielded as ``None`` (the planning step,
:func:`bridges.otlp_in.export.plan`, refuses it and the answer counts it in
``partial_success.rejected_log_records``); a value of an unexpected kind
degrades to ``None`` and is noted.

The protobuf path of the receivers reads each ``KeyValue`` as raw bytes
(:mod:`bridges.otlp_in.rawattrs`, split from here by issue 26: the request
class whose attributes stay bytes, and the memoizing attribute reader).

Anomalies are appended to the caller's ``notes`` list as counter names
(``otlp.value_unexpected``, ``otlp.value_too_deep``, ...): the export path
(:class:`bridges.otlp_in.export.Admission`) turns them into ``BridgeHealth``
counts. Design record:
``shared/aep/docs/bridge-otlp-inbound-design.md`` (we go beyond it: native
protobuf as well as JSON).
"""
from __future__ import annotations

import base64
import math
from typing import Any, Callable, Container, Iterable, Iterator

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

MAX_DEPTH = 16
"""Nesting depth of array/kvlist values kept; deeper values degrade to None."""

FlatRecord = dict[str, Any]


class NotOtlp(ValueError):
    """The payload is not an OTLP logs export request (structurally)."""


# --------------------------------------------------------------------------- protobuf

def _double(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def value_from_proto(v: AnyValue, notes: list[str], depth: int = 0) -> Any:
    """One ``opentelemetry.proto.common.v1.AnyValue`` -> a JSON value."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return _double(v.double_value)
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    if depth >= MAX_DEPTH:
        notes.append("otlp.value_too_deep")
        return None
    if kind == "array_value":
        return [value_from_proto(x, notes, depth + 1) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attrs_from_proto(v.kvlist_value.values, notes, depth + 1)
    notes.append("otlp.value_unexpected")  # e.g. string_value_strindex (profiles only)
    return None


def attrs_from_proto(kvs: Iterable[KeyValue], notes: list[str], depth: int = 0,
                     keys: Container[str] | None = None) -> dict[str, Any]:
    """Repeated ``KeyValue`` -> ``{key: value}`` (a repeated key: last wins).
    ``keys``: flatten only these keys (``None``: all); the others are not
    read at all, so an anomaly in their values is not noted either."""
    out: dict[str, Any] = {}
    for kv in kvs:
        key = kv.key
        if keys is not None and key not in keys:
            continue
        v = kv.value
        # a non-empty string_value is the set member of the oneof (nearly
        # every attribute is one): no WhichOneof for it
        text = v.string_value
        if text:
            out[key] = text
            continue
        kind = v.WhichOneof("value")
        if kind == "string_value":
            out[key] = text
        elif kind == "int_value":
            out[key] = v.int_value
        elif kind == "bool_value":
            out[key] = v.bool_value
        else:
            out[key] = value_from_proto(v, notes, depth)
    return out


def _scope(name: str, version: str) -> dict[str, str] | None:
    scope = {k: v for k, v in (("name", name), ("version", version)) if v}
    return scope or None


def _record(resource: dict[str, Any], attributes: dict[str, Any], *, event_name: Any = None,
            body: Any = None, time_unix_nano: int = 0, observed_time_unix_nano: int = 0,
            severity_number: int = 0, severity_text: str = "",
            scope: dict[str, str] | None = None) -> FlatRecord:
    rec: FlatRecord = {"resource": resource, "attributes": attributes}
    if event_name:
        rec["event_name"] = event_name
    if body is not None:
        rec["body"] = body
    if time_unix_nano:
        rec["time_unix_nano"] = time_unix_nano
    if observed_time_unix_nano:
        rec["observed_time_unix_nano"] = observed_time_unix_nano
    if severity_number:
        rec["severity_number"] = severity_number
    if severity_text:
        rec["severity_text"] = severity_text
    if scope:
        rec["scope"] = scope
    return rec


EXTRA_FIELDS = frozenset({"severity_number", "severity_text", "scope"})
"""The record fields no vendor profile reads so far: a decoder given
``extras=False`` leaves them out (:class:`~bridges.otlp_in.decode.Reads`)."""


def records_from_proto(request: ExportLogsServiceRequest, notes: list[str], *,
                       keys: Container[str] | None = None,
                       resource_keys: Container[str] | None = None,
                       extras: bool = True) -> Iterator[FlatRecord]:
    """Flatten every LogRecord of an ``ExportLogsServiceRequest`` message, in
    order. A decoded protobuf message is structurally sound by construction,
    so this never yields ``None``. ``keys`` / ``resource_keys``: flatten
    only these LogRecord / resource attributes (``None``: all; a vendor
    profile's :attr:`~bridges.otlp_in.profiles.Profile.reads`: what its
    mapper can look at, the same mapping for less work); ``extras=False``:
    without :data:`EXTRA_FIELDS`."""
    for rl in request.resource_logs:
        resource = attrs_from_proto(rl.resource.attributes, notes, 0, resource_keys)
        for sl in rl.scope_logs:
            scope = _scope(sl.scope.name, sl.scope.version)
            for lr in sl.log_records:
                yield _log_record(lr, resource, attrs_from_proto(lr.attributes, notes, 0, keys),
                                  scope, notes, extras)


def _log_record(lr: Any, resource: dict[str, Any], attributes: dict[str, Any],
                scope: dict[str, str] | None, notes: list[str], extras: bool = True
                ) -> FlatRecord:
    """One LogRecord message (real or raw schema) with its flattened
    ``attributes`` -> the :func:`_record` shape, built inline (without
    :data:`EXTRA_FIELDS` unless ``extras``)."""
    rec: FlatRecord = {"resource": dict(resource), "attributes": attributes}
    field = lr.event_name
    if field:
        rec["event_name"] = field
    if lr.HasField("body"):
        body = value_from_proto(lr.body, notes)
        if body is not None:
            rec["body"] = body
    n = lr.time_unix_nano
    if n:
        rec["time_unix_nano"] = n
    n = lr.observed_time_unix_nano
    if n:
        rec["observed_time_unix_nano"] = n
    if not extras:
        return rec
    n = int(lr.severity_number)
    if n:
        rec["severity_number"] = n
    field = lr.severity_text
    if field:
        rec["severity_text"] = field
    if scope:
        rec["scope"] = scope
    return rec


def count_proto_records(request: ExportLogsServiceRequest) -> int:
    return sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)


# --------------------------------------------------------------------------- OTLP/JSON

def _get(obj: dict[str, Any], camel: str, snake: str | None = None) -> Any:
    """A field by its OTLP/JSON lowerCamelCase name, else its proto name."""
    if camel in obj:
        return obj[camel]
    return obj.get(snake) if snake else None


_VALUE_KEYS = (
    ("stringValue", "string_value"), ("boolValue", "bool_value"),
    ("intValue", "int_value"), ("doubleValue", "double_value"),
    ("bytesValue", "bytes_value"), ("arrayValue", "array_value"),
    ("kvlistValue", "kvlist_value"),
)


def _json_int(x: object) -> int | None:
    """An OTLP/JSON int64: a JSON integer or a decimal string."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str):
        s = x.strip()
        if s[:1] and s[0] in "+-":
            sign, s = s[0], s[1:]
        else:
            sign = ""
        if s.isdigit() and s.isascii() and len(s) <= 20:
            return int(sign + s)
    return None


def _json_double(x: object) -> float | str | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        try:
            return _double(float(x))
        except OverflowError:  # a JSON integer beyond a double's range
            return "Infinity" if x > 0 else "-Infinity"
    if isinstance(x, str):
        if x in ("NaN", "Infinity", "-Infinity"):
            return x
        try:
            return _double(float(x))
        except ValueError:
            return None
    return None


_BAD = object()
"""A value of the named kind that is not of that kind (noted, degrades to None)."""


def _json_string(x: Any, notes: list[str], depth: int) -> Any:
    return x if isinstance(x, str) else _BAD


def _json_bool(x: Any, notes: list[str], depth: int) -> Any:
    return x if isinstance(x, bool) else _BAD


def _json_int_value(x: Any, notes: list[str], depth: int) -> Any:
    i = _json_int(x)
    return _BAD if i is None else i


def _json_double_value(x: Any, notes: list[str], depth: int) -> Any:
    d = _json_double(x)
    return _BAD if d is None else d


def _json_array(x: Any, notes: list[str], depth: int) -> Any:
    if not isinstance(x, dict):
        return _BAD
    vals = _get(x, "values")
    if vals is None:
        return []
    if isinstance(vals, list):
        return [value_from_json(e, notes, depth + 1) for e in vals]
    return _BAD


def _json_kvlist(x: Any, notes: list[str], depth: int) -> Any:
    if not isinstance(x, dict):
        return _BAD
    vals = _get(x, "values")
    if vals is None:
        return {}
    if isinstance(vals, list):
        return attrs_from_json(vals, notes, depth + 1)
    return _BAD


# bytesValue is already base64 on this encoding: a string, kept as is.
_JSON_VALUE: dict[str, Callable[[Any, list[str], int], Any]] = {
    "stringValue": _json_string, "boolValue": _json_bool, "intValue": _json_int_value,
    "doubleValue": _json_double_value, "bytesValue": _json_string,
    "arrayValue": _json_array, "kvlistValue": _json_kvlist,
}
_NESTED = frozenset({"arrayValue", "kvlistValue"})


def value_from_json(v: object, notes: list[str], depth: int = 0) -> Any:
    """One OTLP/JSON ``AnyValue`` object -> a JSON value (``None`` for an
    empty or unreadable one, noted)."""
    if not isinstance(v, dict):
        notes.append("otlp.value_unexpected")
        return None
    for camel, snake in _VALUE_KEYS:
        if camel in v or snake in v:
            x = v[camel] if camel in v else v[snake]
            break
    else:
        if v:
            notes.append("otlp.value_unexpected")
        return None
    if camel in _NESTED and depth >= MAX_DEPTH:
        notes.append("otlp.value_too_deep")
        return None
    out = _JSON_VALUE[camel](x, notes, depth)
    if out is _BAD:
        notes.append("otlp.value_unexpected")
        return None
    return out


def attrs_from_json(kvs: object, notes: list[str], depth: int = 0) -> dict[str, Any]:
    """An OTLP/JSON ``KeyValue`` list -> ``{key: value}``; entries without a
    string key are skipped (noted)."""
    out: dict[str, Any] = {}
    if kvs is None:
        return out
    if not isinstance(kvs, list):
        notes.append("otlp.attributes_unexpected")
        return out
    for kv in kvs:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            notes.append("otlp.attribute_malformed")
            continue
        val = kv.get("value")
        out[kv["key"]] = None if val is None else value_from_json(val, notes, depth)
    return out


def _list(obj: dict[str, Any], camel: str, snake: str, where: str) -> list[Any]:
    v = _get(obj, camel, snake)
    if v is None:
        return []
    if not isinstance(v, list):
        raise NotOtlp(f"{where}.{camel} is not an array")
    return v


def _obj(v: Any, where: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise NotOtlp(f"{where} is not an object")
    return v


def records_from_json(doc: object, notes: list[str]) -> list[FlatRecord | None]:
    """Flatten an OTLP/JSON ``ExportLogsServiceRequest`` (already
    ``json.loads``-ed). Returns one entry per LogRecord in order: a flat
    record, or ``None`` for an entry that is not a LogRecord object.

    Raises :class:`NotOtlp` when the document is not an export request: not
    an object, or ``resourceLogs``/``scopeLogs``/``logRecords`` of the wrong
    JSON type. Unknown fields are ignored (OTLP spec: receivers MUST ignore
    unknown fields), so ``{}`` is a valid, empty request."""
    if not isinstance(doc, dict):
        raise NotOtlp("the body is not a JSON object")
    out: list[FlatRecord | None] = []
    for i, rl in enumerate(_list(doc, "resourceLogs", "resource_logs", "request")):
        rl = _obj(rl, f"resourceLogs[{i}]")
        res = _obj(rl.get("resource"), f"resourceLogs[{i}].resource")
        resource = attrs_from_json(res.get("attributes"), notes)
        for j, sl in enumerate(_list(rl, "scopeLogs", "scope_logs", f"resourceLogs[{i}]")):
            sl = _obj(sl, f"resourceLogs[{i}].scopeLogs[{j}]")
            sc = sl.get("scope")
            scope = None
            if isinstance(sc, dict):
                name, version = sc.get("name"), sc.get("version")
                scope = _scope(name if isinstance(name, str) else "",
                               version if isinstance(version, str) else "")
            for lr in _list(sl, "logRecords", "log_records", f"resourceLogs[{i}].scopeLogs[{j}]"):
                out.append(_record_from_json(resource, scope, lr, notes))
    return out


def _record_from_json(resource: dict[str, Any], scope: dict[str, str] | None, lr: Any,
                      notes: list[str]) -> FlatRecord | None:
    if not isinstance(lr, dict):
        notes.append("otlp.record_malformed")
        return None
    ints = {}
    for camel, snake in (("timeUnixNano", "time_unix_nano"),
                         ("observedTimeUnixNano", "observed_time_unix_nano")):
        raw = _get(lr, camel, snake)
        n = _json_int(raw) if raw is not None else 0
        if n is None or n < 0:
            notes.append("otlp.time_unexpected")
            n = 0
        ints[snake] = n
    sev = _get(lr, "severityNumber", "severity_number")
    sev_n = _json_int(sev) if sev is not None else 0
    if sev_n is None:  # the enum name is also legal proto3 JSON
        sev_n = 0
    sev_text = _get(lr, "severityText", "severity_text")
    event_name = _get(lr, "eventName", "event_name")
    if event_name is not None and not isinstance(event_name, str):
        notes.append("otlp.value_unexpected")
        event_name = None
    body = lr.get("body")
    return _record(
        dict(resource), attrs_from_json(lr.get("attributes"), notes),
        event_name=event_name,
        body=value_from_json(body, notes) if body is not None else None,
        time_unix_nano=ints["time_unix_nano"],
        observed_time_unix_nano=ints["observed_time_unix_nano"],
        severity_number=sev_n, severity_text=sev_text if isinstance(sev_text, str) else "",
        scope=scope)
