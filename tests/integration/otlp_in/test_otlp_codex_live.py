"""The real Codex CLI (npm ``@openai/codex``, pinned in
``tests/support/codex.py``) exports its OpenTelemetry logs straight into the
OTLP inbound bridge, once per exporter kind (otlp-grpc, otlp-http binary,
otlp-http json), in both modes: every record maps, nothing falls to the
unknown fallback, sessions are Codex's own thread id, content stays out at
the default ceiling, and the events validate. Offline: the model is the
mock Responses provider (``tests/support/mock_responses.py``)."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import trio

from bridges.core.capture import CapturePolicy
from tests.support import codex as cx
from tests.support.mock_responses import MODEL, MockResponsesServer
from tests.support.otlp_in import bridge_context, drain, otlp_bridge

try:
    from tests.support.schema import validate_event
except ImportError:  # pragma: no cover
    def validate_event(ev):  # type: ignore[misc]
        assert ev["aep"] == "0.1"

pytestmark = pytest.mark.vendor

SCENARIO = {s.name: s for s in cx.SCENARIOS}


@pytest.fixture(scope="module")
def codex_bin():
    return cx.codex_binary()  # installs into the vendor cache; loud skip if npm is unreachable


async def _live(codex_bin, home, scenario, *, primary: bool):
    bridge = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0", primary=primary)
    ctx, recv = bridge_context(bridge.name, "codex", epoch=7)
    mock = MockResponsesServer()
    started = datetime.now(timezone.utc)
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(bridge.run, ctx)
        if scenario.kind == "otlp-grpc":
            endpoint = f"http://127.0.0.1:{bridge.grpc_address[1]}"
        else:
            endpoint = f"http://127.0.0.1:{bridge.http_address[1]}"
        run = await cx.run_scenario(codex_bin, home, scenario, otlp_endpoint=endpoint, mock=mock)
        nursery.cancel_scope.cancel()
    events = drain(recv)
    assert run.returncode == 0, run.describe()
    assert "ExportError" not in run.stderr, run.describe()
    assert run.thread_id and events, run.describe()
    for ev in events:
        validate_event(ev)
        assert ev["session"] == run.thread_id and ev["agent"] == "codex"
        # the vendor's own moment (event.timestamp), not 1970 (time_unix_nano is 0)
        t = datetime.fromisoformat(ev["time"].replace("Z", "+00:00"))
        assert abs((t - started).total_seconds()) < 300
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert "otlp.rejected" not in ctx.health.counters
    return run, events, ctx, mock


@pytest.mark.parametrize("kind", cx.EXPORTER_KINDS)
async def test_live_codex_companion(kind, codex_bin, tmp_path):
    run, events, ctx, mock = await _live(codex_bin, tmp_path / "home", SCENARIO[kind],
                                         primary=False)
    types = [e["type"] for e in events]
    assert all(t.startswith("x.codex.otel.") for t in types)
    assert "x.codex.otel.unknown" not in types
    for t in ("conversation_starts", "user_prompt", "api_request", "sse_event",
              "tool_decision", "tool_result"):
        assert f"x.codex.otel.{t}" in types
    (result,) = [e for e in events if e["type"] == "x.codex.otel.tool_result"]
    assert result["data"]["tool_name"] == "exec_command" and result["data"]["success"] == "true"
    # the default metadata ceiling: no command line, output, prompt or path
    blob = json.dumps(events)
    for leak in ("echo hello", "Process exited", cx.PROMPT, "/root", str(tmp_path)):
        assert leak not in blob


@pytest.mark.parametrize("kind", cx.EXPORTER_KINDS)
async def test_live_codex_primary(kind, codex_bin, tmp_path):
    run, events, ctx, mock = await _live(codex_bin, tmp_path / "home", SCENARIO[kind],
                                         primary=True)
    assert events[0]["type"] == "session.started"
    assert events[0]["data"] == {"client": {"name": "codex"}, "gen_ai.request.model": MODEL}
    (done,) = [e for e in events if e["type"] == "tool.completed"]
    assert done["subject"] == "exec_command"
    assert done["data"]["tool"]["name"] == "exec_command"
    assert isinstance(done["data"]["duration_ms"], int)
    # the call id the model (our mock) gave the tool call
    assert [(done["data"]["tool"]["call_id"], "exec_command")] == \
        [(cid, name) for cid, name, _ in mock.tool_calls]
    types = [e["type"] for e in events]
    assert "x.codex.otel.tool_decision" in types  # an approval has no core type
    assert not any(t.startswith("tool.") and t != "tool.completed" for t in types)
    assert all(t in ("session.started", "tool.completed") or t.startswith("x.codex.otel.")
               for t in types)


async def test_live_codex_forbidden_command_is_a_tool_failure(codex_bin, tmp_path):
    run, events, ctx, mock = await _live(codex_bin, tmp_path / "home",
                                         SCENARIO["otlp-http-protobuf-forbidden"], primary=True)
    (failed,) = [e for e in events if e["type"] == "tool.failed"]
    ((call_id, _, _),) = mock.tool_calls
    assert failed["data"] == {"tool": {"name": "exec_command", "call_id": call_id},
                              "error": {"type": "tool_error"}}
    assert not [e for e in events if e["type"] == "x.codex.otel.tool_decision"]
    assert "rm -rf" not in json.dumps(events)


async def test_live_codex_logged_prompt_is_redacted_at_redacted(codex_bin, tmp_path):
    scenario = SCENARIO["otlp-http-json-log-user-prompt"]
    bridge = otlp_bridge(grpc="off", http="127.0.0.1:0")
    policy = CapturePolicy(ceiling="redacted")
    ctx, recv = bridge_context(bridge.name, "codex", epoch=0, policy=policy)
    mock = MockResponsesServer()
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(bridge.run, ctx)
        run = await cx.run_scenario(codex_bin, tmp_path / "home", scenario,
                                    otlp_endpoint=f"http://127.0.0.1:{bridge.http_address[1]}",
                                    mock=mock)
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    events = drain(recv)
    (prompt,) = [e for e in events if e["type"] == "x.codex.otel.user_prompt"]
    from bridges.core.capture import redact_text
    assert prompt["data"]["prompt"] == redact_text(cx.PROMPT, policy)
    assert prompt["capture"] == "redacted"
    validate_event(prompt)
