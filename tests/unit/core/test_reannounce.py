"""``BridgeContext.reannounce``: after a daemon restart a bridge re-sends the
envelopes its state file restored as open, byte-identically and marked
``redelivery`` (review of issue 8, finding 1)."""
from __future__ import annotations

import logging

import trio

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.envelope import Stamper


async def test_reannounce_resends_this_bridges_envelopes_in_order_and_skips_the_rest():
    out_s, out_r = trio.open_memory_channel(100)
    _cmd_s, cmd_r = trio.open_memory_channel(1)
    old = Stamper("kimi-code", epoch=1, host="h")  # the previous daemon run
    run = old.stamp("s1", {"type": "run.started", "data": {}}, run="r1")
    ask = old.stamp("s1", {"type": "attention.requested", "data": {"kind": "permission"}}, run="r1")
    other = old.stamp("s2", {"type": "run.started", "data": {}}, run="r2")
    foreign = Stamper("opencode", epoch=1, host="h").stamp("s3", {"type": "run.started"}, run="r3")
    elsewhere = Stamper("kimi-code", epoch=1, host="other").stamp("s4", {"type": "run.started"})
    health = BridgeHealth()
    ctx = BridgeContext("kimi_web", Stamper("kimi-code", epoch=2, host="h"), out_s, cmd_r, health,
                        logging.getLogger("t"))
    garbage = [None, "x", {"id": "1"}, {**ask, "seq": "0"}, foreign, elsewhere]
    n = await ctx.reannounce([ask, other, *garbage, run])
    sent = [out_r.receive_nowait() for _ in range(n)]
    assert [o.event for o in sent] == [run, ask, other]  # (session, epoch, seq) order
    assert all(o.redelivery and o.bridge == "kimi_web" for o in sent)
    assert sent[0].event is run  # verbatim: the very envelope, not a re-stamp
    assert health.counters["reannounced"] == 3 and health.counters["reannounce_skipped"] == len(garbage)
    assert ctx.log_mark() == 0  # not a first delivery: the session log is not written again
