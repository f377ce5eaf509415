"""The relay's long-lived bindings (AEP-0003 §3.3 SSE, §3.5 WebSocket): the
writers that drain a connection's :class:`~.outlet.Outlet` onto the ASGI
connection, and the WebSocket's reader and pinger. :mod:`.app` decides
whether a request may open one (auth, browsers) and hands it over.

Every send is shielded from our own cancellation (:func:`_send_shielded`):
a send stuck on a peer that stopped reading is ended by
:meth:`Outlet.kill <supervisor.relay.outlet.Outlet.kill>` (a socket abort,
when the server gives one), never by leaving hypercorn's connection half
torn down."""
from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import trio

from bridges.core.asgi import ABORT_KEY, Receive, Scope, Send, refuse_upgrade, respond
from bridges.core.asgi import header as _header

from .attrmatch import FilterTooLarge, InvalidFilter
from .connections import SocketConnection
from .core import Relay
from .outlet import CLOSED, TERMINATED, Outlet
from .params import (
    parse_capture,
    parse_filter_json,
    parse_from_json,
    parse_last_event_id,
)

__all__ = ["serve_sse", "pump_sse", "serve_socket", "refuse_upgrade"]

log = logging.getLogger("aep.relay.http")


def _query(scope: Scope) -> dict[str, str]:
    qs = scope.get("query_string", b"").decode("utf-8", "replace")
    return dict(urllib.parse.parse_qsl(qs, keep_blank_values=True))


async def serve_sse(relay: Relay, scope: Scope, receive: Receive, send: Send) -> None:
    """``GET /stream`` once authorized (AEP-0003 §3.3): parse ``filter``,
    ``capture``, ``from``, ``live`` and ``Last-Event-ID`` (a refusal is a 400
    before any header), then stream the outlet until it ends or the client
    goes."""
    q = _query(scope)
    try:
        flt = parse_filter_json(q.get("filter"), relay.max_filter_terms)
        ceiling = parse_capture(q.get("capture") or None)
        plan_all, positions = parse_from_json(q.get("from"))
    except FilterTooLarge as e:
        return await respond(send, 400, {"error": "limit-exceeded", "detail": str(e)})
    except InvalidFilter as e:
        return await respond(send, 400, {"error": "invalid-filter", "detail": str(e)})
    if positions is not None and len(positions) > relay.max_from:
        return await respond(send, 400, {
            "error": "limit-exceeded",
            "detail": f"from exceeds AEP_MAX_FROM={relay.max_from} resume positions"})
    if not plan_all and not positions:
        lei = _header(scope, b"last-event-id")
        parsed = parse_last_event_id(lei) if lei else None
        if parsed is not None:
            positions = [parsed]
    live = q.get("live") != "0"
    start = {"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no")]}
    if scope["method"] == "HEAD":
        await send(start)
        return await send({"type": "http.response.body", "body": b""})
    outlet = relay.open_stream(flt, ceiling, plan_all=plan_all, positions=positions, live=live)
    outlet.abort = scope.get("state", {}).get(ABORT_KEY)
    try:
        # a client that posts once the response began must see its event
        await relay.live_fixed(outlet)
        await send(start)
    except BaseException:
        outlet.closed()
        raise
    await pump_sse(relay, outlet, receive, send)


