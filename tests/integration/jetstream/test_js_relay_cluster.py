"""Past one machine, end to end (issue 14): a 3-node JetStream cluster (R3
stream), two daemons publishing through their JetStream sinks (the real
Fleet, stamper, ledger and sink, with test bridges standing in for a
vendor), two ``aep-bridges relay`` processes serving; the AEP SDK consumer
switches relays mid-stream (relay A killed) and resumes on relay B without
loss or duplicates; a NATS node (the stream leader) is killed mid-stream:
nothing at notice+ is lost and every session stays in order; a command
posted at relay B reaches the daemon that owns the session and is acked
once."""
from __future__ import annotations

import json
from typing import Any

import trio

from supervisor.jetstream.link import open_link
from tests.integration.jetstream.fleet_support import BurstBridge, running_fleet
from tests.integration.supervisor.test_fleet_control import ToyBridge
from tests.support.daemon import Collector
from tests.support.js_relay_harness import TOKEN, nats_config, relay_process
from tests.support.nats import NatsCluster, stream_messages


def _key(ev: dict[str, Any]) -> tuple[str, str]:
    return ev["source"], ev["id"]


async def _start(proc) -> None:
    await trio.to_thread.run_sync(proc.start)


async def test_two_daemons_two_relays_resume_across_relays_and_a_node_killed(tmp_path) -> None:
    n = 450
    go = trio.Event()
    t1, t2 = (BurstBridge(n, 3, pace=0.01, name="ticks", start=go, prefix=p) for p in ("one", "two"))
    nats_env = {"AEP_NATS_REPLICAS": "3"}
    (tmp_path / "nats").mkdir()
    with NatsCluster(3, tmp_path / "nats") as c:
        relay_a = relay_process(tmp_path / "ra", c.url, env=nats_env)
        relay_b = relay_process(tmp_path / "rb", c.url, env=nats_env)
        async with running_fleet(tmp_path / "d1", [t1, ToyBridge()], c.url,
                                 token=TOKEN, **nats_env) as f1, \
                running_fleet(tmp_path / "d2", [t2], c.url, token=TOKEN, **nats_env):
            await _start(relay_a)
            await _start(relay_b)
            try:
                first = relay_a.subscribe(token=TOKEN)
                go.set()
                # every session seen on relay A, then A dies mid-stream
                await first.wait_for(lambda col: len({e.get("session") for e in col.events
                                                      if e.get("agent") == "toy"}) >= 6
                                     and len(col.events) >= 150, timeout=180,
                                     what="150 events on relay A")
                await trio.to_thread.run_sync(relay_a.kill)
                first.close()
                seen_a = first.events
                resume_from = first.sub.positions()
                assert {p["session"] for p in resume_from} >= {f"one-{k}" for k in range(3)}
                second = relay_b.subscribe(token=TOKEN, from_=resume_from)

                # the stream's leader node killed mid-stream
                await second.wait_for(lambda col: len(col.events) >= 100, timeout=180,
                                      what="100 events on relay B")
                leader = None
                with trio.fail_after(30):
                    while leader is None:
                        leader = c.stream_leader("AEP")
                        await trio.sleep(0.1)
                await trio.to_thread.run_sync(c.kill, int(leader[1:]))
                with trio.fail_after(300):
                    await t1.done.wait()
                    await t2.done.wait()
                emitted = t1.emitted + t2.emitted
                notice = {_key(e) for e in emitted if e.get("severity") in ("notice", "warning")}

                def all_notice(col: Collector) -> bool:
                    got = {_key(e) for e in seen_a + col.events}
                    return notice <= got
                try:
                    await second.wait_for(all_notice, timeout=300, what="every notice+ event")
                except AssertionError as e:
                    # which ones, by session: a flake in CI (1 of 4 full runs on
                    # 2026-12-02) said only the stream's tail
                    got = {_key(x) for x in seen_a + second.events}
                    missing = sorted((ev["session"], ev["seq"]) for ev in emitted
                                     if _key(ev) in notice - got)
                    raise AssertionError(f"{len(missing)} notice+ events never reached relay "
                                         f"A or B: {missing[:40]}") from e
                await trio.sleep(1.0)
                seen_b = second.events
                new_leader = None
                with trio.fail_after(60):  # a node's /jsz can lag the election
                    while new_leader is None:
                        new_leader = c.stream_leader("AEP")
                        await trio.sleep(0.2)
                assert new_leader != leader

                # per session: strictly increasing seq across both relays (order,
                # no duplicate on resume), and nothing the daemons sent is missing
                toy = [e for e in seen_a + seen_b if e.get("agent") == "toy"]
                by_session: dict[str, list[int]] = {}
                for e in toy:
                    by_session.setdefault(e["session"], []).append(e["seq"])
                for session, seqs in by_session.items():
                    assert seqs == sorted(set(seqs)), f"{session}: order or duplicates {seqs}"
                got = {_key(e) for e in toy}
                assert notice <= got
                assert got == {_key(e) for e in emitted}  # nothing shed: the relays pace
                a_last = {p["session"]: p["seq"] for p in resume_from}
                assert all(e["seq"] > a_last[e["session"]] for e in seen_b
                           if e.get("session") in a_last)

                # control across hosts: posted at relay B, owned by daemon 1
                from tests.support.daemon import command
                outcome, ack = await command(relay_b, "control.cancel", "toy-1", run="r1")
                for _ in range(20):
                    # the claims bucket's own stream may still be electing a leader
                    # after the node kill (seen under CI load): the relay says so
                    # and that it is safe to send again; what a controller does
                    if outcome != "no-route" or "claims bucket did not answer" not in str(ack):
                        break
                    await trio.sleep(1.0)
                    outcome, ack = await command(relay_b, "control.cancel", "toy-1", run="r1")
                assert outcome == "accepted", (ack, f1.jetstream.presence.counters)
                assert ack["type"] == "control.accepted" and ack["agent"] == "toy-agent"
                assert len(f1.members["toy"].bridge.writes) == 1
                async with open_link(nats_config(c.url)) as link:
                    msgs = await stream_messages(link, "AEP", subject="AEP.ev.toy-agent.toy-1")
                acks = [json.loads(m.data) for m in msgs
                        if json.loads(m.data).get("cause") == ack["cause"]]
                assert [a["type"] for a in acks] == ["control.accepted"]
                second.close()
            finally:
                await trio.to_thread.run_sync(relay_a.kill)
                await trio.to_thread.run_sync(relay_b.stop)
