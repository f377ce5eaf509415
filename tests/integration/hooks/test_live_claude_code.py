"""The real Claude Code 2.1.197, offline against the mock Messages API, hooked
to the daemon by what ``aep-bridges hooks install claude-code --project``
writes (``type: "http"`` hooks to ``/hooks/claude-code`` with the bearer
from ``$AEP_TOKEN``, the command shim for ``SessionStart``/``Setup``),
answered with the SDK ``ControlClient`` (issue 27 "Done when"):

- print mode (``claude -p``): the held ``PreToolUse`` gate
  (``AEP_CLAUDE_CODE_GATE_TOOLS=Bash``) allowed from AEP runs a tool print
  mode would refuse; a free-text deny reaches the model as the tool's error;
- the TUI under tmux: its ``PermissionRequest`` allowed from AEP runs the
  tool; the person answering at the terminal first resolves the card
  ``via: oob`` and the late command is nacked; an ``AskUserQuestion`` form
  answered from AEP fills the question;
- a held ``PreToolUse`` nobody answers ends in ``attention.timeout`` and the
  vendor's own flow; with the gate off no decision is ever given; ``EnterWorktree``
  works (the installer leaves ``WorktreeCreate`` unhooked);
- the daemon down for a whole turn (every hook through the command shim):
  the turn finishes, the spooled moments arrive after the daemon starts
  with the times they happened, never held.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from bridges.core.envelope import ms_text
from tests.support import claude_code as cc
from tests.support import mock_anthropic
from tests.support.daemon import DaemonProcess, command
from tests.support.hookinstall import install
from tests.support.schema import validated

pytestmark = pytest.mark.vendor

TOKEN = "live-hooks-token"
MARKER = "aep-tool-ran.txt"
TOUCH = mock_anthropic.Tool("Bash", {"command": f"touch {MARKER} && echo ran", "description": "mark"})


def install_hooks(home: Path, proj: Path, d: DaemonProcess) -> None:
    """The installer's output in ``proj`` (the daemon's URL and hold)."""
    cc.prepare_home(home, proj)
    install("claude-code", home, d, "--project", str(proj))


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    return cc.claude_binary()


def hook_daemon(tmp_path, **env: str) -> DaemonProcess:
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1", "AEP_BRIDGE_OTLP_IN": "0",
                                           "AEP_CLAUDE_CODE_CONTROL": "1",
                                           "AEP_CLAUDE_CODE_HOLD_S": "60", **env}, token=TOKEN)
    return d.start()


@pytest.fixture
def daemon(tmp_path):
    d = hook_daemon(tmp_path, AEP_CLAUDE_CODE_GATE_TOOLS="Bash")
    stream = d.subscribe()
    yield d, stream
    stream.close()
    d.stop()


async def turn(claude_bin, tmp_path, d, stream, answer: dict[str, Any], script: list):
    mock = mock_anthropic.MockAnthropicServer()
    mock.script = list(script)
    home, proj = tmp_path / "home", tmp_path / "proj"
    install_hooks(home, proj, d)
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


# -- the TUI ------------------------------------------------------------------------
DIALOG = "Do you want to proceed?"
QUESTION = "Which environment should I deploy to?"
ASK = mock_anthropic.Tool("AskUserQuestion", {"questions": [{
    "question": QUESTION, "header": "Env", "multiSelect": False,
    "options": [{"label": "Staging", "description": "the staging cluster"},
                {"label": "Production", "description": "the live cluster"}]}]})


@pytest.fixture(scope="module")
def tmux() -> str:
    from tests.support.system import require
    return require("tmux")


@pytest.fixture
def tui_daemon(tmp_path):
    d = hook_daemon(tmp_path)
    stream = d.subscribe()
    yield d, stream
    stream.close()
    d.stop()


class Tui:
    """One TUI session hooked to the daemon: the mock, the tmux pane."""

    def __init__(self, tmp: Path, d: DaemonProcess, script: list) -> None:
        self.mock = mock_anthropic.MockAnthropicServer()
        self.mock.script = list(script)
        self.home, self.proj = tmp / "home", tmp / "proj"
        install_hooks(self.home, self.proj, d)

    async def start(self, nursery, tmux: str, claude_bin: Path):
        await nursery.start(self.mock.serve)
        tui = cc.Tui.start(tmux, claude_bin, self.home, self.proj, base_url=self.mock.base_url,
                           proxy_url=self.mock.base_url, env_extra={"AEP_TOKEN": TOKEN})
        await tui.wait_for("? for shortcuts", timeout=90)
        tui.type_line("run the command")
        return tui


def first(stream, type_: str, **match: Any):
    return lambda s: next((e for e in s.events if e["type"] == type_
                           and all(e.get(k) == v for k, v in match.items())), None)


async def test_tui_permission_request_allowed_from_aep(claude_bin, tmux, tmp_path, tui_daemon):
    d, stream = tui_daemon
    s = Tui(tmp_path, d, [TOUCH, mock_anthropic.Text("Finished.")])
    async with trio.open_nursery() as n:
        with await s.start(n, tmux, claude_bin) as tui:
            ask = await stream.wait_for(first(stream, "attention.requested"), timeout=90)
            assert ask["data"]["kind"] == "permission"
            status, _ = await command(d, "control.attention.respond", ask["session"],
                                      subject=ask["id"], data={"answer": {"option": "allow"}})
            assert status == "accepted"
            await tui.wait_for("Finished.", timeout=60)
        n.cancel_scope.cancel()
    assert (s.proj / MARKER).exists()
    ans = await stream.wait_for(first(stream, "attention.answered", session=ask["session"]))
    assert ans["data"] == {"answer": {"option": "allow"}, "via": "control"}
    validated(stream.of(ask["session"]))


async def test_tui_answered_at_the_terminal_first_resolves_oob(claude_bin, tmux, tmp_path,
                                                               tui_daemon):
    d, stream = tui_daemon
    s = Tui(tmp_path, d, [TOUCH, mock_anthropic.Text("Finished.")])
    async with trio.open_nursery() as n:
        with await s.start(n, tmux, claude_bin) as tui:
            ask = await stream.wait_for(first(stream, "attention.requested"), timeout=90)
            await tui.wait_for(DIALOG)
            tui.send("Enter")  # "1. Yes", at the terminal, while the hook is held
            await tui.wait_for("Finished.", timeout=60)
        n.cancel_scope.cancel()
    assert (s.proj / MARKER).exists()
    ans = await stream.wait_for(first(stream, "attention.answered", session=ask["session"]))
    assert ans["data"] == {"answer": {"option": "allow"}, "via": "oob"}
    assert ans["cause"] == ask["id"]
    late, _ = await command(d, "control.attention.respond", ask["session"], subject=ask["id"],
                            data={"answer": {"option": "deny"}})
    assert late == "refused"
    validated(stream.of(ask["session"]))


async def test_tui_ask_user_question_answered_from_aep(claude_bin, tmux, tmp_path, tui_daemon):
    d, stream = tui_daemon
    s = Tui(tmp_path, d, [ASK, mock_anthropic.Text("Finished.")])
    async with trio.open_nursery() as n:
        with await s.start(n, tmux, claude_bin) as tui:
            ask = await stream.wait_for(first(stream, "attention.requested"), timeout=90)
            assert ask["data"]["kind"] == "form"
            assert [c["id"] for c in ask["data"]["fields"][0]["choices"]] == ["1", "2"]
            status, _ = await command(d, "control.attention.respond", ask["session"],
                                      subject=ask["id"], data={"answer": {"values": {"1": "2"}}})
            assert status == "accepted"
            await tui.wait_for("Finished.", timeout=60)
        n.cancel_scope.cancel()
    (result,) = s.mock.tool_results()
    assert not result.get("is_error") and "Production" in result["text"], result
    validated(stream.of(ask["session"]))


async def test_steering_from_aep_reaches_the_models_next_request(claude_bin, tmp_path):
    """``x.claude-code.control.instruct`` sent while the gate holds the tool
    call is delivered on the next eligible reply (``PostToolUse``, not the
    held ``PreToolUse``: a decision never carries steering) and the model's
    next request carries the text."""
    d = hook_daemon(tmp_path, AEP_CLAUDE_CODE_GATE_TOOLS="Bash", AEP_INSTRUCT="1")
    stream = d.subscribe()
    note = "AEP-STEER-77: prefer the staging database"
    try:
        mock = mock_anthropic.MockAnthropicServer()
        mock.script = [TOUCH, mock_anthropic.Text("ok")]
        home, proj = tmp_path / "home", tmp_path / "proj"
        install_hooks(home, proj, d)
        box: dict[str, Any] = {}
        async with trio.open_nursery() as n:
            await n.start(mock.serve)

            async def run() -> None:
                box["run"] = await cc.run_print(claude_bin, home, proj, "run the command",
                                                base_url=mock.base_url, proxy_url=mock.base_url,
                                                env_extra={"AEP_TOKEN": TOKEN})
            n.start_soon(run)
            ask = await stream.wait_for(lambda s: next((e for e in s.events
                                                        if e["type"] == "attention.requested"),
                                                       None), timeout=90)
            s = ask["session"]
            status, _ = await command(d, "x.claude-code.control.instruct", s, capture="redacted",
                                      data={"text": note})
            assert status == "accepted"
            status, _ = await command(d, "control.attention.respond", s, subject=ask["id"],
                                      data={"answer": {"option": "allow"}})
            assert status == "accepted"
            await stream.wait_for(lambda c: "run" in box, timeout=120)
            n.cancel_scope.cancel()
        assert box["run"].returncode == 0, box["run"].describe()
        reqs = mock.agent_requests()
        assert [i for i, r in enumerate(reqs) if note in mock.texts_sent(r)] == [1]
        delivered = await stream.wait_for(lambda c: c.of(s, "x.claude-code.instruction.delivered"))
        assert delivered[0]["data"]["hook"] == "PostToolUse"
        validated(stream.of(s))
    finally:
        stream.close()
        d.stop()


async def test_enter_worktree_works_with_the_installed_hooks(claude_bin, tmp_path, daemon):
    """The installer leaves ``WorktreeCreate``/``WorktreeRemove`` unhooked: a
    ``WorktreeCreate`` hook replaces Claude Code's own worktree creation, and
    the daemon's ``{}`` would fail every ``EnterWorktree``
    (``tests/integration/hooks_live/test_claude_code_print.py`` shows it)."""
    from tests.support.claude_code_captures import GIT_ENV, _git_init
    d, stream = daemon
    home, proj = tmp_path / "home", tmp_path / "proj"
    install_hooks(home, proj, d)
    _git_init(proj)
    mock = mock_anthropic.MockAnthropicServer()
    mock.script = [mock_anthropic.Tool("EnterWorktree", {"name": "w1"}),
                   mock_anthropic.Text("ok")]
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        run = await cc.run_print(claude_bin, home, proj, "go", base_url=mock.base_url,
                                 proxy_url=mock.base_url,
                                 env_extra={**GIT_ENV, "AEP_TOKEN": TOKEN},
                                 args=("--allowedTools", "EnterWorktree"))
        n.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    (result,) = mock.tool_results()
    assert not result.get("is_error"), result
    s = await stream.wait_for(lambda c: next((e["session"] for e in c.events
                                              if e["type"] == "tool.completed"), None),
                              timeout=60, what="EnterWorktree's tool.completed")
    assert s


async def plain_turn(claude_bin, tmp_path, d: DaemonProcess):
    """One ``claude -p`` turn running ``TOUCH`` with the installed hooks,
    nobody answering: the run, the project."""
    mock = mock_anthropic.MockAnthropicServer()
    mock.script = [TOUCH, mock_anthropic.Text("Done.")]
    home, proj = tmp_path / "home", tmp_path / "proj"
    install_hooks(home, proj, d)
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        run = await cc.run_print(claude_bin, home, proj, "run the command",
                                 base_url=mock.base_url, proxy_url=mock.base_url,
                                 env_extra={"AEP_TOKEN": TOKEN})
        n.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    return run, proj


async def test_a_held_pretooluse_nobody_answers_times_out_to_the_vendors_flow(claude_bin,
                                                                            tmp_path):
    """The hold (3 s here; the installer wrote the vendor's timeout as 13 s)
    ends in ``attention.timeout`` and no decision: print mode's own flow
    refuses the unapproved tool."""
    d = hook_daemon(tmp_path, AEP_CLAUDE_CODE_GATE_TOOLS="Bash", AEP_CLAUDE_CODE_HOLD_S="3")
    stream = d.subscribe()
    try:
        run, proj = await plain_turn(claude_bin, tmp_path, d)
        assert not (proj / MARKER).exists()
        ask = await stream.wait_for(first(stream, "attention.requested"), timeout=30)
        await stream.wait_for(first(stream, "attention.timeout", session=ask["session"]),
                              timeout=30)
        assert not [e for e in stream.of(ask["session"]) if e["type"] == "attention.answered"]
        validated(stream.of(ask["session"]))
    finally:
        stream.close()
        d.stop()


async def test_the_gate_off_gives_zero_decisions(claude_bin, tmp_path):
    """Control off (the default): nothing is held, no decision is given
    (every reply ``{}``): print mode refuses the tool by its own rule."""
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1",
                                           "AEP_BRIDGE_OTLP_IN": "0"}, token=TOKEN)
    d.start()
    stream = d.subscribe()
    try:
        run, proj = await plain_turn(claude_bin, tmp_path, d)
        assert not (proj / MARKER).exists()
        s = await stream.wait_for(lambda c: next((e["session"] for e in c.events
                                                  if e["type"] == "run.finished"), None),
                                  timeout=60, what="run.finished")
        types = [e["type"] for e in validated(stream.of(s))]
        assert "tool.requested" in types
        assert not {"attention.requested", "attention.answered", "control.accepted"} & set(types)
        assert d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]["hooks_held"] == 0
    finally:
        stream.close()
        d.stop()


async def test_daemon_down_the_turn_finishes_and_the_spool_arrives_with_its_times(claude_bin,
                                                                                 tmp_path):
    """The daemon is down for a whole ``claude -p`` turn run on what
    ``hooks install --transport command`` writes (every event through the
    shim: Claude Code's own HTTP hooks have no spool): the turn finishes, no
    hook waits for the missing daemon, every moment is spooled, and the
    daemon started afterwards publishes them with the times they happened
    (each line's ``spooled_at_ms``; the run's and the tool's durations from
    those, not from the ingestion), never held (the gate is open on Read)."""
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1", "AEP_BRIDGE_OTLP_IN": "0",
                                           "AEP_CLAUDE_CODE_CONTROL": "1",
                                           "AEP_CLAUDE_CODE_GATE_TOOLS": "*"}, token=TOKEN)
    home, proj = tmp_path / "home", tmp_path / "proj"
    cc.prepare_home(home, proj)
    install("claude-code", home, d, "--project", str(proj), "--transport", "command")
    (proj / "notes.txt").write_text("spooled-notes\n")
    mock = mock_anthropic.MockAnthropicServer()
    mock.script = [mock_anthropic.Tool("Read", {"file_path": str(proj / "notes.txt")}),
                   mock_anthropic.Text("Read it.")]
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        run = await cc.run_print(claude_bin, home, proj, "read the notes",
                                 base_url=mock.base_url, proxy_url=mock.base_url,
                                 env_extra={"AEP_TOKEN": TOKEN})
        n.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    assert [r["text"] for r in mock.tool_results() if "spooled-notes" in r["text"]], \
        mock.tool_results()
    spool = d.state / "hooks-spool" / "claude-code.jsonl"
    lines = [json.loads(x) for x in spool.read_text().splitlines()]
    at = {}
    for line in lines:  # the first of each event: the turn has one prompt, one tool
        at.setdefault(line["payload"]["hook_event_name"], line["spooled_at_ms"])
    assert {"SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"} <= set(at)
    # a coarse bound, not a measurement: a hook that waited for the vendor's
    # timeout (70 s held) instead of the shim's 1 s budget would blow it
    assert run.wall_s < 30 + len(lines) * 1.0, (run.wall_s, len(lines))
    before_start = time.time_ns() // 1_000_000
    d.start()
    stream = d.subscribe()
    try:
        s = lines[0]["payload"]["session_id"]
        await stream.wait_for(lambda c: c.of(s, "run.finished"), timeout=60,
                              what="the spooled run.finished")
        evs = validated(stream.of(s))
        one = {e["type"]: e for e in reversed(evs)}  # the first of each type
        for t in ("session.started", "run.started", "tool.requested", "tool.completed",
                  "run.finished"):
            assert t in one, [e["type"] for e in evs]
        assert "attention.requested" not in one  # a spooled PreToolUse is never held
        for t, ev in (("session.started", "SessionStart"), ("run.started", "UserPromptSubmit"),
                      ("tool.requested", "PreToolUse"), ("tool.completed", "PostToolUse"),
                      ("run.finished", "Stop")):
            assert one[t]["time"] == ms_text(at[ev]), (t, one[t]["time"], at[ev])
        assert all(e["time"] < ms_text(before_start) for e in evs)  # every one from the spool
        assert one["run.finished"]["data"]["duration_ms"] == at["Stop"] - at["UserPromptSubmit"]
        assert one["tool.completed"]["data"].get("duration_ms", 0) >= 0
        counters = d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]
        assert counters["hooks_held"] == 0 and counters["hooks_spooled_ingested"] == len(lines)
        assert not spool.exists()
    finally:
        stream.close()
        d.stop()
