"""The hook family's run through the fleet's real ledger: run synthesis,
tool pairing, the held gate and its three answer shapes, the timeout, the
out-of-band settling, dedupe, steering, the gate off."""
from __future__ import annotations

import trio

from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.codex_hooks.profile import PROFILE as CODEX
from bridges.hooks_common.config import HookConfig
from tests.support.hooks import Rig

OPEN = HookConfig(control=True, aep_token=True, gate_tools=("Bash",), hold_s=30.0)
S = "sess-1"


def m(event, **kw):
    return {"hook_event_name": event, "session_id": S, "transcript_path": "/secret/t.jsonl",
            "cwd": "/w", **kw}


BASH = {"tool_name": "Bash", "tool_input": {"command": "ls"}}


async def test_runs_are_synthesized_per_prompt_and_tools_pair():
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        for mo in (m("UserPromptSubmit", prompt="hi"), m("PreToolUse", tool_use_id="t1", **BASH),
                   m("PostToolUse", tool_use_id="t1", tool_response={"stdout": "x"}, **BASH),
                   m("Stop"), m("UserPromptSubmit", prompt="again"), m("UserPromptSubmit")):
            status, _, reply = await rig.post(mo)
            assert (status, reply) == (200, {})
        n.cancel_scope.cancel()
    ev = rig.events()
    assert [e["type"] for e in ev] == ["run.started", "tool.requested", "tool.completed",
                                       "run.finished", "run.started", "run.cancelled", "run.started"]
    r1, req, done, fin = ev[:4]
    assert r1["run"] == req["run"] == done["run"] == fin["run"]
    assert done["cause"] == req["id"] and fin["cause"] == r1["id"]
    assert ev[4]["run"] != r1["run"] and ev[5]["run"] == ev[4]["run"] != ev[6]["run"]
    assert all("transcript" not in str(e.get("data")) for e in ev)


async def test_codex_turn_id_is_the_run():
    rig = Rig(CODEX, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        await rig.post(m("UserPromptSubmit", turn_id="turn-7"))
        await rig.post(m("Stop", turn_id="turn-7"))
        n.cancel_scope.cancel()
    assert [e["run"] for e in rig.events()] == ["turn-7", "turn-7"]


async def held(rig, mo):
    """POST ``mo`` in the background; returns (result box, the ask event)."""
    box: dict = {}
    before = len(rig.of("attention.requested"))

    async def go():
        box["r"] = await rig.post(mo)
    rig.nursery.start_soon(go)
    ask = (await rig.wait_for("attention.requested", before + 1))[-1]
    return box, ask


async def finish(box):
    for _ in range(5000):
        if "r" in box:
            return box["r"]
        await trio.sleep(0.001)
    raise AssertionError("the held hook never answered")


async def hung_up(rig, mo):
    """POST ``mo`` (an asking moment), then its hook process hangs up (the
    terminal answered, or the agent was killed) once the ask is out; returns
    the ask event after the post ended."""
    hang = trio.Event()
    box: dict = {}
    before = len(rig.of("attention.requested"))

    async def go():
        box["r"] = await rig.post(mo, hangup=hang)
    rig.nursery.start_soon(go)
    ask = (await rig.wait_for("attention.requested", before + 1))[-1]
    hang.set()
    await finish(box)
    return ask


async def test_permission_allow_option_through_the_ledger():
    rig = Rig(CLAUDE, OPEN)
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, m("PermissionRequest", **BASH))
        assert ask["data"]["respond_via"] == ["control"]
        ack = await rig.command("control.attention.respond", S, {"answer": {"option": "allow"}},
                                subject=ask["id"])
        assert ack["type"] == "control.accepted"
        status, headers, reply = await finish(box)
        assert headers["aep-hold-ms"] == "30000"
        assert reply == {"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                                                "decision": {"behavior": "allow"}}}
        ans = (await rig.wait_for("attention.answered"))[0]
        res = (await rig.wait_for("attention.resolved"))[0]
        assert ans["cause"] == "cmd1" and ans["data"] == {"answer": {"option": "allow"},
                                                           "via": "control"}
        assert res["cause"] == ans["id"] and res["data"]["resolution"] == "answered"
        late = await rig.command("control.attention.respond", S, {"answer": {"option": "deny"}},
                                 subject=ask["id"], cid="cmd2")
        assert late["type"] == "control.rejected" and late["data"]["reason"] == "refused"
        n.cancel_scope.cancel()


async def test_free_text_is_a_deny_whose_text_reaches_the_model_and_option_words_are_options():
    rig = Rig(CLAUDE, OPEN)
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, m("PreToolUse", tool_use_id="t9", **BASH))
        await rig.command("control.attention.respond", S, {"answer": {"text": "use git status"}},
                          subject=ask["id"])
        _, _, reply = await finish(box)
        assert reply == {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                                "permissionDecision": "deny",
                                                "permissionDecisionReason": "use git status"}}
        box, ask2 = await held(rig, m("PreToolUse", tool_use_id="t10", **BASH))
        assert ask2["id"] != ask["id"]
        await rig.command("control.attention.respond", S, {"answer": {"text": " ALLOW "}},
                          subject=ask2["id"], cid="cmd2")
        _, _, reply = await finish(box)
        assert reply["hookSpecificOutput"]["permissionDecision"] == "allow"
        n.cancel_scope.cancel()


