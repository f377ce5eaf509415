"""The real Codex CLI, headless and offline, exports its OTel logs: live vs the committed captures.

For every scenario in ``tests.support.codex.SCENARIOS`` (the three exporter
kinds, the prompt-logging flag, a config-forbidden command) this runs the
pinned Codex against the mock Responses provider and the OTLP capture
receiver, and checks

- the conversation really happened (the shell tool ran, its output went back
  to the model, the final message came out) and Codex never tried to reach
  the internet;
- the exporter used the transport and encoding configured, every record
  belongs to the conversation Codex reported (``conversation.id`` =
  ``thread_id``), and the whole run arrived before Codex exited (flush on exit);
- the live wire shape equals ``tests/fixtures/codex_otel_real/`` (event
  names, and per event name each attribute key with its OTLP value type, the
  resource attribute keys, the scope, which LogRecord fields are set): when a
  Codex bump changes what it sends, this fails and says to regenerate the
  fixtures and re-read the drift analysis in their README;
- Codex does not retry an export refused with a retryable status (so the
  bridge must not shed Codex's exports with 503 lightly).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.support import codex as cx
from tests.support.mock_responses import MockResponsesServer
from tests.support.otlp_capture import Captured, OtlpCapture, decode_logs, log_records

pytestmark = pytest.mark.vendor

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
SCENARIO_BY_KIND = {s.name: s for s in cx.SCENARIOS if s.name in cx.EXPORTER_KINDS}


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    return cx.codex_binary()


def _attrs(rec: dict) -> dict[str, dict]:
    return {a["key"]: a["value"] for a in rec["record"].get("attributes", [])}


def _str(value: dict) -> str:
    return str(next(iter(value.values()))) if value else ""


def wire_shape(caps: list[Captured]) -> dict:
    """What a bridge depends on, without the values that change per run."""
    events: dict[str, dict[str, str]] = {}
    resource_keys, scopes, fields = set(), set(), set()
    for cap in caps:
        for rec in log_records(cap):
            attrs = _attrs(rec)
            name = _str(attrs.get("event.name", {}))
            per = events.setdefault(name, {})
            for k, v in attrs.items():
                per[k] = next(iter(v.keys()), "empty")
            resource_keys |= {a["key"] for a in rec["resource"].get("attributes", [])}
            scopes.add(rec["scope"].get("name", ""))
        msg = decode_logs(cap)
        for rl in msg.resource_logs:
            for sl in rl.scope_logs:
                for lr in sl.log_records:
                    fields |= {f.name for f, _ in lr.ListFields()}
    return {"events": events, "resource_keys": sorted(resource_keys),
            "scopes": sorted(scopes), "log_record_fields": sorted(fields)}


def fixture_captures(name: str) -> list[Captured]:
    sc = MANIFEST["scenarios"][name]
    return [Captured(e["transport"], "logs", e["path"], e["content_type"],
                     e["content_encoding"], (FIXTURES / e["file"]).read_bytes())
            for e in sc["exports"]]


def test_fixtures_are_for_the_pinned_version():
    assert MANIFEST["codex_version"] == cx.CODEX_VERSION, (
        "tests/support/codex.py pins a different Codex than the committed captures: "
        "regenerate them (tests/fixtures/codex_otel_real/README.md)")
    assert set(MANIFEST["scenarios"]) == {s.name for s in cx.SCENARIOS}


@pytest.mark.parametrize("scenario", cx.SCENARIOS, ids=lambda s: s.name)
async def test_real_codex_exports_the_conversation(scenario, codex_bin, tmp_path):
    run, mock, cap = await cx.capture_scenario(codex_bin, tmp_path / "home", scenario)

    # the conversation happened, offline
    assert run.returncode == 0, run.describe()
    assert not mock.egress(), f"Codex tried to leave the machine: " \
        f"{[(r.method, r.path, r.headers.get('host')) for r in mock.egress()]}"
    assert not mock.problems, mock.problems
    assert len(mock.tool_calls) == 1, run.describe()
    call_id, _tool, _args = mock.tool_calls[0]
    outputs = [o for o in mock.tool_outputs() if o.get("call_id") == call_id]
    assert outputs, "the tool output never came back to the model"
    commands = run.commands()
    if scenario.rules:  # refused by the execpolicy before anything ran
        assert commands == [], run.describe()
        assert "rejected" in outputs[0]["output"], outputs[0]
    else:
        assert len(commands) == 1 and scenario.command in commands[0]["command"], run.describe()
        assert commands[0]["exit_code"] == 0 and "hello" in commands[0]["aggregated_output"]
        assert "hello" in outputs[0]["output"]
    assert any(ev.get("type") == "item.completed"
               and ev["item"].get("text") == mock.final_text for ev in run.events)
    assert run.thread_id

    # the exporter used what we configured, and flushed before exiting
    logs = cap.logs()
    assert logs, f"no OTLP logs export arrived before Codex exited\n{run.describe()}"
    assert {c.signal for c in cap.captures} == {"logs"}, "traces/metrics exporters are off"
    for c in logs:
        if scenario.kind == "otlp-grpc":
            assert c.transport == "grpc"
        else:
            assert (c.transport, c.path) == ("http", "/v1/logs")
            want = "application/json" if scenario.kind.endswith("json") else \
                "application/x-protobuf"
            assert c.content_type.split(";")[0] == want
    records = [r for c in logs for r in log_records(c)]
    names = [_str(_attrs(r).get("event.name", {})) for r in records]
    assert {_str(_attrs(r).get("conversation.id", {})) for r in records} == {run.thread_id}
    assert "codex.conversation_starts" in names and "codex.tool_result" in names
    (result,) = [_attrs(r) for r in records if _str(_attrs(r)["event.name"]) ==
                 "codex.tool_result"]
    assert _str(result["call_id"]) == call_id
    assert _str(result["success"]) == ("false" if scenario.rules else "true")
    (prompt,) = [_attrs(r) for r in records if _str(_attrs(r)["event.name"]) ==
                 "codex.user_prompt"]
    assert _str(prompt["prompt"]) == (cx.PROMPT if scenario.log_user_prompt else "[REDACTED]")
    assert _str(prompt["prompt_length"]) == str(len(cx.PROMPT))

    # the live wire shape is the committed one
    assert wire_shape(logs) == wire_shape(fixture_captures(scenario.name)), (
        f"Codex {cx.CODEX_VERSION} now sends a different shape than "
        f"tests/fixtures/codex_otel_real/{scenario.name}: regenerate the fixtures and "
        "re-check the drift analysis in their README")


@pytest.mark.parametrize("kind", cx.EXPORTER_KINDS)
async def test_real_codex_does_not_retry_a_refused_export(kind, codex_bin, tmp_path):
    """Codex's exporter (OTel Rust SDK 0.31) makes one attempt at exit: a retryable
    refusal (HTTP 503 + Retry-After, gRPC UNAVAILABLE) loses the whole run's logs.
    The bridge must therefore not answer Codex with 503 lightly (see the fixtures'
    README, "Delivery"). If a Codex bump starts retrying, this fails: re-evaluate."""
    mock, cap = MockResponsesServer(), OtlpCapture(refuse_first=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(cap.serve)
        endpoint = cap.grpc_url if kind == "otlp-grpc" else cap.http_url
        run = await cx.run_scenario(codex_bin, tmp_path / "home", SCENARIO_BY_KIND[kind],
                                    otlp_endpoint=endpoint, mock=mock)
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    assert cap.refused == 1
    refused, *later = cap.logs()
    # On a loaded machine the batch processor's timer can fire mid-run, so a
    # later export may carry records made after the refused one: that is no
    # retry. A retry would carry a refused record again.
    seen = {json.dumps(r["record"], sort_keys=True) for r in log_records(refused)}
    assert seen, "the refused export carried no LogRecord"
    again = [r for c in later for r in log_records(c)
             if json.dumps(r["record"], sort_keys=True) in seen]
    assert not again, "Codex retried: the drop-on-refusal note no longer holds"
    assert "ExportError" in run.stderr
