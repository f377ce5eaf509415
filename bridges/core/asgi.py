"""The app-side ASGI conventions every HTTP surface here shares (the relay,
the OTLP/HTTP receiver, the daemon's health app, the test doubles of vendor
servers), written once. Hypercorn does the protocol (:mod:`bridges.core.http`
serves); these are request/response chores, the bearer-token check and the
DNS-rebinding ``Host`` guard.

- :func:`lifespan`, :func:`read_body`, :func:`headers`, :func:`header`,
  :func:`send_bytes`, :func:`send_json`: one request's plumbing;
  :func:`send_metrics`: the answer to a ``/metrics`` scrape.
- :func:`presented_tokens` / :func:`bearer_ok`: AEP-0003 §8.1 credentials,
  ``Authorization: Bearer <token>`` or ``?access_token=<token>``, compared
  in constant time; never logged.
- :func:`host_allowed` / :func:`host_guard`: on a loopback listener, a
  request whose ``Host`` is not a loopback name (``localhost``,
  ``*.localhost``, RFC 6761), a loopback address or the bound host is
  refused 403 ``host-not-allowed`` (AEP-0003 §8: a page in the operator's
  browser must not reach a loopback service through a rebound name). A
  request without ``Host`` (HTTP/1.0 tools) is not a browser and passes; a
  non-loopback bind is exposed on purpose and not guarded this way. The
  bound address comes from the connection state the server sets
  (:data:`LISTEN_KEY`), else from the ASGI scope's ``server``.

Pure functions over ASGI scopes and callables: no sockets of their own."""
from __future__ import annotations

import hmac
import ipaddress
import json
import urllib.parse
from typing import Any, Awaitable, Callable, Iterable, Iterator

__all__ = [
    "Scope", "Message", "Receive", "Send", "App", "ABORT_KEY", "LISTEN_KEY",
    "lifespan", "read_body", "headers", "header", "send_bytes", "send_json", "respond",
    "send_metrics", "presented_tokens", "token_matches", "bearer_ok",
    "host_allowed", "is_loopback_listener", "listen_host", "host_guard", "refuse_upgrade",
]

Scope = dict[str, Any]
"""An ASGI connection scope (``{"type": "http", "path": ..., "headers": ...}``)."""
Message = dict[str, Any]
"""One ASGI event (``{"type": "http.request", "body": b"...", ...}``)."""
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
"""An ASGI 3 application."""

#: ``scope["state"]`` key under which :func:`bridges.core.http.serve_app`
#: puts a callable that aborts the connection's socket (sheds a stalled peer).
ABORT_KEY = "aep.abort"

#: ``scope["state"]`` key under which :func:`bridges.core.http.serve_app`
#: puts the listening socket's bound ``(host, port)`` (the DNS-rebinding guard).
LISTEN_KEY = "aep.listen"


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer the ASGI lifespan protocol: nothing to start or stop."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected first.
    Raises ``OverflowError`` past ``limit`` bytes (the caller answers 413)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise OverflowError(f"body over {limit} bytes")
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


