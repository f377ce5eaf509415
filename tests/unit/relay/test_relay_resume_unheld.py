"""Resume from a position of a session the relay holds nothing of (AEP-0003
§3.3 item 3, §5): e.g. a relay restarted empty, the emitter not yet re-sent.
Replay cannot judge the position, so the subscription waits for the
session's first event past it: the exact next one (same epoch, seq + 1)
passes silently; anything later (a gap, a later epoch) is preceded by
``replay-exhausted`` with ``earliest`` = that event's position, once.
Events at or before the position are forwarded as received (live fan-out
never dedupes, §5) and leave it waiting. Never for replay-all."""
from __future__ import annotations

import json

import trio

from supervisor.relay.attrmatch import Filter
from supervisor.relay.core import Relay

from .test_relay_core import ev, take, ws

S = "ses-x"
EPOCH = 2


def post(relay: Relay, *seqs: int, epoch: int = EPOCH, session: str = S) -> None:
    relay.ingest_http([relay.entry(ev(s, session=session, epoch=epoch, id=f"{session}-{epoch}-{s}"))
                       for s in seqs])


def sse_wire(chunks) -> list[str]:
    """The stream in wire order: ``"# <comment>"`` or the event's ``id``."""
    text = b"".join(c for c in chunks if isinstance(c, bytes)).decode()
    out = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith(":"):
                out.append("#" + line[1:])
            elif line.startswith("id: "):
                out.append(line[4:])
    return out


def stream(relay: Relay, positions, *, plan_all: bool = False, live: bool = True, flt=None):
    return relay.open_stream(Filter(flt or {}), None, plan_all=plan_all,
                             positions=positions, live=live)


async def test_sse_gap_after_the_position_gets_one_marker_before_the_first_event():
    relay = Relay()
    outlet = stream(relay, [(S, (EPOCH, 5))])
    assert relay.fanout.pending == 1
    post(relay, 8, 9)
    post(relay, 11)  # a later hole is no exhaustion (as in replay): no second marker
    assert sse_wire(await take(outlet)) == [
        f"# replay-exhausted {S} {EPOCH}:8", f"{S}:{EPOCH}:8", f"{S}:{EPOCH}:9", f"{S}:{EPOCH}:11"]
    assert relay.fanout.pending == 0 and relay.counters["replay_exhausted_late"] == 1


async def test_sse_the_exact_next_event_resolves_without_a_marker():
    relay = Relay()
    outlet = stream(relay, [(S, (EPOCH, 5))])
    post(relay, 6, 8)
    wire = sse_wire(await take(outlet))
    assert wire == [f"{S}:{EPOCH}:6", f"{S}:{EPOCH}:8"]
    assert relay.fanout.pending == 0 and relay.counters["replay_exhausted_late"] == 0


async def test_sse_events_at_or_before_the_position_are_forwarded_and_keep_it_waiting():
    relay = Relay()
    outlet = stream(relay, [(S, (EPOCH, 5))])
    post(relay, 3, 4, 5)  # an emitter re-sending from its start: no gap evidence yet
    post(relay, 1, epoch=EPOCH - 1)  # an earlier epoch: before the position too
    assert relay.fanout.pending == 1
    post(relay, 9)
    assert sse_wire(await take(outlet)) == [
        f"{S}:{EPOCH}:3", f"{S}:{EPOCH}:4", f"{S}:{EPOCH}:5", f"{S}:{EPOCH - 1}:1",
        f"# replay-exhausted {S} {EPOCH}:9", f"{S}:{EPOCH}:9"]


async def test_sse_a_later_epoch_is_a_gap():
    relay = Relay()
    outlet = stream(relay, [(S, (EPOCH, 5))])
    post(relay, 0, 1, epoch=EPOCH + 1)
    assert sse_wire(await take(outlet)) == [
        f"# replay-exhausted {S} {EPOCH + 1}:0", f"{S}:{EPOCH + 1}:0", f"{S}:{EPOCH + 1}:1"]


async def test_replay_all_and_plain_live_never_wait_or_mark():
    relay = Relay()
    every = stream(relay, None, plan_all=True)
    plain = stream(relay, None)
    assert relay.fanout.pending == 0
    post(relay, 8, 9)
    for outlet in (every, plain):
        assert sse_wire(await take(outlet)) == [f"{S}:{EPOCH}:8", f"{S}:{EPOCH}:9"]


async def test_replay_only_waits_for_nothing():
    relay = Relay()
    outlet = stream(relay, [(S, (EPOCH, 5))], live=False)
    assert relay.fanout.pending == 0
    post(relay, 8)
    out = await take(outlet)
    assert sse_wire(out) == ["# replay-complete"] and out[-1] == ("END", True)


async def test_a_held_or_remembered_session_is_replay_s_business_not_pending():
    relay = Relay(buffer=2, max_sessions=1)
    post(relay, 0, 1, 2, 3)  # held from 2
    held = stream(relay, [(S, (EPOCH, 0))])
    assert relay.fanout.pending == 0
    assert sse_wire(await take(held)) == [
        f"# replay-exhausted {S} {EPOCH}:2", f"{S}:{EPOCH}:2", f"{S}:{EPOCH}:3"]
    post(relay, 0, session="other")  # evicts S wholly; the relay remembers it
    gone = stream(relay, [(S, (EPOCH, 1))])
    assert relay.fanout.pending == 0
    assert sse_wire(await take(gone)) == [f"# replay-exhausted {S} {EPOCH}:4"]


