"""Scenarios that make the real Claude Code fire its hook events, and the writer of
``tests/fixtures/claude_code_real/`` (every hook payload it sent, per scenario).

Each :class:`Scenario` runs Claude Code 2.1.197 offline (print mode or the TUI
under tmux) with EVERY hook event hooked (:func:`tests.support.claude_code.all_hooks_settings`:
HTTP hooks to a :class:`~tests.support.hook_capture.HookCapture` answering ``{}``,
command hooks for ``SessionStart``/``Setup``), and returns the deliveries in
arrival order. ``python -m tests.support.claude_code_captures [OUTDIR]``
regenerates the fixtures (``--measure N``: the hooks' cost on a one-tool turn,
:func:`measure`): ``<scenario>/<NN>-<Event>.json`` (the payload as sent,
temp paths replaced by ``/TMP/...``; nothing else scrubbed) and ``manifest.json``
(per scenario: how it was made, and the events in order).
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import trio

from tests.support import claude_code as cc
from tests.support.hook_capture import HookCapture, Hooked, read_command_captures
from tests.support.mock_anthropic import Fail, MockAnthropicServer, Step, Text, Tool

BASH_HI = Tool("Bash", {"command": "echo hi", "description": "Print hi"})
#: the MCP server that elicits (tests/support/mcp_elicit.py), as a project file for
#: ``--mcp-config``; its tool is ``mcp__elicit__deploy``
MCP_CONFIG = (".mcp-elicit.json", json.dumps({"mcpServers": {"elicit": {
    "command": sys.executable,
    "args": ["-S", str(Path(__file__).with_name("mcp_elicit.py"))]}}}))
ELICIT_ARGS = ("--allowedTools", "mcp__elicit__deploy", "--mcp-config", MCP_CONFIG[0])

TuiDriver = Callable[[cc.Tui, HookCapture, MockAnthropicServer], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    """One capture: ``script`` for the mock; ``prompts`` (print mode: one ``claude -p``
    per prompt, later ones ``--resume`` the first session; TUI: ``tui`` drives it);
    ``args`` for every run; ``files`` written into the project first."""

    name: str
    how: str
    script: tuple[Step, ...]
    prompts: tuple[str, ...] = ("run the command",)
    args: tuple[str, ...] = ("--allowedTools", "Bash")
    files: tuple[tuple[str, str], ...] = ()
    tui: TuiDriver | None = None
    #: file names for the FileChanged matcher (Claude Code watches what it names)
    watch: tuple[str, ...] = ()
    #: make the project a git repository with one commit first
    git: bool = False


async def _tui_permission(tui: cc.Tui, cap: HookCapture, mock: MockAnthropicServer) -> None:
    tui.type_line("run the command")
    await cap.wait_for("PermissionRequest")
    await tui.wait_for("Do you want to proceed?")
    # Claude Code's permission_prompt Notification comes a few seconds after the dialog
    with trio.move_on_after(15):
        await cap.wait_for("Notification")
    tui.send("Enter")  # "1. Yes"
    await tui.wait_for("Finished.", timeout=60)
    await _tui_exit(tui, cap)


async def _tui_ask(tui: cc.Tui, cap: HookCapture, mock: MockAnthropicServer) -> None:
    tui.type_line("ask me")
    await cap.wait_for("PreToolUse")
    await tui.wait_for("Staging", timeout=30)
    tui.send("Enter")  # the first option
    await trio.sleep(1.0)
    screen = tui.screen()
    if "Submit" in screen:  # the review step of the question form
        tui.send("Enter")
    await tui.wait_for("Finished.", timeout=60)
    await _tui_exit(tui, cap)


async def _tui_compact(tui: cc.Tui, cap: HookCapture, mock: MockAnthropicServer) -> None:
    tui.type_line("run the command")
    await tui.wait_for("Finished.", timeout=60)
    tui.type_line("/compact")
    with trio.move_on_after(60):
        await cap.wait_for("PostCompact")
    await _tui_exit(tui, cap)


async def _tui_config_file(tui: cc.Tui, cap: HookCapture, mock: MockAnthropicServer) -> None:
    tui.type_line("hello")
    await tui.wait_for("Finished.", timeout=60)
    proj = Path(cap.of("UserPromptSubmit")[0]["cwd"])
    (proj / ".claude" / "settings.local.json").write_text('{"env": {"AEP_X": "1"}}\n')
    (proj / "notes.txt").write_text("two\n")
    with trio.move_on_after(20):
        await cap.wait_for("ConfigChange")
        await cap.wait_for("FileChanged")
    await _tui_exit(tui, cap)


async def _tui_exit(tui: cc.Tui, cap: HookCapture) -> None:
    await trio.sleep(0.5)
    tui.type_line("/exit")
    with trio.move_on_after(20):
        await cap.wait_for("SessionEnd")


ASK = Tool("AskUserQuestion", {"questions": [{
    "question": "Which environment should I deploy to?", "header": "Env",
    "multiSelect": False,
    "options": [{"label": "Staging", "description": "the staging cluster"},
                {"label": "Production", "description": "the live cluster"}]}]})

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("print-bash", "claude -p, Bash allowed, the mock calls Bash `echo hi` then answers",
             (BASH_HI, Text("It printed hi."))),
    Scenario("print-bash-failure", "claude -p, Bash allowed, the command exits 3",
             (Tool("Bash", {"command": "echo oops >&2; exit 3", "description": "Fail"}),
              Text("It failed."))),
    Scenario("print-refused", "claude -p, Bash NOT allowed, `touch refused.txt` (not read-only: "
             "`echo` would be auto-allowed): print mode refuses it at once (no PermissionRequest)",
             (Tool("Bash", {"command": "touch refused.txt", "description": "Touch"}),
              Text("It was refused.")), args=()),
    Scenario("print-write-edit", "claude -p, Write then Edit of notes.txt allowed",
             (Tool("Write", {"file_path": "@PROJ@/notes.txt", "content": "one\n"}),
              Tool("Edit", {"file_path": "@PROJ@/notes.txt", "old_string": "one",
                            "new_string": "two"}),
              Text("Wrote and edited.")), args=("--allowedTools", "Write,Edit")),
    Scenario("print-subagent", "claude -p, the Agent tool starts a general-purpose subagent "
             "that answers at once", (
                 Tool("Agent", {"description": "Look around", "prompt": "Say hello.",
                                "subagent_type": "general-purpose"}),
                 Text("Hello from the subagent."), Text("The subagent said hello.")),
             args=("--allowedTools", "Agent")),
    Scenario("print-tasks", "claude -p, TaskCreate then TaskUpdate to completed", (
        Tool("TaskCreate", {"subject": "Check the logs", "description": "Read them",
                            "activeForm": "Checking the logs"}),
        Tool("TaskUpdate", {"taskId": "1", "status": "completed"}),
        Text("Task done.")), args=("--allowedTools", "TaskCreate,TaskUpdate")),
    Scenario("print-instructions-cwd", "claude -p with a CLAUDE.md in the project; Bash "
             "`cd sub && pwd`", (
                 Tool("Bash", {"command": "cd sub && pwd", "description": "Enter sub"}),
                 Text("Moved.")),
             files=(("CLAUDE.md", "Always be brief.\n"), ("sub/.keep", ""))),
    Scenario("print-slash-command", "claude -p '/hello world' with .claude/commands/hello.md",
             (Text("Hello, world."),), prompts=("/hello world",),
             files=((".claude/commands/hello.md", "Say hello to $ARGUMENTS.\n"),)),
    Scenario("print-stop-failure", "claude -p, the model answers HTTP 400",
             (Fail(400, "invalid_request_error", "mock: scripted failure"),)),
    Scenario("print-auto-denied", "claude -p --permission-mode auto, Bash `rm -rf` of a "
             "missing path outside the project: the auto-mode classifier (its requests get the mock's plain "
             "answer, which it cannot parse) denies it", (
                 Tool("Bash", {"command": "rm -rf /tmp/aep-cc-nothing-here", "description": "rm"}),
                 Text("It was denied.")), args=("--permission-mode", "auto")),
    Scenario("print-elicitation", "claude -p with a stdio MCP server (tests/support/"
             "mcp_elicit.py) whose tool sends elicitation/create; no hook answers, so print "
             "mode cancels it", (Tool("mcp__elicit__deploy", {}), Text("Deployed.")),
             args=ELICIT_ARGS, files=(MCP_CONFIG,)),
    Scenario("print-worktree", "claude -p in a git repository, EnterWorktree then ExitWorktree "
             "allowed: a WorktreeCreate hook REPLACES git's worktree creation, and the capture "
             "server's {} (no worktreePath) makes EnterWorktree fail", (
                 Tool("EnterWorktree", {"name": "w1"}),
                 Tool("ExitWorktree", {"action": "remove", "discard_changes": True}),
                 Text("ok")), args=("--allowedTools", "EnterWorktree,ExitWorktree"), git=True),
    Scenario("print-setup-init", "claude --init -p: the Setup hook (trigger init), command "
             "hook only", (Text("Ready."),), args=("--init",)),
    Scenario("print-compact", "claude -p one Bash turn, then `claude -p --resume <id> /compact`",
             (BASH_HI, Text("It printed hi.")), prompts=("run the command", "/compact")),
    Scenario("tui-permission", "TUI under tmux, Bash `touch` not allowed: PermissionRequest and the "
             "dialog; answered 'Yes' at the terminal; /exit",
             (Tool("Bash", {"command": "touch made.txt && echo made", "description": "Touch"}),
              Text("Finished.")), args=(), tui=_tui_permission),
    Scenario("tui-ask-user-question", "TUI under tmux, AskUserQuestion with two options; the "
             "first chosen at the terminal; /exit", (ASK, Text("Finished.")), args=(),
             tui=_tui_ask),
    Scenario("tui-config-file-change", "TUI under tmux, one text turn, then the test writes "
             ".claude/settings.local.json and notes.txt (named in the FileChanged matcher); "
             "/exit", (Text("Finished."),), args=(), files=(("notes.txt", "one\n"),),
             watch=("notes.txt",), tui=_tui_config_file),
    Scenario("tui-compact", "TUI under tmux, a Bash turn (allowed) then /compact; /exit",
             (BASH_HI, Text("Finished.")), args=("--allowedTools", "Bash"), tui=_tui_compact),
)


@dataclass
class Capture:
    """What one scenario produced: the deliveries in order (HTTP and command hooks
    merged by arrival), the runs' results, the mock, and the temp root."""

    hooked: list[Hooked]
    runs: list[Any] = field(default_factory=list)
    mock: MockAnthropicServer | None = None
    root: Path | None = None