async def test_form_invalid_values_are_nacked_and_the_ask_stays_pending():
    rig = Rig(CLAUDE, OPEN)
    qs = {"questions": [{"question": "Which db?", "header": "DB", "multiSelect": False,
                         "options": [{"label": "PostgreSQL"}, {"label": "SQLite"}]}]}
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, m("PermissionRequest", tool_name="AskUserQuestion",
                                     tool_input=qs))
        assert ask["data"]["kind"] == "form"
        bad = await rig.command("control.attention.respond", S, {"answer": {"values": {}}},
                                subject=ask["id"], cid="bad")
        assert bad["type"] == "control.rejected" and bad["data"]["reason"] == "invalid"
        assert "r" not in box
        ok = await rig.command("control.attention.respond", S,
                               {"answer": {"values": {"1": "2"}}}, subject=ask["id"], cid="ok")
        assert ok["type"] == "control.accepted"
        _, _, reply = await finish(box)
        dec = reply["hookSpecificOutput"]["decision"]
        assert dec["behavior"] == "allow"
        assert dec["updatedInput"]["answers"] == {"Which db?": "SQLite"}
        assert dec["updatedInput"]["questions"] == qs["questions"]
        n.cancel_scope.cancel()


async def test_the_hold_ends_with_attention_timeout_and_no_decision():
    rig = Rig(CLAUDE, HookConfig(control=True, aep_token=True, hold_s=0.05))
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, m("PermissionRequest", **BASH))
        _, headers, reply = await finish(box)
        assert reply == {} and headers["aep-hold-ms"] == "50"
        t = (await rig.wait_for("attention.timeout"))[0]
        assert t["cause"] == ask["id"] and t["subject"] == ask["id"]
        late = await rig.command("control.attention.respond", S, {"answer": {"option": "allow"}},
                                 subject=ask["id"])
        assert late["type"] == "control.rejected"
        n.cancel_scope.cancel()


async def test_answered_at_the_terminal_resolves_oob_and_the_late_command_is_nacked():
    rig = Rig(CLAUDE, OPEN)
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        ask = await hung_up(rig, m("PermissionRequest", **BASH))  # the terminal answered
        await rig.post(m("PostToolUse", tool_use_id="x", tool_response="ok", **BASH))
        ans = (await rig.wait_for("attention.answered"))[0]
        assert ans["data"] == {"answer": {"option": "allow"}, "via": "oob"}
        assert ans["cause"] == ask["id"]
        late = await rig.command("control.attention.respond", S, {"answer": {"option": "deny"}},
                                 subject=ask["id"])
        assert late["type"] == "control.rejected" and late["data"]["reason"] == "refused"
        n.cancel_scope.cancel()


async def test_gate_off_means_zero_decisions_and_unsupported_commands():
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        _, h, reply = await rig.post(m("PermissionRequest", **BASH))
        assert reply == {} and "aep-hold-ms" not in h
        _, h, reply = await rig.post(m("PreToolUse", tool_use_id="t", **BASH))
        assert reply == {} and "aep-hold-ms" not in h
        ask = rig.of("attention.requested")[0]
        assert ask["data"]["respond_via"] == ["oob"]
        nack = await rig.command("control.attention.respond", S, {"answer": {"option": "allow"}},
                                 subject=ask["id"])
        assert nack["type"] == "control.rejected" and nack["data"]["reason"] == "unsupported"
        n.cancel_scope.cancel()
    assert rig.bridge.capabilities()["control"]["accepts"] == []


async def test_a_repeated_hook_id_is_emitted_once():
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        h = {"X-AEP-Hook-Id": "a" * 32}
        await rig.post(m("UserPromptSubmit"), headers=h)
        await rig.post(m("UserPromptSubmit"), headers=h)
        n.cancel_scope.cancel()
    assert rig.types() == ["run.started"]
    assert rig.ctx.health.counters["hooks_duplicate"] == 1


