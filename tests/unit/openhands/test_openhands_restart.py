"""A restart starts clean (issue 7): each run of an :class:`OpenHandsBridge`
builds its own receiver (and, gated on, its own controller bound to that
receiver) in an :class:`OpenHandsRun`; nothing of a run stays on the bridge
object. (What is persisted per conversation and restored on reattach is
proven against the real server in
``tests/integration/openhands/test_openhands_real.py``.)"""
from __future__ import annotations

import logging

import trio

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.openhands import OpenHandsRun, from_env
from bridges.openhands.control import OpenHandsControl
from bridges.openhands.conversation import Conversation, Settling
from supervisor.fleet import run_bridge


async def one_run(bridge, poke=None) -> OpenHandsRun:
    out_s, _out_r = trio.open_memory_channel(100)
    _, cmd_r = trio.open_memory_channel(10)
    ctx = BridgeContext(bridge.name, Stamper(bridge.agent, epoch=1, host="t"), out_s, cmd_r,
                        BridgeHealth(), logging.getLogger("t"))
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            run = await n.start(run_bridge, bridge, ctx)
            if poke is not None:
                poke(run)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
    return run


async def test_each_run_has_its_own_receiver_and_controller(tmp_path):
    # nobody listens on port 1: discovery fails and backs off; no vendor needed
    bridge = from_env({"AEP_OPENHANDS_URL": "http://127.0.0.1:1", "AEP_OPENHANDS_CONTROL": "1",
                       "AEP_TOKEN": "t", "AEP_STATE_DIR": str(tmp_path)}, policy=CapturePolicy())
    before = dict(vars(bridge))

    def plant(run: OpenHandsRun) -> None:  # runtime state a run accumulates
        conv = Conversation("c1", status="running")
        conv.notes["pause"] = "cmd-1"
        conv.settling = Settling("cmd-2", {"option": "approve"})
        run.receiver.conversations["c1"] = conv

    first = await one_run(bridge, plant)
    assert vars(bridge) == before  # the bridge object holds no run state
    second = await one_run(bridge)
    assert isinstance(first.controller, OpenHandsControl)
    assert isinstance(second.controller, OpenHandsControl)
    assert second.receiver is not first.receiver and second.controller is not first.controller
    assert second.controller.receiver is second.receiver
    assert "c1" in first.receiver.conversations
    assert second.receiver.conversations == {}  # no notes, no settling mark, no conversation


async def test_gated_off_a_run_has_no_controller(tmp_path):
    bridge = from_env({"AEP_OPENHANDS_URL": "http://127.0.0.1:1", "AEP_STATE_DIR": str(tmp_path)},
                      policy=CapturePolicy())
    run = await one_run(bridge)
    assert run.controller is None and run.receiver.decorate is None
