"""SSE consumption (AEP-0003 §3.3, §5, §7, §8.4) against the relay on a real
listener, with the protocol's SDK as the consumer: ``aep_sdk.subscribe``
(threaded) and ``aep_sdk.aio.subscribe`` (asyncio, in its own thread), plus
a raw httpx reader for the wire details (``event:``/``id:`` fields, comment
lines, ``Last-Event-ID``) and a raw socket for a consumer that stops reading."""
from __future__ import annotations

import asyncio
import json
import queue
import socket
from functools import partial

import aep_sdk
import httpx
import trio

from tests.support.relay_harness import SSE, TOKEN, emitter_hello, event, running_relay, wait_until

WAIT = 20


async def _noop(_):
    return None


async def collect(q: queue.Queue, n: int) -> list[dict]:
    out = []
    with trio.fail_after(WAIT):
        while len(out) < n:
            out.append(await trio.to_thread.run_sync(partial(q.get, timeout=WAIT)))
    return out


async def test_sdk_subscribe_live_filter_and_resume():
    async with running_relay(token=TOKEN) as (relay, base):
        conn = relay.attach_emitter(emitter_hello(), _noop)
        q: queue.Queue = queue.Queue()
        sub = aep_sdk.subscribe(base, q.put, token=TOKEN,
                                filter={"type": ["attention.*"], "severity": {"gte": "notice"}})
        try:
            await wait_until(lambda: relay.stats()["subscribers"] == 1)
            await conn.ingest(event(0, type="session.started", severity="notice", data={}))
            await conn.ingest(event(1, type="attention.requested", severity="notice",
                                    data={"kind": "permission", "prompt": "p"}))
            await conn.ingest(event(2, type="attention.requested", severity="info",
                                    data={"kind": "permission", "prompt": "p"}))
            await conn.ingest(event(3, type="attention.resolved", severity="warning", data={}))
            got = await collect(q, 2)
            assert [e["seq"] for e in got] == [1, 3]
            positions = sub.positions()
            assert positions == [{"session": "s1", "epoch": 0, "seq": 3}]
        finally:
            sub.close()
        # a later consumer resumes strictly after the recorded position
        for s in range(4, 7):
            await conn.ingest(event(s))
        q2: queue.Queue = queue.Queue()
        sub2 = aep_sdk.subscribe(base, q2.put, token=TOKEN, from_=positions)
        try:
            assert [e["seq"] for e in await collect(q2, 3)] == [4, 5, 6]
        finally:
            sub2.close()


async def test_sdk_replay_all_then_live():
    async with running_relay() as (relay, base):
        conn = relay.attach_emitter(emitter_hello(), _noop)
        for sess in ("a", "b"):
            for s in range(3):
                await conn.ingest(event(s, session=sess))
        q: queue.Queue = queue.Queue()
        sub = aep_sdk.subscribe(base, q.put, from_="all")
        try:
            got = await collect(q, 6)
            assert sorted((e["session"], e["seq"]) for e in got) == [
                (s, i) for s in ("a", "b") for i in range(3)]
            await conn.ingest(event(3, session="b"))
            assert (await collect(q, 1))[0]["seq"] == 3
            assert q.empty()
        finally:
            sub.close()


def _aio_replay(base: str, token: str, filter: dict, capture: str | None) -> tuple[list, list]:
    async def main():
        comments: list[str] = []
        sub = await aep_sdk.aio.subscribe(base, token=token, filter=filter, capture=capture,
                                          from_="all", live=False, on_comment=comments.append)
        got = [ev async for ev in sub]
        return got, comments
    return asyncio.run(asyncio.wait_for(main(), WAIT))


async def test_aio_subscribe_replay_only_with_capture_ceiling():
    async with running_relay(token=TOKEN) as (relay, base):
        conn = relay.attach_emitter(emitter_hello(), _noop)
        await conn.ingest(event(0, type="tool.completed", capture="full",
                                data={"tool": {"name": "Bash", "call_id": "c1"}, "status": "success",
                                      "result": "secret output"}))
        await conn.ingest(event(1, session="other"))
        got, comments = await trio.to_thread.run_sync(
            _aio_replay, base, TOKEN, {"session": "s1"}, "metadata")
        assert [e["seq"] for e in got] == [0]
        assert got[0]["capture"] == "metadata"
        assert "result" not in got[0]["data"]  # down-leveled mechanically (§6.4)
        assert got[0]["data"]["tool"] == {"name": "Bash", "call_id": "c1"}
        assert comments[-1] == "replay-complete"


async def test_wire_fields_last_event_id_and_replay_exhausted():
    async with running_relay(buffer=3) as (relay, base), httpx.AsyncClient(timeout=WAIT) as c:
        conn = relay.attach_emitter(emitter_hello(), _noop)
        for s in range(6):
            await conn.ingest(event(s, epoch=2))
        async with trio.open_nursery() as n:
            sse = await n.start(SSE().run, c, base + "/stream",
                                {"last-event-id": "s1:2:1"}, None)
            await wait_until(lambda: len(sse.messages) == 3)
            await conn.ingest({"aep": "0.1", "id": "hb", "type": "agent.heartbeat",
                               "time": "2026-11-30T12:00:00Z", "source": "aep://box/agent/codex",
                               "agent": "codex"})
            await wait_until(lambda: len(sse.messages) == 4)
            n.cancel_scope.cancel()
        assert sse.comments[:2] == ["connected; heartbeat every 15s", "replay-exhausted s1 2:3"]
        assert [m.get("id") for m in sse.messages] == ["s1:2:3", "s1:2:4", "s1:2:5", None]
        assert [m["event"] for m in sse.messages] == ["tool.completed"] * 3 + ["agent.heartbeat"]
        assert json.loads(sse.messages[0]["data"]) == event(3, epoch=2)
        # `from` takes precedence over Last-Event-ID
        r = await c.get(base + "/stream", headers={"last-event-id": "s1:2:1"},
                        params={"from": json.dumps([{"session": "s1", "epoch": 2, "seq": 4}]),
                                "live": "0"})
        assert r.text.count("event: ") == 1 and "id: s1:2:5" in r.text


