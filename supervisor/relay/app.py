"""The relay's ASGI face, served by hypercorn's trio worker (AEP-0003 §3):

- ``POST /events``: one event (``application/json``) or an NDJSON batch
  (``application/x-ndjson``); ``AEP-Version: 0.1`` required. 202
  ``{"accepted": n}``; 400 ``{"error": "invalid-event", "detail", "line"?}``
  (the batch is rejected whole, nothing ingested); 401 without the token;
  403 for commands (control flows only on the WebSocket, AEP-0004 §4.1);
  413 ``payload-too-large`` (``AEP_MAX_BODY``) or ``too-many-events``
  (``AEP_MAX_BATCH``); 415 for another content type; 426
  ``{"versions": ["0.1"]}`` for a missing or unsupported version.
- ``GET /events`` and ``GET /.well-known/aep``: the discovery document.
- ``GET /stream``: SSE with ``filter``, ``capture``, ``from`` (JSON array
  or ``all``), ``live=0`` and ``Last-Event-ID``; refusals (400) go out
  before any header.
- ``GET /socket``: the WebSocket duplex (hello, subscriptions, roster,
  events, commands, ping/pong).
- ``GET /healthz``: ``{"ok": true}`` to anyone; counts only when
  authorized.

Authentication: ``Authorization: Bearer <token>`` or ``?access_token=``.
Nothing here logs a request line or a query string (the token may ride
it, §8.1).

Browsers (a page in the operator's browser must not read the stream or
inject events; AEP-0003 §8):

- CORS headers go only to origins listed in ``Relay(cors_origins=...)``
  (``AEP_CORS_ORIGINS``): ``Access-Control-Allow-Origin: <that origin>``
  plus ``Vary: Origin``, for reads and ``POST /events``. With a token set
  and no list, reads (``GET``/``HEAD``) answer ``*`` from any origin: the
  bearer token is what protects them, and a page cannot have it unless the
  operator gave it. Writes from a browser always need a listed origin.
- A request carrying an ``Origin`` it is not allowed to use is refused 403
  ``origin-not-allowed`` before anything else (preflight included), so
  even a request the browser sends without preflight does nothing. Tools
  (curl, the SDK, bridges) send no ``Origin`` and are unaffected.
- ``/socket``: an upgrade whose ``Origin`` is present and not listed is
  refused 403 (the socket carries writes and commands; no ``*`` for it).
- DNS rebinding: when the listener is bound to a loopback address, a
  request whose ``Host`` is not a loopback name (``localhost``,
  ``*.localhost``), a loopback address or the bound host is refused 403
  ``host-not-allowed`` (all paths, ``/healthz`` and ``/socket``
  included). A request without ``Host`` (HTTP/1.0 tools) is not a browser
  and passes. A non-loopback bind is exposed on purpose and is not
  guarded this way (set ``AEP_TOKEN``). The bound address comes from the
  connection state :func:`~bridges.core.http.serve_app` sets
  (:data:`~bridges.core.asgi.LISTEN_KEY`), else from the ASGI scope's ``server``."""
from __future__ import annotations

import json
import logging
import urllib.parse
from typing import Any, Callable

import trio

from bridges.core.aep import AEP_VERSION, is_command_type, loads
from bridges.core.asgi import ABORT_KEY, header as _header, host_allowed, lifespan, listen_host
from bridges.core.http import FaultLog, fault_kind

from .attrmatch import InvalidFilter
from .connections import SocketConnection
from .core import Relay
from .envelope import InvalidEvent
from .outlet import CLOSED, TERMINATED, Outlet
from .params import (normalize_origin, parse_capture, parse_filter_json, parse_from_json,
                     parse_last_event_id)

__all__ = ["RelayApp", "make_app"]

log = logging.getLogger("aep.relay.http")
_FAULTS = FaultLog(log)

