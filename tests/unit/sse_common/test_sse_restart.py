"""A restart starts clean (issue 7, "run state off bridge objects"): every
run of an :class:`SseBridge` builds its own tracker, receiver, state file and
controller (the :class:`SseRun` handle); the bridge object carries nothing
from one run to the next, and the only thing the second run inherits is
what the first deliberately persisted to disk (open runs, pending asks)."""
from __future__ import annotations

import json
import logging

import httpx
import trio

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.opencode_sse import PROFILE as OC
from bridges.sse_common.bridge import SseBridge, SseRun
from bridges.sse_common.config import SseConfig
from bridges.sse_common.control import ControlGate
from bridges.sse_common.receiver import ReceiverSettings
from supervisor.fleet import run_bridge

OPEN, DONE = "ses_open", "ses_done"


def frame(f: dict) -> str:
    return f"data: {json.dumps({'directory': '/p', 'payload': f})}\n\n"


def user(sid: str, mid: str) -> dict:
    return {"type": "message.updated", "properties": {
        "sessionID": sid, "info": {"id": mid, "role": "user"}}}


FIRST_STREAM = "".join(frame(f) for f in [
    user(OPEN, "msg_1"),
    {"type": "permission.asked", "properties": {
        "id": "per_1", "sessionID": OPEN, "permission": "bash", "patterns": ["ls"],
        "metadata": {}, "always": [], "tool": {"messageID": "m", "callID": "c"}}},
    user(DONE, "msg_2"),
    {"type": "session.idle", "properties": {"sessionID": DONE}},
    {"type": "server.heartbeat", "properties": {}},
])


class Vendor:
    """The vendor as an httpx transport: ``stream`` is the body of the
    global event stream (``None``: the stream never answers, so the run
    stays exactly as restored); REST reads say the open session is still
    busy with its ask pending."""

    def __init__(self, stream: str | None) -> None:
        self.stream = stream

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/global/event":
            if self.stream is None:
                await trio.sleep_forever()
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=self.stream.encode())
        if path == "/session/status":
            return httpx.Response(200, json={OPEN: {"type": "busy"}})
        if path == "/permission":
            return httpx.Response(200, json=[{"id": "per_1", "sessionID": OPEN,
                                              "permission": "bash", "patterns": ["ls"]}])
        if path in ("/question", "/session") or path.endswith("/message"):
            return httpx.Response(200, json=[])
        return httpx.Response(200, json={})


async def run_once(bridge: SseBridge, vendor: Vendor, until) -> tuple[SseRun, list[dict]]:
    """One run through the fleet's path until ``until(events)``; returns
    the run's handle and the events it emitted."""
    bridge._transport = httpx.MockTransport(vendor)
    out_s, out_r = trio.open_memory_channel(1000)
    _, cmd_r = trio.open_memory_channel(10)
    ctx = BridgeContext(bridge.name, Stamper("opencode", epoch=1, host="t"), out_s, cmd_r,
                        BridgeHealth(), logging.getLogger("t"))
    events: list[dict] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            run = await n.start(run_bridge, bridge, ctx)

            async def collect():
                async for o in out_r:
                    events.append(o.event)
            n.start_soon(collect)
            while not until(run, events):
                await trio.sleep(0.02)
            # what was emitted by then, collected or still queued (the
            # receiver sends without a checkpoint while there is room)
            while True:
                try:
                    events.append(out_r.receive_nowait().event)
                except trio.WouldBlock:
                    break
            n.cancel_scope.cancel()
    return run, events


async def test_a_restart_starts_clean_but_for_what_was_persisted(tmp_path):
    cfg = SseConfig.defaults(OC, primary=True, control=True, token="t", state_dir=tmp_path)
    bridge = SseBridge(OC, cfg, policy=CapturePolicy(),
                       receiver_settings=ReceiverSettings(backoff_initial=0.05, backoff_max=0.1,
                                                          degraded_interval=3600))
    before = dict(vars(bridge))

    def first_done(run, events):
        return any(e["type"] == "attention.requested" for e in events) and \
            any(e["type"] == "run.finished" and e["session"] == DONE for e in events) and \
            run.tracker.counters.get("heartbeats")

    first, events1 = await run_once(bridge, Vendor(FIRST_STREAM), first_done)
    ask_event = next(e for e in events1 if e["type"] == "attention.requested")
    assert set(first.tracker.sessions) >= {OPEN, DONE}
    assert first.tracker.counters and first.receiver.connects >= 1
    assert isinstance(first.controller, ControlGate) and first.controller.tracker is first.tracker
    bridge._transport = before["_transport"]
    assert vars(bridge) == before  # the bridge object holds no run state

    second, events2 = await run_once(bridge, Vendor(None), lambda run, events: True)
    assert second is not first
    assert second.tracker is not first.tracker and second.receiver is not first.receiver
    assert second.controller is not first.controller
    assert second.controller.tracker is second.tracker  # commands see this run's state
    # only the persisted part came back: the open run and its pending ask,
    # with the attention.requested id every answer refers to
    assert list(second.tracker.sessions) == [OPEN]
    [ask] = second.tracker.sessions[OPEN].asks.values()
    assert ask.event_id == ask_event["id"]
    assert second.tracker.open_run(OPEN) == first.tracker.open_run(OPEN)
    # nothing else: no counters, no connection history, nothing emitted again
    assert second.tracker.counters == {} and second.receiver.connects == 0
    assert events2 == []


async def test_a_companion_restart_inherits_nothing(tmp_path):
    cfg = SseConfig.defaults(OC, state_dir=tmp_path)  # companion: nothing is persisted
    bridge = SseBridge(OC, cfg, policy=CapturePolicy(),
                       receiver_settings=ReceiverSettings(backoff_initial=0.05, backoff_max=0.1,
                                                          degraded_interval=3600))
    first, events1 = await run_once(bridge, Vendor(FIRST_STREAM),
                                    lambda run, events: run.tracker.counters.get("heartbeats"))
    assert events1 and first.controller is None
    second, _ = await run_once(bridge, Vendor(None), lambda run, events: True)
    assert list(second.tracker.sessions) == [] and second.tracker.counters == {}
    assert not list(tmp_path.rglob("*.json"))
