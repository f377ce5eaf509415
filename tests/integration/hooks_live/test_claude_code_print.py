"""The real Claude Code 2.1.197 in print mode (``claude -p``), offline against the
mock Messages API, hooked: what the hooks engineer's bridge relies on, checked
against what reached the model (the mock's recorded requests).

- every hook event print mode fires reaches an HTTP hook (and the command hook
  for ``SessionStart``), the turn completes, nothing left the machine;
- a held ``PreToolUse`` is waited for: the tool does not run, and the model is
  not asked again, until the hook answers;
- ``permissionDecision: allow`` runs a tool print mode would refuse;
- ``deny`` + ``permissionDecisionReason``: the tool does not run and the reason
  reaches the model as the tool's error;
- ``{}`` is no decision: the vendor's own rule applies (refused when the tool is
  not allowed, run when it is);
- ``additionalContext`` in a ``UserPromptSubmit`` / ``PostToolUse`` reply
  reaches the model's next request.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support import claude_code as cc
from tests.support.hook_capture import HookCapture, read_command_captures
from tests.support.mock_anthropic import MockAnthropicServer, Text, Tool

pytestmark = pytest.mark.vendor

MARKER = "aep-tool-ran.txt"
#: a Bash call whose side effect proves it ran
TOUCH = Tool("Bash", {"command": f"touch {MARKER} && echo ran", "description": "mark"})


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    return cc.claude_binary()


async def _run(claude_bin: Path, tmp: Path, script: list, answers: dict, *,
               allowed: tuple[str, ...] = ("Bash",), events=cc.HOOK_EVENTS,
               prompt: str = "run the command", mock: MockAnthropicServer | None = None,
               extra_args: tuple[str, ...] = ()):
    mock = mock or MockAnthropicServer()
    mock.script = list(script)
    cap = HookCapture(answers=answers)
    home, proj, cmd_dir = tmp / "home", tmp / "proj", tmp / "cmd"
    cmd_dir.mkdir(parents=True)
    cc.prepare_home(home, proj)
    args = (("--allowedTools", ",".join(allowed)) if allowed else ()) + extra_args
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(cap.serve)
        assert cap.url is not None and mock.base_url is not None
        cc.write_settings(proj, cc.all_hooks_settings(cap.url, cmd_dir, events=events))
        run = await cc.run_print(claude_bin, home, proj, prompt, base_url=mock.base_url,
                                 proxy_url=mock.base_url, args=args)
        nursery.cancel_scope.cancel()
    assert not mock.problems, mock.problems
    assert not mock.egress(), [(r.method, r.path) for r in mock.egress()]
    return run, mock, cap, proj, cmd_dir


async def test_print_turn_fires_the_hooks_offline(claude_bin, tmp_path):
    run, mock, cap, proj, cmd_dir = await _run(
        claude_bin, tmp_path, [TOUCH, Text("It ran.")], {})
    assert run.returncode == 0, run.describe()
    assert (run.result or {}).get("result") == "It ran."
    assert (proj / MARKER).exists()
    for ev in ("UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "SessionEnd"):
        assert cap.of(ev), (ev, cap.events())
    # no PermissionRequest in print mode: the tool was allowed, nothing asked
    assert "PermissionRequest" not in cap.events()
    starts = [h for h in read_command_captures(cmd_dir) if h.event == "SessionStart"]
    assert starts and starts[0].body["hook_event_name"] == "SessionStart"
    pre = cap.of("PreToolUse")[0]
    assert pre["tool_name"] == "Bash" and pre["tool_input"]["command"] == TOUCH.input["command"]
    tool_id = mock.tool_uses[0][0]
    assert pre["tool_use_id"] == tool_id
    assert [r["text"] for r in mock.tool_results()] == ["ran"]


async def test_held_pretooluse_is_waited_for_then_allow_runs_a_refused_tool(claude_bin, tmp_path):
    seen_while_held: dict = {}

    async def hold_then_allow(body):
        await trio.sleep(1.5)  # long against the hook round trip; nothing may move meanwhile
        seen_while_held["agent_requests"] = len(mock.agent_requests())
        seen_while_held["ran"] = (tmp_path / "proj" / MARKER).exists()
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                       "permissionDecision": "allow",
                                       "permissionDecisionReason": "allowed over AEP"}}

    mock = MockAnthropicServer()
    run, _, cap, proj, _ = await _run(
        claude_bin, tmp_path, [TOUCH, Text("It ran.")], {"PreToolUse": hold_then_allow},
        allowed=(), mock=mock)
    assert run.returncode == 0, run.describe()
    assert seen_while_held == {"agent_requests": 1, "ran": False}
    assert (proj / MARKER).exists()
    assert [r["text"] for r in mock.tool_results()] == ["ran"]
    assert not mock.tool_results()[0].get("is_error")


async def test_pretooluse_deny_reason_reaches_the_model_as_the_tool_error(claude_bin, tmp_path):
    reason = "AEP-DENY-7f3: not on a Friday, use the staging box"
    run, mock, cap, proj, _ = await _run(
        claude_bin, tmp_path, [TOUCH, Text("Understood.")],
        {"PreToolUse": {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                               "permissionDecision": "deny",
                                               "permissionDecisionReason": reason}}})
    assert run.returncode == 0, run.describe()
    assert not (proj / MARKER).exists()
    (result,) = mock.tool_results()
    assert result.get("is_error") is True
    assert reason in result["text"]
    assert not cap.of("PostToolUse")


@pytest.mark.parametrize("allowed, runs", [((), False), (("Bash",), True)],
                         ids=["not-allowed-refused", "allowed-runs"])
async def test_empty_pretooluse_answer_is_no_decision(claude_bin, tmp_path, allowed, runs):
    run, mock, cap, proj, _ = await _run(
        claude_bin, tmp_path, [TOUCH, Text("ok")], {"PreToolUse": {}}, allowed=allowed)
    assert run.returncode == 0, run.describe()
    assert cap.of("PreToolUse")
    assert (proj / MARKER).exists() is runs
    (result,) = mock.tool_results()
    assert bool(result.get("is_error")) is not runs
    # print mode never asks: a refused tool fires no PermissionRequest
    assert "PermissionRequest" not in cap.events()


@pytest.mark.parametrize("event, first", [("UserPromptSubmit", 0), ("PreToolUse", 1),
                                          ("PostToolUse", 1)])
async def test_additional_context_reaches_the_next_model_request(claude_bin, tmp_path, event,
                                                                first):
    """Steering's carrier: ``additionalContext`` in these hooks' replies is in the next
    model request (the first for the prompt's hook, the one after the tool for the
    tool hooks; PreToolUse's with no decision, the tool still runs)."""
    note = f"AEP-STEER-{event}: prefer the staging database"
    run, mock, cap, proj, _ = await _run(
        claude_bin, tmp_path, [TOUCH, Text("ok")],
        {event: {"hookSpecificOutput": {"hookEventName": event, "additionalContext": note}}})
    assert run.returncode == 0, run.describe()
    reqs = mock.agent_requests()
    assert [note in mock.texts_sent(r) for r in reqs].index(True) == first
    assert (proj / MARKER).exists()


async def test_http_hook_past_its_timeout_is_no_decision(claude_bin, tmp_path):
    """An HTTP hook that has not answered within its ``timeout`` is dropped and the
    vendor's own flow goes on (here: Bash allowed, so it runs), never a deny."""
    async def too_slow(body):
        await trio.sleep(30)
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                       "permissionDecision": "deny",
                                       "permissionDecisionReason": "too late"}}

    mock = MockAnthropicServer(script=[TOUCH, Text("ok")])
    cap = HookCapture(answers={"PreToolUse": too_slow})
    home, proj = tmp_path / "home", tmp_path / "proj"
    cc.prepare_home(home, proj)
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(cap.serve)
        assert cap.url and mock.base_url
        cc.write_settings(proj, {"hooks": {"PreToolUse": [
            {"matcher": "", "hooks": [cc.http_hook(f"{cap.url}/PreToolUse", timeout_s=2)]}]}})
        run = await cc.run_print(claude_bin, home, proj, "go", base_url=mock.base_url,
                                 proxy_url=mock.base_url, args=("--allowedTools", "Bash"))
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    assert cap.of("PreToolUse")
    assert (proj / MARKER).exists()
    assert [r["text"] for r in mock.tool_results()] == ["ran"]


