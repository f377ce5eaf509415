"""The real Codex 0.171.0 (``codex exec``, offline against the Responses mock)
hooked by what ``aep-bridges hooks install codex`` writes (the command shim,
``bridges/hooks_common/shim.py``, trusted) to the daemon's ``/hooks/codex``,
its ``PermissionRequest`` (``codex exec --approve-for-me`` + an escalation;
the TUI under tmux, on-request + workspace-write) answered from AEP with
the SDK ``ControlClient`` (issue 27 "Done when"): allowed,
the command runs; a free-text deny, the model reads the text as the tool's
output. The daemon down during a run: the turn finishes, the shim spools
each moment into the daemon's spool directory (the installer wrote it),
and the restarted daemon publishes them."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from bridges.core.envelope import ms_text
from tests.support import codex_hooks as ch
from tests.support.daemon import DaemonProcess, command
from tests.support.hookinstall import install
from tests.support.schema import validated

pytestmark = pytest.mark.vendor

TOKEN = "live-codex-hooks-token"


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    from tests.support import codex as cx
    return cx.codex_binary()


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CODEX_HOOKS": "1", "AEP_BRIDGE_OTLP_IN": "0",
                                           "AEP_CODEX_HOOKS_CONTROL": "1",
                                           "AEP_CODEX_HOOKS_HOLD_S": "60"}, token=TOKEN)
    d.start()
    stream = d.subscribe()
    yield d, stream
    stream.close()
    d.stop()


def installed(home: Path, d: DaemonProcess, base: str) -> str:
    """``base`` as the user's config.toml, then the installer's entries
    (trusted) merged in for the daemon ``d``: the file's text."""
    path = home / ".codex" / "config.toml"
    path.write_text(base)
    install("codex", home, d)
    return path.read_text()


async def exec_answered(codex_bin: Path, root: Path, d: DaemonProcess, stream,
                        answer: dict[str, Any]):
    from tests.support import codex as cx
    from tests.support.mock_responses import MockResponsesServer
    home = root / "home"
    (home / ".codex").mkdir(parents=True)
    outside = root / "outside.txt"
    mock = MockResponsesServer(command=f"touch {outside} && echo made", extra_args=dict(ch.ESCALATE))
    box: dict[str, Any] = {}
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        cfg = installed(home, d, ch.base_config(mock.base_url, approval_policy="on-request",
                                                sandbox_mode="workspace-write"))

        async def run() -> None:
            box["run"] = await cx.run_codex_exec(codex_bin, home, cx.PROMPT, cfg,
                                                 proxy_url=mock.base_url.rsplit("/v1", 1)[0],
                                                 timeout=120, args=("--approve-for-me",),
                                                 env_extra={"AEP_TOKEN": TOKEN})
        n.start_soon(run)
        ask = await stream.wait_for(lambda s: next((e for e in s.events
                                                    if e["type"] == "attention.requested"), None),
                                    timeout=90, what="Codex's PermissionRequest")
        status, _ = await command(d, "control.attention.respond", ask["session"],
                                  subject=ask["id"], capture="redacted", data={"answer": answer})
        assert status == "accepted"
        await stream.wait_for(lambda s: "run" in box, timeout=120, what="codex exec to finish")
        n.cancel_scope.cancel()
    assert box["run"].returncode == 0, box["run"].describe()
    return ask, outside, mock


async def test_codex_permission_request_allowed_from_aep(codex_bin, tmp_path, daemon):
    d, stream = daemon
    ask, outside, mock = await exec_answered(codex_bin, tmp_path, d, stream, {"option": "allow"})
    assert outside.exists()
    assert ask["agent"] == "codex" and ask["data"]["kind"] == "permission"
    s = ask["session"]
    await stream.wait_for(lambda c: c.of(s, "run.finished"), what="run.finished")
    evs = validated(stream.of(s))
    types = [e["type"] for e in evs]
    for t in ("session.started", "run.started", "tool.requested", "attention.answered",
              "tool.completed", "run.finished"):
        assert t in types, types
    assert {e["run"] for e in evs if e["type"].startswith(("tool.", "run."))} == {ask["run"]}


async def test_codex_permission_request_denied_with_text_from_aep(codex_bin, tmp_path, daemon):
    d, stream = daemon
    reason = "AEP-CX-DENY-5: ask the on-call first"
    ask, outside, mock = await exec_answered(codex_bin, tmp_path, d, stream, {"text": reason})
    assert not outside.exists()
    (out,) = mock.tool_outputs()
    assert reason in out["output"], out
    validated(stream.of(ask["session"]))


