"""The JetStream relay in process against a real nats-server (issue 14):
POST /events published (deduped by (source, id)), replay-all, resume from
a position, live=0, replay-exhausted under a tiny stream (SSE comment and
WS frame, exact AEP-0003 §5 shapes), filters that become the consumer's
subject filters (asked of the server), discovery advertising the stream's
retention, and control routed across two relays by the claims bucket."""
from __future__ import annotations

import json
from typing import Any

import httpx
import trio
import trio_websocket

from supervisor.jetstream.link import aio, open_link
from tests.support.js_relay_harness import (
    TOKEN,
    SocketEmitter,
    ensure_stream,
    nats_config,
    roster_of,
    running_js_relay,
)
from tests.support.nats import NatsCluster
from tests.support.relay_harness import SSE, event, wait_until

AUTH = {"authorization": f"Bearer {TOKEN}"}
POST = {**AUTH, "content-type": "application/x-ndjson", "aep-version": "0.1"}


def ndjson(events: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(e) for e in events)


def positions(messages: list[dict[str, str]]) -> list[tuple[str, int]]:
    out = []
    for m in messages:
        ev = json.loads(m["data"])
        out.append((ev["session"], ev["seq"]))
    return out


async def test_publish_replay_all_resume_and_live_zero(tmp_path) -> None:
    evs = [event(i, "s1") for i in range(10)] + [event(i, "s2") for i in range(5)] + \
        [event(i, "s3", agent="opencode") for i in range(3)]
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=10) as client:
            r = await client.post(base + "/events", content=ndjson(evs), headers=POST)
            assert r.status_code == 202 and r.json() == {"accepted": 18}
            again = await client.post(base + "/events", content=ndjson(evs[:4]), headers=POST)
            assert again.status_code == 202
            info = await aio(relay.link.js.stream_info)("AEP")
            assert info.state.messages == 18  # the redelivery was dropped by Nats-Msg-Id

            everything = SSE()
            await everything.run(client, base + "/stream", headers=AUTH,
                                 params={"from": "all", "live": "0"})
            got = positions(everything.messages)
            assert sorted(got) == sorted((e["session"], e["seq"]) for e in evs)
            for s in ("s1", "s2", "s3"):  # per-session order
                seqs = [q for sess, q in got if sess == s]
                assert seqs == sorted(seqs)
            assert everything.comments[-1] == "replay-complete"
            assert everything.messages[0]["id"] == "s1:0:0"

            resumed = SSE()
            await resumed.run(client, base + "/stream", params={"live": "0"},
                              headers={**AUTH, "last-event-id": "s1:0:6"})
            assert positions(resumed.messages) == [("s1", 7), ("s1", 8), ("s1", 9)]
            assert not any(c.startswith("replay-exhausted") for c in resumed.comments)

            two = SSE()
            await two.run(client, base + "/stream", headers=AUTH, params={
                "live": "0", "from": json.dumps([{"session": "s2", "epoch": 0, "seq": 2},
                                                 {"session": "s3", "epoch": 0, "seq": 0}])})
            assert sorted(positions(two.messages)) == [("s2", 3), ("s2", 4), ("s3", 1), ("s3", 2)]

            pinned = SSE()  # live=0 replays the sessions the filter pins
            await pinned.run(client, base + "/stream", headers=AUTH, params={
                "live": "0", "filter": json.dumps({"session": "s3"})})
            assert positions(pinned.messages) == [("s3", 0), ("s3", 1), ("s3", 2)]