async def test_unreachable_http_hooks_do_not_stop_the_turn(claude_bin, tmp_path):
    from tests.support.net import free_port
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    mock = MockAnthropicServer(script=[TOUCH, Text("It ran.")])
    home, proj = tmp_path / "home", tmp_path / "proj"
    cc.prepare_home(home, proj)
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        assert mock.base_url
        cc.write_settings(proj, cc.all_hooks_settings(dead, None))
        run = await cc.run_print(claude_bin, home, proj, "go", base_url=mock.base_url,
                                 proxy_url=mock.base_url, args=("--allowedTools", "Bash"))
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    assert (run.result or {}).get("result") == "It ran."
    assert (proj / MARKER).exists()


@pytest.mark.parametrize("action", ["accept", "decline", None])
async def test_elicitation_answered_by_the_hook_reaches_the_mcp_server(claude_bin, tmp_path,
                                                                      action):
    """An MCP server's ``elicitation/create`` fires ``Elicitation`` (its schema as
    ``requested_schema``); the hook's ``action`` (+ ``content``) is what the server
    receives (and returns to the model); no answer in print mode is a ``cancel``
    followed by ``ElicitationResult``."""
    import json

    from tests.support.claude_code_captures import ELICIT_ARGS, MCP_CONFIG
    from tests.support.mcp_elicit import MESSAGE, SCHEMA
    values = {"environment": "production", "confirm": True}
    answers = {}
    if action:
        answers["Elicitation"] = {"hookSpecificOutput": {
            "hookEventName": "Elicitation", "action": action,
            **({"content": values} if action == "accept" else {})}}
    (tmp_path / "proj").mkdir(parents=True)
    (tmp_path / "proj" / MCP_CONFIG[0]).write_text(MCP_CONFIG[1])
    run, mock, cap, proj, _ = await _run(
        claude_bin, tmp_path, [Tool("mcp__elicit__deploy", {}), Text("ok")], answers,
        allowed=(), prompt="deploy", extra_args=ELICIT_ARGS)
    assert run.returncode == 0, run.describe()
    (asked,) = cap.of("Elicitation")
    assert asked["message"] == MESSAGE and asked["requested_schema"]["required"] == \
        SCHEMA["required"] and asked["mcp_server_name"] == "elicit"
    (result,) = mock.tool_results()
    got = json.loads(result["text"].split("elicitation: ", 1)[1])
    expected = {"action": action or "cancel"}
    if action == "accept":
        expected["content"] = values
    assert got == expected
    assert bool(cap.of("ElicitationResult")) is (action is None)


