"""The tee's own link (:class:`bridges.acp.link.DaemonLink`) against the
ACP bridge in process, on a real hypercorn listener: a tee id is bound to
the connection that first used it (issue 25 row 5), and the real tee stays
compatible with that: it keeps the daemon's resume key across a dropped
connection (the same story continues), and a tee whose id another
connection holds mints a new one."""
from __future__ import annotations

import json
import logging

import trio
from trio_websocket import open_websocket_url

from bridges.acp import AcpBridge, wire
from bridges.acp.link import DaemonLink, ObservationQueue
from bridges.acp.tee import TeeOptions
from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.envelope import Stamper
from supervisor.web.http import serve_asgi
from supervisor.web.mounts import Mounts
from tests.integration.acp.test_acp_hub import frame, not_found


async def wait_for(pred, what: str) -> None:
    with trio.fail_after(20):
        while not pred():
            await trio.sleep(0.02)


async def start_hub(nursery):
    mounts = Mounts()
    stop = trio.Event()
    (url,) = await nursery.start(serve_asgi, mounts.wrap(not_found), "127.0.0.1", 0, stop)
    send, recv = trio.open_memory_channel(1000)
    _, commands = trio.open_memory_channel(1)
    ctx = BridgeContext("acp", Stamper("acp", epoch=1, host="h"), send, commands, BridgeHealth(),
                        logging.getLogger("test.acp"), mounts=mounts)
    run = await nursery.start(AcpBridge().run, ctx)
    return url, ctx, run.hub, recv, stop


def link_for(url: str, tee_id: str, notes: list[str]) -> DaemonLink:
    opts = TeeOptions(command=["agent"], daemon=url, tee_id=tee_id)
    return DaemonLink(opts, ObservationQueue(), lambda: {"drops": 0}, note=notes.append)


async def test_the_tee_keeps_its_key_across_a_dropped_connection(nursery):
    url, ctx, hub, recv, stop = await start_hub(nursery)
    notes: list[str] = []
    link = link_for(url, "TEEKEY", notes)
    nursery.start_soon(link.run)
    await wait_for(lambda: link.resume is not None, "the welcome")
    key = link.resume
    assert key == hub.tees["TEEKEY"].key
    link.queue.push(wire.piece("client", frame({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                                                "params": {"cwd": "/"}})))
    await wait_for(lambda: ctx.health.counters["lines"] == 1, "the first line")
    for scope in list(hub._handlers):  # the connection drops (the daemon side closes it)
        scope.cancel()
    await wait_for(lambda: ctx.health.counters["tees_attached"] == 0, "the drop")
    # the link reconnects with its key and sends this there
    link.queue.push(wire.piece("agent", frame({"jsonrpc": "2.0", "id": 1,
                                               "result": {"sessionId": "s1"}})))
    await wait_for(lambda: ctx.health.counters["lines"] == 2, "the second line")
    assert link.connections == 2
    c = ctx.health.counters
    assert link.tee_id == "TEEKEY" and link.resume == key
    assert c["tees_seen"] == 1 and c["tee_claims_refused"] == 0, c
    types = []
    while True:  # the response joined the request sent on the first connection
        try:
            types.append(recv.receive_nowait().event["type"])
        except trio.WouldBlock:
            break
    assert "session.started" in types, types
    stop.set()


async def test_a_tee_whose_id_is_held_elsewhere_mints_a_new_one(nursery):
    url, ctx, hub, recv, stop = await start_hub(nursery)
    ws_url = url.replace("http://", "ws://") + wire.path_for("acp")
    async with open_websocket_url(ws_url) as squatter:
        await squatter.send_message(json.dumps(wire.hello("HELD", "acp", ["x"], 1, {})))
        await wait_for(lambda: ctx.health.counters["tees_attached"] == 1, "the squatter")
        notes: list[str] = []
        link = link_for(url, "HELD", notes)
        nursery.start_soon(link.run)
        await wait_for(lambda: link.connected and link.resume is not None, "a connection")
        assert link.tee_id != "HELD" and hub.tees[link.tee_id].attached == 1
        c = ctx.health.counters
        assert c["tee_claims_refused"] == 1 and c["tees_attached"] == 2, c
    stop.set()