async def test_only_waiting_subscribers_get_the_marker_and_each_once():
    relay = Relay()
    a = stream(relay, [(S, (EPOCH, 5)), ("ses-y", (0, 0))])
    b = stream(relay, [(S, (EPOCH, 7))])
    c = stream(relay, None)
    assert relay.fanout.pending == 3
    post(relay, 8, 9)
    assert sse_wire(await take(a)) == [f"# replay-exhausted {S} {EPOCH}:8",
                                       f"{S}:{EPOCH}:8", f"{S}:{EPOCH}:9"]
    assert sse_wire(await take(b)) == [f"{S}:{EPOCH}:8", f"{S}:{EPOCH}:9"]  # 8 is b's next
    assert sse_wire(await take(c)) == [f"{S}:{EPOCH}:8", f"{S}:{EPOCH}:9"]
    assert relay.fanout.pending == 1  # a still waits on ses-y


async def test_the_verdict_ignores_the_filter_as_replay_s_does():
    # what the relay holds decides, not what this subscriber is shown
    relay = Relay()
    outlet = stream(relay, [(S, (EPOCH, 5))], flt={"type": "tool.started"})
    relay.ingest_http([relay.entry(ev(8, session=S, epoch=EPOCH, id="a")),
                       relay.entry(ev(9, session=S, epoch=EPOCH, id="b", type="tool.started"))])
    assert sse_wire(await take(outlet)) == [f"# replay-exhausted {S} {EPOCH}:8", f"{S}:{EPOCH}:9"]


async def test_ws_marker_frame_precedes_the_event_and_follows_the_replay():
    relay = Relay()
    post(relay, 0, 1, session="held", epoch=0)
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "r", "from": [
        {"session": "held", "epoch": 0, "seq": 0}, {"session": S, "epoch": EPOCH, "seq": 5}]}))
    post(relay, 8)
    out = await take(conn.outlet)
    assert out[0] == {"type": "subscribed", "id": "r"}
    assert (out[1]["session"], out[1]["seq"]) == ("held", 1)  # the replay first
    assert out[2] == {"type": "replay-exhausted", "sub": "r", "session": S,
                      "earliest": {"epoch": EPOCH, "seq": 8}}
    assert (out[3]["session"], out[3]["seq"]) == (S, 8)
    assert len(out) == 4


async def test_ws_next_event_and_replay_all_get_no_marker():
    relay = Relay()
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "n", "from": [
        {"session": S, "epoch": EPOCH, "seq": 5}]}))
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "all", "from": "all"}))
    post(relay, 6, 7)
    out = await take(conn.outlet)
    assert [f["type"] for f in out] == ["subscribed", "subscribed"] + ["tool.completed"] * 4
    assert relay.counters["replay_exhausted_late"] == 0


async def test_ws_later_epoch_marker():
    relay = Relay()
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": 7, "from": [
        {"session": S, "epoch": EPOCH, "seq": 5}]}))
    post(relay, 0, epoch=EPOCH + 1)
    out = await take(conn.outlet)
    assert out[1] == {"type": "replay-exhausted", "sub": 7, "session": S,
                      "earliest": {"epoch": EPOCH + 1, "seq": 0}}
    assert out[2]["seq"] == 0 and len(out) == 3


async def test_waiting_positions_go_with_the_subscription():
    relay = Relay()
    conn = await ws(relay)
    frm = [{"session": f"s{i}", "epoch": 0, "seq": 1} for i in range(3)]
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "r", "from": frm}))
    assert relay.fanout.pending == 3
    # replaced: the new subscription waits on its own positions only
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "r", "from": frm[:1]}))
    assert relay.fanout.pending == 1
    await conn.handle_text(json.dumps({"type": "unsubscribe", "id": "r"}))
    assert relay.fanout.pending == 0
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "q", "from": frm}))
    conn.close()
    assert relay.fanout.pending == 0
    outlet = stream(relay, [(S, (EPOCH, 5))])
    outlet.terminate("slow-consumer")  # shed: detached
    assert relay.fanout.pending == 0
    post(relay, 9)
    await trio.lowlevel.checkpoint()
    assert relay.counters["replay_exhausted_late"] == 0


async def test_a_session_named_twice_waits_from_its_earliest_position():
    relay = Relay()
    outlet = stream(relay, [(S, (EPOCH, 7)), (S, (EPOCH, 5))])
    assert relay.fanout.pending == 1
    post(relay, 7)  # past 5 but not its next: the conservative verdict
    assert sse_wire(await take(outlet)) == [f"# replay-exhausted {S} {EPOCH}:7", f"{S}:{EPOCH}:7"]


async def test_a_marker_that_sheds_its_consumer_ends_the_wait_of_its_other_subscriptions():
    # two subscriptions of one WebSocket wait on S; the first marker passes the
    # hard bound: the consumer is shed (closing, 1013) mid-resolution, the ingest goes on
    relay = Relay(queue_soft_bytes=10, queue_hard_bytes=100)
    conn = await ws(relay)
    for sid in ("a", "b"):
        await conn.handle_text(json.dumps({"type": "subscribe", "id": sid, "from": [
            {"session": S, "epoch": EPOCH, "seq": 5}]}))
    assert relay.fanout.pending == 2
    post(relay, 9)
    assert relay.fanout.pending == 0 and relay.counters["streams_terminated"] == 1
    out = await take(conn.outlet)
    assert out[0]["type"] == "closing" and out[-1] == ("END", (1013, "slow-consumer"))
    assert relay.buffers.held(S) == 1