@pytest.mark.parametrize("hooked", [False, True], ids=["not-hooked", "hooked"])
async def test_a_worktree_create_hook_replaces_git_worktree_creation(claude_bin, tmp_path,
                                                                     hooked):
    """Not an observation point: a ``WorktreeCreate`` hook IS the worktree creator (it
    must answer ``hookSpecificOutput.worktreePath``), so a hook that only observes
    (``{}``) breaks ``EnterWorktree``. An installer must leave ``WorktreeCreate``
    (and its pair ``WorktreeRemove``) unhooked."""
    from tests.support.claude_code_captures import GIT_ENV, _git_init
    home, proj = tmp_path / "home", tmp_path / "proj"
    cc.prepare_home(home, proj)
    _git_init(proj)
    mock = MockAnthropicServer(script=[Tool("EnterWorktree", {"name": "w1"}), Text("ok")])
    cap = HookCapture()
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(cap.serve)
        assert cap.url and mock.base_url
        events = ("PreToolUse", "WorktreeCreate") if hooked else ("PreToolUse",)
        cc.write_settings(proj, cc.all_hooks_settings(cap.url, None, events=events))
        run = await cc.run_print(claude_bin, home, proj, "go", base_url=mock.base_url,
                                 proxy_url=mock.base_url, env_extra=GIT_ENV,
                                 args=("--allowedTools", "EnterWorktree"))
        nursery.cancel_scope.cancel()
    assert run.returncode == 0, run.describe()
    (result,) = mock.tool_results()
    assert bool(result.get("is_error")) is hooked, result
    if hooked:
        assert "WorktreeCreate hook failed" in result["text"]
        assert cap.of("WorktreeCreate")[0]["name"] == "w1"