async def test_daemon_down_the_turn_finishes_and_the_spool_arrives_after_restart(codex_bin,
                                                                                tmp_path):
    """The daemon is down for a whole ``codex exec`` turn: it finishes, no
    hook waits for the missing daemon (the shim gives up on a refused
    connection at once, within its 1 s budget otherwise), every moment is
    spooled into the directory the installer wrote, and the daemon started
    afterwards publishes them to an AEP consumer (never held)."""
    from tests.support import codex as cx
    from tests.support.mock_responses import MockResponsesServer
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CODEX_HOOKS": "1",
                                           "AEP_BRIDGE_OTLP_IN": "0",
                                           "AEP_CODEX_HOOKS_CONTROL": "1",
                                           "AEP_CODEX_HOOKS_GATE_TOOLS": "*"}, token=TOKEN)
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    mock = MockResponsesServer()
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        cfg = installed(home, d, ch.base_config(mock.base_url))
        t0 = time.monotonic()
        run = await cx.run_codex_exec(codex_bin, home, cx.PROMPT, cfg, timeout=120,
                                      proxy_url=mock.base_url.rsplit("/v1", 1)[0],
                                      env_extra={"AEP_TOKEN": TOKEN})
        wall = time.monotonic() - t0
        n.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    assert run.commands(), run.describe()
    spool = d.state / "hooks-spool" / "codex.jsonl"
    lines = [json.loads(x) for x in spool.read_text().splitlines()]
    events = [line["payload"]["hook_event_name"] for line in lines]
    assert {"SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"} <= set(events)
    # a coarse bound, not a measurement: a shim that waited for the vendor's
    # timeout (10 s, 130 s held) instead of its 1 s budget would blow it
    assert wall < 30 + len(lines) * 1.0, (wall, len(lines))
    d.start()
    stream = d.subscribe()
    try:
        s = lines[0]["payload"]["session_id"]
        await stream.wait_for(lambda c: c.of(s, "run.finished"), timeout=60,
                              what="the spooled run.finished")
        evs = validated(stream.of(s))
        types = [e["type"] for e in evs]
        for t in ("session.started", "run.started", "tool.requested", "tool.completed",
                  "run.finished"):
            assert t in types, types
        assert "attention.requested" not in types  # a spooled PreToolUse is never held
        assert not spool.exists()
        # each event carries its moment's time (the line's spooled_at_ms), not the ingestion's
        at = {}
        for line in lines:
            at.setdefault(line["payload"]["hook_event_name"], line["spooled_at_ms"])
        one = {e["type"]: e for e in reversed(evs)}
        assert one["run.started"]["time"] == ms_text(at["UserPromptSubmit"])
        assert one["run.finished"]["time"] == ms_text(at["Stop"])
        assert one["run.finished"]["data"]["duration_ms"] == at["Stop"] - at["UserPromptSubmit"]
    finally:
        stream.close()
        d.stop()


@pytest.mark.parametrize("answer", [{"option": "allow"}, {"text": "AEP-CXT-9: not today"}],
                         ids=["allow", "deny-text"])
async def test_codex_tui_permission_request_answered_from_aep(codex_bin, tmp_path, daemon,
                                                              answer):
    """The Codex TUI (on-request + workspace-write, under tmux) with the
    installed hooks: its ``PermissionRequest`` (fired before its own dialog)
    answered from AEP through the daemon; allowed, the command runs with no
    dialog; a free-text deny reaches the model as the tool's output."""
    from tests.support import codex as cx
    from tests.support.claude_code import Tui
    from tests.support.mock_responses import MockResponsesServer
    from tests.support.system import require
    d, stream = daemon
    home = tmp_path / "home"
    work = home / "work"
    for p in (home / ".codex", home / "tmp", work):
        p.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside.txt"
    mock = MockResponsesServer(command=f"touch {outside} && echo made", extra_args=ch.ESCALATE)
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        installed(home, d, ch.tui_config(mock.base_url, work))
        env = {**cx.codex_env(codex_bin, home, mock.base_url.rsplit("/v1", 1)[0]),
               "AEP_TOKEN": TOKEN}
        with Tui.launch(require("tmux"), home / "tmux.sock", work, env, (str(codex_bin),),
                        session="cx") as tui:
            await tui.wait_for("Ask Codex to do anything", timeout=90)
            tui.type_line("run it")
            ask = await stream.wait_for(lambda s: next((e for e in s.events
                                                        if e["type"] == "attention.requested"),
                                                       None),
                                        timeout=90, what="the TUI's PermissionRequest")
            assert ask["data"]["kind"] == "permission"
            status, _ = await command(d, "control.attention.respond", ask["session"],
                                      subject=ask["id"], capture="redacted",
                                      data={"answer": answer})
            assert status == "accepted"
            with trio.fail_after(60):
                while not mock.tool_outputs():
                    await trio.sleep(0.2)
            tui.send("C-c")
            await trio.sleep(0.5)
            tui.send("C-c")
        n.cancel_scope.cancel()
    (out,) = mock.tool_outputs()
    if "option" in answer:
        assert outside.exists() and "made" in out["output"], out
    else:
        assert not outside.exists() and answer["text"] in out["output"], out
    validated(stream.of(ask["session"]))
