"""The tee proxy: an ASGI app (served by hypercorn) that forwards every
request to the AG-UI agent server verbatim and streams its response back
untouched, teeing ``text/event-stream`` responses onto the AEP stream.

Design record ``bridge-agui-design.md`` ("Attach shape: a tee proxy, because
observation must not drive runs"): the UI points at the proxy instead of the
agent; neither side is modified. Per request:

- **Forwarded verbatim**: method, path and query (below the path prefix of
  ``AEP_AGUI_UPSTREAM``, whose scheme, host, port and userinfo no request
  can change: :mod:`bridges.agui.target`; a target that would, or whose
  ``..`` climbs above the prefix, is answered ``400``, counted
  ``agui.bad_requests``), every header
  except the hop-by-hop ones (RFC 9110 §7.6.1: ``Connection`` and the
  headers it names, ``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``,
  ``Transfer-Encoding``, ``Upgrade``) and ``Host`` (set to the upstream's,
  as a reverse proxy does), and the body, streamed as it arrives. The client
  adds no header of its own (no ``Accept-Encoding``, no ``User-Agent``):
  content negotiation stays between the UI and the agent.
- **Streamed back untouched**: status, headers (minus hop-by-hop; the
  agent's own ``Date``/``Server``), and the body's raw bytes (not decoded)
  written to the UI as they arrive, each write flushed before anything else
  is done with it. Chunks that arrive while the previous write is still
  going out are written together next (:data:`QUEUED_CHUNKS`): bytes and
  order never change, nothing waits for a socket that is free.
- **Teed**: only a ``text/event-stream`` response with no
  ``Content-Encoding``; the tee gets a copy of each chunk after it was sent
  (:class:`bridges.agui.tee.Tee`). Anything else (JSON, the protobuf
  ``application/vnd.ag-ui.event+proto`` media type, a compressed stream)
  passes through unobserved and counted (``agui.unobserved``,
  ``agui.unobserved_proto``).

Faults (each a test in ``tests/unit/agui/test_agui_proxy.py``):

- upstream unreachable or failing before its response headers: the UI gets
  ``502`` ``text/plain`` naming the upstream and the failure kind (never a
  header or body of the request), counted ``agui.upstream_unreachable``;
- the UI disconnects (during the upload, while the upstream has not sent
  its response headers yet, or during the response): the upstream request
  is cancelled at once (its connection closed, which is what tells the agent
  server), the run closed ``run.failed {reason: client_disconnected}``,
  counted ``agui.client_disconnects``;
- the upstream fails mid-stream: the UI's connection is aborted (a
  truncated stream, not a clean end that would claim the run finished), the
  run closed ``run.failed {reason: upstream_error}``, counted
  ``agui.upstream_errors``; an upstream that simply ends its stream with the
  run open closes it ``run.failed {reason: upstream_ended}``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import trio

from bridges.core.asgi import ABORT_KEY, lifespan
from bridges.core.bridge import BridgeHealth

from .target import BadTarget, Upstream
from .tee import Tee

log = logging.getLogger("aep.bridge.agui.proxy")

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})

PEEK_BODY = 1 << 20
"""Bytes of the request body kept (beside forwarding it) to read the run
input's ``threadId``/``runId``."""

QUEUED_CHUNKS = 16
"""Chunks read from the upstream while the UI's socket is still taking the
previous write; they go out together in the next write (never held once the
socket is free: under a light stream every chunk is its own write). With
httpcore's 64 KiB reads, at most about 1 MiB is in flight per stream."""

BATCH_BYTES = 256 * 1024
"""Most bytes joined into one write."""

EVENT_STREAM = "text/event-stream"
PROTO_STREAM = "application/vnd.ag-ui.event+proto"

OpenTee = Callable[[bytes], Tee]


class _ClientGone(Exception):
    """The UI disconnected while its request body was being forwarded."""


def media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def forward_headers(raw: list[tuple[bytes, bytes]], *, drop_host: bool) -> list[tuple[bytes, bytes]]:
    """``raw`` minus hop-by-hop headers (and those ``Connection`` names) and,
    with ``drop_host``, ``Host``; ``Content-Length`` too when a
    ``Transfer-Encoding`` frames the body (RFC 9112 §6.3: the body we stream
    is the decoded one, so a length beside it would lie). Order, case and
    duplicates are kept."""
    named = set(HOP_BY_HOP)
    for k, v in raw:
        if k.lower() == b"connection":
            named.update(t.strip().lower() for t in v.decode("latin-1").split(",") if t.strip())
        elif k.lower() == b"transfer-encoding":
            named.add("content-length")
    if drop_host:
        named.add("host")
    return [(k, v) for k, v in raw if k.decode("latin-1").lower() not in named]


