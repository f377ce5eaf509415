"""Acceptance (issue 2, section 6): real Codex -> OTLP -> the daemon -> AEP ``/stream``.

Per parametrization: the daemon (``aep-bridges run``, its own process, state
dir and loopback ports) with the OTLP inbound bridge in companion or primary
mode; the SDK consumer (``aep_sdk.subscribe``, threaded, handed back to trio)
on the embedded relay's ``/stream``; then the pinned real Codex CLI
(``tests/support/codex.py``) runs one headless ``codex exec`` whose mock model
makes one shell tool call, exporting its logs to the daemon with one exporter
kind (gRPC, HTTP protobuf, HTTP JSON).

What is expected comes from what the real Codex sent (the committed capture
of the same scenario, ``tests/fixtures/codex_otel_real/``, whose live shape
``test_codex_capture.py`` keeps honest) and from the design record
``bridge-otlp-inbound-design.md`` / the pins ``codex-otel.json``:

- every event: valid envelope + payload schema (``tests/support/schema.py``),
  ``agent = codex``, ``session`` = the ``conversation.id`` Codex used (the
  ``thread_id`` of ``codex exec --json``), ``source`` ending in
  ``/agent/codex/session/<id>``, per-session ``seq`` strictly increasing,
  one ``epoch``, the record's time (Codex leaves ``time_unix_nano`` at 0:
  never 1970), ``capture`` at most ``metadata``;
- companion: one ``x.codex.otel.<name without codex.>`` per LogRecord Codex
  sent, and no core type at all;
- primary: the same, except ``codex.conversation_starts`` ->
  ``session.started`` (``client.name = codex``, the model) and the shell call's
  ``codex.tool_result`` -> ``tool.completed`` (``subject`` and ``tool.name`` =
  ``exec_command``, integer ``duration_ms``); with a command forbidden by
  Codex's execpolicy -> ``tool.failed``;
- nothing of the conversation's content (the command line, its output, the
  prompt) leaks at the default ``metadata`` ceiling, and the JSONL session
  log holds exactly the events streamed;
- SIGTERM ends the daemon with status 0.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import trio

from tests.support import codex as cx
from tests.support.daemon import DaemonProcess
from tests.support.mock_responses import MockResponsesServer
from tests.support.otlp_capture import Captured, log_records
from tests.support.schema import validate_event

pytestmark = pytest.mark.vendor

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "codex_otel_real"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
SCENARIOS = {s.name: s for s in cx.SCENARIOS}
CORE_PREFIXES = ("agent.", "session.", "run.", "progress.", "tool.", "delegation.",
                 "attention.", "resource.", "error.", "state.", "assessment.", "message.",
                 "control.")


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    return cx.codex_binary()


# --------------------------------------------------------------------------
# what the real Codex sends for a scenario (from the committed capture)
# --------------------------------------------------------------------------

def captured_event_names(scenario: str) -> list[str]:
    names = []
    for e in MANIFEST["scenarios"][scenario]["exports"]:
        cap = Captured(e["transport"], "logs", e["path"], e["content_type"],
                       e["content_encoding"], (FIXTURES / e["file"]).read_bytes())
        for rec in log_records(cap):
            attrs = {a["key"]: a["value"] for a in rec["record"].get("attributes", [])}
            names.append(attrs["event.name"]["stringValue"])
    return names


def companion_type(event_name: str) -> str:
    """The pins' rule: ``x.codex.otel.{snake_of_event_name}``."""
    return "x.codex.otel." + event_name.removeprefix("codex.")


def expected_types(scenario: str, primary: bool) -> Counter:
    out = Counter()
    for n in captured_event_names(scenario):
        if primary and n == "codex.conversation_starts":
            out["session.started"] += 1
        elif primary and n == "codex.tool_result":
            out["tool.failed" if SCENARIOS[scenario].rules else "tool.completed"] += 1
        else:
            out[companion_type(n)] += 1
    return out


# --------------------------------------------------------------------------
# the daemon
# --------------------------------------------------------------------------

def codex_daemon(tmp: Path, *, primary: bool) -> DaemonProcess:
    """``aep-bridges run`` with the OTLP inbound bridge (companion or primary)."""
    # said explicitly both ways: primary is the default now (issue 29)
    env = {"AEP_BRIDGE_OTLP_IN": "1", "AEP_OTLP_PRIMARY": "1" if primary else "0"}
    return DaemonProcess(tmp / "state", env)


def otlp_endpoint(daemon: DaemonProcess, kind: str) -> str:
    listen = "AEP_OTLP_GRPC_LISTEN" if kind == "otlp-grpc" else "AEP_OTLP_HTTP_LISTEN"
    return f"http://{daemon.env[listen]}"


# --------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------

