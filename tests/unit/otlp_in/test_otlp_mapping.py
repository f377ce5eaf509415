"""The codex/vscode mappers beyond the pins: capture gating at every
ceiling (design record "Capture"), the primary-mode rules, degradation of
odd records, and every shape the real Codex 0.171.0 exporter sends
(``tests/fixtures/codex_otel_real/``, captured from the real binary)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from bridges.core import capture
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.otlp_in import codex, flatten, vscode
from bridges.otlp_in.common import record_time
from tests.support.shared import aep_dir, fixture

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real"

META = Posture(mode="companion", policy=CapturePolicy(ceiling="metadata"))
RED = Posture(mode="companion", policy=CapturePolicy(ceiling="redacted"))
FULL = Posture(mode="companion", policy=CapturePolicy(ceiling="full"))
NONE = Posture(mode="companion", policy=CapturePolicy(ceiling="none"))


def _pin(vendor: str, name: str) -> dict:
    pins = fixture(f"mappings/{vendor}-otel.json")
    return json.loads(json.dumps(pins["records"][name]["input"]))  # a private copy


def _one(rec, posture, mapper=codex.map_record):
    out = mapper(rec, posture, [])
    assert len(out) == 1
    return out[0]


# --------------------------------------------------------------------------- capture

PROMPT = "deploy with token=sk-live-abcdefghijklmnop and mail bob@example.com"


def test_prompt_never_forwarded_as_the_vendor_placeholder():
    rec = _pin("codex", "user_prompt")  # prompt = "[REDACTED]" (vendor flag off)
    for posture in (META, RED, FULL):
        assert "prompt" not in _one(rec, posture)["data"]


def test_prompt_double_gate_vendor_sent_and_ceiling_redacted_plus():
    rec = _pin("codex", "user_prompt")
    rec["attributes"]["prompt"] = PROMPT
    assert _one(rec, META)["data"] == {"prompt_length": "147"}
    red = _one(rec, RED)["data"]["prompt"]
    assert red == capture.redact_text(PROMPT, RED.policy)  # the shared §9.4 pipeline
    assert "sk-live-abcdefghijklmnop" not in red and "bob@example.com" not in red
    assert _one(rec, FULL)["data"]["prompt"] == PROMPT


def test_prompt_stays_vendor_namespaced_in_primary():
    rec = _pin("codex", "user_prompt")
    rec["attributes"]["prompt"] = PROMPT
    out = _one(rec, Posture(mode="primary", policy=CapturePolicy(ceiling="redacted")))
    assert out["type"] == "x.codex.otel.user_prompt"


def test_user_email_only_at_full_host_name_at_redacted():
    rec = _pin("codex", "conversation_starts")
    rec["attributes"]["user.email"] = "dev@example.com"
    meta = _one(rec, META)["data"]
    assert "host.name" not in meta and "user.email" not in meta
    red = _one(rec, RED)["data"]
    assert red["host.name"] == "dev-host-1" and "user.email" not in red
    full = _one(rec, FULL)["data"]
    assert full["host.name"] == "dev-host-1" and full["user.email"] == "dev@example.com"


def test_tool_error_text_redacted_gated():
    rec = _pin("codex", "tool_result_fail")  # error = "exit 1"
    assert "error" not in _one(rec, META)["data"]
    assert _one(rec, RED)["data"]["error"] == capture.redact_text("exit 1", RED.policy)
    prim = codex.map_record(rec, Posture(mode="primary", policy=CapturePolicy(ceiling="redacted")),
                            [])
    assert prim[0]["data"]["error"] == {"type": "tool_error",
                                        "message": capture.redact_text("exit 1", RED.policy)}


def test_tool_arguments_and_output_only_at_full():
    rec = _pin("codex", "tool_result_ok")
    rec["attributes"].update(arguments='{"cmd": "cat ~/.ssh/id_rsa"}', output="secret output")
    for posture in (META, RED):
        data = _one(rec, posture)["data"]
        assert "arguments" not in data and "output" not in data
    full = _one(rec, FULL)["data"]
    assert full["arguments"] == '{"cmd": "cat ~/.ssh/id_rsa"}' and full["output"] == "secret output"
    prim_red = codex.map_record(rec, Posture(mode="primary", policy=CapturePolicy(ceiling="redacted")), [])[0]
    assert "result" not in prim_red["data"]
    prim_full = codex.map_record(rec, Posture(mode="primary", policy=CapturePolicy(ceiling="full")), [])[0]
    assert prim_full["data"]["result"] == "secret output"


def test_vscode_genai_messages_redacted_plus():
    rec = _pin("vscode", "inference_details")
    msgs = rec["attributes"]["gen_ai.input.messages"]
    assert "gen_ai.input.messages" not in _one(rec, META, vscode.map_record)["data"]
    assert _one(rec, RED, vscode.map_record)["data"]["gen_ai.input.messages"] == \
        capture.redact_text(msgs, RED.policy)
    assert _one(rec, FULL, vscode.map_record)["data"]["gen_ai.input.messages"] == msgs


def test_metadata_fields_survive_a_none_ceiling_only_through_the_stamper():
    # The mapper's own grades start at metadata; at ceiling none the
    # stamper's gate is the last word (AEP-0003 §9.1) — nothing above
    # metadata is ever added by the mapper.
    rec = _pin("codex", "conversation_starts")
    rec["attributes"]["user.email"] = "dev@example.com"
    data = _one(rec, NONE)["data"]
    assert "host.name" not in data and "user.email" not in data


def test_unexpected_value_kinds_in_metadata_fields_are_dropped_and_noted():
    rec = _pin("codex", "api_request")
    rec["attributes"]["status"] = {"nested": "map"}
    rec["attributes"]["attempts"] = ["a", "b"]
    rec["attributes"]["duration_ms"] = "x" * 5000
    notes: list[str] = []
    (out,) = codex.map_record(rec, META, notes)
    assert "status" not in out["data"] and "attempts" not in out["data"]
    assert len(out["data"]["duration_ms"]) == 512
    assert notes.count("otlp.value_unexpected") == 2 and "otlp.value_truncated" in notes


# --------------------------------------------------------------------------- primary rules

PRIMARY = Posture(mode="primary", policy=CapturePolicy())


@pytest.mark.parametrize("source,by", [("Config", "policy"), ("config", "policy"),
                                       ("AutomatedReviewer", "runtime"),
                                       ("automated_reviewer", "runtime")])
def test_primary_deny_sources(source, by):
    rec = _pin("codex", "tool_decision_config_deny")
    rec["attributes"].update(source=source, decision="Denied", call_id="call_9")
    assert codex.map_record(rec, PRIMARY, []) == [
        {"type": "tool.denied", "data": {"tool": {"name": "shell", "call_id": "call_9"}, "by": by},
         "subject": "shell"}]


def test_primary_user_deny_emits_nothing_even_capitalised():
    rec = _pin("codex", "tool_decision_user_deny")
    rec["attributes"]["source"] = "User"
    assert codex.map_record(rec, PRIMARY, []) == []


def test_primary_approval_stays_vendor_namespaced():
    rec = _pin("codex", "tool_decision_config_deny")
    rec["attributes"]["decision"] = "approved"
    assert _one(rec, PRIMARY)["type"] == "x.codex.otel.tool_decision"


@pytest.mark.parametrize("change", [
    {"success": "maybe"}, {"success": None}, {"tool_name": None}, {"tool_name": 7},
])
def test_primary_tool_result_that_cannot_be_decided_degrades(change):
    rec = _pin("codex", "tool_result_ok")
    rec["attributes"].update(change)
    notes: list[str] = []
    (out,) = codex.map_record(rec, PRIMARY, notes)
    assert out["type"] == "x.codex.otel.tool_result"
    assert "otlp.degraded" in notes


def test_primary_deny_from_an_unknown_source_degrades():
    rec = _pin("codex", "tool_decision_config_deny")
    rec["attributes"]["source"] = "Oracle"
    notes: list[str] = []
    assert _one(rec, PRIMARY)["type"] == "x.codex.otel.tool_decision"
    codex.map_record(rec, PRIMARY, notes)
    assert "otlp.degraded" in notes


def test_primary_typed_values_from_the_real_exporter():
    rec = _pin("codex", "tool_result_ok")
    rec["attributes"].update(success=True, duration_ms=412)  # bool/int instead of strings
    assert _one(rec, PRIMARY)["data"] == {"tool": {"name": "shell"}, "duration_ms": 412}
    rec["attributes"]["duration_ms"] = -3  # not a duration: omitted, still completed
    assert _one(rec, PRIMARY)["data"] == {"tool": {"name": "shell"}}


def test_vscode_never_emits_denied_or_ended():
    rec = _pin("vscode", "tool_call_fail")
    del rec["attributes"]["error.type"]
    out = _one(rec, Posture(mode="primary", policy=CapturePolicy()), vscode.map_record)
    assert out["type"] == "tool.failed" and out["data"]["error"] == {"type": "tool_error"}
    assert vscode.PRIMARY_TYPES == ("session.started", "tool.completed", "tool.failed")


def test_unknown_and_nameless_records():
    notes: list[str] = []
    rec = {"resource": {}, "attributes": {"conversation.id": "c1", "secret": "s3cr3t"}}
    assert codex.map_record(rec, FULL, notes) == [{"type": "x.codex.otel.unknown", "data": {}}]
    assert "otlp.no_event_name" in notes
    rec["attributes"]["event.name"] = "codex.brand_new"
    notes.clear()
    assert codex.map_record(rec, FULL, notes) == [
        {"type": "x.codex.otel.unknown", "data": {"event.name": "codex.brand_new"}}]
    assert notes == ["otlp.unknown_event"]


# --------------------------------------------------------------------------- real Codex 0.171.0

def _real(scenario: str) -> list[dict]:
    d = REAL / scenario
    notes: list[str] = []
    if (d / "export-000.pb").exists():
        req = ExportLogsServiceRequest.FromString((d / "export-000.pb").read_bytes())
        recs = list(flatten.records_from_proto(req, notes))
    else:
        recs = flatten.records_from_json(json.loads((d / "export-000.json").read_text()), notes)
    assert notes == [] and recs and all(r is not None for r in recs)
    return recs


SCENARIOS = ["otlp-grpc", "otlp-http-protobuf", "otlp-http-json",
             "otlp-http-json-log-user-prompt", "otlp-http-protobuf-forbidden"]


def _manifest():
    return json.loads((REAL / "manifest.json").read_text())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_real_capture_companion(scenario):
    recs = _real(scenario)
    conv = _manifest()["scenarios"][scenario]["conversation_id"]
    stamper = Stamper("codex", host="h")
    for rec in recs:
        name = rec["attributes"]["event.name"]
        assert codex.session_key(rec) == conv
        notes: list[str] = []
        (out,) = codex.map_record(rec, META, notes)
        # Every event name 0.171 sends is a known one: its own vendor type,
        # never the unknown fallback.
        assert out["type"] == "x.codex.otel." + name.removeprefix("codex.")
        assert notes == []
        blob = json.dumps(out)
        # Content never leaks at metadata: command line, output, prompt, paths.
        for leak in ("echo hello", "rm -rf", "Process exited", "Run `echo", "/root"):
            assert leak not in blob
        # The record's time is the vendor's event.timestamp (time_unix_nano is 0).
        assert "time_unix_nano" not in rec
        ev = stamper.stamp(conv, out, time=record_time(rec))
        assert ev["time"] == rec["attributes"]["event.timestamp"]


def test_real_capture_sse_keys_and_typed_values():
    recs = _real("otlp-grpc")
    sse = [codex.map_record(r, META, [])[0]["data"] for r in recs
           if r["attributes"]["event.name"] == "codex.sse_event"]
    assert {"event.kind": "response.created", "duration_ms": "0"} in sse
    tokens = [d for d in sse if "input_token_count" in d][0]
    assert tokens["cached_token_count"] == 0 and tokens["input_token_count"] == "120"
    api = [codex.map_record(r, META, [])[0]["data"] for r in recs
           if r["attributes"]["event.name"] == "codex.api_request"][0]
    assert api["http.response.status_code"] == 200 and api["attempt"] == 0
    assert api["endpoint"] == "/responses"
    assert not any(k.startswith("auth.") for k in api)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_real_capture_primary(scenario):
    recs = _real(scenario)
    got = [(r["attributes"]["event.name"], codex.map_record(r, PRIMARY, [])) for r in recs]
    starts = [o for n, o in got if n == "codex.conversation_starts"]
    assert starts == [[{"type": "session.started", "data": {
        "client": {"name": "codex"}, "gen_ai.request.model": "mock-codex-model"}}]]
    (result,) = [o for n, o in got if n == "codex.tool_result"]
    raw = [r for r in recs if r["attributes"]["event.name"] == "codex.tool_result"][0]
    tool = {"name": "exec_command", "call_id": "call_mock_2"}
    if scenario.endswith("forbidden"):
        # An execpolicy-forbidden command: success "false", no error
        # attribute, no tool_decision at all: a tool.failed, not a denial.
        assert result == [{"type": "tool.failed", "subject": "exec_command", "data": {
            "tool": tool, "error": {"type": "tool_error"}}}]
        assert not [n for n, _ in got if n == "codex.tool_decision"]
    else:
        assert result == [{"type": "tool.completed", "subject": "exec_command", "data": {
            "tool": tool, "duration_ms": int(raw["attributes"]["duration_ms"])}}]
        (decision,) = [o for n, o in got if n == "codex.tool_decision"]
        assert decision[0]["type"] == "x.codex.otel.tool_decision"  # approved by Config
    for name, out in got:
        if name not in ("codex.conversation_starts", "codex.tool_result", "codex.tool_decision"):
            assert out[0]["type"].startswith("x.codex.otel.")


def test_real_capture_forbidden_reason_only_at_full():
    recs = _real("otlp-http-protobuf-forbidden")
    raw = [r for r in recs if r["attributes"]["event.name"] == "codex.tool_result"][0]
    full = codex.map_record(raw, Posture(mode="primary", policy=CapturePolicy(ceiling="full")), [])[0]
    assert full["data"]["error"]["message"] == raw["attributes"]["output"]
    red = codex.map_record(raw, Posture(mode="primary", policy=CapturePolicy(ceiling="redacted")), [])[0]
    assert "message" not in red["data"]["error"]


def test_real_capture_logged_prompt_through_the_pipeline():
    recs = _real("otlp-http-json-log-user-prompt")
    prompt = _manifest()["prompt"]
    (rec,) = [r for r in recs if r["attributes"]["event.name"] == "codex.user_prompt"]
    assert rec["attributes"]["prompt"] == prompt
    assert "prompt" not in codex.map_record(rec, META, [])[0]["data"]
    assert codex.map_record(rec, RED, [])[0]["data"]["prompt"] == \
        capture.redact_text(prompt, RED.policy)


def test_real_capture_payload_types_validate():
    # The primary core types stamp into schema-valid envelopes.
    import jsonschema
    env_schema = json.loads((aep_dir() / "schemas" / "aep-event.schema.json").read_text())
    stamper = Stamper("codex", host="h")
    for scenario in SCENARIOS:
        for rec in _real(scenario):
            for em in codex.map_record(rec, PRIMARY, []):
                ev = stamper.stamp(codex.session_key(rec), em, time=record_time(rec))
                jsonschema.validate(ev, env_schema)
                p = aep_dir() / "schemas" / "types" / f"{ev['type']}.schema.json"
                if p.exists():
                    jsonschema.validate(ev.get("data", {}), json.loads(p.read_text()))


# --------------------------------------------------------------------------- honest capture claims

@pytest.mark.parametrize("ceiling", ["metadata", "redacted", "full"])
def test_stamped_capture_is_the_level_actually_honored(ceiling):
    # x.* types have no schema: the profile's gating hint lets the stamper
    # claim what was kept, not the ceiling (AEP-0003 §9.5).
    from bridges.otlp_in.profiles import PROFILES
    profile = PROFILES["codex"]
    policy = CapturePolicy(ceiling=ceiling)
    stamper = Stamper("codex", host="h", policy=policy)
    posture = Posture(mode="companion", policy=policy)
    api = _pin("codex", "api_request")
    (em,) = codex.map_record(api, posture, [])
    assert stamper.stamp("c1", profile.stampable(em))["capture"] == "metadata"
    rec = _pin("codex", "user_prompt")
    rec["attributes"]["prompt"] = PROMPT
    (em,) = codex.map_record(rec, posture, [])
    ev = stamper.stamp("c1", profile.stampable(em))
    assert ev["capture"] == ceiling
    assert ("prompt" in ev["data"]) == (ceiling != "metadata")
    if ceiling == "redacted":
        assert ev["data"]["prompt"] == capture.redact_text(PROMPT, policy)
    # the hint never reaches the wire, and core types get none
    assert "gating" not in ev
    prim = codex.map_record(_pin("codex", "tool_result_ok"), Posture(mode="primary", policy=policy), [])[0]
    assert profile.stampable(prim) is prim


# --------------------------------------------------------------------------- redaction at metadata

TOKEN = "tok-3c1f9b7e22d04a55aa81"
ALICE = "alice-secret-token-1234"
SECRETS = CapturePolicy(secret_values=(TOKEN, ALICE))


@pytest.mark.parametrize("mode", ["companion", "primary"])
def test_metadata_strings_are_redacted_of_the_daemons_credentials(mode):
    """Issue 25, sixth outside attack: an OTLP ``codex.tool_decision`` with
    ``tool_name=$AEP_TOKEN`` and ``decision=<a per-emitter credential>`` was
    written verbatim to the session log; the hooks redacted the same. Every
    metadata string goes through the policy's redaction now."""
    posture = Posture(mode=mode, policy=SECRETS)
    for name, change in (("tool_decision_config_deny", {"tool_name": TOKEN, "call_id": f"c {ALICE}",
                                                        "decision": "denied"}),
                         ("tool_decision_config_deny", {"tool_name": TOKEN, "decision": ALICE}),
                         ("conversation_starts", {"model": f"model {TOKEN}"}),
                         ("tool_result_ok", {"tool_name": ALICE, "call_id": TOKEN})):
        rec = _pin("codex", name)
        rec["attributes"].update(change)
        out = codex.map_record(rec, posture, [])
        text = json.dumps(out)
        assert out and TOKEN not in text and ALICE not in text, (name, text)
        assert "[REDACTED:secret]" in text, text


def test_a_vscode_primary_tool_name_is_redacted():
    rec = _pin("vscode", "tool_call_ok")
    rec["attributes"]["gen_ai.tool.name"] = TOKEN
    out = vscode.map_record(rec, Posture(mode="primary", policy=SECRETS), [])
    assert out and TOKEN not in json.dumps(out)


def test_a_secret_across_the_metadata_cut_is_still_redacted():
    rec = _pin("codex", "conversation_starts")
    rec["attributes"]["model"] = "m" * 500 + TOKEN + "x" * 100
    notes: list[str] = []
    (out,) = codex.map_record(rec, Posture(mode="companion", policy=SECRETS), notes)
    assert TOKEN[:12] not in out["data"]["model"]
    assert len(out["data"]["model"]) == 512 and "otlp.value_truncated" in notes