def new_client() -> httpx.AsyncClient:
    """The upstream client: no read deadline (an AG-UI run stream may idle
    as long as the agent thinks; the UI decides when to give up), 10 s to
    connect, no pool limit (many concurrent runs), no environment proxies,
    no default headers, no redirects followed (the UI sees them)."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0, write=60.0),
                               limits=httpx.Limits(max_connections=None,
                                                   max_keepalive_connections=64),
                               trust_env=False, follow_redirects=False)
    client.headers.clear()
    return client


@dataclass
class _Exchange:
    """How one response copy went: ``gone`` (the UI left), ``finished``
    (the upstream's body ended and was passed on whole), ``failed`` (the
    upstream read failed: the exception's type name)."""

    gone: bool = False
    finished: bool = False
    failed: str | None = None


async def _watch_ui(receive: Any, body_done: trio.Event, ex: _Exchange,
                    scope: trio.CancelScope) -> None:
    """Once the request body is in, the next ASGI message is the UI's
    disconnect: mark it and stop the copy (which cancels the upstream read)."""
    await body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass
    ex.gone = True
    scope.cancel()


async def _read_upstream(response: httpx.Response, chunks: trio.MemorySendChannel[bytes],
                         ex: _Exchange) -> None:
    async with chunks:
        try:
            async for chunk in response.aiter_raw():
                await chunks.send(chunk)
        except httpx.HTTPError as e:
            ex.failed = type(e).__name__


def _ready(chunks: trio.MemoryReceiveChannel[bytes], first: bytes) -> list[bytes]:
    """``first`` and every chunk already queued behind it (no waiting)."""
    batch = [first]
    size = len(first)
    while size < BATCH_BYTES:
        try:
            batch.append(chunks.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        size += len(batch[-1])
    return batch


async def _bad_request(send: Any) -> None:
    refusal = b"aep-bridges AG-UI proxy: the request target cannot be forwarded\n"
    await send({"type": "http.response.start", "status": 400, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(refusal)).encode())]})
    await send({"type": "http.response.body", "body": refusal})


