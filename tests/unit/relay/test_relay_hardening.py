"""Issue 10, the relay's own rules, without sockets (the black-box versions
are ``tests/integration/hardening/``): replaced subscriptions stop their
replay (#3), stuck consumers are shed and draining ones are not (#7), a
live emitter's source is its own (#8), a conflicting (source, id) is
refused and never delivered (#14)."""
from __future__ import annotations

import json

import pytest
import trio

from supervisor.relay import InvalidEvent, Relay
from tests.unit.relay.test_relay_core import ev, hello, take, ws


async def _noop(_cmd):
    return None


async def test_replacing_a_subscription_abandons_its_queued_replay():
    relay = Relay()
    em = relay.attach_emitter(hello(), _noop)
    for i in range(3000):
        await em.ingest(ev(i))
    conn = await ws(relay)
    for _ in range(50):
        await conn.handle_text(json.dumps({"type": "subscribe", "id": "a", "from": "all"}))
    frames = await take(conn.outlet)
    events = [f for f in frames if isinstance(f, dict) and f.get("type") == "tool.completed"]
    # only the last subscription's replay runs to the end (earlier ones stop
    # within their first chunk)
    assert 3000 <= len(events) < 3000 + 49 * 300, len(events)
    assert [f["id"] for f in frames if f.get("type") == "subscribed"] == ["a"] * 50


async def test_a_stuck_writer_is_shed_and_a_draining_one_is_not(autojump_clock):
    relay = Relay(stuck_s=10.0)
    em = relay.attach_emitter(hello(), _noop)
    stuck = await ws(relay)
    await stuck.handle_text(json.dumps({"type": "subscribe", "id": "a"}))
    await take(stuck.outlet)
    killed = []
    stuck.outlet.abort = lambda: killed.append(True)
    stuck.outlet.in_send, stuck.outlet.send_started = True, trio.current_time()
    await em.ingest(ev(0))
    await trio.sleep(5)
    await em.ingest(ev(1))
    assert stuck.outlet.state == "open"  # blocked 5 s: slow, not stuck yet
    await trio.sleep(6)
    await em.ingest(ev(2))
    assert stuck.outlet.state == "terminated" and killed == [True]
    assert relay.counters["streams_terminated"] == 1

    healthy = await ws(relay)
    await healthy.handle_text(json.dumps({"type": "subscribe", "id": "b"}))
    await take(healthy.outlet)
    for i in range(3, 30):
        healthy.outlet.in_send, healthy.outlet.send_started = True, trio.current_time()
        await em.ingest(ev(i))
        await trio.sleep(5)  # every send completes within 5 s: draining
        healthy.outlet.in_send = False
    assert healthy.outlet.state == "open"


async def test_a_live_emitters_source_is_refused_to_everyone_else():
    relay = Relay()
    bridge = relay.attach_emitter(hello(agent="a"), _noop)
    await bridge.ingest(ev(0))
    forged = relay.entry(ev(1, id="forged"))
    assert relay.check_batch([forged]) is not None  # POST /events
    other = await ws(relay, role="emitter", agent="a")
    await other.handle_text(json.dumps(ev(1, id="forged2")))
    (err,) = await take(other.outlet)
    assert err["code"] == "invalid-event" and "connected emitter" in err["detail"]
    await bridge.ingest(ev(1))  # the owner still may
    assert relay.counters["refused_owned_source"] == 2
    bridge.close()  # once the owner is gone, the source is free again
    assert relay.check_batch([relay.entry(ev(5, id="later"))]) is None


async def test_a_conflicting_duplicate_is_refused_and_a_redelivery_passes():
    relay = Relay()
    first = ev(0, data={"exit_code": 0})
    assert relay.check_batch([relay.entry(first)]) is None
    relay.ingest_http([relay.entry(first)])
    other = {**first, "data": {"exit_code": 1}}
    problem = relay.check_batch([relay.entry(other)])
    assert problem is not None and "(source, id)" in problem[1]
    reordered = dict(reversed(list(first.items())))
    assert relay.check_batch([relay.entry(reordered)]) is None  # same content
    a, b = ev(7), {**ev(7), "data": {"exit_code": 3}}
    assert relay.check_batch([relay.entry(a), relay.entry(b)]) is not None  # within a batch
    conn = await ws(relay, role="emitter", agent="a")
    await conn.handle_text(json.dumps(other))
    (err,) = await take(conn.outlet)
    assert err["code"] == "invalid-event"
    with pytest.raises(InvalidEvent):
        await relay.attach_emitter(hello(agent="a", ), _noop).ingest(other)


