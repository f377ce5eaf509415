"""The OTLP/HTTP transport: ``POST /v1/logs`` on hypercorn (trio worker).

:class:`HttpReceiver` is the ASGI app: it reads the body (bounded by
``max_body`` as declared and as streamed), decodes it
(:func:`bridges.otlp_in.decode.decode_http_body`: protobuf or JSON, gzip
inflated with a cap), awaits the trio-side *export* coroutine
(:data:`bridges.otlp_in.export.Export`) and answers through the one error
-> status map (:mod:`bridges.otlp_in.status`): 200 with the
``ExportLogsServiceResponse`` (``partial_success`` when records were
rejected), 400/413/415 with a ``google.rpc.Status`` body, 503 with
``Retry-After``; answers are encoded like the request (protobuf for
protobuf, JSON for JSON). Outside the OTLP path: 404 (with where logs go:
Codex posts to its configured endpoint verbatim) and 405.

:func:`serve_http` puts the app on a listener (OTLP spec "OTLP/HTTP";
design record ``shared/aep/docs/bridge-otlp-inbound-design.md``, "Design":
receiver, here native protobuf as well as JSON).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable

import trio

from bridges.core.asgi import Receive, Scope, Send, host_guard, lifespan
from bridges.core.http import bind_socket, hyper_config, serve_app
from bridges.core.settings import Address

from .decode import ALL, ProtoDecoder, Reads, decode_http_body, inflate_http_body, is_json
from .export import Export, OnProblem
from .flatten import FlatRecord
from .lane import LANE, LANE_WAIT_S, Lane, LaneBusy
from .status import (
    BadRequest,
    HttpAnswer,
    Refusal,
    Refused,
    Unavailable,
    detached,
    http_accepted,
    http_refused,
)

LOGS_PATH = "/v1/logs"

Decoded = tuple[bool, list[FlatRecord | None]] | Refused
"""What a decoding thread hands back: ``(is_json, records)`` or the refusal."""

DECODE_DEADLINE_S = 10.0
"""Seconds one OTLP/HTTP body may take to decode (in a worker thread), its
wait for the decoding lane (:data:`~bridges.otlp_in.lane.LANE_WAIT_S`)
included."""

DECODERS = 16
"""OTLP/HTTP bodies handed to decoding threads at once, per listener (each
queued for the lane or decoding; bodies past them wait their turn on the
event loop, within ``DECODE_DEADLINE_S``)."""

_NOT_FOUND = HttpAnswer(404, b"not found: OTLP logs are accepted at POST /v1/logs\n",
                        "text/plain")
_NOT_ALLOWED = HttpAnswer(405, b"method not allowed\n", "text/plain", ((b"allow", b"POST"),))


class HttpReceiver:
    """The ASGI app behind hypercorn: ``POST /v1/logs`` only (404
    elsewhere, 405 for other methods). ``export``: the trio-side export
    coroutine; ``max_body``: the body limit in bytes (compressed and
    inflated); ``on_problem``: see :data:`OnProblem` (retryable refusals are
    counted by the export path, not here); ``reads``: the attributes to
    flatten (:class:`~bridges.otlp_in.decode.Reads`)."""

    def __init__(self, export: Export, *, max_body: int, on_problem: OnProblem,
                 body_timeout: float = 30.0, reads: Reads = ALL, lane: Lane = LANE) -> None:
        self.export = export
        self.lane = lane
        self.reads = reads
        self._proto = ProtoDecoder(reads)  # shared by the decode threads
        self.max_body = max_body
        self.on_problem = on_problem
        self.body_timeout = body_timeout
        # decoding (inflate, protobuf/JSON parse, flatten) runs in worker
        # threads, so no body can hold the event loop (issue 10 #4), one at
        # a time process-wide (the lane); past DECODE_DEADLINE_S the request
        # is refused 503. Threads enough for the lane, not this limiter, to
        # order the bodies waiting (small before large: a limiter of two let
        # two slow bodies keep every small export from the lane)
        self._decoders = trio.CapacityLimiter(DECODERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["type"] != "http":
            return
        if scope.get("path", "").rstrip("/") != LOGS_PATH:
            return await _respond(send, _NOT_FOUND)
        if scope.get("method") != "POST":
            return await _respond(send, _NOT_ALLOWED)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        await _respond(send, await self._answer(headers, receive))

    async def _answer(self, headers: dict[str, str], receive: Receive) -> HttpAnswer:
        json_answer = is_json(headers.get("content-type"))
        try:
            with trio.move_on_after(self.body_timeout) as slow:
                body = await self._read_body(headers, receive)
            if slow.cancelled_caught:  # headers came, the body did not (issue 10 #6)
                raise BadRequest(Refusal.TIMEOUT, "request body not received within "
                                 f"{self.body_timeout:g}s", "otlp.body_timeout")
            notes: list[str] = []
            decoded: Decoded | None = None
            with trio.move_on_after(DECODE_DEADLINE_S) as late:
                decoded = await trio.to_thread.run_sync(
                    self._decode, headers.get("content-type"), headers.get("content-encoding"),
                    body, notes, abandon_on_cancel=True, limiter=self._decoders)
            del body  # the records are all that is kept of it
            if late.cancelled_caught or decoded is None:
                self.on_problem("otlp.decode_timeout", "decoding exceeded its deadline")
                raise Unavailable(f"decoding took over {DECODE_DEADLINE_S:g}s; retry later")
            if isinstance(decoded, Refused):  # answered, not raised: see _decode
                if isinstance(decoded, Unavailable):  # no decoding turn came
                    self.on_problem("otlp.decode_timeout", decoded.message)
                return self._refused(decoded, json_answer)
            json_answer, records = decoded
            result = await self.export(records, notes)
        except Refused as e:
            return self._refused(e, json_answer)
        return http_accepted(result, is_json=json_answer)

    def _refused(self, e: Refused, json_answer: bool) -> HttpAnswer:
        if isinstance(e, BadRequest):
            self.on_problem(e.counter, f"HTTP {e.status}: {e.message}")
        answer = http_refused(e, is_json=json_answer)
        if e.refusal is Refusal.TIMEOUT:  # the rest of the body may never come
            answer = dataclasses.replace(answer, headers=answer.headers
                                         + ((b"connection", b"close"),))
        return answer

    def _decode(self, content_type: str | None, content_encoding: str | None, body: bytes,
                notes: list[str]) -> Decoded:
        """:func:`decode_http_body` in the lane (on a worker thread); a
        refusal is returned, :func:`~bridges.otlp_in.status.detached` from
        the frames that hold the body, never raised across the hand-off;
        :class:`~bridges.otlp_in.status.Unavailable` when no turn comes
        within :data:`~bridges.otlp_in.lane.LANE_WAIT_S`."""
        try:
            # inflated first, outside the lane (zlib lets go of the GIL), so
            # the turn goes by the size the decoder reads
            body = inflate_http_body(content_type, content_encoding, body, self.max_body)
            with self.lane.held(LANE_WAIT_S, size=len(body)):
                return decode_http_body(content_type, None, body, self.max_body, notes,
                                        self.reads, self._proto)
        except Refused as e:
            return detached(e)
        except LaneBusy as e:
            return Unavailable(f"{e}; retry later")

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> bytes:
        declared = headers.get("content-length")
        if (declared is not None and declared.strip().isascii() and declared.strip().isdigit()
                and int(declared) > self.max_body):
            raise BadRequest(Refusal.TOO_LARGE, f"body of {int(declared)} bytes exceeds "
                             f"{self.max_body}", "otlp.too_large")
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise BadRequest(Refusal.MALFORMED, "client disconnected mid-body", "otlp.disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise BadRequest(Refusal.TOO_LARGE, f"body exceeds {self.max_body} bytes",
                                 "otlp.too_large")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)


async def _respond(send: Send, answer: HttpAnswer) -> None:
    headers = [(b"content-type", answer.content_type.encode()),
               (b"content-length", str(len(answer.body)).encode()), *answer.headers]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


GRACEFUL_S = 1.0
"""Seconds the exports in flight get to answer once ``shutdown`` is set."""


async def serve_http(app: HttpReceiver, listen: Address, *, log: logging.Logger,
                     on_refused_host: Callable[[], None], on_fault: Callable[[str], None],
                     where: str, max_connections: int | None = None,
                     shutdown: trio.Event | None = None,
                     task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``listen`` until ``shutdown`` is set (then: stop
    accepting, close idle keep-alive connections, give the exports in
    flight :data:`GRACEFUL_S` to answer, and return) or until cancelled
    (no answer for what is in flight); ``task_status.started``
    gets the bound ``(host, port)``. Through the shared hardened
    :func:`~bridges.core.http.serve_app`: a connection that makes
    hypercorn raise is closed, reported as ``on_fault(kind)`` and logged
    once per kind under ``where``, instead of ending the listener
    (hypercorn#225); behind the shared DNS-rebinding guard
    (:func:`~bridges.core.asgi.host_guard`): on a loopback
    bind, a request whose ``Host`` is not a loopback name/address is refused
    403 and reported as ``on_refused_host()`` (rebinding would bypass any
    CORS rule). ``log`` gets hypercorn's error log. Raises ``OSError`` when
    the address cannot be bound."""
    host, port = listen
    # hypercorn's own keep-alive default (5 s), as this listener always had
    cfg = hyper_config(graceful_timeout=GRACEFUL_S, keep_alive_timeout=5.0, errorlog=log)
    sock = bind_socket(host, port)

    class _Started(trio.TaskStatus[Address]):  # reports the configured host, the bound port
        def started(self, value: Address | None = None) -> None:
            assert value is not None
            task_status.started((host, value[1]))

    await serve_app(host_guard(app, on_refuse=on_refused_host), sock,
                    shutdown if shutdown is not None else trio.Event(), config=cfg,
                    task_status=_Started(), on_fault=on_fault, max_connections=max_connections,
                    where=f"{where} {host}:{sock.getsockname()[1]}")