async def test_a_filter_becomes_the_consumers_subject_filters_and_live_flows(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:
            flt = {"agent": "codex", "session": ["s1", "s2"], "type": "tool.*"}
            live = SSE()
            nursery.start_soon(lambda: live.run(client, base + "/stream", headers=AUTH,
                                                params={"filter": json.dumps(flt)}))
            await wait_until(lambda: len(relay.consumers) == 1)
            (name, subjects), = relay.consumers.items()
            assert subjects == ["AEP.ev.codex.s1", "AEP.ev.codex.s2"]
            # and the server holds that consumer with those filter subjects
            info = await aio(relay.link.js.consumer_info)("AEP", name)
            assert info.config.filter_subjects == ["AEP.ev.codex.s1", "AEP.ev.codex.s2"]
            batch = [event(0, "s1"), event(1, "s1", type="run.started"), event(0, "s3"),
                     event(0, "s2", agent="opencode"), event(2, "s1"), event(0, "s2")]
            r = await client.post(base + "/events", content=ndjson(batch), headers=POST)
            assert r.status_code == 202
            await wait_until(lambda: len(live.messages) >= 3)
            await trio.sleep(0.5)
            got = positions(live.messages)  # sessions publish concurrently: order per session
            assert sorted(got) == [("s1", 0), ("s1", 2), ("s2", 0)]
            assert [q for s, q in got if s == "s1"] == [0, 2]
            nursery.cancel_scope.cancel()
        # the subscription's consumer is deleted with it
        async with open_link(nats_config(c.url)) as link:
            names = [ci.name for ci in await aio(link.js.consumers_info)("AEP")]
            assert name not in names


async def test_replay_exhausted_under_a_tiny_stream(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        async with open_link(nats_config(c.url)) as link:
            await ensure_stream(link, max_msgs=10)
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=10) as client:
            r = await client.post(base + "/events", headers=POST,
                                  content=ndjson([event(i, "s1") for i in range(30)]))
            assert r.status_code == 202
            disco = (await client.get(base + "/.well-known/aep", headers=AUTH)).json()
            assert disco["capabilities"]["replay"] == {"buffer": 10, "all": True}
            assert disco["capabilities"]["experimental"]["jetstream"]["max_msgs"] == 10

            sse = SSE()
            await sse.run(client, base + "/stream", headers=AUTH, params={
                "live": "0", "from": json.dumps([{"session": "s1", "epoch": 0, "seq": 4}])})
            assert sse.comments[1] == "replay-exhausted s1 0:20"
            assert positions(sse.messages) == [("s1", n) for n in range(20, 30)]

            # replay-all never says exhausted (§5 rule 2)
            everything = SSE()
            await everything.run(client, base + "/stream", headers=AUTH,
                                 params={"from": "all", "live": "0"})
            assert not any(c.startswith("replay-exhausted") for c in everything.comments)
            assert len(everything.messages) == 10

            ws_url = base.replace("http://", "ws://") + f"/socket?access_token={TOKEN}"
            async with trio_websocket.open_websocket_url(ws_url) as ws:
                await ws.send_message(json.dumps({"type": "hello", "versions": ["0.1"],
                                                  "role": "consumer"}))
                assert json.loads(await ws.get_message())["type"] == "hello"
                await ws.send_message(json.dumps({
                    "type": "subscribe", "id": "a", "filter": {"session": "s1"},
                    "from": [{"session": "s1", "epoch": 0, "seq": 4}]}))
                assert json.loads(await ws.get_message()) == {"type": "subscribed", "id": "a"}
                assert json.loads(await ws.get_message()) == {
                    "type": "replay-exhausted", "sub": "a", "session": "s1",
                    "earliest": {"epoch": 0, "seq": 20}}
                seqs = []
                with trio.fail_after(10):
                    while len(seqs) < 10:
                        seqs.append(json.loads(await ws.get_message())["seq"])
                assert seqs == list(range(20, 30))


async def test_capture_ceiling_down_levels_what_the_stream_holds(tmp_path) -> None:
    ev = event(0, "s1", capture="full", data={"text": "secret prompt"})
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=10) as client:
            r = await client.post(base + "/events", headers=POST, content=ndjson([ev]))
            assert r.status_code == 202
            sse = SSE()
            await sse.run(client, base + "/stream", headers=AUTH,
                          params={"from": "all", "live": "0", "capture": "none"})
            got = json.loads(sse.messages[0]["data"])
            assert got["capture"] == "none" and "data" not in got
            full = SSE()
            await full.run(client, base + "/stream", headers=AUTH,
                           params={"from": "all", "live": "0", "capture": "full"})
            assert json.loads(full.messages[0]["data"])["data"] == {"text": "secret prompt"}


def _command(url: str, type_: str, session: str) -> tuple[str, Any]:
    import aep_sdk
    client = aep_sdk.ControlClient(url, agent="tester", host="laptop", token=TOKEN)
    client.connect(connect_timeout_ms=10_000)
    try:
        return "accepted", client.send(type_, session, ack_window_ms=10_000, retries=0)
    except aep_sdk.NackError as e:
        return e.reason, e.detail
    finally:
        client.close()


