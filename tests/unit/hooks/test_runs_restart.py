"""A turn open across a daemon restart (issue 27's trial, finding 1): the
hook bridge keeps its open runs and tool calls in its state file
(:mod:`bridges.hooks_common.runs`), reads them back at start, and the
turn's late ``PostToolUse`` and ``Stop`` pair with and close what the
previous run opened; a restored run whose session never speaks again is
closed ``interrupted``."""
from __future__ import annotations

import json

import trio

from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.codex_hooks.profile import PROFILE as CODEX
from bridges.hooks_common.config import HookConfig
from bridges.hooks_common.runs import entry, restore_entry
from bridges.hooks_common.session import SessionState, input_print
from tests.support.hooks import Rig

S = "sess-r"
BASH = {"tool_name": "Bash", "tool_input": {"command": "ls"}}


def m(event, **kw):
    return {"hook_event_name": event, "session_id": S, "cwd": "/w", **kw}


def test_a_session_entry_round_trips_and_garbage_is_left_out():
    st = SessionState(S, run="run_1", run_started="ev_started", run_t0=1000, last_run="run_0")
    st.last_at = 5000
    st.tools["toolu_1"] = ("ev_req", 2000)
    st.requested.append(("Bash", input_print({"command": "ls"}), "ev_req"))
    doc = json.loads(json.dumps(entry(st)))  # what the state file holds is JSON
    back = SessionState(S)
    assert restore_entry(back, doc)
    assert (back.run, back.run_started, back.run_t0, back.last_run, back.last_at) == \
        ("run_1", "ev_started", 1000, "run_0", 5000)
    assert back.tools == st.tools and back.requested == st.requested
    assert back.requested_id(m("PermissionRequest", **BASH)) == "ev_req"
    assert entry(SessionState(S)) is None  # nothing open: no entry
    hostile = {"run": ["x"], "started": 3, "t0": "1", "tools": {"a": ["ev", 1, 2], "b": "x"},
               "requested": [["Bash", {"k": 1}, "ev"], "x"], "at": True}
    odd = SessionState(S)
    assert not restore_entry(odd, hostile) and not restore_entry(odd, [1])
    assert (odd.run, odd.tools, odd.requested, odd.last_at) == (None, {}, [], 0)


async def _first_daemon(cfg, profile, moments):
    rig = Rig(profile, cfg)
    async with trio.open_nursery() as n:
        await rig.start(n)
        for mo in moments:
            await rig.post(mo)
        n.cancel_scope.cancel()
    return rig.events()


async def test_a_stop_after_a_restart_closes_the_run_the_first_daemon_opened(tmp_path):
    cfg = HookConfig(state_dir=tmp_path)
    before = await _first_daemon(cfg, CLAUDE, [m("UserPromptSubmit", prompt="hi"),
                                               m("PreToolUse", tool_use_id="toolu_1", **BASH)])
    started, requested = before
    assert (tmp_path / CLAUDE.key).is_dir()
    rig = Rig(CLAUDE, cfg)  # the restarted daemon
    async with trio.open_nursery() as n:
        run = await rig.start(n)
        assert rig.ctx.health.counters["runs_restored"] == 1
        await rig.post(m("PostToolUse", tool_use_id="toolu_1", tool_response={"stdout": "x"},
                         **BASH))
        await rig.post(m("Stop"))
        n.cancel_scope.cancel()
    done, fin = rig.events()
    assert done["type"] == "tool.completed" and done["cause"] == requested["id"]
    assert done["run"] == fin["run"] == started["run"]
    assert fin["type"] == "run.finished" and fin["cause"] == started["id"]
    assert isinstance(fin["data"]["duration_ms"], int)
    assert run.hub.sessions.get(S).run is None
    rig2 = Rig(CLAUDE, cfg)  # closed: nothing left to restore
    async with trio.open_nursery() as n:
        await rig2.start(n)
        n.cancel_scope.cancel()
    assert rig2.ctx.health.counters["runs_restored"] == 0


async def test_a_codex_turn_restored_is_not_adopted_twice(tmp_path):
    cfg = HookConfig(state_dir=tmp_path)
    (started,) = await _first_daemon(cfg, CODEX, [m("UserPromptSubmit", turn_id="turn-1")])
    rig = Rig(CODEX, cfg)
    async with trio.open_nursery() as n:
        await rig.start(n)
        await rig.post(m("Stop", turn_id="turn-1"))
        n.cancel_scope.cancel()
    (fin,) = rig.events()
    assert fin["type"] == "run.finished" and fin["run"] == "turn-1" and fin["cause"] == started["id"]


async def test_a_restored_run_whose_session_stays_silent_is_closed_interrupted(tmp_path):
    cfg = HookConfig(state_dir=tmp_path)
    (started,) = await _first_daemon(cfg, CLAUDE, [m("UserPromptSubmit", prompt="hi")])
    rig = Rig(CLAUDE, cfg)
    rig.bridge.restored_idle_s = 0.0
    async with trio.open_nursery() as n:
        await rig.start(n)
        (failed,) = await rig.wait_for("run.failed", 1)
        n.cancel_scope.cancel()
    assert failed["data"]["reason"] == "interrupted" and failed["run"] == started["run"]
    assert failed["cause"] == started["id"]
    assert rig.ctx.health.counters["runs_interrupted"] == 1
    assert rig.types() == ["run.failed"]  # once
