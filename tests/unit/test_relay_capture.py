"""Capture ceilings at fan-out (AEP-0003 §6.4, AEP-0001 §8.2): every case of
``conformance/fixtures/downlevel/cases.json`` delivered through the relay to
a subscriber holding the case's ceiling, including the command copy
observers see (DL2: routed, then fanned out for audit)."""
from __future__ import annotations

import json

import pytest

from supervisor.relay.attrmatch import Filter
from supervisor.relay.core import Relay
from tests.support.shared import fixture

CASES = fixture("downlevel/cases.json")["cases"]


async def delivered(outlet):
    out = []
    while outlet._q:
        payloads, _ = await outlet.next_batch()
        out.extend(payloads)
    data = [ln[6:] for ln in b"".join(out).decode().split("\n") if ln.startswith("data: ")]
    return [json.loads(d) for d in data]


async def _noop(_):
    return None


@pytest.mark.parametrize("case", CASES, ids=[c["event"]["id"] for c in CASES])
async def test_downlevel_corpus_through_fanout(case):
    ev = case["event"]
    relay = Relay(token="t")
    command = ev["type"].startswith("control.")
    if command:  # a live claimant that accepts it, so the command is routed
        target = relay.attach_emitter(
            {"type": "hello", "versions": ["0.1"], "role": "emitter",
             "identity": {"agent": "target"},
             "capabilities": {"control": {"accepts": [ev["type"]], "ack_window_ms": 10000}}},
            _noop)
        await target.ingest({"aep": "0.1", "id": "T0", "type": "session.started",
                             "time": "2026-07-03T09:00:00Z", "source": "aep://h/agent/target",
                             "agent": "target", "session": ev["session"], "seq": 0, "data": {}})
    ceiling_sub = relay.open_stream(Filter({}), case["ceiling"], plan_all=False,
                                    positions=None, live=True)
    as_stored = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    if command:
        sender = relay.open_socket(True)
        await sender.handle_text(json.dumps({"type": "hello", "versions": ["0.1"],
                                             "role": "consumer", "identity": {"agent": "mc"}}))
        await sender.handle_text(json.dumps(ev))
        assert relay.counters["commands_routed"] == 1
    else:
        relay.ingest_http([relay.entry(ev)])
    (got,) = await delivered(ceiling_sub)
    assert got["capture"] == case["expect_capture"]
    assert got.get("data") == case.get("expect_data"), case["name"]
    for k in ("id", "type", "session", "source", "agent"):
        assert got.get(k) == ev.get(k)  # core attributes untouched (AEP-0001 §4.2)
    # a subscriber without a ceiling gets the event as stored
    assert (await delivered(as_stored)) == [ev]


async def test_replay_is_down_leveled_too():
    case = next(c for c in CASES if c["event"]["id"] == "DL1")
    relay = Relay()
    relay.ingest_http([relay.entry(case["event"])])
    outlet = relay.open_stream(Filter({}), case["ceiling"], plan_all=True, positions=None, live=False)
    (got,) = await delivered(outlet)
    assert got["capture"] == case["expect_capture"] and got["data"] == case["expect_data"]