async def test_a_command_through_relay_b_reaches_the_emitter_on_relay_a(tmp_path) -> None:
    verb = "control.attention.respond"
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (ra, base_a), \
                running_js_relay(c.url, token=TOKEN) as (rb, base_b):
            em = await trio.to_thread.run_sync(lambda: SocketEmitter(base_a, token=TOKEN,
                                                                     accepts=[verb]))
            try:
                s1 = em.session("s1")
                s1.emit("run.started", severity="notice")
                await wait_until(lambda: ra.counters["published"] >= 1)
                await wait_until(lambda: "s1" in [s for s in ra.claims._holders])

                roster = await trio.to_thread.run_sync(roster_of, base_b)
                assert [r for r in roster if r["session"] == "s1"] == [{
                    "session": "s1", "agent": "codex", "instance": "box-a/codex",
                    "control": {"accepts": [verb], "ack_window_ms": 10_000},
                    "emits": ["run", "tool", "control"]}]

                outcome, ack = await trio.to_thread.run_sync(_command, base_b, verb, "s1")
                assert outcome == "accepted", ack
                assert ack["type"] == "control.accepted"
                # the SDK's ControlTarget sends the ack, then runs the command (on the
                # emitter's reader thread): the ack can arrive first
                await wait_until(lambda: len(em.executed) >= 1)
                assert len(em.executed) == 1 and em.executed[0]["type"] == verb
                assert rb.counters["commands_forwarded"] == 1
                assert ra.counters["commands_received"] == 1

                # the relay's own refusals, exactly as the embedded relay answers
                # (the SDK reports codes outside its nack reasons as "invalid",
                # the relay's code first in the detail)
                nobody = await trio.to_thread.run_sync(_command, base_b, verb, "nobody")
                assert nobody[0] == "invalid" and nobody[1].startswith("no-route: "), nobody
                other = await trio.to_thread.run_sync(_command, base_b, "control.cancel", "s1")
                assert other[0] == "unsupported", other

                # a second would-be claimant of s1 (on relay B, another source): its
                # event is refused (the session's binding in AEP_bindings, issue 25),
                # so A's emitter keeps its commands instead of both going ambiguous
                em2 = await trio.to_thread.run_sync(lambda: SocketEmitter(
                    base_b, token=TOKEN, accepts=[verb], host="box-b"))
                try:
                    em2.session("s1").emit("run.started", severity="notice")
                    await wait_until(lambda: rb.counters["refused_owned_session"] >= 1)
                    assert rb.counters["published"] == 0
                    assert [f.get("code") for f in em2.frames if f["type"] == "error"] == [
                        "invalid-event"], em2.frames
                finally:
                    em2.close()
                outcome, _ = await trio.to_thread.run_sync(_command, base_a, verb, "s1")
                assert outcome == "accepted"
                assert len(em.executed) == 2
            finally:
                em.close()


async def test_post_is_503_unavailable_while_no_server_acknowledges(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=60) as client:
            ok = await client.post(base + "/events", headers=POST, content=ndjson([event(0)]))
            assert ok.status_code == 202
            await trio.to_thread.run_sync(c.kill, 0)
            r = await client.post(base + "/events", headers=POST, content=ndjson([event(1)]))
            assert r.status_code == 503 and r.json()["error"] == "unavailable"
            # (the session bindings are read before the publish, issue 25: either says it)
            assert relay.counters["publish_failed"] + relay.counters.get("bindings_unavailable", 0) == 1
            await trio.to_thread.run_sync(c.start, 0)
            # the emitter sends it again once NATS is back: stored once
            with trio.fail_after(60):
                while True:
                    r = await client.post(base + "/events", headers=POST,
                                          content=ndjson([event(1), event(0)]))
                    if r.status_code == 202:
                        break
                    await trio.sleep(0.5)
            info = await aio(relay.link.js.stream_info)("AEP")
            assert info.state.messages == 2