_JSON = b"application/json"
_ACAO = b"access-control-allow-origin"
_VARY = (b"vary", b"Origin")
_ALLOW_HEADERS = (b"access-control-allow-headers",
                  b"authorization, accept, content-type, last-event-id, aep-version")
_READS = ("GET", "HEAD")


async def _respond(send: Callable, status: int, body: Any = None, *,
                   headers: list[tuple[bytes, bytes]] | None = None, close: bool = False) -> None:
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    hs = [(b"content-length", str(len(data)).encode())] + list(headers or [])
    if body is not None:
        hs.append((b"content-type", _JSON))
    if close:
        hs.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": data})


def _with_headers(send: Callable, extra: list[tuple[bytes, bytes]]) -> Callable:
    """``send`` adding ``extra`` headers to the response start."""
    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": list(message.get("headers", [])) + extra}
        await send(message)
    return wrapped


def _query(scope: dict[str, Any]) -> dict[str, str]:
    qs = scope.get("query_string", b"").decode("utf-8", "replace")
    return dict(urllib.parse.parse_qsl(qs, keep_blank_values=True))


class RelayApp:
    """The ASGI application for one :class:`~supervisor.relay.core.Relay`.
    ``healthz(authorized) -> dict`` replaces the relay's own health body
    (the daemon adds per-bridge status); when authorized and the body has no
    ``relay_counts`` key, the relay's counts are added under it."""

    def __init__(self, relay: Relay, healthz: Callable[[bool], dict[str, Any]] | None = None) -> None:
        self.relay = relay
        self.healthz = healthz

    def connection_fault(self, kind: str) -> None:
        """Count a connection the server had to close on an exception
        (called by :func:`bridges.core.http.serve_app`)."""
        self.relay.counters["connection_errors"] += 1

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        kind = scope["type"]
        try:
            if kind == "http":
                await self._http(scope, receive, send)
            elif kind == "websocket":
                await self._websocket(scope, receive, send)
            elif kind == "lifespan":
                await lifespan(receive, send)
        except Exception as e:  # noqa: BLE001 -- one request's fault stays with it
            # (e.g. h11 refusing our answer on a connection a hostile client
            # already broke): counted, logged once per kind, no traceback flood
            self.relay.counters["handler_errors"] += 1
            _FAULTS.record(fault_kind(e), f"relay {kind} handler", e)

    # -- browsers ----------------------------------------------------------------
    def _cors(self, origin: str | None, write: bool) -> list[tuple[bytes, bytes]] | None:
        """The CORS headers for a request from ``origin`` (``[]`` without
        one), or ``None`` when that origin may not make it (see the module
        docstring, "Browsers")."""
        if origin is None:
            return []
        relay = self.relay
        if normalize_origin(origin) in relay.cors_origins:
            return [(_ACAO, origin.encode("latin-1")), _VARY]
        if not write and relay.has_token and not relay.cors_origins:
            return [(_ACAO, b"*")]
        return None

    def _host_ok(self, scope: dict[str, Any]) -> bool:
        if host_allowed(_header(scope, b"host") or "", listen_host(scope)):
            return True
        self.relay.counters["refused_host"] += 1
        return False

    # -- HTTP ------------------------------------------------------------------
    async def _http(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        path, method = scope["path"], scope["method"]
        relay = self.relay
        if not self._host_ok(scope):
            return await _respond(send, 403, {"error": "host-not-allowed"}, close=True)
        origin = _header(scope, b"origin")
        if method == "OPTIONS" and path in ("/stream", "/events", "/.well-known/aep"):
            # preflight carries no token by design: it grants only the right to ask
            asked = (_header(scope, b"access-control-request-method") or "GET").strip().upper()
            if origin is None:  # not a CORS preflight: what the path takes, no grant
                return await _respond(send, 204, headers=[(b"allow", b"GET, POST, OPTIONS")])
            cors = self._cors(origin, asked not in _READS)
            if cors is None:
                relay.counters["refused_origin"] += 1
                return await _respond(send, 403, {"error": "origin-not-allowed"})
            listed = cors[0][1] != b"*"
            return await _respond(send, 204, headers=cors + [
                (b"access-control-allow-methods", b"GET, POST, OPTIONS" if listed else b"GET, OPTIONS"),
                _ALLOW_HEADERS, (b"access-control-max-age", b"86400")])
        cors = self._cors(origin, method not in _READS)
        if cors is None:
            relay.counters["refused_origin"] += 1
            return await _respond(send, 403, {"error": "origin-not-allowed"})
        if cors:
            send = _with_headers(send, cors)  # every answer from here on, stream included
        if path == "/healthz":
            if method not in ("GET", "HEAD"):
                return await _respond(send, 405, {"error": "method-not-allowed"})
            return await self._healthz(scope, send)
        if path not in ("/events", "/.well-known/aep", "/stream"):
            return await _respond(send, 404, {"error": "not-found"})
        if not relay.authorized(scope["headers"], scope.get("query_string", b"")):
            return await _respond(send, 401, {"error": "unauthorized"},
                                  headers=[(b"www-authenticate", b"Bearer")])
        if relay.closing:
            return await _respond(send, 503, {"error": "shutting-down"}, close=True)
        if path == "/stream":
            if method not in ("GET", "HEAD"):
                return await _respond(send, 405, {"error": "method-not-allowed"})
            return await self._stream(scope, receive, send)
        if method in ("GET", "HEAD"):
            return await _respond(send, 200, relay.discovery())
        if path == "/events" and method == "POST":
            return await self._post(scope, receive, send)
        return await _respond(send, 405, {"error": "method-not-allowed"})

    async def _healthz(self, scope: dict[str, Any], send: Callable) -> None:
        authed = self.relay.authorized(scope["headers"], scope.get("query_string", b""))
        if self.healthz is not None:
            body = dict(self.healthz(authed))
            if authed and "relay_counts" not in body:
                body["relay_counts"] = self.relay.stats()
        else:
            body = {"ok": True}
            if authed:
                body.update(self.relay.stats())
        await _respond(send, 200, body, headers=[(b"cache-control", b"no-store")])

    async def _read_body(self, scope: dict[str, Any], receive: Callable) -> bytes | None:
        """The request body, or ``None`` when it exceeds ``max_body`` (the
        remainder is drained up to the same amount again so the emitter can
        read the 413 instead of a reset)."""
        limit = self.relay.max_body
        body = bytearray()
        over = False
        drained = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise trio.BrokenResourceError("client went away")
            chunk = msg.get("body", b"")
            if over:
                drained += len(chunk)
            else:
                body += chunk
                if len(body) > limit:
                    over, body = True, bytearray()
            if not msg.get("more_body") or drained > limit:
                return None if over else bytes(body)

    async def _post(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        relay = self.relay
        if (_header(scope, b"aep-version") or "").strip() != AEP_VERSION:
            return await _respond(send, 426, {"versions": [AEP_VERSION]},
                                  headers=[(b"upgrade", b"AEP/" + AEP_VERSION.encode())])
        ctype = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        if ctype not in ("application/json", "application/x-ndjson"):
            return await _respond(send, 415, {
                "error": "unsupported-media-type",
                "detail": "use application/json (one event) or application/x-ndjson (a batch)"})
        declared = _header(scope, b"content-length")
        too_large = {"error": "payload-too-large", "max_bytes": relay.max_body}
        if declared is not None and declared.isascii() and declared.isdigit() \
                and (len(declared) > 19 or int(declared) > 2 * relay.max_body):
            return await _respond(send, 413, too_large, close=True)
        try:
            body = await self._read_body(scope, receive)
        except trio.BrokenResourceError:
            return
        if body is None:
            return await _respond(send, 413, too_large, close=True)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return await _respond(send, 400, {"error": "invalid-event", "detail": "body is not UTF-8"})
        if ctype == "application/json":
            lines = [(0, text)]
        else:
            lines = [(i, ln) for i, ln in enumerate(text.split("\n")) if ln.strip()]
            if len(lines) > relay.max_batch:
                return await _respond(send, 413, {"error": "too-many-events",
                                                  "max": relay.max_batch, "count": len(lines)})
        entries = []
        batch = ctype != "application/json"
        for lineno, ln in lines:
            where = {"line": lineno} if batch else {}  # 0-based line of the body
            try:
                ev = loads(ln)
                entry = relay.entry(ev)
            except (ValueError, InvalidEvent) as e:
                relay.counters["invalid_events"] += 1
                detail = str(e) if isinstance(e, InvalidEvent) else f"not valid JSON: {e}"
                return await _respond(send, 400, {"error": "invalid-event", "detail": detail, **where})
            if is_command_type(ev["type"]):
                return await _respond(send, 403, {
                    "error": "unauthorized", **where,
                    "detail": "commands flow only on an authenticated WebSocket (AEP-0004 §4.1)"})
            entries.append(entry)
        problem = relay.check_batch(entries)
        if problem is not None:
            index, detail = problem
            relay.counters["invalid_events"] += 1
            where = {"line": lines[index][0]} if batch else {}
            return await _respond(send, 400, {"error": "invalid-event", "detail": detail, **where})
        if relay.closing:
            return await _respond(send, 503, {"error": "shutting-down"}, close=True)
        relay.ingest_http(entries)
        await _respond(send, 202, {"accepted": len(entries)})

    # -- SSE -------------------------------------------------------------------
    async def _stream(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        relay = self.relay
        q = _query(scope)
        try:
            flt = parse_filter_json(q.get("filter"))
            ceiling = parse_capture(q.get("capture") or None)
            plan_all, positions = parse_from_json(q.get("from"))
        except InvalidFilter as e:
            return await _respond(send, 400, {"error": "invalid-filter", "detail": str(e)})
        if positions is not None and len(positions) > relay.max_from:
            return await _respond(send, 400, {
                "error": "limit-exceeded",
                "detail": f"from exceeds AEP_MAX_FROM={relay.max_from} resume positions"})
        if not plan_all and not positions:
            lei = _header(scope, b"last-event-id")
            parsed = parse_last_event_id(lei) if lei else None
            if parsed is not None:
                positions = [parsed]
        live = q.get("live") != "0"
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]})
        if scope["method"] == "HEAD":
            return await send({"type": "http.response.body", "body": b""})
        outlet = relay.open_stream(flt, ceiling, plan_all=plan_all, positions=positions, live=live)
        outlet.abort = scope.get("state", {}).get(ABORT_KEY)
        await self._pump_sse(outlet, receive, send)

    async def _pump_sse(self, outlet: Outlet, receive: Callable, send: Callable) -> None:
        relay = self.relay
        heartbeat = relay.heartbeat_s
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                while True:
                    with trio.move_on_after(heartbeat) as idle:
                        payloads, end = await outlet.next_batch(linger=relay.sse_linger())
                    if idle.cancelled_caught:
                        payloads, end = [b": ping\n\n"], None
                    body = b"".join(payloads)
                    if body or end is not None:
                        await _send_shielded(outlet, send, {"type": "http.response.body", "body": body,
                                                            "more_body": end is None})
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

    # -- WebSocket ---------------------------------------------------------------
    async def _websocket(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        relay = self.relay
        msg = await receive()
        if msg["type"] != "websocket.connect":
            return
        status = None
        origin = _header(scope, b"origin")
        if not self._host_ok(scope):
            status, body = 403, {"error": "host-not-allowed"}
        elif origin is not None and normalize_origin(origin) not in relay.cors_origins:
            relay.counters["refused_origin"] += 1
            status, body = 403, {"error": "origin-not-allowed"}
        elif scope["path"] != "/socket":
            status, body = 404, {"error": "not-found"}
        elif not relay.authorized(scope["headers"], scope.get("query_string", b"")):
            status, body = 401, {"error": "unauthorized"}
        elif relay.closing:
            status, body = 503, {"error": "shutting-down"}
        if status is not None:
            return await _ws_refuse(scope, send, status, body)
        try:
            await send({"type": "websocket.accept"})
        except Exception:  # noqa: BLE001 -- the server's connection broke under the handshake
            # (h11 refuses the 101 when bytes were pipelined behind the upgrade)
            return
        conn = relay.open_socket(relay.authenticated(scope["headers"], scope.get("query_string", b"")))
        conn.outlet.abort = scope.get("state", {}).get(ABORT_KEY)
        last_rx = [trio.current_time()]
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ws_reader, conn, receive, nursery.cancel_scope, last_rx)
                nursery.start_soon(self._ws_pinger, conn, last_rx)
                await self._ws_writer(conn, send)
                nursery.cancel_scope.cancel()
        except Exception as e:  # noqa: BLE001 -- one socket's fault stays with it
            if not isinstance(e, (trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
                log.warning("relay: websocket ended on %s", type(e).__name__)
        finally:
            conn.close()

    async def _ws_reader(self, conn: SocketConnection, receive: Callable,
                         scope: trio.CancelScope, last_rx: list[float]) -> None:
        while True:
            msg = await receive()
            last_rx[0] = trio.current_time()
            t = msg["type"]
            if t == "websocket.disconnect":
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

    async def _ws_pinger(self, conn: SocketConnection, last_rx: list[float]) -> None:
        relay = self.relay
        while True:
            await trio.sleep(relay.ws_ping_s)
            now = trio.current_time()
            if now - last_rx[0] > relay.ws_timeout_s:
                conn.outlet.terminate("ping-timeout", code=1001)
                return
            conn.ping(int(now * 1000))

    async def _ws_writer(self, conn: SocketConnection, send: Callable) -> None:
        outlet = conn.outlet
        while outlet.state != CLOSED:
            payloads, end = await outlet.next_batch()
            for text in payloads:
                await _send_shielded(outlet, send, {"type": "websocket.send", "text": text})
            if end is not None:
                code, reason = end if isinstance(end, tuple) else (1000, "")
                await _send_shielded(outlet, send, {"type": "websocket.close", "code": code,
                                                    "reason": reason})
                return


async def _send_shielded(outlet: Outlet, send: Callable, message: dict[str, Any]) -> None:
    """One ASGI send, never interrupted by our own cancellation: a cancel
    landing inside the server's send path (e.g. on a disconnect) would leave
    its connection half torn down. A send stuck on a peer that stopped
    reading is ended by :meth:`Outlet.kill` (socket abort) instead."""
    outlet.in_send = True
    try:
        with trio.CancelScope(shield=True):
            await send(message)
    finally:
        outlet.in_send = False


async def _watch_disconnect(receive: Callable, scope: trio.CancelScope) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            scope.cancel()
            return


async def _ws_refuse(scope: dict[str, Any], send: Callable, status: int, body: Any) -> None:
    """Refuse the upgrade with a real HTTP status when the server supports
    the ASGI websocket denial extension (hypercorn does), else close (403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        data = json.dumps(body).encode()
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", _JSON), (b"content-length", str(len(data)).encode())]
                    + ([(b"www-authenticate", b"Bearer")] if status == 401 else [])})
        await send({"type": "websocket.http.response.body", "body": data})
    else:
        await send({"type": "websocket.close", "code": 1008})


def make_app(relay: Relay, *, healthz: Callable[[bool], dict[str, Any]] | None = None) -> RelayApp:
    """The relay's ASGI app. ``healthz(authorized) -> dict`` optionally
    replaces the bare health body (see :class:`RelayApp`)."""
    return RelayApp(relay, healthz)
