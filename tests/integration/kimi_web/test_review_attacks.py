"""Reviewer's attack probes (issue 8 review): each test states the
behaviour a hostile or buggy kap-server should get; a red one is a finding."""
from __future__ import annotations

import pytest
import trio

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


@pytest.mark.xfail(strict=False, reason="KNOWN BUG (issue 8 review finding 3): under load the tracker can hold more sessions than the 500-session wake cap (seen 1059 > 1000 in one clean-clone run); subscriptions stay bounded")
async def test_frames_for_unknown_sessions_do_not_grow_state_without_bound(tmp_path):
    n = 3000
    flood = [event("turn.started", f"session_flood_{i}", 1, turnId=0, promptId=f"p{i}",
                   origin={"kind": "user"}) for i in range(n)]
    stub = stub_with(flood + [turn(1), ended(2), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"), "the real session's run", timeout=60)
        subscribed = len(h.run.receiver.subscribed)
        tracked = len(h.run.tracker.sessions)
        assert subscribed <= 1000 and tracked <= 1000, (subscribed, tracked)


async def test_tiny_heartbeat_does_not_turn_into_a_reconnect_storm(tmp_path):
    stub = stub_with([turn(1), ended(2), ("hang",)], heartbeat_ms=1)
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"))
        await trio.sleep(5)
        assert stub.connections <= 3, (stub.connections, len(stub.rest))
