"""The real Claude Code 2.1.197 in print mode (``claude -p``), offline against the
mock Messages API, hooked to the daemon (``type: "http"`` hooks to
``/hooks/claude-code`` with the bearer from ``$AEP_TOKEN``): the held
``PreToolUse`` gate (``AEP_CLAUDE_CODE_GATE_TOOLS=Bash``) is allowed from AEP
with the SDK ``ControlClient`` and the tool runs, a tool print mode would
otherwise refuse; a free-text deny reaches the model as the tool's error.

The harness (``tests.support.claude_code``, ``tests.support.mock_anthropic``)
is the live-harness branch's; until it is merged this module skips."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.daemon import DaemonProcess, command
from tests.support.schema import validated

cc = pytest.importorskip("tests.support.claude_code")
mock_anthropic = pytest.importorskip("tests.support.mock_anthropic")

pytestmark = pytest.mark.vendor

TOKEN = "live-hooks-token"
MARKER = "aep-tool-ran.txt"
TOUCH = mock_anthropic.Tool("Bash", {"command": f"touch {MARKER} && echo ran", "description": "mark"})
EVENTS = ("UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure", "Stop",
          "SessionEnd")


def settings(daemon_url: str) -> dict[str, Any]:
    """What ``aep-bridges hooks install claude-code --transport http`` writes
    (hold 60 s -> the vendor's timeout 70 s)."""
    url = f"{daemon_url}/hooks/claude-code"
    hook = {"type": "http", "url": url, "timeout": 70,
            "headers": {"Authorization": "Bearer $AEP_TOKEN"}, "allowedEnvVars": ["AEP_TOKEN"]}
    hooks = {}
    for ev in EVENTS:
        group: dict[str, Any] = {"hooks": [dict(hook)]}
        if ev in ("PreToolUse", "PostToolUse", "PostToolUseFailure"):
            group["matcher"] = ""
        hooks[ev] = [group]
    return {"hooks": hooks, "allowedHttpHookUrls": [f"{daemon_url}/*"]}


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    return cc.claude_binary()


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1", "AEP_BRIDGE_OTLP_IN": "0",
                                           "AEP_CLAUDE_CODE_CONTROL": "1",
                                           "AEP_CLAUDE_CODE_GATE_TOOLS": "Bash",
                                           "AEP_CLAUDE_CODE_HOLD_S": "60"}, token=TOKEN)
    d.start()
    stream = d.subscribe()
    yield d, stream
    stream.close()
    d.stop()


async def turn(claude_bin, tmp_path, d, stream, answer: dict[str, Any], script: list):
    mock = mock_anthropic.MockAnthropicServer()
    mock.script = list(script)
    home, proj = tmp_path / "home", tmp_path / "proj"
    cc.prepare_home(home, proj)
    cc.write_settings(proj, settings(d.url))
    box: dict[str, Any] = {}
    async with trio.open_nursery() as n:
        await n.start(mock.serve)

        async def run() -> None:
            box["run"] = await cc.run_print(claude_bin, home, proj, "run the command",
                                            base_url=mock.base_url, proxy_url=mock.base_url,
                                            env_extra={"AEP_TOKEN": TOKEN})
        n.start_soon(run)
        ask = await stream.wait_for(lambda s: next((e for e in s.events
                                                    if e["type"] == "attention.requested"), None),
                                    timeout=90, what="the gate's attention.requested")
        status, _ = await command(d, "control.attention.respond", ask["session"],
                                  subject=ask["id"], capture="redacted", data={"answer": answer})
        assert status == "accepted"
        await stream.wait_for(lambda s: "run" in box, timeout=120, what="claude -p to finish")
        n.cancel_scope.cancel()
    assert not mock.egress(), [(r.method, r.path) for r in mock.egress()]
    return box["run"], mock, proj, ask


async def test_held_pretooluse_allowed_from_aep_runs_the_tool(claude_bin, tmp_path, daemon):
    d, stream = daemon
    run, mock, proj, ask = await turn(claude_bin, tmp_path, d, stream, {"option": "allow"},
                                      [TOUCH, mock_anthropic.Text("It ran.")])
    assert run.returncode == 0, run.describe()
    assert (proj / MARKER).exists()
    assert [r["text"] for r in mock.tool_results()] == ["ran"]
    s = ask["session"]
    await stream.wait_for(lambda c: c.of(s, "run.finished"), what="run.finished")
    evs = validated(stream.of(s))
    types = [e["type"] for e in evs]
    for t in ("run.started", "tool.requested", "attention.requested", "control.accepted",
              "attention.answered", "attention.resolved", "tool.completed", "run.finished"):
        assert t in types, types


async def test_free_text_deny_from_aep_reaches_the_model(claude_bin, tmp_path, daemon):
    d, stream = daemon
    reason = "AEP-DENY-91: not on a Friday, use the staging box"
    run, mock, proj, ask = await turn(claude_bin, tmp_path, d, stream, {"text": reason},
                                      [TOUCH, mock_anthropic.Text("Understood.")])
    assert run.returncode == 0, run.describe()
    assert not (proj / MARKER).exists()
    (result,) = mock.tool_results()
    assert result.get("is_error") is True and reason in result["text"]
    validated(stream.of(ask["session"]))