async def test_an_event_over_the_servers_max_payload_is_413_not_send_again(tmp_path) -> None:
    # the stream can never hold it: a 503 "send them again" would have the
    # emitter retry forever (found by a fresh-user review)
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=60) as client:
            limit = relay.link.nc.max_payload
            big = event(1, type="x.test.blob.sent", data={"blob": "z" * (limit + 1)})
            r = await client.post(base + "/events", headers=POST,
                                  content=ndjson([event(0), big]))
            assert r.status_code == 413, r.text
            assert r.json()["error"] == "payload-too-large" and r.json()["line"] == 1
            info = await aio(relay.link.js.stream_info)("AEP")
            assert info.state.messages == 0  # nothing of the refused batch published
            ok = await client.post(base + "/events", headers=POST, content=ndjson([event(0)]))
            assert ok.status_code == 202


async def test_an_sse_stream_misses_nothing_posted_once_its_response_began(tmp_path,
                                                                           monkeypatch) -> None:
    """The SSE response starts only once the consumer has fixed where live
    delivery starts (the stream's last sequence read), as a WS holds its
    ``subscribed`` frame: a client that posts as soon as the response
    began sees its own event. Before, the response began at once, and an
    event published before the stream's bounds were read fell between the
    (empty) replay and the live phase."""
    import asyncio
    from functools import partial
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:
            real = relay.link.js.stream_info

            async def late(*args: Any, **kwargs: Any) -> Any:
                await asyncio.sleep(0.5)  # the bounds read answered late
                return await real(*args, **kwargs)
            monkeypatch.setattr(relay.link.js, "stream_info", late)
            live = SSE()
            await nursery.start(partial(live.run, client, base + "/stream", headers=AUTH))
            assert live.status == 200
            r = await client.post(base + "/events", content=ndjson([event(0, "s1")]),
                                  headers=POST)
            assert r.status_code == 202
            await wait_until(lambda: len(live.messages) >= 1, timeout=10)
            assert positions(live.messages) == [("s1", 0)]
            nursery.cancel_scope.cancel()


async def test_the_sessions_frame_names_what_the_stream_holds(tmp_path) -> None:
    """The ``sessions`` extension frame on the JetStream relay: every
    session with messages in the stream (an ended one, a session name that
    needs an encoded subject token), summed over agents; the same shape as
    the embedded relay's."""
    evs = [event(i, "s1") for i in range(3)] + [event(0, "s1", agent="opencode")] + \
        [event(i, "a b.c", source="aep://box/agent/codex/session/ab") for i in range(2)]
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=10) as client:
            r = await client.post(base + "/events", content=ndjson(evs), headers=POST)
            assert r.status_code == 202
            url = base.replace("http://", "ws://") + f"/socket?access_token={TOKEN}"
            async with trio_websocket.open_websocket_url(url) as ws:
                await ws.send_message(json.dumps({
                    "type": "hello", "versions": ["0.1"], "role": "consumer",
                    "identity": {"agent": "t", "instance": "t/1"}, "capabilities": {}}))
                h = json.loads(await ws.get_message())
                assert h["capabilities"]["experimental"]["sessions"] == {}
                assert "jetstream" in h["capabilities"]["experimental"]
                await ws.send_message(json.dumps({"type": "sessions", "id": "s-1"}))
                with trio.fail_after(10):
                    while (got := json.loads(await ws.get_message()))["type"] != "sessions":
                        pass
            assert got["id"] == "s-1" and got["complete"] is True
            assert sorted(got["entries"], key=lambda e: e["session"]) == [
                {"session": "a b.c", "events": 2}, {"session": "s1", "events": 4}]


async def test_a_replay_of_big_events_misses_none(tmp_path) -> None:
    """Round 16 of issue 25: one reader replaying 100 stored events of about
    0.9 MB got 80-87 of them: 256 were pulled at once, overran the relay's
    NATS connection and the outlet's room, and the replay still ended
    ``replay-complete``. A pull asks for 8 MiB by the last batch's sizes."""
    n, blob = 60, "z" * 900_000
    evs = [event(i, "big", type="x.test.blob.sent", data={"blob": blob}) for i in range(n)]
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=120) as client:
            for i in range(0, n, 10):  # under AEP_MAX_BODY a POST
                r = await client.post(base + "/events", content=ndjson(evs[i:i + 10]), headers=POST)
                assert r.status_code == 202, r.text
            replay = SSE()
            await replay.run(client, base + "/stream", headers=AUTH,
                             params={"from": "all", "live": "0", "capture": "full"})
            got = positions(replay.messages)
            assert got == [("big", i) for i in range(n)], (len(got), got[:12])
            assert replay.comments[-1] == "replay-complete"
