"""Reviewer's attack probes (issue 8 review): each test states the
behaviour a hostile or buggy kap-server should get; a red one is a finding."""
from __future__ import annotations

import pytest
import trio

from bridges.kimi_web.receiver import MAX_WOKEN
from tests.integration.kimi_web.test_faults import S, bridge_on, ended, stub_with, turn
from tests.support.kimi_stub import event


def deep(n: int):
    v: object = "x"
    for _ in range(n):
        v = [v]
    return v


async def test_deep_json_at_full_capture_does_not_kill_the_attachment(tmp_path):
    stub = stub_with([turn(1), event("tool.call.started", S, 2, toolCallId="c1", name="Bash",
                                     args={"command": deep(900)}),
                      event("tool.result", S, 3, toolCallId="c1", output=deep(900)),
                      ended(4), ("hang",)])
    async with bridge_on(stub, tmp_path, capture="full") as h:
        await h.until(lambda: h.of("run.finished"), "the run after the deep frames")
        assert stub.connections == 1, h.counters()


async def test_lone_surrogates_do_not_kill_the_attachment(tmp_path):
    stub = stub_with([turn(1), event("tool.call.started", S, 2, toolCallId="c\ud800", name="Ba\udfffsh",
                                     args={"command": "echo \ud800"}),
                      event("tool.result", S, 3, toolCallId="c\ud800", output="o\udc00"),
                      ended(4), ("hang",)])
    async with bridge_on(stub, tmp_path, capture="full") as h:
        await h.until(lambda: h.of("run.finished"), "the run after the surrogates")
        assert stub.connections == 1, h.counters()


@pytest.mark.parametrize("acks", ["prompt", "late"])
async def test_frames_for_unknown_sessions_do_not_grow_state_without_bound(tmp_path, acks):
    """3000 sessions announced by frames alone: at most MAX_WOKEN of them are
    followed, in every per-session structure. ``late``: the server acks the
    subscriptions only after the whole flood (what a loaded machine does at
    random), so every eviction happens while the evicted session's ack is
    still on its way; that ack must not bring the session back."""
    n = 3000
    flood = [event("turn.started", f"session_flood_{i}", 1, turnId=0, promptId=f"p{i}",
                   origin={"kind": "user"}) for i in range(n)]
    script = [("hold_acks",), *flood, ("release_acks",)] if acks == "late" else flood
    stub = stub_with(script + [turn(1), ended(2), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        r = h.run.receiver
        await h.until(lambda: h.of("run.finished") and not r._pending_subs,
                      "the real session's run and every subscription answered", timeout=60)
        bound = MAX_WOKEN + 1  # the woken ones and the listed one
        sizes = {"tracked": len(h.run.tracker.sessions), "subscribed": len(r.subscribed),
                 "woken": len(r._woken), "held": len(r._held), "held_bytes": len(r._held_bytes),
                 "held_cut": len(r._held_cut), "no_cursor": len(r._no_cursor),
                 "dormant": len(r.dormant), "pending": sum(map(len, r._pending_subs.values()))}
        assert max(sizes.values()) <= bound and sizes["woken"] == MAX_WOKEN, sizes
        assert set(h.run.tracker.sessions) <= r.subscribed | r._listed, sizes
        evicted = h.counters()["sessions_evicted"]
        assert evicted == n - MAX_WOKEN, h.counters()
        unsubscribed = [f for f in stub.received if f.get("type") == "unsubscribe"]
        assert len(unsubscribed) == evicted


async def test_acks_for_sessions_never_subscribed_hold_no_state(tmp_path):
    """A server whose subscribe acks also accept sessions the bridge never
    asked for: nothing of them is tracked or subscribed."""
    stub = stub_with([turn(1), ended(2), ("hang",)])
    stub.ack_also = [f"session_ghost_{i}" for i in range(50)]
    async with bridge_on(stub, tmp_path) as h:
        r = h.run.receiver
        await h.until(lambda: h.of("run.finished") and not r._pending_subs, "the real session's run")
        assert set(h.run.tracker.sessions) == {S}, sorted(h.run.tracker.sessions)[:5]
        assert r.subscribed == {S} and not r._held


async def test_tiny_heartbeat_does_not_turn_into_a_reconnect_storm(tmp_path):
    stub = stub_with([turn(1), ended(2), ("hang",)], heartbeat_ms=1)
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"))
        await trio.sleep(5)
        assert stub.connections <= 3, (stub.connections, len(stub.rest))