async def pump_sse(relay: Relay, outlet: Outlet, receive: Receive, send: Send) -> None:
    """Write ``outlet`` as one SSE response body: batches (lingering per
    :meth:`Relay.sse_linger`) after a ``: connected`` comment, ``: ping``
    after ``heartbeat_s`` idle, until
    the outlet ends or the client disconnects; a shed consumer's connection
    is aborted."""
    heartbeat = relay.heartbeat_s
    last_write = -heartbeat
    try:
        # a comment at once (the outlet already open, so nothing is missed
        # meanwhile): `curl -N` shows the stream is live before any event
        await send({"type": "http.response.body", "more_body": True,
                    "body": b": connected; heartbeat every %gs\n\n" % heartbeat})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
            nursery.start_soon(_watch_stuck, outlet)
            while True:
                with trio.move_on_after(heartbeat) as idle:
                    payloads, end = await outlet.next_batch(linger=relay.sse_linger(),
                                                            last_write=last_write)
                if idle.cancelled_caught:
                    payloads, end = [b": ping\n\n"], None
                body = b"".join(payloads)
                if body or end is not None:
                    await _send_shielded(outlet, send, {"type": "http.response.body", "body": body,
                                                        "more_body": end is None})
                    last_write = trio.current_time()
                if end is not None:
                    break
            nursery.cancel_scope.cancel()
        if outlet.state == TERMINATED:
            outlet.kill()  # a shed consumer's connection is closed, not kept alive
    except Exception as e:  # noqa: BLE001 -- a broken stream costs nothing more
        if not isinstance(e, (trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
            log.debug("relay: SSE stream ended: %s", type(e).__name__)
    finally:
        outlet.closed()


async def serve_socket(relay: Relay, scope: Scope, receive: Receive, send: Send) -> None:
    """An accepted-to-be ``/socket`` upgrade (the caller checked it may be):
    accept, then run the duplex (AEP-0003 §3.5) until either side ends it:
    a reader feeding :meth:`SocketConnection.handle_text`, a pinger (liveness,
    §3.5 rule 5) and the writer draining the outlet."""
    try:
        await send({"type": "websocket.accept"})
    except Exception:  # noqa: BLE001 -- the server's connection broke under the handshake
        # (h11 refuses the 101 when bytes were pipelined behind the upgrade)
        return
    headers, qs = scope["headers"], scope.get("query_string", b"")
    conn = relay.open_socket(relay.authenticated(headers, qs), relay.principal(headers, qs))
    conn.outlet.abort = scope.get("state", {}).get(ABORT_KEY)
    last_rx = [trio.current_time()]
    peer_gone = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_ws_reader, conn, receive, nursery.cancel_scope, last_rx, peer_gone)
            nursery.start_soon(_ws_pinger, relay, conn, last_rx)
            nursery.start_soon(_watch_stuck, conn.outlet)
            if await _ws_writer(conn, send):
                # we sent a close frame: finish the close handshake (RFC 6455
                # §7.1.1) by waiting, bounded, for the peer's. Returning at once
                # drops TCP under the peer's reply; the reset then discards what
                # it had not read yet (issue 10 #1: Node's WebSocket lost the
                # error frame and saw 1006)
                with trio.move_on_after(relay.ws_close_wait_s):
                    await peer_gone.wait()
            nursery.cancel_scope.cancel()
    except Exception as e:  # noqa: BLE001 -- one socket's fault stays with it
        if not isinstance(e, (trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
            log.warning("relay: websocket ended on %s", type(e).__name__)
    finally:
        conn.close()


async def _ws_reader(conn: SocketConnection, receive: Receive,
                     scope: trio.CancelScope, last_rx: list[float],
                     peer_gone: trio.Event | None = None) -> None:
    while True:
        msg = await receive()
        last_rx[0] = trio.current_time()
        t = msg["type"]
        if t == "websocket.disconnect":
            if peer_gone is not None:
                peer_gone.set()
            scope.cancel()
            return
        if t != "websocket.receive":
            continue
        if msg.get("text") is not None:
            try:
                await conn.handle_text(msg["text"])
            except Exception as e:  # noqa: BLE001 -- a bug answers, never crashes the socket
                log.exception("relay: frame handling failed")
                conn.error("internal-error", type(e).__name__)
        elif msg.get("bytes") is not None:
            conn.handle_binary()


async def _ws_pinger(relay: Relay, conn: SocketConnection, last_rx: list[float]) -> None:
    while True:
        await trio.sleep(relay.ws_ping_s)
        now = trio.current_time()
        if now - last_rx[0] > relay.ws_timeout_s:
            conn.outlet.terminate("ping-timeout", code=1001)
            return
        conn.ping(int(now * 1000))


async def _ws_writer(conn: SocketConnection, send: Send) -> bool:
    """Write the outlet until its end; ``True`` when a close frame was sent."""
    outlet = conn.outlet
    while outlet.state != CLOSED:
        payloads, end = await outlet.next_batch()
        for text in payloads:
            await _send_shielded(outlet, send, {"type": "websocket.send", "text": text})
        if end is not None:
            code, reason = end if isinstance(end, tuple) else (1000, "")
            await _send_shielded(outlet, send, {"type": "websocket.close", "code": code,
                                                "reason": reason})
            return True
    return False


async def _send_shielded(outlet: Outlet, send: Send, message: dict[str, Any]) -> None:
    """One ASGI send, never interrupted by our own cancellation: a cancel
    landing inside the server's send path (e.g. on a disconnect) would leave
    its connection half torn down. A send stuck on a peer that stopped
    reading is ended by :meth:`Outlet.kill` (socket abort) instead."""
    outlet.in_send = True
    outlet.send_started = trio.current_time()
    try:
        with trio.CancelScope(shield=True):
            await send(message)
    finally:
        outlet.in_send = False
    # a send to a peer that is gone returns without yielding: without this
    # checkpoint a writer with a long replay spins the loop to the end of it,
    # and never sees its own cancellation (issue 10 #3)
    await trio.lowlevel.checkpoint()


async def _watch_stuck(outlet: Outlet) -> None:
    """Shed the consumer once its writer is stuck (issue 10 #7; no offer may
    come to notice it: traffic can stop while the stuck one holds its queue)."""
    period = max(outlet.hub.stuck_s / 4, 0.05)
    while outlet.state not in (TERMINATED, CLOSED):
        await trio.sleep(period)
        if outlet.shed_if_stuck():
            return


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            scope.cancel()
            return
