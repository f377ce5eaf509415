"""Every codex-otel and vscode-otel mapping pin (AEP-0002 Annex A) reproduces
exactly, in both modes, read from shared/ at test time. Each pin's input is
also pushed through real OTLP nesting (protobuf and OTLP/JSON) and the
flattener, so the flattened record equals the pin input."""
from __future__ import annotations

import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from bridges.core.capture import CapturePolicy
from bridges.core.posture import Posture
from bridges.otlp_in import flatten
from bridges.otlp_in.profiles import PROFILES
from tests.support.shared import fixture

FILES = {"codex": "mappings/codex-otel.json", "vscode": "mappings/vscode-otel.json"}


def _cases():
    for vendor, rel in FILES.items():
        pins = fixture(rel)
        entries = dict(pins["records"])
        entries["unknown"] = pins["unknown"]
        for name, entry in entries.items():
            for mode in ("companion", "primary"):
                yield pytest.param(vendor, entry, mode, id=f"{vendor}-{name}-{mode}")


def _expected(entry, mode):
    exp = entry[mode]
    if exp is None:
        return []
    return [{k: v for k, v in exp.items() if not k.startswith("$")}]


@pytest.mark.parametrize("vendor,entry,mode", list(_cases()))
def test_pin(vendor, entry, mode):
    profile = PROFILES[vendor]
    posture = Posture(mode=mode, policy=CapturePolicy())  # default metadata
    got = profile.map_record(entry["input"], posture, [])
    assert got == _expected(entry, mode)


def test_pin_files_cover_both_modes_and_unknown():
    # Guards against a fixture reshuffle silently shrinking the parametrization.
    ids = [p.id for p in _cases()]
    assert len(ids) == 2 * (len(fixture(FILES["codex"])["records"]) + 1
                            + len(fixture(FILES["vscode"])["records"]) + 1)
    assert "codex-unknown-primary" in ids and "vscode-unknown-companion" in ids


def test_identity_session_keys_match_the_pins():
    codex_pins, vscode_pins = fixture(FILES["codex"]), fixture(FILES["vscode"])
    assert codex_pins["identity"]["session_from"] == "conversation.id"
    assert vscode_pins["identity"]["session_from"] == "resource:session.id"
    for entry in codex_pins["records"].values():
        assert PROFILES["codex"].session_key(entry["input"]) == \
            entry["input"]["attributes"]["conversation.id"]
    for entry in vscode_pins["records"].values():
        assert PROFILES["vscode"].session_key(entry["input"]) == \
            entry["input"]["resource"]["session.id"]
    assert codex_pins["identity"]["run_from"] is None  # no runs synthesized: nothing to check


def _any(v):
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=v)


def nest_proto(inp) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    for k, v in inp["resource"].items():
        rl.resource.attributes.append(KeyValue(key=k, value=_any(v)))
    lr = rl.scope_logs.add().log_records.add()
    for k, v in inp["attributes"].items():
        lr.attributes.append(KeyValue(key=k, value=_any(v)))
    return req


def all_pin_inputs():
    for vendor, rel in FILES.items():
        pins = fixture(rel)
        for name, entry in list(pins["records"].items()) + [("unknown", pins["unknown"])]:
            yield pytest.param(entry["input"], id=f"{vendor}-{name}")


@pytest.mark.parametrize("inp", list(all_pin_inputs()))
def test_flatten_real_nesting_reproduces_pin_input(inp):
    req = nest_proto(inp)
    notes: list[str] = []
    (rec,) = list(flatten.records_from_proto(req, notes))
    assert rec == inp and notes == []
    # The same request on the OTLP/JSON encoding (int64 as strings) flattens
    # to the same record.
    doc = json.loads(json_format.MessageToJson(req))
    (rec_j,) = flatten.records_from_json(doc, notes)
    assert rec_j == inp and notes == []
