"""Tenth outside attack on issue 25, finding 1: every open ask kept its
whole vendor moment (8 ``PermissionRequest`` of 4 MiB bodies of ``[[],...]``
took 800 MiB) and every later moment re-digested each open ask's full
input (0.67 s a moment with 6 asks open); open asks had no cap. An ask now
keeps only what its reply and its matching need, matches on the print it
made once, and a session (and a bridge) keeps a bounded number open."""
from __future__ import annotations

import trio

import bridges.hooks_common.hub as hub_mod
import bridges.hooks_common.session as session_mod
from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.hooks_common.config import HookConfig
from bridges.hooks_common.session import ASKS_MAX
from tests.support.hooks import Rig

S = "sess-asks"


def m(event, sid=S, **kw):
    return {"hook_event_name": event, "session_id": sid, **kw}


def _reach(root, limit=100_000):
    """The ids of the containers and strings reachable from ``root``'s fields
    through dicts, lists, tuples (bounded walk)."""
    seen: dict[int, object] = {}
    todo = list(vars(root).values())
    while todo and len(seen) < limit:
        v = todo.pop()
        if id(v) in seen:
            continue
        if isinstance(v, dict):
            seen[id(v)] = v
            todo += list(v.keys()) + list(v.values())
        elif isinstance(v, (list, tuple)):
            seen[id(v)] = v
            todo += list(v)
        elif isinstance(v, str):
            seen[id(v)] = v
    return seen


async def test_an_open_ask_keeps_nothing_of_a_big_input():
    big = [[] for _ in range(20_000)]
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        run = await rig.start(n)
        await rig.post(m("UserPromptSubmit"))
        await rig.post(m("PermissionRequest", tool_name="mcp__x", tool_input={"x": big},
                         permission_suggestions=[{"big": big}]))
        st = run.hub.sessions.get(S)
        (ask,) = st.open_asks()
        reached = _reach(ask)
        # the posted JSON was parsed afresh: look for any list of that size
        assert not any(isinstance(v, list) and len(v) >= 1_000 for v in reached.values())
        assert len(reached) < 200, len(reached)
        n.cancel_scope.cancel()


async def test_a_moment_does_not_digest_the_open_asks_inputs_again(monkeypatch):
    rig = Rig(CLAUDE, HookConfig())
    calls: list[object] = []
    real = session_mod.digest
    async with trio.open_nursery() as n:
        run = await rig.start(n)
        await rig.post(m("UserPromptSubmit"))
        for i in range(6):
            await rig.post(m("PermissionRequest", tool_name="Bash",
                             tool_input={"x": [[i] for _ in range(5_000)]}))
        assert len(run.hub.sessions.get(S).open_asks()) == 6

        def counting(value):
            calls.append(value)
            return real(value)

        monkeypatch.setattr(session_mod, "digest", counting)
        await rig.post(m("PostToolUse", tool_name="Bash", tool_input={"x": 1},
                         tool_response={"ok": True}))
        monkeypatch.setattr(session_mod, "digest", real)
        assert len(run.hub.sessions.get(S).open_asks()) == 6  # none of them was this call
        n.cancel_scope.cancel()
    # the moment's own input printed once; never an open ask's kept input
    assert not any(isinstance(v, list) for v in calls), [type(v) for v in calls]


async def test_past_the_cap_the_oldest_ask_is_dismissed():
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        run = await rig.start(n)
        await rig.post(m("UserPromptSubmit"))
        for i in range(ASKS_MAX + 3):
            await rig.post(m("PermissionRequest", tool_name="Bash",
                             tool_input={"command": f"echo {i}"}))
        assert len(run.hub.sessions.get(S).open_asks()) == ASKS_MAX
        asked = [e["id"] for e in rig.of("attention.requested")]
        resolved = rig.of("attention.resolved")  # before the run's end dismisses the rest
        n.cancel_scope.cancel()
    assert [e["subject"] for e in resolved] == asked[:3]
    assert {e["data"]["resolution"] for e in resolved} == {"dismissed"}


async def test_past_the_bridge_cap_the_oldest_ask_of_any_session_is_dismissed(monkeypatch):
    monkeypatch.setattr(hub_mod, "ASKS_TOTAL_MAX", 4)
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        run = await rig.start(n)
        for sid in ("s-a", "s-b", "s-c"):
            await rig.post(m("UserPromptSubmit", sid))
            for i in range(2):
                await rig.post(m("PermissionRequest", sid, tool_name="Bash",
                                 tool_input={"command": f"echo {i}"}))
        assert sum(len(s.open_asks()) for s in run.hub.sessions.all()) == 4
        asked = [e["id"] for e in rig.of("attention.requested")]
        resolved = [e["subject"] for e in rig.of("attention.resolved")]
        n.cancel_scope.cancel()
    assert resolved == asked[:2]


async def test_a_held_forms_reply_still_echoes_its_input():
    """What the reply reads survives (Claude Code's ``AskUserQuestion``
    answer is ``updatedInput``: the input and its answers)."""
    from bridges.hooks_common.answers import Decision
    q = {"questions": [{"question": "Which?", "header": "Pick", "multiSelect": False,
                        "options": [{"label": "a", "description": ""},
                                    {"label": "b", "description": ""}]}]}
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        run = await rig.start(n)
        await rig.post(m("UserPromptSubmit"))
        await rig.post(m("PermissionRequest", tool_name="AskUserQuestion", tool_input=q))
        (ask,) = run.hub.sessions.get(S).open_asks()
        out = CLAUDE.reply(ask.reply_moment(), Decision("submit", values={"Which?": "b"}))
        n.cancel_scope.cancel()
    updated = out["hookSpecificOutput"]["decision"]["updatedInput"]
    assert updated["questions"] == q["questions"] and "answers" in updated