def headers(scope: Scope) -> dict[str, str]:
    """Request headers as a lower-cased ``str`` dict (last one wins)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def header(scope: Scope, name: bytes) -> str | None:
    """The first request header called ``name`` (lower-case bytes), or ``None``."""
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def send_bytes(send: Send, status: int, body: bytes, content_type: str,
                     extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """One complete response."""
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any,
                    extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """One complete JSON response."""
    await send_bytes(send, status, json.dumps(obj).encode(), "application/json", extra)


async def respond(send: Send, status: int, body: Any = None, *,
                  headers: Iterable[tuple[bytes, bytes]] = (), close: bool = False) -> None:
    """One complete response: ``body`` ``None`` (empty, no content type),
    ``bytes`` (sent as JSON) or an object (``json.dumps``); ``headers``
    added; ``close`` asks the client to close the connection
    (``Connection: close``)."""
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    hs = [(b"content-length", str(len(data)).encode()), *headers]
    if body is not None:
        hs.append((b"content-type", b"application/json"))
    if close:
        hs.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": data})


async def send_metrics(send: Any, scope: Scope, authorized: bool,
                       render: Callable[[str], tuple[bytes, str]]) -> None:
    """Answer a ``/metrics`` scrape: ``render(accept_header) -> (body,
    content_type)`` (the Prometheus text format or OpenMetrics, as the
    scraper's ``Accept`` asks); ``401`` when not ``authorized`` (behind the
    token like the ``/healthz`` counts); ``405`` for anything but GET/HEAD."""
    method = scope["method"]
    if method not in ("GET", "HEAD"):
        return await respond(send, 405, {"error": "method-not-allowed"},
                             headers=[(b"allow", b"GET, HEAD")])
    if not authorized:
        return await respond(send, 401, {"error": "unauthorized"},
                             headers=[(b"www-authenticate", b"Bearer")])
    body, content_type = render(header(scope, b"accept") or "")
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


# -- credentials (AEP-0003 §8.1) ----------------------------------------------------

def presented_tokens(headers: Iterable[tuple[bytes, bytes]],
                     query_string: bytes = b"") -> Iterator[str]:
    """Every credential a request presents: each ``Authorization: Bearer``
    value (scheme case-insensitive, surrounding blanks stripped), then each
    ``access_token`` query parameter."""
    for k, v in headers:
        if k.lower() == b"authorization":
            scheme, _, cred = v.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                yield cred.strip()
    if query_string and b"access_token" in query_string:
        for name, value in urllib.parse.parse_qsl(query_string.decode("latin-1"),
                                                  keep_blank_values=True):
            if name == "access_token":
                yield value


def token_matches(token: str | bytes | None, presented: str | None) -> bool:
    """Constant-time comparison of a ``presented`` credential with the
    configured ``token`` (as UTF-8 bytes, so any header text compares
    safely); ``False`` when either is missing."""
    if not token or presented is None:
        return False
    want = token.encode("utf-8") if isinstance(token, str) else token
    return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), want)


def bearer_ok(token: str | bytes | None, headers: Iterable[tuple[bytes, bytes]],
              query_string: bytes = b"") -> bool:
    """True only when a ``token`` is configured and the request presents it
    (:func:`presented_tokens`, :func:`token_matches`). No token
    configured: ``False``; the caller decides what an open service allows."""
    return bool(token) and any(token_matches(token, p)
                               for p in presented_tokens(headers, query_string))


# -- the DNS-rebinding guard ----------------------------------------------------------

def _loopback_listener(listen_host: str | None) -> str | None:
    """The listener's host, lower-cased and without a zone, when it is a
    loopback bind (the guard applies); else ``None``."""
    if not listen_host:
        return None
    lh = listen_host.split("%", 1)[0].lower()
    try:
        return lh if ipaddress.ip_address(lh).is_loopback else None
    except ValueError:
        return lh if lh == "localhost" else None


def _host_name(host: str) -> str | None:
    """The name part of a ``Host`` value (``name``, ``name:port``,
    ``[v6]``, ``[v6]:port``), or ``None`` when malformed."""
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name
    name, sep, port = host.rpartition(":")
    if not sep:
        return port
    if not port.isdigit() or ":" in name:
        return None
    return name


def host_allowed(host: str, listen_host: str | None) -> bool:
    """The DNS-rebinding guard: whether a request with ``Host: host`` may be
    served by a listener bound to ``listen_host``. Always true for a
    non-loopback (or unknown) listener and for an empty ``host``; on a
    loopback listener only ``localhost``, ``*.localhost`` (RFC 6761), a
    loopback IP literal or the bound host itself pass (any port)."""
    lh = _loopback_listener(listen_host)
    host = host.strip()
    if lh is None or not host:
        return True
    name = _host_name(host)
    if name is None:
        return False
    name = name.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost") or name == lh:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback_listener(listen_host: str | None) -> bool:
    """Whether a listener bound to ``listen_host`` is a loopback bind, where
    :func:`host_allowed` vets ``Host`` against DNS rebinding."""
    return _loopback_listener(listen_host) is not None


def listen_host(scope: Scope) -> str | None:
    """The bound host of the listener serving ``scope`` (see module docstring)."""
    addr = (scope.get("state") or {}).get(LISTEN_KEY) or scope.get("server")
    return addr[0] if addr else None


def host_guard(app: App, on_refuse: Callable[[], None] | None = None) -> App:
    """Wrap an ASGI ``app`` (the OTLP/HTTP receiver, a health app) in the
    DNS-rebinding guard (:func:`host_allowed` against the bound listener):
    a refused HTTP request gets 403 ``host-not-allowed`` (and
    ``Connection: close``), a refused WebSocket is closed before accept.
    ``on_refuse()`` counts it."""
    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not host_allowed(
                header(scope, b"host") or "", listen_host(scope)):
            if on_refuse is not None:
                on_refuse()
            if scope["type"] == "http":
                return await respond(send, 403, {"error": "host-not-allowed"}, close=True)
            await receive()
            return await send({"type": "websocket.close", "code": 1008})
        await app(scope, receive, send)
    return guarded


async def refuse_upgrade(scope: Scope, send: Callable, status: int, body: Any) -> None:
    """Refuse a WebSocket upgrade (after its ``websocket.connect``) with a
    real HTTP status and a JSON ``body`` when the server supports the ASGI
    websocket denial extension (hypercorn does), else close 1008. A 401
    carries ``WWW-Authenticate: Bearer``."""
    if "websocket.http.response" in scope.get("extensions", {}):
        data = json.dumps(body).encode()
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]
                    + ([(b"www-authenticate", b"Bearer")] if status == 401 else [])})
        await send({"type": "websocket.http.response.body", "body": data})
    else:
        await send({"type": "websocket.close", "code": 1008})
