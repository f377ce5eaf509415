"""Asks settled by what the vendor does next, steering's refusals, and the
defined behaviour of odd moments."""
from __future__ import annotations

import trio

from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.codex_hooks.profile import PROFILE as CODEX
from bridges.hooks_common.config import HookConfig
from tests.support.hooks import Rig

S = "sess-2"
BASH = {"tool_name": "Bash", "tool_input": {"command": "rm -rf build"}}


def m(event, **kw):
    return {"hook_event_name": event, "session_id": S, **kw}


async def run(rig, *moments):
    async with trio.open_nursery() as n:
        await rig.start(n)
        for mo in moments:
            await rig.post(mo)
        n.cancel_scope.cancel()
    return rig


async def test_permission_denied_settles_the_ask_as_denied_oob():
    rig = await run(Rig(CLAUDE, HookConfig()), m("UserPromptSubmit"), m("PermissionRequest", **BASH),
                    m("PermissionDenied", tool_use_id="t1", **BASH))
    ans = rig.of("attention.answered")[0]
    assert ans["data"] == {"answer": {"option": "deny"}, "via": "oob"}
    assert rig.of("tool.denied")[0]["data"]["by"] == "policy"


async def test_a_run_ending_dismisses_what_is_still_open():
    rig = await run(Rig(CLAUDE, HookConfig()), m("UserPromptSubmit"), m("PermissionRequest", **BASH),
                    m("Stop"))
    assert rig.types() == ["run.started", "attention.requested", "attention.resolved",
                           "run.finished"]
    assert rig.of("attention.resolved")[0]["data"]["resolution"] == "dismissed"


async def test_an_elicitation_answered_elsewhere_settles_with_its_values():
    schema = {"type": "object", "properties": {"env": {"type": "string", "enum": ["a", "b"]}}}
    rig = await run(Rig(CLAUDE, HookConfig()),
                    m("Elicitation", mcp_server_name="srv", message="pick", requested_schema=schema),
                    m("ElicitationResult", mcp_server_name="srv", action="accept",
                      content={"env": "b"}),
                    m("ElicitationResult", mcp_server_name="srv", action="accept",
                      content={"env": "a"}))  # an orphan: nothing
    assert rig.types() == ["attention.requested", "attention.answered", "attention.resolved"]
    assert rig.of("attention.answered")[0]["data"] == {"answer": {"values": {"env": "b"}},
                                                       "via": "oob"}


async def test_a_declined_elicitation_is_answered_with_the_action():
    rig = await run(Rig(CLAUDE, HookConfig()),
                    m("Elicitation", message="pick", requested_schema={"type": "object"}),
                    m("ElicitationResult", action="decline"))
    assert rig.of("attention.answered")[0]["data"]["answer"] == {"option": "decline"}


async def test_a_moment_without_a_session_is_counted_and_answered_with_no_decision():
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        assert (await rig.post({"hook_event_name": "Stop"}))[2] == {}
        assert (await rig.post({"hook_event_name": "Stop", "session_id": 7}))[2] == {}
        n.cancel_scope.cancel()
    assert rig.types() == [] and rig.ctx.health.counters["hooks_no_session"] == 2


async def test_steering_refuses_an_unknown_session_a_full_queue_and_bad_text():
    rig = Rig(CODEX, HookConfig(instruct=True, aep_token=True))
    verb = "x.codex.control.instruct"
    async with trio.open_nursery() as n:
        await rig.start(n)
        unknown = await rig.command(verb, "nobody", {"text": "hi"}, cid="u")
        assert unknown["data"]["reason"] == "refused"
        await rig.post(m("UserPromptSubmit", turn_id="t1"))
        bad = await rig.command(verb, S, {"text": "  "}, cid="b")
        assert bad["data"]["reason"] == "invalid"
        for i in range(20):
            assert (await rig.command(verb, S, {"text": f"n{i}"}, cid=f"q{i}"))["type"] == \
                "control.accepted"
        full = await rig.command(verb, S, {"text": "one more"}, cid="full")
        assert full["type"] == "control.rejected" and full["data"]["reason"] == "invalid"
        # Codex delivers on PreToolUse; all twenty joined, in order
        _, _, reply = await rig.post(m("PreToolUse", turn_id="t1", tool_use_id="c", **BASH))
        text = reply["hookSpecificOutput"]["additionalContext"]
        assert text.split("\n\n") == [f"n{i}" for i in range(20)]
        respond = await rig.command("control.attention.respond", S, {"answer": {"option": "allow"}},
                                    subject="x", cid="r")
        assert respond["data"]["reason"] == "unsupported"  # steering only: no respond gate
        n.cancel_scope.cancel()
    assert len(rig.of("x.codex.instruction.delivered")) == 20


async def test_a_held_hook_never_carries_steering():
    rig = Rig(CLAUDE, HookConfig(control=True, instruct=True, aep_token=True, gate_tools=("Bash",),
                                 hold_s=0.05))
    async with trio.open_nursery() as n:
        await rig.start(n)
        await rig.post(m("UserPromptSubmit"))
        await rig.command("x.claude-code.control.instruct", S, {"text": "later"})
        _, h, reply = await rig.post(m("PreToolUse", tool_use_id="t", **BASH))
        assert "aep-hold-ms" in h and reply == {}  # held, timed out: no steering in a decision
        _, _, reply = await rig.post(m("PostToolUse", tool_use_id="t", tool_response="x", **BASH))
        assert reply["hookSpecificOutput"]["additionalContext"] == "later"
        n.cancel_scope.cancel()