async def run_e2e(codex_bin: Path, tmp_path: Path, scenario: cx.Scenario, primary: bool):
    daemon = codex_daemon(tmp_path, primary=primary)
    mock = MockResponsesServer()
    reader = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(mock.serve)
            await trio.to_thread.run_sync(daemon.start)
            reader = daemon.subscribe()
            run = await cx.run_scenario(codex_bin, tmp_path / "home", scenario,
                                        otlp_endpoint=otlp_endpoint(daemon, scenario.kind),
                                        mock=mock)
            assert run.returncode == 0, run.describe()
            assert run.thread_id, run.describe()
            assert not mock.egress(), [(r.method, r.path) for r in mock.egress()]
            assert not mock.problems, mock.problems
            want = expected_types(scenario.name, primary)
            session = run.thread_id
            try:
                await reader.wait_for(lambda r: len(r.of(session)) >= sum(want.values()))
            except AssertionError:
                got = Counter(e.get("type") for e in reader.events)
                raise AssertionError(
                    f"stream incomplete: want {dict(want)}\ngot {dict(got)}\n"
                    f"errors {reader.errors}\n{daemon.log()[-6000:]}") from None
            await trio.sleep(0.5)  # anything beyond the expected would show up here
            events = list(reader.events)
            status = await trio.to_thread.run_sync(daemon.stop)
            nursery.cancel_scope.cancel()
    finally:
        if reader is not None:
            reader.close()
        daemon.kill()
    return run, events, status, daemon


def check_common(run: cx.CodexRun, events: list[dict], daemon: DaemonProcess) -> list[dict]:
    session = run.thread_id
    mine = [e for e in events if e.get("session") == session]
    strangers = [e for e in events if e.get("session") != session]
    assert not strangers, f"events outside the conversation: {strangers[:3]}"
    for ev in mine:
        validate_event(ev)
        assert ev["agent"] == "codex"
        assert ev["source"].endswith(f"/agent/codex/session/{session}"), ev["source"]
        assert not ev["time"].startswith("1970"), ev  # Codex leaves time_unix_nano at 0
        assert ev.get("capture", "metadata") in ("none", "metadata"), ev
    seqs = [e["seq"] for e in mine]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    assert len({e.get("epoch", 0) for e in mine}) == 1
    # content never leaves at the metadata ceiling: command line, output, prompt
    blob = json.dumps(mine)
    for secret in (cx.PROMPT, "echo hello", "Process exited with code", "aep-nothing-here"):
        assert secret not in blob, f"{secret!r} leaked at the metadata ceiling"
    # the durable log holds exactly what was streamed
    logged = []
    for f in sorted((daemon.state / "logs").rglob("*.jsonl")):
        logged += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    assert sorted(e["id"] for e in logged) == sorted(e["id"] for e in mine)
    return mine


@pytest.mark.parametrize("primary", [False, True], ids=["companion", "primary"])
@pytest.mark.parametrize("kind", cx.EXPORTER_KINDS)
async def test_real_codex_conversation_arrives_on_the_stream(kind, primary, codex_bin,
                                                             tmp_path):
    scenario = SCENARIOS[kind]
    run, events, status, daemon = await run_e2e(codex_bin, tmp_path, scenario, primary)
    mine = check_common(run, events, daemon)
    assert Counter(e["type"] for e in mine) == expected_types(scenario.name, primary)
    core = [e for e in mine if e["type"].startswith(CORE_PREFIXES)]
    if not primary:
        assert core == [], "companion mode never emits core types"
    else:
        (started,) = [e for e in mine if e["type"] == "session.started"]
        assert started["data"]["client"]["name"] == "codex"
        assert started["data"].get("gen_ai.request.model") == "mock-codex-model"
        (done,) = [e for e in mine if e["type"] == "tool.completed"]
        assert done["subject"] == "exec_command"
        assert done["data"]["tool"]["name"] == "exec_command"
        assert isinstance(done["data"]["duration_ms"], int) and done["data"]["duration_ms"] >= 0
        assert started["seq"] < done["seq"]
    assert status == 0, f"daemon exit {status} on SIGTERM\n{daemon.log()[-6000:]}"


async def test_real_codex_forbidden_command_is_tool_failed_in_primary(codex_bin, tmp_path):
    scenario = SCENARIOS["otlp-http-protobuf-forbidden"]
    run, events, status, daemon = await run_e2e(codex_bin, tmp_path, scenario, True)
    mine = check_common(run, events, daemon)
    assert Counter(e["type"] for e in mine) == expected_types(scenario.name, True)
    (failed,) = [e for e in mine if e["type"] == "tool.failed"]
    assert failed["subject"] == "exec_command"
    assert failed["data"]["tool"]["name"] == "exec_command"
    assert failed["data"]["error"]["type"] == "tool_error"  # synthesized (pins)
    assert "tool.completed" not in {e["type"] for e in mine}
    assert status == 0, daemon.log()[-6000:]