async def test_true_for_1_or_1_0_for_true_is_other_content_not_a_redelivery():
    """Python's ``True == 1 == 1.0`` let changed content pass as a
    redelivery (fresh-user review): JSON values of other types differ."""
    relay = Relay()
    first = ev(0, data={"exit_code": 1, "ok": False})
    relay.ingest_http([relay.entry(first)])
    for changed in ({"exit_code": True, "ok": False}, {"exit_code": 1, "ok": 0}):
        problem = relay.check_batch([relay.entry({**first, "data": changed})])
        assert problem is not None and "(source, id)" in problem[1], changed
    same_number = {**first, "data": {"exit_code": 1.0, "ok": False}}  # one JSON number
    assert relay.check_batch([relay.entry(same_number)]) is None


async def test_one_source_over_two_sessions_cannot_hold_one_id_twice():
    """``source`` need not name the session (AEP-0001 §5.1 #6 only
    recommends it) and consumers dedupe on ``(source, id)``: the same id
    under another session of that source is other content, refused, on
    POST and on a socket (fresh-user review: both were accepted, and
    consumers dropped the second, real event)."""
    relay = Relay()
    shared = "aep://h/agent/shared"
    first = ev(0, session="xs1", id="X", source=shared, data={"v": 1})
    relay.ingest_http([relay.entry(first)])
    again = ev(0, session="xs2", id="X", source=shared, data={"v": 2})
    problem = relay.check_batch([relay.entry(again)])
    assert problem is not None and "(source, id)" in problem[1]
    conn = await ws(relay, role="emitter", agent="a")
    await conn.handle_text(json.dumps(again))
    (err,) = await take(conn.outlet)
    assert err["code"] == "invalid-event"
    other_id = ev(0, session="xs2", id="Y", source=shared)
    assert relay.check_batch([relay.entry(other_id)]) is None  # a new id is fine
    relay.ingest_http([relay.entry(other_id)])
    assert relay.check_batch([relay.entry(ev(1, session="xs2", id="Z", source=shared))]) is None
    assert relay.check_batch([relay.entry(first)]) is None  # its own redelivery still passes


async def test_a_fleet_bridges_sources_are_its_own_before_its_first_event():
    """Fifth outside attack on issue 25: posts under the Claude Code
    bridge's agent-scoped source (``aep://{host}/agent/claude-code``, its
    ``agent.idle``'s) in fresh sessions were accepted, before and after the
    bridge used it. Every source at or under a fleet bridge's base is the
    fleet's from the attach on: refused to a post and to a ``/socket``
    emitter, counted ``refused_owned_source``; the bridge itself may."""
    base = "aep://vm/agent/claude-code"
    relay = Relay()
    bridge = relay.attach_emitter(hello(agent="claude-code"), _noop, source_base=base)
    for i, source in enumerate([base, base + "/session/fresh", "AEP://VM/agent/claude-code"]):
        forged = relay.entry(ev(1, session=f"probe-{i}", source=source, agent="claude-code"))
        assert relay.check_batch([forged]) is not None, source  # POST /events
    other = await ws(relay, role="emitter", agent="claude-code")
    await other.handle_text(json.dumps(ev(1, session="probe-ws", source=base, agent="claude-code")))
    (err,) = await take(other.outlet)
    assert err["code"] == "invalid-event" and "bridge of this daemon" in err["detail"]
    assert relay.counters["refused_owned_source"] == 4
    # a look-alike that is not under the base is someone else's
    assert relay.check_batch([relay.entry(ev(1, session="x", source=base + "-fan"))]) is None
    # the bridge's own events under it (the agent-scoped one has no seq)
    await bridge.ingest(ev(1, session="real", source=base + "/session/real", agent="claude-code"))
    await bridge.ingest({"aep": "0.1", "id": "idle-1", "type": "agent.idle", "source": base,
                         "agent": "claude-code", "time": "2026-07-03T10:00:00Z"})
    assert relay.counters["refused_owned_source"] == 4