async def test_a_body_that_is_not_an_object_is_400_and_counted():
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        for raw in (b"[1]", b"not json", b"\xff"):
            status, _, reply = await rig.post(None, raw=raw)
            assert status == 400 and "error" in reply
        n.cancel_scope.cancel()
    assert rig.ctx.health.counters["hooks_bad_body"] == 3


async def test_steering_is_delivered_on_the_next_eligible_reply_and_dropped_at_session_end():
    rig = Rig(CLAUDE, HookConfig(instruct=True, aep_token=True))
    async with trio.open_nursery() as n:
        await rig.start(n)
        await rig.post(m("UserPromptSubmit"))
        ack = await rig.command("x.claude-code.control.instruct", S, {"text": "prefer rg"})
        assert ack["type"] == "control.accepted"
        _, _, reply = await rig.post(m("Stop"))  # not eligible
        assert reply == {}
        _, _, reply = await rig.post(m("UserPromptSubmit"))
        assert reply == {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit",
                                                "additionalContext": "prefer rg"}}
        d = rig.of("x.claude-code.instruction.delivered")
        assert len(d) == 1 and d[0]["cause"] == "cmd1"
        await rig.command("x.claude-code.control.instruct", S, {"text": "later"}, cid="c2")
        await rig.post(m("SessionEnd", reason="other"))
        drop = rig.of("x.claude-code.instruction.dropped")
        assert len(drop) == 1 and drop[0]["cause"] == "c2"
        assert drop[0]["data"] == {"reason": "session-ended"}
        n.cancel_scope.cancel()


async def test_a_new_vendor_is_a_small_profile():
    """The family's extension point: an observe-only vendor whose payload
    nests its event name (pi), names its session otherwise and whose
    neutral reply is not ``{}`` (Antigravity) is a profile and a mapper,
    nothing else."""
    from bridges.core.posture import Posture
    from bridges.hooks_common.handlers import CORE, dispatch
    from bridges.hooks_common.profile import HookProfile

    # the family's handlers under the vendor's own event names, one of its own
    table = {"PreToolUse": CORE["PreToolUse"], "BeforeAgent": CORE["UserPromptSubmit"],
             "Bye": lambda mo, p: [{"type": "agent.idle", "data": {"reason": "bye"}}]}

    def mapper(mo, posture: Posture):
        return dispatch(table, mo, posture, event=mo["event"]["type"])

    toy = HookProfile(key="toy_hooks", agent="toy", env="TOY_HOOKS", title="a toy", pins="",
                      map_hook=mapper, event_field="event.type", session_field="conversationId",
                      permission_events=frozenset(), gate_event=None,
                      neutral=lambda ev: {"decision": ""} if ev in ("PreToolUse", "Stop") else {})
    rig = Rig(toy, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        pre = {"event": {"type": "PreToolUse"}, "conversationId": "c", "tool_name": "run"}
        assert (await rig.post(pre))[2] == {"decision": ""}
        assert (await rig.post({"event": {"type": "Other"}, "conversationId": "c"}))[2] == {}
        await rig.post({"event": {"type": "Bye"}, "conversationId": "c"})
        n.cancel_scope.cancel()
    assert rig.types() == ["tool.requested", "x.toy.session.other", "agent.idle"]
    assert rig.mounts.apps == {}  # unmounted when the run ended


async def test_a_run_that_ends_releases_its_held_hooks_with_no_decision():
    rig = Rig(CLAUDE, OPEN)
    box: dict = {}
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as n:
            rig.nursery = outer
            await rig.start(n)

            async def go():
                box["r"] = await rig.post(m("PermissionRequest", **BASH))
            outer.start_soon(go)
            await rig.wait_for("attention.requested")
            n.cancel_scope.cancel()  # the bridge's run ends (a stop, a restart)
        with trio.fail_after(5):
            while "r" not in box:
                await trio.sleep(0.001)
    assert box["r"][2] == {}
    # AEP-0002 section 7 rule 2: the released ask gets its terminal event (a restarted
    # daemon never learns of it, so without one it stays pending for every consumer)
    ask, = rig.of("attention.requested")
    done = [e for e in rig.of("attention.resolved") if e["subject"] == ask["id"]]
    assert [e["data"]["resolution"] for e in done] == ["dismissed"]


async def test_a_hold_ends_before_a_short_vendor_timeout():
    """A vendor whose hook times out sooner than the configured hold (VS
    Code's 30 s PreToolUse) is answered before it: the hold is clamped."""
    import dataclasses
    short = dataclasses.replace(CLAUDE, vendor_timeout_s={"PermissionRequest": 5.05})
    rig = Rig(short, HookConfig(control=True, aep_token=True, hold_s=120.0))
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, m("PermissionRequest", **BASH))
        _, headers, reply = await finish(box)
        assert headers["aep-hold-ms"] == "50" and reply == {}
        t = (await rig.wait_for("attention.timeout"))[0]
        assert t["data"]["after_ms"] == 50
        n.cancel_scope.cancel()


