"""The narrowed decode (``Profile.reads``): the decoder flattens only the
attributes a profile's session key, record time and mapper look at, and
that must change nothing downstream. Held on every mapping pin (both
vendors), on every real Codex 0.171 protobuf capture (OTLP/JSON is flattened whole), and on
generated records, in both modes at every capture ceiling: the plan (the
emissions, their sessions and times, the notes, the refusals) of the
narrowed records equals the plan of the full ones."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from bridges.core.aep import CAPTURE_LEVELS
from bridges.core.capture import CapturePolicy
from bridges.core.posture import Posture
from bridges.otlp_in import flatten
from bridges.otlp_in.decode import ALL, Reads, decode_http_body, decode_json, decode_proto
from bridges.otlp_in.export import plan
from bridges.otlp_in.profiles import PROFILES
from tests.support.shared import fixture

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real"
PINS = {"codex": "mappings/codex-otel.json", "vscode": "mappings/vscode-otel.json"}
POSTURES = [Posture(mode=mode, policy=CapturePolicy(ceiling=ceiling))
            for mode in ("companion", "primary") for ceiling in CAPTURE_LEVELS]


def _reads(vendor: str) -> Reads:
    p = PROFILES[vendor]
    return Reads(p.reads, p.resource_reads, p.fields)


def _narrow(rec: dict, reads: Reads) -> dict:
    out = {k: v for k, v in rec.items() if k in ("attributes", "resource")
           or reads.fields is None or k in reads.fields}
    out["attributes"] = {k: v for k, v in rec["attributes"].items() if k in reads.attributes}
    out["resource"] = {k: v for k, v in rec["resource"].items() if k in reads.resource}
    return out


def _same_plan(vendor: str, full: list, narrow: list) -> None:
    profile = PROFILES[vendor]
    for posture in POSTURES:
        assert plan(narrow, profile, posture) == plan(full, profile, posture), posture


def test_every_profile_declares_what_it_reads():
    for vendor, profile in PROFILES.items():
        assert profile.reads and profile.resource_reads, vendor
        assert "event.name" in profile.reads and "event.timestamp" in profile.reads
        for type_levels in profile.levels.values():  # every graded payload key is read
            assert set(type_levels) - {"host.name"} <= profile.reads, vendor


def _pin_inputs(vendor: str) -> list[dict]:
    pins = fixture(PINS[vendor])
    return [e["input"] for e in [*pins["records"].values(), pins["unknown"]]]


@pytest.mark.parametrize("vendor", sorted(PINS))
def test_the_pins_map_the_same_from_the_narrowed_records(vendor):
    full = _pin_inputs(vendor)
    narrow = [_narrow(r, _reads(vendor)) for r in full]
    _same_plan(vendor, full, narrow)
    # ...and the narrowing really drops something on these inputs
    assert any(n != f for n, f in zip(narrow, full, strict=True)) or vendor == "vscode"


def _real_requests() -> list[tuple[str, bytes]]:
    out = []
    for path in sorted(REAL.glob("*/export-*")):
        out.append(("json" if path.suffix == ".json" else "proto", path.read_bytes()))
    return out


def _real_requests() -> list[bytes]:
    return [p.read_bytes() for p in sorted(REAL.glob("*/export-*.pb"))]


@pytest.mark.parametrize("body", _real_requests(),
                         ids=[f"pb-{i}" for i in range(len(_real_requests()))])
def test_real_codex_exports_decode_narrowed_to_the_same_plan(body):
    reads = _reads("codex")
    full_notes: list[str] = []
    full = decode_proto(body, full_notes)
    narrow_notes: list[str] = []
    narrow = decode_proto(body, narrow_notes, reads)
    assert narrow == [_narrow(r, reads) for r in full]
    assert narrow_notes == full_notes == []
    _same_plan("codex", full, narrow)
    # 0.171 sends attributes no mapping looks at: those are what is skipped
    dropped = {k for r in full for k in r["attributes"]} - reads.attributes
    assert {"app.version", "originator", "terminal.type", "slug"} <= dropped
    # ...and record fields none looks at (its severity, the scope)
    assert {"severity_number", "severity_text", "scope"} <= {k for r in full for k in r} \
        and not any({"severity_number", "severity_text", "scope"} & set(r) for r in narrow)


def test_json_bodies_are_flattened_whole():
    # OTLP/JSON keeps every attribute (and counts each malformed value)
    body = next(REAL.glob("otlp-http-json/export-*.json")).read_bytes()
    _, full = decode_http_body("application/json", None, body, 1 << 24, [])
    _, again = decode_http_body("application/json", None, body, 1 << 24, [], _reads("codex"))
    assert again == full and any("app.version" in r["attributes"] for r in full)


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 2 ** 40), st.text(max_size=12),
                    st.sampled_from(["true", "false", "412", "deny", "Config", "user",
                                     "2026-11-30T13:05:16.466Z", "/home/alice/x", "a@b.io"]))
_value = st.recursive(_scalar, lambda c: st.lists(c, max_size=2)
                      | st.dictionaries(st.text(max_size=4), c, max_size=2), max_leaves=6)


def _records(vendor: str):
    profile = PROFILES[vendor]
    names = sorted(profile.known) + ["codex.mystery", "x"]
    pin_keys = {k for r in _pin_inputs(vendor) for k in r["attributes"]}
    keys = st.sampled_from(sorted(profile.reads | pin_keys) + ["app.version", "model.x", "k"])
    rkeys = st.sampled_from(sorted(profile.resource_reads) + ["service.name", "host.arch"])
    return st.lists(st.fixed_dictionaries(
        {"resource": st.dictionaries(rkeys, _value, max_size=3),
         "attributes": st.tuples(st.sampled_from(names), st.dictionaries(keys, _value,
                                                                         max_size=8)).map(
             lambda t: {"event.name": t[0], **t[1]})},
        optional={"time_unix_nano": st.integers(0, 2 ** 63),
                  "observed_time_unix_nano": st.integers(0, 2 ** 63),
                  "event_name": st.sampled_from(["codex.tool_result", "event x.rs:1"]),
                  "body": st.sampled_from(["codex.user_prompt", "free text"]),
                  # the fields no profile reads (Reads.fields): narrowed away
                  "severity_number": st.integers(1, 24), "severity_text": st.text(max_size=5),
                  "scope": st.just({"name": "codex_otel.log_only"})}),
        min_size=1, max_size=4)


@pytest.mark.parametrize("vendor", sorted(PINS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_generated_records_map_the_same_narrowed(vendor, data):
    full = data.draw(_records(vendor))
    reads = _reads(vendor)
    _same_plan(vendor, full, [_narrow(r, reads) for r in full])


@pytest.mark.parametrize("vendor", sorted(PINS))
def test_protobuf_narrows_the_pins_nested_in_a_real_request(vendor):
    # the pin inputs nested into a real request, decoded both ways with the reads
    from tests.unit.otlp_in.test_otlp_pins import nest_proto

    reads = _reads(vendor)
    for inp in _pin_inputs(vendor):
        req = nest_proto(inp)
        (rec,) = flatten.records_from_proto(req, [], keys=reads.attributes,
                                            resource_keys=reads.resource, extras=reads.extras)
        assert rec == _narrow(inp, reads)
        assert decode_proto(req.SerializeToString(), [], reads) == [rec]
        assert decode_proto(req.SerializeToString(), [], ALL) == [inp]
        doc = json.loads(json_format.MessageToJson(req))
        assert decode_json(json.dumps(doc).encode(), []) == [inp]


def test_a_malformed_value_of_an_unread_key_is_not_read():
    req = ExportLogsServiceRequest()
    lr = req.resource_logs.add().scope_logs.add().log_records.add()
    for k in ("event.name", "slug"):
        kv = lr.attributes.add(key=k)
        kv.value.string_value = "codex.sse_event" if k == "event.name" else ""
    deep = lr.attributes.add(key="app.deep").value
    for _ in range(flatten.MAX_DEPTH + 2):
        deep = deep.array_value.values.add()
    full_notes: list[str] = []
    decode_proto(req.SerializeToString(), full_notes)
    assert full_notes == ["otlp.value_too_deep"]
    narrow_notes: list[str] = []
    (rec,) = decode_proto(req.SerializeToString(), narrow_notes, _reads("codex"))
    assert narrow_notes == [] and rec["attributes"] == {"event.name": "codex.sse_event"}


# --------------------------------------------------------------------------- record time

def _record_time_reference(rec, now=None, notes=None):
    """record_time as it was written before its closure was inlined (the
    behavior the inline version keeps, note for note)."""
    from datetime import datetime, timezone

    from bridges.otlp_in.common import EARLIEST, FUTURE_SLACK, _from_nanos, attrs
    out_of_range = False

    def plausible(t):
        nonlocal out_of_range
        if t is None or now is None:
            return t
        if t < EARLIEST or t > now + FUTURE_SLACK:
            out_of_range = True
            return None
        return t

    try:
        t = plausible(_from_nanos(rec.get("time_unix_nano")))
        if t:
            return t
        ts = attrs(rec).get("event.timestamp")
        if isinstance(ts, str) and 10 <= len(ts) <= 40:
            try:
                t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
            except ValueError:
                t = None
            if t is not None:
                if t.tzinfo is None:
                    t = t.replace(tzinfo=timezone.utc)
                if 1971 <= t.year <= 9998 and (t := plausible(t)) is not None:
                    return t
        return plausible(_from_nanos(rec.get("observed_time_unix_nano")))
    finally:
        if out_of_range and notes is not None:
            notes.append("otlp.time_out_of_range")


_NS = st.one_of(st.none(), st.just(0), st.just(-3), st.just(True),
                st.integers(10 ** 18, 2 ** 64 - 1), st.integers(0, 10 ** 30))
_TS = st.one_of(st.none(), st.just(5), st.sampled_from([
    "2026-11-30T13:05:16.466Z", "2026-11-30T13:05:16", "2026-11-30T13:05:16+05:00",
    "1999-12-31T23:59:59.999Z", "2999-01-01T00:00:00Z", "1970-01-01T00:00:00Z",
    "2026-13-40T00:00:00Z", "9999-12-31T23:59:59Z", "garbage-garbage", "2026-11-30"]),
    st.text(max_size=45))


@settings(max_examples=500, deadline=None)
@given(t=_NS, ts=_TS, obs=_NS, with_now=st.booleans(), attrs_kind=st.sampled_from(
    ["dict", "none", "list"]))
def test_record_time_keeps_its_behavior(t, ts, obs, with_now, attrs_kind):
    from datetime import datetime, timezone

    from bridges.core.envelope import rfc3339
    from bridges.otlp_in.common import record_moment, record_time
    rec = {"attributes": {"event.timestamp": ts} if attrs_kind == "dict" else
           (None if attrs_kind == "none" else ["event.timestamp"])}
    if t is not None:
        rec["time_unix_nano"] = t
    if obs is not None:
        rec["observed_time_unix_nano"] = obs
    now = datetime(2026, 11, 30, 13, 5, tzinfo=timezone.utc) if with_now else None
    got_notes: list[str] = []
    ref_notes: list[str] = []
    assert record_time(rec, now, got_notes) == _record_time_reference(rec, now, ref_notes)
    assert got_notes == ref_notes
    # record_moment is the same moment; given as text, it is exactly what the
    # stamper would have written for it
    moment = record_moment(rec, now, [])
    ref = _record_time_reference(rec, now, [])
    if isinstance(moment, str):
        assert ref is not None and moment == rfc3339(ref)
    else:
        assert moment == ref
