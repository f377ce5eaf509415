"""Orderly shutdown of a served relay (docs/relay.md "Shutdown: drain, don't
drop"; DESIGN.md SIGTERM): stop accepting, ``: shutting-down`` and a clean
end on every SSE stream, a ``closing`` frame then close 1001 on every
WebSocket, and a bounded drain even when a consumer stopped reading."""
from __future__ import annotations

import json
import socket

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from bridges.core.http import bind_socket
from supervisor.relay.core import Relay, RelayClosed
from supervisor.relay.serve import serve_relay
from tests.support.relay_harness import SSE, emitter_hello, event, wait_until

WAIT = 20


async def _noop(_):
    return None


async def test_shutdown_ends_sse_and_websockets_in_order():
    relay = Relay()
    stop = trio.Event()
    done = trio.Event()
    conn = relay.attach_emitter(emitter_hello(), _noop)
    async with trio.open_nursery() as n, httpx.AsyncClient(timeout=WAIT) as c:

        async def serve(task_status=trio.TASK_STATUS_IGNORED):
            await serve_relay(relay, ("127.0.0.1", 0), shutdown=stop, reason="maintenance",
                              task_status=task_status)
            done.set()

        host, port = await n.start(serve)
        base = f"http://{host}:{port}"
        sse = await n.start(SSE().run, c, base + "/stream", None, None)
        ws_frames: list = []
        ws_code = []

        async def ws_client(task_status=trio.TASK_STATUS_IGNORED):
            async with open_websocket_url(f"ws://{host}:{port}/socket") as ws:
                await ws.send_message(json.dumps({"type": "hello", "versions": ["0.1"],
                                                  "role": "consumer", "identity": {"agent": "t"}}))
                await ws.get_message()
                await ws.send_message(json.dumps({"type": "subscribe", "id": "all"}))
                await ws.get_message()
                task_status.started()
                try:
                    while True:
                        ws_frames.append(json.loads(await ws.get_message()))
                except ConnectionClosed as e:
                    ws_code.append(e.reason.code)

        await n.start(ws_client)
        await conn.ingest(event(0))
        await wait_until(lambda: sse.messages and ws_frames)
        stop.set()
        with trio.fail_after(WAIT):
            await done.wait()
            await sse.ended.wait()
        await wait_until(lambda: ws_code)
        assert sse.comments[-1] == "shutting-down"
        assert [m["id"] for m in sse.messages] == ["s1:0:0"]
        assert ws_frames[-1] == {"type": "closing", "reason": "maintenance",
                                 "delivered": [{"sub": "all", "session": "s1", "epoch": 0, "seq": 0}]}
        assert ws_code == [1001]
        with pytest.raises(RelayClosed):
            await conn.ingest(event(1))
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            await c.get(base + "/healthz")


async def test_shutdown_is_bounded_with_a_consumer_that_stopped_reading():
    relay = Relay(queue_soft_bytes=64 << 20, queue_hard_bytes=128 << 20)  # never shed by §8.4 here
    stop = trio.Event()
    done = trio.Event()
    conn = relay.attach_emitter(emitter_hello(), _noop)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with trio.open_nursery() as n:

        async def serve(task_status=trio.TASK_STATUS_IGNORED):
            await serve_relay(relay, sock, shutdown=stop, task_status=task_status)
            done.set()

        await n.start(serve)
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(b"GET /stream HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        try:
            await wait_until(lambda: relay.stats()["subscribers"] == 1)
            (outlet,) = relay.outlets
            seq = 0
            with trio.fail_after(WAIT):
                while not (outlet.in_send and outlet.queued):  # the writer is stuck in a send
                    await conn.ingest(event(seq, data={"pad": "x" * 16000}))
                    seq += 1
            stop.set()
            with trio.fail_after(WAIT):
                await done.wait()
            assert relay.counters["connections_aborted"] == 1
            assert not relay.outlets
        finally:
            stalled.close()
