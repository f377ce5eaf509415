"""The relay's ASGI face, served by hypercorn's trio worker (AEP-0003 §3):

- ``POST /events``: one event (``application/json``) or an NDJSON batch
  (``application/x-ndjson``); ``AEP-Version: 0.1`` required. 202
  ``{"accepted": n}``; 400 ``{"error": "invalid-event", "detail", "line"?}``
  (the batch is rejected whole, nothing ingested); 401 without the token;
  403 for commands (control flows only on the WebSocket, AEP-0004 §4.1)
  and for acks (only a command's target decides it, :mod:`.acks`);
  413 ``payload-too-large`` (``AEP_MAX_BODY``) or ``too-many-events``
  (``AEP_MAX_BATCH``); 415 for another content type; 426
  ``{"versions": ["0.1"], "error", "detail"}`` for a missing or unsupported
  version (the detail names the header); 429 ``too-many-sessions`` with
  ``Retry-After`` when the batch would open more new session log files
  than ``AEP_RELAY_MAX_NEW_SESSIONS`` / ``AEP_RELAY_NEW_SESSIONS_PER_S``
  admit (nothing of it admitted, :mod:`.newsessions`); 503
  ``unavailable`` when the relay's store did not take the events (the
  embedded relay's session log, :attr:`Relay.persist
  <supervisor.relay.core.Relay.persist>`: a ``202`` means they are on
  disk; a JetStream relay's stream).
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

import logging
from typing import Any, Callable, Sequence

import trio

from bridges.core.aep import ACK_TYPES, AEP_VERSION, check_json, is_command_type, loads
from bridges.core.asgi import (
    Message,
    Receive,
    Scope,
    Send,
    host_allowed,
    lifespan,
    listen_host,
    respond,
    send_metrics,
)
from bridges.core.asgi import header as _header
from bridges.core.http import FaultLog, fault_kind
from bridges.core.pacing import Pacer

from .connections import TooLarge, Unavailable
from .core import Relay
from .envelope import InvalidEvent, formed_entry
from .newsessions import TooManySessions
from .params import normalize_origin
from .streams import refuse_upgrade, serve_socket, serve_sse

__all__ = ["RelayApp", "make_app"]

log = logging.getLogger("aep.relay.http")
_FAULTS = FaultLog(log)

_JSON = b"application/json"
_ACAO = b"access-control-allow-origin"
_VARY = (b"vary", b"Origin")
_ALLOW_HEADERS = (b"access-control-allow-headers",
                  b"authorization, accept, content-type, last-event-id, aep-version")
_READS = ("GET", "HEAD")


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """``send`` adding ``extra`` headers to the response start."""
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": list(message.get("headers", [])) + extra}
        await send(message)
    return wrapped


def _line_number(parts: Sequence[bytes | str], j: int) -> int:
    """The 0-based line of the body holding its ``j``-th event (``parts``:
    the body split at ``\n``, bytes or text; blank lines hold none). Asked
    only for an answer that names a line, so the hot path keeps no index
    per line."""
    for i, line in enumerate(parts):
        if line.strip(b" \t\r") if isinstance(line, bytes) else line.strip(" \t\r"):
            if not j:
                return i
            j -= 1
    raise IndexError(j)


class RelayApp:
    """The ASGI application for one :class:`~supervisor.relay.core.Relay`.
    ``healthz(authorized) -> dict`` replaces the relay's own health body
    (the daemon adds per-bridge status); when authorized and the body has no
    ``relay_counts`` key, the relay's counts are added under it."""

    def __init__(self, relay: Relay, healthz: Callable[[bool], dict[str, Any]] | None = None,
                 metrics: Callable[[str], tuple[bytes, str]] | None = None) -> None:
        self.relay = relay
        self.healthz = healthz
        self.metrics = metrics

    def connection_fault(self, kind: str) -> None:
        """Count a connection the server had to close on an exception
        (called by :func:`bridges.core.http.serve_app`)."""
        self.relay.counters["connection_errors"] += 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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

    def _host_ok(self, scope: Scope) -> bool:
        if host_allowed(_header(scope, b"host") or "", listen_host(scope)):
            return True
        self.relay.counters["refused_host"] += 1
        return False

    # -- HTTP ------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        relay = self.relay
        if not self._host_ok(scope):
            return await respond(send, 403, {"error": "host-not-allowed"}, close=True)
        origin = _header(scope, b"origin")
        if method == "OPTIONS" and path in ("/stream", "/events", "/.well-known/aep"):
            return await self._preflight(scope, origin, send)
        cors = self._cors(origin, method not in _READS)
        if cors is None:
            relay.counters["refused_origin"] += 1
            return await respond(send, 403, {"error": "origin-not-allowed"})
        if cors:
            send = _with_headers(send, cors)  # every answer from here on, stream included
        if path == "/healthz":
            if method not in ("GET", "HEAD"):
                return await respond(send, 405, {"error": "method-not-allowed"})
            return await self._healthz(scope, send)
        if path == "/metrics" and self.metrics is not None:
            return await send_metrics(send, scope, relay.authorized(
                scope["headers"], scope.get("query_string", b"")), self.metrics)
        if path not in ("/events", "/.well-known/aep", "/stream"):
            return await respond(send, 404, {"error": "not-found"})
        if not relay.authorized(scope["headers"], scope.get("query_string", b"")):
            return await respond(send, 401, {"error": "unauthorized"},
                                 headers=[(b"www-authenticate", b"Bearer")])
        if relay.closing:
            return await respond(send, 503, {"error": "shutting-down"}, close=True)
        if path == "/stream":
            if method not in ("GET", "HEAD"):
                return await respond(send, 405, {"error": "method-not-allowed"})
            return await serve_sse(relay, scope, receive, send)
        if method in ("GET", "HEAD"):
            return await respond(send, 200, relay.discovery())
        if path == "/events" and method == "POST":
            return await self._post(scope, receive, send)
        return await respond(send, 405, {"error": "method-not-allowed"})

    async def _preflight(self, scope: Scope, origin: str | None, send: Send) -> None:
        """``OPTIONS``: a CORS preflight grants (or refuses) what ``origin``
        may ask; without ``Origin`` it is no preflight and gets ``Allow``.
        A preflight carries no token by design: it grants only the right to ask."""
        asked = (_header(scope, b"access-control-request-method") or "GET").strip().upper()
        if origin is None:
            return await respond(send, 204, headers=[(b"allow", b"GET, POST, OPTIONS")])
        cors = self._cors(origin, asked not in _READS)
        if cors is None:
            self.relay.counters["refused_origin"] += 1
            return await respond(send, 403, {"error": "origin-not-allowed"})
        listed = cors[0][1] != b"*"
        return await respond(send, 204, headers=cors + [
            (b"access-control-allow-methods", b"GET, POST, OPTIONS" if listed else b"GET, OPTIONS"),
            _ALLOW_HEADERS, (b"access-control-max-age", b"86400")])

    async def _healthz(self, scope: Scope, send: Send) -> None:
        authed = self.relay.authorized(scope["headers"], scope.get("query_string", b""))
        if self.healthz is not None:
            body = dict(self.healthz(authed))
            if authed and "relay_counts" not in body:
                body["relay_counts"] = self.relay.stats()
        else:
            body = {"ok": True}
            if authed:
                body.update(self.relay.stats())
        await respond(send, 200, body, headers=[(b"cache-control", b"no-store")])

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request body, or ``None`` when it exceeds ``max_body`` (the
        remainder is drained up to the same amount again so the emitter can
        read the 413 instead of a reset)."""
        limit = self.relay.max_body
        chunks: list[bytes] = []  # joined once at the end (one copy; none for one chunk)
        size = 0
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
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    over, chunks = True, []
            if not msg.get("more_body") or drained > limit:
                return None if over else b"".join(chunks)

    async def _post(self, scope: Scope, receive: Receive, send: Send) -> None:
        relay = self.relay
        if (sent := (_header(scope, b"aep-version") or "").strip()) != AEP_VERSION:
            # the spec's body ({"versions"}), plus words naming the header: a
            # first POST without it otherwise reads as a version quarrel
            why = f"is {sent!r}" if sent else "is missing"
            return await respond(send, 426, {
                "versions": [AEP_VERSION], "error": "upgrade-required",
                "detail": f"POST /events needs the header AEP-Version: {AEP_VERSION} (it {why})"},
                                  headers=[(b"upgrade", b"AEP/" + AEP_VERSION.encode())])
        ctype = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        if ctype not in ("application/json", "application/x-ndjson"):
            return await respond(send, 415, {
                "error": "unsupported-media-type",
                "detail": "use application/json (one event) or application/x-ndjson (a batch)"})
        declared = _header(scope, b"content-length")
        too_large = {"error": "payload-too-large", "max_bytes": relay.max_body}
        if declared is not None and declared.isascii() and declared.isdigit() \
                and (len(declared) > 19 or int(declared) > 2 * relay.max_body):
            return await respond(send, 413, too_large, close=True)
        body: bytes | None = b""
        with trio.move_on_after(relay.body_timeout_s) as slow:
            try:
                body = await self._read_body(scope, receive)
            except trio.BrokenResourceError:
                return
        if slow.cancelled_caught:  # headers came, the body did not (issue 10 #6)
            relay.counters["body_timeouts"] = relay.counters.get("body_timeouts", 0) + 1
            return await respond(send, 408, {"error": "body-timeout",
                                             "max_seconds": relay.body_timeout_s}, close=True)
        if body is None:
            return await respond(send, 413, too_large, close=True)
        if not body.isascii():  # (ASCII is UTF-8: no decoding to know it)
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                return await respond(send, 400, {"error": "invalid-event",
                                                  "detail": "body is not UTF-8"})
        batch = ctype != "application/json"
        if not batch:
            parts = lines = [body]
        else:
            # blank means JSON whitespace only: strip() of the text would also
            # drop a line of \x0b or U+2028 without a word (AEP-0003 §3.2: 400,
            # with its index). The body's bytes split where its text would:
            # UTF-8 holds no \n byte inside a character
            parts = body.split(b"\n")
            lines = [ln for ln in parts if ln.strip(b" \t\r")]
            if len(lines) > relay.max_batch:
                return await respond(send, 413, {"error": "too-many-events",
                                                  "max": relay.max_batch, "count": len(lines)})
        entries = await self._entries(lines)
        if isinstance(entries, tuple):  # a refusal: (status, detail, index of its event)
            status, detail, j = entries
            where = {"line": _line_number(parts, j)} if batch else {}
            if status == 403:
                return await respond(send, 403, {"error": "unauthorized", **where, "detail": detail})
            return await respond(send, 400, {"error": "invalid-event", "detail": detail, **where})
        principal = relay.principal(scope["headers"], scope.get("query_string", b""))
        # the fleet's sources first, yielding (bounded work a source, but a
        # batch has thousands); then the rest in one step with the admission
        problem = await relay.check_fleet_sources(entries) or \
            relay.check_batch(entries, fleet=False) or \
            relay.check_posted_sessions(entries, principal)
        if problem is not None:
            index, detail = problem
            relay.counters["invalid_events"] += 1
            where = {"line": _line_number(parts, index)} if batch else {}
            return await respond(send, 400, {"error": "invalid-event", "detail": detail, **where})
        if relay.closing:
            return await respond(send, 503, {"error": "shutting-down"}, close=True)
        await self._ingest(entries, send, principal)

    async def _entries(self, lines: list[bytes]) -> list[Any] | tuple[int, str, int]:
        """The entries of a body's non-blank ``lines`` (UTF-8), or the
        refusal of the first that has none: ``(status, detail, index)``, 400
        ``invalid-event`` (counted) or 403 ``unauthorized`` for a command.
        Yields by work done (:class:`~bridges.core.pacing.Pacer`: 256 KiB of
        lines, 65,536 JSON containers or 128 lines, whichever comes first),
        so a batch is parsed while other requests, a gated hook's among
        them, are served: 6,000 events held the loop 12 s (an eighth
        outside attack), then 80 lines of 65,000 arrays each 2.3 s between
        two yields of "every 128 lines" (an eleventh, finding 2)."""
        relay = self.relay
        entries = []
        entry_of = relay.entry
        pace = Pacer()
        for j, ln in enumerate(lines):
            try:
                # before any parse: a tenth attack's loop stall; then the
                # checkpoint due before this line's work (due(): no coroutine a line)
                if pace.due(len(ln), check_json(ln)):
                    await trio.lowlevel.checkpoint()
                # the event's entry from its bytes when that path knows the
                # answer (envelope.formed_entry), else from its text
                entry = formed_entry(ln)
                if entry is None:
                    text = ln.decode("utf-8")
                    entry = entry_of(loads(text), text, owned=True)
            except (ValueError, InvalidEvent) as e:
                relay.counters["invalid_events"] += 1
                detail = str(e) if isinstance(e, InvalidEvent) else f"not valid JSON: {e}"
                return 400, detail, j
            # a command carries no seq (validated): a sequenced event is none
            if entry.pos is None and is_command_type(entry.attrs["type"]):
                return 403, "commands flow only on an authenticated WebSocket (AEP-0004 §4.1)", j
            if entry.attrs["type"] in ACK_TYPES:  # only a command's target decides it (.acks)
                relay.counters["refused_acks"] += 1
                return 403, ("an ack (control.accepted/control.rejected) is accepted only from "
                             "the connection its command was routed to (AEP-0004 §3)"), j
            entries.append(entry)
        return entries

    async def _ingest(self, entries: list[Any], send: Send, principal: str) -> None:
        """Ingest a checked batch: 202 ``{"accepted": n}``, 413
        ``payload-too-large`` for an event the store can never take, or 503
        ``unavailable`` when the store did not take it (send it again), 429
        ``too-many-sessions`` + ``Retry-After`` past the new-session budget
        (:mod:`.newsessions`; nothing admitted)."""
        try:
            # (no checkpoint from the budget to the log write: the budget holds)
            self.relay.check_new_sessions(entries, None)
            accepted = await self.relay.ingest_http_batch(entries, principal=principal)
        except InvalidEvent as e:  # a session another principal owns (a JetStream relay's check)
            self.relay.counters["invalid_events"] += 1
            return await respond(send, 400, {"error": "invalid-event", "detail": str(e)})
        except TooManySessions as e:
            return await respond(send, 429, {"error": "too-many-sessions", "detail": str(e)},
                                 headers=[(b"retry-after", str(int(e.retry_after)).encode())])
        except TooLarge as e:  # never storable: resending cannot help
            return await respond(send, 413, {"error": "payload-too-large", "detail": str(e),
                                             "line": e.index})
        except Unavailable as e:
            return await respond(send, 503, {"error": "unavailable", "detail": str(e)})
        await respond(send, 202, {"accepted": accepted})

    # -- WebSocket ---------------------------------------------------------------
    def _socket_refusal(self, scope: Scope) -> tuple[int, dict[str, str]] | None:
        """Why a ``/socket`` upgrade is refused (status, body), in order:
        Host (DNS rebinding), an unlisted ``Origin`` (no ``*`` for the
        socket: it carries writes and commands), path, token, shutdown."""
        relay = self.relay
        origin = _header(scope, b"origin")
        if not self._host_ok(scope):
            return 403, {"error": "host-not-allowed"}
        if origin is not None and normalize_origin(origin) not in relay.cors_origins:
            relay.counters["refused_origin"] += 1
            return 403, {"error": "origin-not-allowed"}
        if scope["path"] != "/socket":
            return 404, {"error": "not-found"}
        if not relay.authorized(scope["headers"], scope.get("query_string", b"")):
            return 401, {"error": "unauthorized"}
        if relay.closing:
            return 503, {"error": "shutting-down"}
        return None

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        msg = await receive()
        if msg["type"] != "websocket.connect":
            return
        refusal = self._socket_refusal(scope)
        if refusal is not None:
            return await refuse_upgrade(scope, send, *refusal)
        await serve_socket(self.relay, scope, receive, send)


def make_app(relay: Relay, *, healthz: Callable[[bool], dict[str, Any]] | None = None,
             metrics: Callable[[str], tuple[bytes, str]] | None = None) -> RelayApp:
    """The relay's ASGI app. ``healthz(authorized) -> dict`` optionally
    replaces the bare health body (see :class:`RelayApp`); ``metrics() ->
    (body, content_type)`` (given the ``Accept`` header) serves ``GET /metrics`` (the daemon's)."""
    return RelayApp(relay, healthz, metrics)
