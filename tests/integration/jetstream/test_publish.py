"""The JetStream sink against a real nats-server (issue 14): every event
the fleet emits lands in the stream once, with its headers, in per-session
order; redelivery is deduped by the server; NATS down at the start loses
nothing."""
from __future__ import annotations

import json

import trio

from supervisor.jetstream import subjects as S
from supervisor.jetstream.link import aio, open_link
from tests.integration.jetstream.fleet_support import (
    BurstBridge,
    decoded,
    nats_config,
    running_fleet,
    wait_published,
)
from tests.support.nats import NatsCluster, stream_messages


def _jsonl(tmp_path) -> list[dict]:
    out = []
    for p in sorted((tmp_path / "state" / "logs").rglob("*.jsonl")):
        out += [json.loads(line) for line in p.read_text().splitlines()]
    return out


def _assert_per_session_order(events: list[dict]) -> None:
    last: dict[str, int] = {}
    for ev in events:
        s = ev["session"]
        assert ev["seq"] > last.get(s, -1), f"session {s}: seq {ev['seq']} after {last[s]}"
        last[s] = ev["seq"]


async def test_every_event_is_published_once_with_its_headers(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        bridge = BurstBridge(600, sessions=5)
        async with running_fleet(tmp_path, [bridge], c.url) as fleet:
            await bridge.done.wait()
            await wait_published(fleet, 600)
            cfg = fleet.cfg.nats
            daemon = fleet.jetstream.daemon
            async with open_link(cfg) as link:
                msgs = await stream_messages(link, "AEP")
        assert len(msgs) == 600
        events = decoded(msgs)
        # the same bytes as the JSONL session log (the line without its newline)
        logged = {(e["source"], e["id"]): e for e in _jsonl(tmp_path)}
        assert {(e["source"], e["id"]) for e in events} == set(logged)
        assert [e["id"] for e in events if e["session"] == "ses-1"] == \
            [e["id"] for e in bridge.emitted if e["session"] == "ses-1"]
        _assert_per_session_order(events)
        for m, ev in zip(msgs, events, strict=True):
            assert m.subject == S.event_subject("AEP", "toy", ev["session"])
            h = m.headers
            assert h[S.MSG_ID] == f"{ev['id']} {ev['source']}"
            assert S.parse_pos(h[S.POS]) == (ev["epoch"], ev["seq"])
            assert h[S.SEVERITY] == ev.get("severity", "info")
            assert h[S.TYPE] == "x.toy.tick" and h[S.DAEMON] == daemon
        st = fleet.jetstream.publisher.stats()
        assert st["dropped"] == 0 and st["duplicates"] == 0 and st["outbox"] == 0


async def test_redelivered_events_are_deduped_by_the_server(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        bridge = BurstBridge(40, sessions=2)
        async with running_fleet(tmp_path, [bridge], c.url) as fleet:
            await bridge.done.wait()
            await wait_published(fleet, 40)
            ctx = fleet.members["burst"].ctx
            for ev in bridge.emitted:  # a reconnect's resend: the same envelopes
                await ctx.redeliver(ev)
            pub = fleet.jetstream.publisher
            with trio.fail_after(30):
                while pub.stats()["duplicates"] < 40:
                    await trio.sleep(0.05)
            async with open_link(fleet.cfg.nats) as link:
                info = await aio(link.js.stream_info)("AEP")
        assert info.state.messages == 40
        assert pub.stats()["acked"] == 80


async def test_nats_down_at_start_then_up_loses_nothing(tmp_path) -> None:
    c = NatsCluster(1, tmp_path)  # ports reserved, not started yet
    try:
        bridge = BurstBridge(300, sessions=3)
        async with running_fleet(tmp_path, [bridge], c.url) as fleet:
            await bridge.done.wait()  # the daemon runs and emits while NATS is down
            with trio.fail_after(20):  # the pump takes the last ones off the channel
                while fleet.jetstream.publisher.depth < 300:
                    await trio.sleep(0.02)
            assert fleet.jetstream.publisher.stats()["acked"] == 0
            assert fleet.healthz(True)["nats"]["connected"] is False
            await trio.to_thread.run_sync(c.start)
            await wait_published(fleet, 300)
            async with open_link(fleet.cfg.nats) as link:
                events = decoded(await stream_messages(link, "AEP"))
        assert sorted(e["id"] for e in events) == sorted(e["id"] for e in bridge.emitted)
        assert [e["id"] for e in events if e["session"] == "ses-0"] == \
            [e["id"] for e in bridge.emitted if e["session"] == "ses-0"]
        _assert_per_session_order(events)
    finally:
        c.close()


async def test_an_existing_stream_with_other_settings_is_updated_and_said_so(tmp_path, caplog) -> None:
    with NatsCluster(1, tmp_path) as c:
        async with open_link(nats_config(c.url)) as link:
            await aio(link.js.add_stream)(name="AEP", subjects=["AEP.ev.>"], max_age=60.0)
        bridge = BurstBridge(4, sessions=1)
        async with running_fleet(tmp_path, [bridge], c.url, AEP_NATS_MAX_AGE="7200") as fleet:
            await bridge.done.wait()
            await wait_published(fleet, 4)
            assert fleet.jetstream.stream_state == "updated"
            async with open_link(fleet.cfg.nats) as link:
                info = await aio(link.js.stream_info)("AEP")
        assert info.config.max_age == 7200.0 and info.config.duplicate_window == 300.0
        assert info.state.messages == 4
        said = [r.getMessage() for r in caplog.records if "existed with other settings" in r.getMessage()]
        assert said and "max_age: 60.0 -> 7200.0" in said[0]
