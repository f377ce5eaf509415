"""The real Claude Code 2.1.197 interactive TUI under tmux, offline, hooked: the
``PermissionRequest`` moment the hook bridge answers, checked against what the
terminal shows and what reached the model.

- a tool that needs approval fires ``PermissionRequest`` (no ``tool_use_id``;
  ``tool_name`` + ``tool_input`` as in the ``PreToolUse`` before it) while the
  terminal shows its own dialog;
- the hook's ``decision.behavior: allow`` runs the tool (the dialog goes away);
  ``deny`` + ``message``: the tool does not run and the message reaches the model
  as the tool's error;
- ``{}`` is no decision: the dialog stays and the person's answer decides;
- the person answering at the terminal first while the hook is still held: the
  tool runs at once, and the hook's late answer changes nothing.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support import claude_code as cc
from tests.support.hook_capture import HookCapture
from tests.support.mock_anthropic import MockAnthropicServer, Text, Tool
from tests.support.system import require

pytestmark = pytest.mark.vendor

MARKER = "aep-tool-ran.txt"
TOUCH = Tool("Bash", {"command": f"touch {MARKER} && echo ran", "description": "mark"})
DIALOG = "Do you want to proceed?"


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    return cc.claude_binary()


@pytest.fixture(scope="module")
def tmux() -> str:
    return require("tmux")


def _permission(behavior: str, message: str = "") -> dict:
    decision: dict = {"behavior": behavior}
    if message:
        decision["message"] = message
    return {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}}


class Session:
    """One TUI run: the mock, the capture server, the tmux pane."""

    def __init__(self, tmp: Path, answers: dict) -> None:
        self.mock = MockAnthropicServer(script=[TOUCH, Text("Finished.")])
        self.cap = HookCapture(answers=answers)
        self.home, self.proj = tmp / "home", tmp / "proj"
        self.cmd_dir = tmp / "cmd"
        self.cmd_dir.mkdir(parents=True)
        cc.prepare_home(self.home, self.proj)

    async def start(self, nursery, tmux: str, claude_bin: Path) -> cc.Tui:
        await nursery.start(self.mock.serve)
        await nursery.start(self.cap.serve)
        assert self.cap.url and self.mock.base_url
        cc.write_settings(self.proj, cc.all_hooks_settings(self.cap.url, self.cmd_dir))
        tui = cc.Tui.start(tmux, claude_bin, self.home, self.proj, base_url=self.mock.base_url,
                           proxy_url=self.mock.base_url)
        await tui.wait_for("? for shortcuts", timeout=90)
        tui.type_line("run the command")
        return tui

    async def wait_done(self, tui: cc.Tui) -> str:
        return await tui.wait_for("Finished.", timeout=60)

    def check_offline(self) -> None:
        assert not self.mock.problems, self.mock.problems
        assert not self.mock.egress(), [(r.method, r.path) for r in self.mock.egress()]


async def test_permission_request_allow_from_the_hook_runs_the_tool(claude_bin, tmux, tmp_path):
    s = Session(tmp_path, {"PermissionRequest": _permission("allow")})
    async with trio.open_nursery() as nursery:
        with await s.start(nursery, tmux, claude_bin) as tui:
            await s.wait_done(tui)
            (req,) = await s.cap.wait_for("PermissionRequest")
        nursery.cancel_scope.cancel()
    s.check_offline()
    assert (s.proj / MARKER).exists()
    assert "tool_use_id" not in req
    pre = s.cap.of("PreToolUse")[0]
    assert (req["tool_name"], req["tool_input"]) == (pre["tool_name"], pre["tool_input"])
    assert [r["text"] for r in s.mock.tool_results()] == ["ran"]


async def test_permission_request_deny_message_reaches_the_model(claude_bin, tmux, tmp_path):
    message = "AEP-DENY-PR-41: ask the on-call first"
    s = Session(tmp_path, {"PermissionRequest": _permission("deny", message)})
    async with trio.open_nursery() as nursery:
        with await s.start(nursery, tmux, claude_bin) as tui:
            await s.cap.wait_for("PermissionRequest")
            with trio.fail_after(60):
                while not s.mock.tool_results():
                    await trio.sleep(0.2)
            screen = tui.screen()
        nursery.cancel_scope.cancel()
    s.check_offline()
    assert not (s.proj / MARKER).exists(), screen
    (result,) = s.mock.tool_results()
    assert result.get("is_error") is True and message in result["text"], result


async def test_empty_answer_leaves_the_dialog_to_the_person(claude_bin, tmux, tmp_path):
    s = Session(tmp_path, {"PermissionRequest": {}})
    async with trio.open_nursery() as nursery:
        with await s.start(nursery, tmux, claude_bin) as tui:
            await s.cap.wait_for("PermissionRequest")
            await tui.wait_for(DIALOG)
            await trio.sleep(1.0)  # the hook answered {}: nothing may have run
            assert not (s.proj / MARKER).exists()
            tui.send("Enter")  # "1. Yes" is selected
            await s.wait_done(tui)
        nursery.cancel_scope.cancel()
    s.check_offline()
    assert (s.proj / MARKER).exists()


async def test_terminal_answer_first_wins_over_a_held_hook(claude_bin, tmux, tmp_path):
    release = trio.Event()
    late: dict = {}

    async def held(body):
        await release.wait()
        late["answered"] = True
        return _permission("deny", "too late")

    s = Session(tmp_path, {"PermissionRequest": held})
    async with trio.open_nursery() as nursery:
        with await s.start(nursery, tmux, claude_bin) as tui:
            await s.cap.wait_for("PermissionRequest")
            await tui.wait_for(DIALOG)
            tui.send("Enter")
            await s.wait_done(tui)
            ran_before_release = (s.proj / MARKER).exists()
            release.set()
            await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    s.check_offline()
    assert ran_before_release
    assert [r["text"] for r in s.mock.tool_results()] == ["ran"]
    assert not s.mock.tool_results()[0].get("is_error")


async def test_ask_user_question_answered_by_the_permission_hook(claude_bin, tmux, tmp_path):
    """The form loop (docs/adapters.md "AskUserQuestion"): the held PermissionRequest
    for AskUserQuestion answered ``allow`` + ``updatedInput {questions, answers}`` (the
    answer keyed by question text, the option's label as value) fills the question:
    the model gets that answer as the tool result without a key pressed."""
    from tests.support.claude_code_captures import ASK
    question = ASK.input["questions"][0]["question"]

    def answer(body):
        if body.get("tool_name") != "AskUserQuestion":
            return {}
        return {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {
            "behavior": "allow", "updatedInput": {**body["tool_input"],
                                                  "answers": {question: "Production"}}}}}

    s = Session(tmp_path, {"PermissionRequest": answer})
    s.mock.script = [ASK, Text("Finished.")]
    async with trio.open_nursery() as nursery:
        with await s.start(nursery, tmux, claude_bin) as tui:
            await s.wait_done(tui)
            (post,) = await s.cap.wait_for("PostToolUse")
        nursery.cancel_scope.cancel()
    s.check_offline()
    (result,) = s.mock.tool_results()
    assert not result.get("is_error") and "Production" in result["text"], result
    assert "Staging" not in result["text"].split(question)[-1]
    assert post["tool_response"]["answers"] == {question: "Production"}