def test_a_session_remembers_its_tools_bounded_and_never_their_inputs():
    """A fourth outside attack on issue 25: ``PreToolUse`` moments with
    unique 3.9 MB ``tool_use_id`` s (or inputs), never followed by
    ``PostToolUse``, grew the daemon 3.8 MB a hook without end. A session
    now keeps at most TOOLS_MAX open calls, long ids and names as digests,
    and of an input only per-key digests; pairing still works."""
    from bridges.hooks_common.session import KEY_MAX, REQUESTED_MAX, TOOLS_MAX, SessionState, bounded_key
    st = SessionState("s")
    big = {"command": "x" * 100_000}
    for i in range(TOOLS_MAX + 50):
        st.remember_tool({"tool_name": "Bash" * 100, "tool_use_id": f"{i}-" + "t" * 10_000,
                          "tool_input": big}, f"ev{i}", i)
    assert len(st.tools) == TOOLS_MAX and all(len(k) <= KEY_MAX + 1 for k in st.tools)
    assert len(st.requested) == REQUESTED_MAX
    assert all(len(str(entry)) < 1_000 for entry in st.requested)  # no input, no long name
    last = TOOLS_MAX + 49
    assert st.tools[bounded_key(f"{last}-" + "t" * 10_000)] == (f"ev{last}", last)
    assert bounded_key("0-" + "t" * 10_000) not in st.tools  # the oldest forgotten
    # a PermissionRequest (no tool_use_id) still pairs by name and input
    assert st.requested_id({"tool_name": "Bash" * 100, "tool_input": big}) == f"ev{last}"
    assert st.requested_id({"tool_name": "Bash" * 100, "tool_input": {"command": "y"}}) is None


async def test_a_long_tool_use_id_still_pairs_its_completion():
    rig = Rig(CLAUDE, HookConfig())
    call = "t" * 5_000
    async with trio.open_nursery() as n:
        await rig.start(n)
        for mo in (m("UserPromptSubmit", prompt="hi"), m("PreToolUse", tool_use_id=call, **BASH),
                   m("PostToolUse", tool_use_id=call, tool_response={"stdout": "x"}, **BASH)):
            assert (await rig.post(mo))[0] == 200
        n.cancel_scope.cancel()
    ev = rig.events()
    req, done = ev[1], ev[2]
    assert (req["type"], done["type"]) == ("tool.requested", "tool.completed")
    assert done["cause"] == req["id"]


async def test_an_ask_whose_hook_hung_up_times_out_when_its_hold_would_have_ended():
    """A user trial (issue 27): the agent killed mid-ask sends no next
    moment, and its ask stayed pending for good (``respond --pending``
    listed it; a later ask made ``respond`` with no id refuse). Unsettled
    when its hold would have ended, it times out."""
    rig = Rig(CLAUDE, HookConfig(control=True, aep_token=True, gate_tools=("Bash",), hold_s=0.5))
    async with trio.open_nursery() as n:
        rig.nursery = n
        run = await rig.start(n)
        ask = await hung_up(rig, m("PermissionRequest", **BASH))  # the hook process is gone
        await trio.sleep(0.6)
        await run.hub.expire()  # (or the bridge's own sweep did it already)
        t = (await rig.wait_for("attention.timeout"))[0]
        assert t["subject"] == ask["id"] and t["cause"] == ask["id"]
        # not at the hang-up: once the hold would have ended (a lower bound only)
        assert t["data"]["after_ms"] == 500
        assert _ms(t["time"]) - _ms(ask["time"]) >= 500
        assert await run.hub.expire() == 0 and len(rig.of("attention.timeout")) == 1  # once
        late = await rig.command("control.attention.respond", S, {"answer": {"option": "allow"}},
                                 subject=ask["id"])
        assert late["type"] == "control.rejected"
        n.cancel_scope.cancel()


def _ms(stamp: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000
