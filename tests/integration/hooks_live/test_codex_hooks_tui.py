"""The real Codex 0.171.0 TUI under tmux (on-request + workspace-write), offline,
with trusted command hooks: its ``PermissionRequest`` for an escalation request.

- the hook's ``behavior: allow`` runs the command with no dialog; ``deny`` +
  ``message`` refuses it and the message reaches the model as the tool output;
- ``{}`` (empty stdout) is no decision: the "Would you like to run" dialog appears
  and the person's answer decides;
- the hook runs BEFORE the dialog: while it is held, no dialog is on screen and
  nothing runs (so in Codex's TUI the hook and the person never race);
- the TUI's exit fires ``SessionEnd``.

One known outbound attempt is allowed: the TUI fetches
``raw.githubusercontent.com/openai/codex/main/announcement_tip.toml`` at start with
no switch to stop it; the proxy tripwire refuses it.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import trio

from tests.support import codex as cx
from tests.support import codex_hooks as ch
from tests.support.hook_capture import command_capture, read_command_captures
from tests.support.mock_responses import MockResponsesServer
from tests.support.system import require

pytestmark = pytest.mark.vendor

DIALOG = "Would you like to run the following command?"
ANNOUNCEMENT = "raw.githubusercontent.com:443"


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    return cx.codex_binary()


@pytest.fixture(scope="module")
def tmux() -> str:
    return require("tmux")


class Run:
    def __init__(self, tmp: Path, permission_command: str | None = None,
                 permission_stdout: str = "") -> None:
        self.root, self.cmd_dir = tmp, tmp / "cmd"
        self.cmd_dir.mkdir()
        self.outside = tmp / "outside.txt"
        self.commands = {ev: command_capture(self.cmd_dir, ev) for ev in ch.HOOK_EVENTS}
        self.commands["PermissionRequest"] = permission_command or command_capture(
            self.cmd_dir, "PermissionRequest", permission_stdout)
        self.mock = MockResponsesServer(command=f"touch {self.outside} && echo made",
                                        extra_args=ch.ESCALATE)

    def events(self) -> list[str]:
        return [h.event for h in read_command_captures(self.cmd_dir)]

    async def wait_event(self, event: str, timeout: float = 60) -> None:
        with trio.fail_after(timeout):
            while event not in self.events():
                await trio.sleep(0.1)

    def check_offline(self) -> None:
        assert not self.mock.problems
        assert [r.path for r in self.mock.egress()] in ([], [ANNOUNCEMENT])


async def _drive(run: Run, tmux: str, codex_bin: Path, body) -> str:
    async with trio.open_nursery() as nursery:
        await nursery.start(run.mock.serve)
        with ch.start_tui(tmux, codex_bin, run.root, run.mock, run.commands) as tui:
            await tui.wait_for("Ask Codex to do anything", timeout=90)
            tui.type_line("run it")
            await body(tui)
            tui.send("C-c")
            await trio.sleep(0.5)
            tui.send("C-c")
            with trio.move_on_after(20):
                await run.wait_event("SessionEnd")
            screen = tui.screen()
        nursery.cancel_scope.cancel()
    run.check_offline()
    return screen


@pytest.mark.parametrize("behavior", ["allow", "deny"])
async def test_tui_permission_request_answered_by_the_hook(codex_bin, tmux, tmp_path, behavior):
    message = "AEP-CXT-7: not from this terminal"
    run = Run(tmp_path, permission_stdout=ch.permission_decision(behavior, message))

    async def body(tui):
        await run.wait_event("Stop")
        assert DIALOG not in tui.screen()

    await _drive(run, tmux, codex_bin, body)
    assert "PermissionRequest" in run.events() and "SessionEnd" in run.events()
    (out,) = run.mock.tool_outputs()
    if behavior == "allow":
        assert run.outside.exists() and "made" in out["output"]
    else:
        assert not run.outside.exists() and message in out["output"]


async def test_tui_empty_answer_leaves_the_dialog_to_the_person(codex_bin, tmux, tmp_path):
    run = Run(tmp_path)

    async def body(tui):
        await tui.wait_for(DIALOG, timeout=60)
        assert not run.outside.exists()
        tui.send("Enter")  # "1. Yes, proceed"
        await run.wait_event("Stop")

    await _drive(run, tmux, codex_bin, body)
    assert run.outside.exists()


async def test_tui_hook_runs_before_the_dialog(codex_bin, tmux, tmp_path):
    release = tmp_path / "release.json"
    capture = command_capture(tmp_path / "cmd", "PermissionRequest")
    held = (f"{capture}; while [ ! -f {shlex.quote(str(release))} ]; do sleep 0.1; done; "
            f"cat {shlex.quote(str(release))}")
    run = Run(tmp_path, permission_command=held)

    async def body(tui):
        await run.wait_event("PermissionRequest")
        await trio.sleep(1.5)  # long against a dialog draw; none may appear
        screen = tui.screen()
        assert DIALOG not in screen and not run.outside.exists(), screen
        partial = release.with_suffix(".part")  # renamed: the hook never reads half of it
        partial.write_text(ch.permission_decision("allow"))
        partial.rename(release)
        await run.wait_event("Stop")

    await _drive(run, tmux, codex_bin, body)
    assert run.outside.exists()
