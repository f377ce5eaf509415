"""The JetStream sink on a 3-node cluster with an R3 stream (issue 14): a
node killed mid-stream and the stream leader changing while a bridge keeps
emitting through a small outbox: nothing at notice+ is lost, per-session
order is kept, and the only missing events are debug/info ones, each
counted as a drop."""
from __future__ import annotations

from collections import Counter

import trio

from supervisor.jetstream.link import open_link
from tests.integration.jetstream.fleet_support import (
    BurstBridge,
    decoded,
    running_fleet,
)
from tests.support.nats import NatsCluster, stream_messages


async def _leader(c: NatsCluster, stream: str) -> str:
    with trio.fail_after(30):
        while True:
            got = await trio.to_thread.run_sync(c.stream_leader, stream)
            if got:
                return got
            await trio.sleep(0.1)


async def test_leader_killed_mid_stream_loses_no_notice_and_keeps_order(tmp_path) -> None:
    with NatsCluster(3, tmp_path) as c:
        bridge = BurstBridge(1500, sessions=6, pace=0.002)
        async with running_fleet(tmp_path, [bridge], c.url, AEP_NATS_REPLICAS="3",
                                 AEP_NATS_OUTBOX="64") as fleet:
            with trio.fail_after(60):
                while len(bridge.emitted) < 400:
                    await trio.sleep(0.02)
            leader = await _leader(c, "AEP")
            await trio.to_thread.run_sync(c.kill, int(leader[1:]))
            await bridge.done.wait()
            pub = fleet.jetstream.publisher
            with trio.fail_after(120):  # every event through the pump, then acked or shed
                while fleet.counters["events"] < 1500 or pub.depth:
                    await trio.sleep(0.05)
            st = pub.stats()
            new_leader = await _leader(c, "AEP")
            async with open_link(fleet.cfg.nats) as link:
                events = decoded(await stream_messages(link, "AEP"))
        assert new_leader != leader
        ids = [e["id"] for e in events]
        assert len(ids) == len(set(ids)), "an event stored twice"
        stored = set(ids)
        missing = [e for e in bridge.emitted if e["id"] not in stored]
        sev = Counter(e.get("severity", "info") for e in missing)
        assert set(sev) <= {"debug", "info"}, f"lost notice+: {sev}"
        # every missing event was counted as a drop; a counted drop may still
        # have been stored: its publish reached the server but the ack was lost
        # in the failover, so the outbox could not know (supervisor/delivery/outbox.py:
        # a rewound entry is shed as unconfirmed). At most one such publish is in
        # flight per session lane in each failed round.
        assert sev["debug"] <= st["dropped_debug"] and sev["info"] <= st["dropped_info"]
        over = st["dropped_debug"] + st["dropped_info"] - sev["debug"] - sev["info"]
        assert over <= st["rounds_failed"] * bridge.sessions, (over, st)
        for s in {e["session"] for e in bridge.emitted}:
            want = [e["id"] for e in bridge.emitted if e["session"] == s and e["id"] in stored]
            assert [e["id"] for e in events if e["session"] == s] == want, f"order of {s}"
        # stored = acked + the stored-but-shed whose ack was lost (the over-count)
        assert st["acked"] + over >= len(events) and st["outbox"] == 0