class TeeProxy:
    """The ASGI app. ``upstream``: the agent server's base URL (the
    configured one, :class:`~bridges.agui.target.Upstream`);
    ``client``: from :func:`new_client`; ``open_tee(body_peek)``:
    a :class:`~bridges.agui.tee.Tee` for one event stream; ``health``: the
    bridge's (counters, ``source`` = the upstream answered last time)."""

    def __init__(self, upstream: str, client: httpx.AsyncClient, open_tee: OpenTee,
                 health: BridgeHealth) -> None:
        self.upstream = Upstream.parse(upstream)
        self.client = client
        self.open_tee = open_tee
        self.health = health

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1003})
            return
        if scope["type"] == "http":
            await self._http(scope, receive, send)

    # ------------------------------------------------------------------ one request
    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        health = self.health
        health.count("agui.requests")
        raw_path = scope.get("raw_path") or scope["path"].encode("utf-8")
        headers = forward_headers(list(scope.get("headers", [])), drop_host=True)
        has_body = any(k.lower() in (b"content-length", b"transfer-encoding")
                       for k, _ in scope.get("headers", []))
        peek = bytearray()
        body_done = trio.Event()

        async def body():
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise _ClientGone
                chunk = msg.get("body", b"")
                if len(peek) < PEEK_BODY:
                    peek.extend(chunk[:PEEK_BODY - len(peek)])
                if chunk:
                    yield chunk
                if not msg.get("more_body"):
                    break
            body_done.set()

        if has_body:
            content: Any = body()
        else:  # no body framing: nothing to stream (and no chunked framing added)
            async for _ in body():
                pass
            content = b""
        try:  # BadTarget: a host, port or climb in the target; InvalidURL: a bad query
            url = self.upstream.url(raw_path, scope.get("query_string") or b"")
            request = self.client.build_request(scope["method"], url, headers=headers,
                                                content=content)
        except (BadTarget, httpx.InvalidURL, ValueError) as e:  # the UI's error
            health.count("agui.bad_requests")
            # the rule, never the target's bytes (a query can carry a token)
            log.debug("AG-UI request refused 400 for %s: %s", self.upstream.shown,
                      e if isinstance(e, BadTarget) else type(e).__name__)
            await _bad_request(send)
            return
        try:
            response = await self._send(request, receive, body_done)
        except _ClientGone:
            health.count("agui.client_disconnects")
            return
        except httpx.HTTPError as e:
            await self._unreachable(send, e)
            return
        try:
            health.source = True
            await self._relay(scope, receive, send, response, bytes(peek), body_done)
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()

    async def _send(self, request: httpx.Request, receive: Any,
                    body_done: trio.Event) -> httpx.Response:
        """The upstream's response (headers in, body streaming), sent with
        the upstream's own credentials. Raises ``httpx.HTTPError``, or
        :class:`_ClientGone` when the UI leaves first, during the upload
        (the body reader sees it) or once the body is in, while the
        upstream has not answered yet (issue 25 row 2: a hung upstream
        held the request, its connection and both fds forever)."""
        gone = False
        response: httpx.Response | None = None

        async def watch(scope: trio.CancelScope) -> None:
            nonlocal gone
            await body_done.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            scope.cancel()

        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            try:
                response = await self.client.send(request, stream=True, auth=self.upstream.auth)
            except (_ClientGone, httpx.HTTPError) as e:  # raised here, not as a group
                failure = e
            nursery.cancel_scope.cancel()
        if failure is not None and not gone:
            raise failure
        if gone or response is None:
            if response is not None:  # answered as the UI left: nobody to give it to
                with trio.CancelScope(shield=True):
                    await response.aclose()
            raise _ClientGone
        return response

    async def _unreachable(self, send: Any, e: httpx.HTTPError) -> None:
        self.health.count("agui.upstream_unreachable")
        self.health.source = False
        kind = type(e).__name__
        self.health.detail = f"upstream unreachable ({kind})"
        log.warning("AG-UI upstream %s unreachable: %s", self.upstream.shown, kind)
        body = (f"aep-bridges AG-UI proxy: the agent server at {self.upstream.shown} did not answer "
                f"({kind})\n").encode()
        await send({"type": "http.response.start", "status": 502, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _relay(self, scope: dict[str, Any], receive: Any, send: Any,
                     response: httpx.Response, peek: bytes, body_done: trio.Event) -> None:
        health = self.health
        ctype = media_type(response.headers.get("content-type"))
        encoded = media_type(response.headers.get("content-encoding")) not in ("", "identity")
        tee: Tee | None = None
        if ctype == EVENT_STREAM and not encoded:
            health.count("agui.streams")
            tee = self.open_tee(peek)
        else:
            health.count("agui.unobserved")
            if ctype == PROTO_STREAM:
                health.count("agui.unobserved_proto")
        out_headers = [(k.lower(), v) for k, v in forward_headers(response.headers.raw,
                                                                   drop_host=False)]
        try:
            await self._pump(scope, receive, send, response, out_headers, tee, body_done)
        finally:
            if tee is not None and not tee.state.closed:  # cancelled: the bridge is stopping
                tee.close("proxy_stopped")

    async def _pump(self, scope: dict[str, Any], receive: Any, send: Any,
                    response: httpx.Response, out_headers: list[tuple[bytes, bytes]],
                    tee: Tee | None, body_done: trio.Event) -> None:
        """Copy the response to the UI (three tasks: the UI watcher, the
        upstream reader, the writer), then settle how it ended."""
        ex = _Exchange()
        chunks_in, chunks_out = trio.open_memory_channel[bytes](QUEUED_CHUNKS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_ui, receive, body_done, ex, nursery.cancel_scope)
            nursery.start_soon(_read_upstream, response, chunks_in, ex)
            try:
                await send({"type": "http.response.start", "status": response.status_code,
                            "headers": out_headers})
                async with chunks_out:
                    async for chunk in chunks_out:
                        batch = _ready(chunks_out, chunk)
                        await send({"type": "http.response.body", "body": b"".join(batch),
                                    "more_body": True})
                        if tee is not None:
                            for c in batch:
                                tee.feed(c)
                if ex.failed is None:
                    ex.finished = True
                    # shielded: this send ends the response, and for a UI that
                    # asked for Connection: close it is where hypercorn closes
                    # the socket; the UI watcher, told "disconnect" by that
                    # very close, would cancel it half way (socket left open)
                    with trio.CancelScope(shield=True):
                        await send({"type": "http.response.body", "body": b""})
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                ex.gone = True  # the UI's socket went away under a send
            nursery.cancel_scope.cancel()
        self._settle(scope, tee, ex)

    def _settle(self, scope: dict[str, Any], tee: Tee | None, ex: "_Exchange") -> None:
        health = self.health
        if ex.gone and not ex.finished:
            if trio.current_effective_deadline() == -math.inf:
                # the bridge itself is being stopped (hypercorn tells the app
                # "disconnect" as it goes): not the UI's doing
                reason = "proxy_stopped"
            else:
                reason = "client_disconnected"
                health.count("agui.client_disconnects")
        elif ex.failed is not None:
            reason = "upstream_error"
            health.count("agui.upstream_errors")
            health.detail = f"upstream stream failed ({ex.failed})"
            self._abort(scope)
        else:
            reason = "upstream_ended"
        if tee is not None:
            tee.close(reason)

    @staticmethod
    def _abort(scope: dict[str, Any]) -> None:
        """Close the UI's connection without ending the response, so a
        truncated stream reads as truncated (serve_app's abort handle)."""
        abort = (scope.get("state") or {}).get(ABORT_KEY)
        if abort is not None:
            abort()