GIT_ENV = {"GIT_AUTHOR_NAME": "aep", "GIT_AUTHOR_EMAIL": "aep@example.invalid",
           "GIT_COMMITTER_NAME": "aep", "GIT_COMMITTER_EMAIL": "aep@example.invalid"}


def _git_init(proj: Path) -> None:
    import os
    import subprocess
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(proj), **GIT_ENV}
    (proj / "README").write_text("aep\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "init"]):
        subprocess.run(["git", "-C", str(proj), *args], check=True, env=env, timeout=30)


def _materialise(step: Step, proj: Path) -> Step:
    if isinstance(step, Tool):
        text = json.dumps(step.input).replace("@PROJ@", str(proj))
        return Tool(step.name, json.loads(text), step.text)
    return step


async def run_scenario(binary: Path, root: Path, sc: Scenario, *, tmux: str = "tmux",
                       events: tuple[str, ...] = cc.HOOK_EVENTS) -> Capture:
    """Run ``sc`` under ``root`` (made); every hook answered ``{}``."""
    home, proj, cmd_dir = root / "home", root / "proj", root / "cmd"
    cmd_dir.mkdir(parents=True)
    cc.prepare_home(home, proj)
    for rel, text in sc.files:
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(text)
    if sc.git:
        _git_init(proj)
    mock = MockAnthropicServer(script=[_materialise(s, proj) for s in sc.script])
    cap = HookCapture()
    runs = []
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(cap.serve)
        assert mock.base_url and cap.url
        settings = cc.all_hooks_settings(cap.url, cmd_dir, events=events)
        if sc.watch and "FileChanged" in settings["hooks"]:
            settings["hooks"]["FileChanged"][0]["matcher"] = "|".join(sc.watch)
        cc.write_settings(proj, settings)
        if sc.tui is not None:
            with cc.Tui.start(tmux, binary, home, proj, base_url=mock.base_url,
                              proxy_url=mock.base_url, args=sc.args) as tui:
                await tui.wait_for("? for shortcuts", timeout=90)
                await sc.tui(tui, cap, mock)
                runs.append(tui.screen())
        else:
            session = None
            for prompt in sc.prompts:
                extra = ("--resume", session) if session else ()
                run = await cc.run_print(binary, home, proj, prompt, base_url=mock.base_url,
                                         proxy_url=mock.base_url, args=(*sc.args, *extra),
                                         env_extra=GIT_ENV if sc.git else None)
                runs.append(run)
                session = session or (run.result or {}).get("session_id")
        await trio.sleep(0.5)  # a SessionEnd POST may still be in flight
        nursery.cancel_scope.cancel()
    hooked = sorted(cap.hooked + read_command_captures(cmd_dir), key=lambda h: h.at)
    return Capture(hooked, runs, mock, root)


def scrub(value: Any, root: Path) -> Any:
    """``value`` with the temp root (and its /private twin) replaced by ``/TMP``."""
    text = json.dumps(value)
    text = text.replace(str(root), "/TMP")
    # the transcript dir name is the project path with / turned into -
    text = text.replace(re.sub(r"[^A-Za-z0-9]", "-", str(root)), "-TMP")
    return json.loads(text)


def write_fixtures(outdir: Path, names: tuple[str, ...] = ()) -> None:
    """Regenerate ``outdir`` (default ``tests/fixtures/claude_code_real``): every
    scenario (or only ``names``), one file per delivery, and ``manifest.json``."""
    binary = cc.claude_binary()
    manifest_path = outdir / "manifest.json"
    manifest = (json.loads(manifest_path.read_text()) if manifest_path.exists()
                else {"claude_code_version": cc.CLAUDE_CODE_VERSION,
                      "package": cc.CLAUDE_CODE_PACKAGE, "scenarios": {}})

    async def main() -> None:
        for sc in SCENARIOS:
            if names and sc.name not in names:
                continue
            with tempfile.TemporaryDirectory(prefix="aep-cc-") as tmp:
                cap = await run_scenario(binary, Path(tmp), sc)
            d = outdir / sc.name
            if d.exists():
                for old in d.iterdir():
                    old.unlink()
            d.mkdir(parents=True, exist_ok=True)
            order = []
            for i, h in enumerate(cap.hooked):
                fname = f"{i:02d}-{h.event}.json"
                (d / fname).write_text(json.dumps(scrub(h.body, Path(tmp)), indent=1) + "\n")
                order.append(h.event)
            assert cap.mock is not None
            manifest["scenarios"][sc.name] = {
                "how": sc.how, "mode": "tui" if sc.tui else "print", "args": list(sc.args),
                "prompts": list(sc.prompts), "events": order,
                "egress": [(r.method, r.path) for r in cap.mock.egress()],
                "mock_problems": cap.mock.problems}
            print(sc.name, order, flush=True)
    trio.run(main)
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


async def one_tool_turn(binary: Path, root: Path, hooked: bool) -> tuple[float, int]:
    """One ``claude -p`` turn with one Bash call (``echo hi``) and a final text, with
    no hooks or with every event hooked (HTTP to a capture server answering ``{}``,
    command hooks for SessionStart/Setup): ``(wall s, Claude Code's duration_ms)``."""
    home, proj, cmd_dir = root / "home", root / "proj", root / "cmd"
    cmd_dir.mkdir(parents=True)
    cc.prepare_home(home, proj)
    mock = MockAnthropicServer(script=[BASH_HI, Text("ok")])
    cap = HookCapture()
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(cap.serve)
        assert mock.base_url and cap.url
        if hooked:
            cc.write_settings(proj, cc.all_hooks_settings(cap.url, cmd_dir))
        run = await cc.run_print(binary, home, proj, "run", base_url=mock.base_url,
                                 proxy_url=mock.base_url, args=("--allowedTools", "Bash"))
        nursery.cancel_scope.cancel()
    if run.returncode != 0 or (run.result or {}).get("result") != "ok":
        raise RuntimeError(run.describe())
    return run.wall_s, int((run.result or {}).get("duration_ms") or 0)


def measure(rounds: int) -> None:
    """Print the no-hooks vs all-hooked one-tool turn (alternating, ``rounds`` each)."""
    import statistics
    binary = cc.claude_binary()
    res: dict[bool, list[tuple[float, int]]] = {False: [], True: []}

    async def main() -> None:
        for _ in range(rounds):
            for hooked in (False, True):
                with tempfile.TemporaryDirectory(prefix="aep-cc-") as tmp:
                    res[hooked].append(await one_tool_turn(binary, Path(tmp), hooked))
    trio.run(main)
    for hooked, runs in res.items():
        walls = sorted(w for w, _ in runs)
        print(f"{'every event hooked' if hooked else 'no hooks'}: wall median "
              f"{statistics.median(walls):.2f} s (min {walls[0]:.2f}, max {walls[-1]:.2f}), "
              f"duration_ms median {statistics.median(d for _, d in runs):.0f}")


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] == ["--measure"]:
        measure(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    else:
        out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/fixtures/claude_code_real")
        write_fixtures(out, tuple(sys.argv[2:]))
