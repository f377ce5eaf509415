"""The ack gate (issue 25 row 6, ``supervisor/relay/acks.py``) on the
in-process paths: a fleet bridge (``LocalEmitter``) acks through the
trusted path as before; an ack of a command routed to another connection,
or a second decision, is refused, from any party."""
from __future__ import annotations

import json

import pytest

from bridges.core.aep import dumps
from supervisor.relay.acks import AckRefused
from supervisor.relay.core import Relay
from tests.unit.relay.test_relay_core import cmd, ev, hello, take, ws


def ack(seq, cause, type="control.accepted", **kw):
    return ev(seq, type=type, cause=cause, id=kw.pop("id", f"ack-{cause}-{seq}"), **kw)


async def _routed(relay: Relay, target_deliver):
    bridge = relay.attach_emitter(hello(), target_deliver)
    bridge.ingest_stamped(ev(1), dumps(ev(1)))
    sender = await ws(relay)
    await sender.handle_text(json.dumps(cmd()))
    assert await take(sender.outlet) == []
    return bridge, sender


async def test_a_bridge_acks_its_routed_command_through_the_trusted_path():
    got = []

    async def deliver(c):
        got.append(c)

    relay = Relay(token="t")
    bridge, _ = await _routed(relay, deliver)
    assert [c["id"] for c in got] == ["C1"]
    a = ack(2, "C1")
    pairs = [(ev(3), dumps(ev(3))), (a, dumps(a)), (ev(4), dumps(ev(4)))]
    # the run stops at the ack (gated one by one), which passes
    assert bridge.ingest_stamped_run(pairs) == 1
    assert bridge.ingest_stamped(a, dumps(a)) is True
    assert bridge.ingest_stamped_run(pairs, 2) == 3
    assert relay.buffers.held("s1") == 4 and relay.counters["refused_acks"] == 0
    # the recorded ack again (a retried command's recovery) passes
    bridge.ingest_stamped(a, dumps(a))
    # a second, different decision does not
    late = ack(5, "C1", type="control.rejected", data={"reason": "refused"})
    with pytest.raises(AckRefused):
        bridge.ingest_stamped(late, dumps(late))
    assert relay.counters["refused_acks"] == 1


async def test_a_bridge_may_ack_a_command_that_reached_it_another_way():
    relay = Relay(token="t")
    bridge = relay.attach_emitter(hello(), lambda c: None)
    a = ack(1, "via-nats")
    assert bridge.ingest_stamped(a, dumps(a)) is True
    assert relay.counters["refused_acks"] == 0


async def test_an_ack_of_a_command_routed_elsewhere_is_refused_in_process_too():
    relay = Relay(token="t")

    async def deliver(c):
        pass

    await _routed(relay, deliver)
    other = relay.attach_emitter(hello(agent="b"), deliver)
    a = ack(1, "C1", session="s1", agent="b", source="aep://h/agent/b/session/s1")
    with pytest.raises(AckRefused):
        other.ingest_stamped(a, dumps(a))
    assert relay.counters["refused_acks"] == 1