async def test_heartbeat_comments_while_idle():
    async with running_relay(heartbeat_s=0.05) as (relay, base), httpx.AsyncClient(timeout=WAIT) as c:
        async with trio.open_nursery() as n:
            sse = await n.start(SSE().run, c, base + "/stream", None, None)
            await wait_until(lambda: sse.comments.count("ping") >= 3)
            n.cancel_scope.cancel()
        # the first thing on the wire is a comment, before any event or heartbeat
        assert sse.comments[0] == "connected; heartbeat every 0.05s"


async def test_disconnect_mid_stream_costs_nothing():
    async with running_relay() as (relay, base), httpx.AsyncClient(timeout=WAIT) as c:
        conn = relay.attach_emitter(emitter_hello(), _noop)
        for _ in range(3):
            async with trio.open_nursery() as n:
                sse = await n.start(SSE().run, c, base + "/stream", None, None)
                await conn.ingest(event(len(relay.buffers.sessions()) + 100, session="x"))
                await wait_until(lambda sse=sse: sse.messages)
                n.cancel_scope.cancel()  # the client goes away mid-stream
        await wait_until(lambda: relay.stats()["subscribers"] == 0 and not relay.outlets)
        for s in range(200):  # fan-out to nobody: nothing queued anywhere
            await conn.ingest(event(s, session="after"))
        assert relay.stats()["subscribers"] == 0


def _raw_stream(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /stream HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: text/event-stream\r\n\r\n")
    return s


async def test_consumer_that_stops_reading_is_shed_and_resumes_exactly():
    """§8.4: debug/info toward a stalled consumer are dropped and counted;
    notice+ that cannot be queued ends the stream (here: the socket is
    aborted, the writer being stuck in a send); the consumer then resumes by
    position and gets every notice+ event."""
    async with running_relay(queue_soft_bytes=32 * 1024, queue_hard_bytes=64 * 1024) as (relay, base):
        port = int(base.rsplit(":", 1)[1])
        conn = relay.attach_emitter(emitter_hello(), _noop)
        stalled = _raw_stream(port)
        try:
            await wait_until(lambda: relay.stats()["subscribers"] == 1)
            pad = "x" * 16000
            seq = 0
            for _ in range(20000):  # low severity flood: dropped, never terminates
                await conn.ingest(event(seq, severity="debug", data={"pad": pad}))
                seq += 1
                if relay.counters["dropped_low_severity"] > 50:
                    break
            assert relay.counters["dropped_low_severity"] > 50
            assert relay.counters["streams_terminated"] == 0
            first_notice = seq
            for _ in range(20000):
                await conn.ingest(event(seq, severity="notice", data={"pad": pad}))
                seq += 1
                if relay.counters["streams_terminated"]:
                    break
            assert relay.counters["streams_terminated"] == 1
            await wait_until(lambda: not relay.outlets and relay.stats()["subscribers"] == 0)
            assert relay.counters["connections_aborted"] == 1  # closed, not kept alive
            # the stalled peer sees the connection end (after whatever was in flight)
            stalled.settimeout(WAIT)

            def drain():
                while stalled.recv(65536):
                    pass
            try:
                await trio.to_thread.run_sync(drain)
            except ConnectionResetError:
                pass
        finally:
            stalled.close()
        # resume from before the notice burst: nothing at notice+ is missing
        q: queue.Queue = queue.Queue()
        sub = aep_sdk.subscribe(base, q.put, filter={"severity": {"gte": "notice"}},
                                from_=[{"session": "s1", "epoch": 0, "seq": first_notice - 1}])
        try:
            got = await collect(q, seq - first_notice)
            assert [e["seq"] for e in got] == list(range(first_notice, seq))
        finally:
            sub.close()


async def test_many_subscribers_each_get_every_event_in_order():
    async with running_relay() as (relay, base), httpx.AsyncClient(timeout=WAIT) as c:
        conn = relay.attach_emitter(emitter_hello(), _noop)
        async with trio.open_nursery() as n:
            readers = [await n.start(SSE().run, c, base + "/stream", None, None) for _ in range(30)]
            await wait_until(lambda: relay.stats()["subscribers"] == 30)
            for s in range(50):
                await conn.ingest(event(s))
            await wait_until(lambda: all(len(r.messages) == 50 for r in readers))
            n.cancel_scope.cancel()
        for r in readers:
            assert [m["id"] for m in r.messages] == [f"s1:0:{s}" for s in range(50)]


def _aio_live(base: str, n: int) -> list:
    async def main():
        sub = await aep_sdk.aio.subscribe(base, filter={"session": "live"})
        got = []
        async for ev in sub:
            got.append(ev)
            if len(got) == n:
                sub.close()
        return got
    return asyncio.run(asyncio.wait_for(main(), WAIT))


async def test_aio_subscribe_live():
    async with running_relay() as (relay, base):
        conn = relay.attach_emitter(emitter_hello(), _noop)
        async with trio.open_nursery() as n:
            result = []

            async def consume():
                result.extend(await trio.to_thread.run_sync(_aio_live, base, 3))

            n.start_soon(consume)
            await wait_until(lambda: relay.stats()["subscribers"] == 1)
            for s in range(3):
                await conn.ingest(event(s, session="other"))
                await conn.ingest(event(s, session="live"))
        assert [(e["session"], e["seq"]) for e in result] == [("live", 0), ("live", 1), ("live", 2)]
