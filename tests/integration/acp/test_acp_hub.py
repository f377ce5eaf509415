"""The ACP bridge in process, on a real hypercorn listener through the
daemon's :class:`supervisor.web.mounts.Mounts`: a raw tee speaking the wire,
the mapping in the bridge's own run, the path unmounted between runs, and a
restart that starts clean (the run state lives in the per-run ``TeeHub``)."""
from __future__ import annotations

import json
import logging

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from bridges.acp import AcpBridge, wire
from bridges.core.asgi import lifespan
from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.envelope import Stamper
from supervisor.web.http import serve_asgi
from supervisor.web.mounts import Mounts


async def not_found(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    if scope["type"] == "websocket":
        await receive()
        return await send({"type": "websocket.close", "code": 1008})
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def frame(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


async def events(recv, n: int) -> list[dict]:
    out = []
    with trio.fail_after(10):
        while len(out) < n:
            out.append((await recv.receive()).event)
    return out


def test_mount_refuses_a_second_owner():
    m = Mounts()
    with m.mount("/x", not_found):
        with pytest.raises(ValueError):
            with m.mount("/x", not_found):
                pass
        assert m.mounted() == ["/x"]
    assert m.mounted() == []


async def test_a_restarted_bridge_starts_clean(nursery):
    mounts = Mounts(token="tok")
    stop = trio.Event()
    (url,) = await nursery.start(serve_asgi, mounts.wrap(not_found), "127.0.0.1", 0, stop)
    ws_url = url.replace("http://", "ws://") + "/bridges/acp/acp"
    auth = [(b"authorization", b"Bearer tok")]
    send, recv = trio.open_memory_channel(100)
    _, commands = trio.open_memory_channel(1)
    ctx = BridgeContext("acp", Stamper("acp", epoch=1, host="h"), send, commands, BridgeHealth(),
                        logging.getLogger("test.acp"), mounts=mounts)
    bridge = AcpBridge()

    async def run_once(task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            await bridge.run(ctx, task_status=task_status)
        return scope

    hello = json.dumps(wire.hello("TEE1", "acp", ["agent"], 1, {"drops": 0}))
    async with trio.open_nursery() as runs:
        await runs.start(run_once)
        assert ctx.health.source is True
        with pytest.raises(ConnectionRejected) as e:  # the daemon's token guard
            async with open_websocket_url(ws_url):
                pass
        assert e.value.status_code == 401
        async with open_websocket_url(ws_url, extra_headers=auth) as ws:
            await ws.send_message(hello)
            # a session bound, then a prompt request split across two records
            await ws.send_message(
                wire.record("client", frame({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                                             "params": {"cwd": "/"}}))
                + wire.record("agent", frame({"jsonrpc": "2.0", "id": 1,
                                              "result": {"sessionId": "s1"}})))
            prompt = frame({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                            "params": {"sessionId": "s1", "prompt": []}})
            await ws.send_message(wire.record("client", prompt[:20]))
            await ws.send_message(wire.record("client", prompt[20:]))
            got = await events(recv, 3)
            assert [e["type"] for e in got] == ["x.acp.session.new", "session.started",
                                                "run.started"]
            assert got[2]["run"] == "TEE1.2"
            assert ctx.health.counters["tees_attached"] == 1
            runs.cancel_scope.cancel()  # the bridge stops: the tee is told to come back later
            with pytest.raises(ConnectionClosed) as closed:
                with trio.fail_after(10):
                    await ws.get_message()
            assert closed.value.reason.code == 1012
    assert ctx.health.source is False and mounts.mounted() == []
    async with trio.open_nursery() as runs:
        await runs.start(run_once)
        async with open_websocket_url(ws_url, extra_headers=auth) as ws:
            await ws.send_message(hello)  # the same tee, reconnecting
            await ws.send_message(wire.record("agent", frame(
                {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}})))
            (ev,) = await events(recv, 1)
            # the new run knows nothing of the old one's pending prompt
            assert ev["type"] == "x.acp.rpc.unmatched"
        runs.cancel_scope.cancel()
    stop.set()


async def test_more_tees_than_allowed_are_refused_503(nursery):
    mounts = Mounts()
    stop = trio.Event()
    (url,) = await nursery.start(serve_asgi, mounts.wrap(not_found), "127.0.0.1", 0, stop)
    ws_url = url.replace("http://", "ws://") + "/bridges/acp/acp"
    send, recv = trio.open_memory_channel(100)
    _, commands = trio.open_memory_channel(1)
    ctx = BridgeContext("acp", Stamper("acp", epoch=1, host="h"), send, commands, BridgeHealth(),
                        logging.getLogger("test.acp"), mounts=mounts)
    from bridges.acp.config import AcpConfig
    bridge = AcpBridge(config=AcpConfig(max_tees=1))
    async with trio.open_nursery() as runs:
        await runs.start(bridge.run, ctx)
        async with open_websocket_url(ws_url) as first:
            await first.send_message(json.dumps(wire.hello("TEEA", "acp", ["a"], 1, {})))
            with trio.fail_after(10):
                while ctx.health.counters["tees_attached"] != 1:
                    await trio.sleep(0.01)
            with pytest.raises(ConnectionRejected) as e:
                async with open_websocket_url(ws_url):
                    pass
            assert e.value.status_code == 503
            assert ctx.health.counters["refused"] == 1
        runs.cancel_scope.cancel()
    stop.set()
