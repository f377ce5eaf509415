"""The OTLP/logs receivers: OTLP/HTTP ``POST /v1/logs`` (hypercorn, trio
worker) and OTLP/gRPC ``LogsService/Export`` (grpcio, its own thread pool,
every request handed back to trio explicitly).

Both decode to flattened records (:mod:`bridges.otlp_in.flatten`) and call
one trio-side *export* coroutine (the bridge's)::

    async def export(records: list[FlatRecord | None], notes: list[str]) -> Accepted

which returns :class:`Accepted` (``rejected`` records and an
``error_message`` for ``partial_success``) or raises :class:`Unavailable`
(the relay channel is saturated or the bridge is stopping: retryable).

Answers, per the OTLP specification ("OTLP/HTTP", "OTLP/gRPC"):

======================================  ==========================  =================
situation                               HTTP                        gRPC
======================================  ==========================  =================
accepted (some records maybe rejected)  200 ExportLogsServiceResp.  OK + response
undecodable payload                     400 (google.rpc.Status)     INVALID_ARGUMENT
unsupported Content-Type / -Encoding    415                         (n/a)
body over the size limit                413 (compressed or not)     RESOURCE_EXHAUSTED
relay channel saturated / stopping      503 + ``Retry-After``       UNAVAILABLE +
                                                                    ``google.rpc.retryinfo-bin``
======================================  ==========================  =================

HTTP responses are encoded like the request (protobuf for protobuf, JSON for
JSON). The size limit applies to the body as received AND to the inflated
body: gzip is inflated incrementally with a cap, so a gzip bomb costs at most
``max_body + 1`` bytes.
"""
from __future__ import annotations

import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import grpc
import trio
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                    ExportLogsServiceResponse)

from . import flatten
from .flatten import FlatRecord, NotOtlp
from supervisor.asgi import lifespan

DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Default request size limit in bytes (compressed and inflated)."""

LOGS_PATH = "/v1/logs"
SERVICE = logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name

# google.rpc.Code values used in error bodies.
_INVALID_ARGUMENT, _RESOURCE_EXHAUSTED, _UNAVAILABLE = 3, 8, 14

_PROTOBUF_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})
_JSON_TYPES = frozenset({"application/json"})


@dataclass(frozen=True)
class Accepted:
    """The export outcome: ``rejected`` LogRecords that could not be mapped
    (``partial_success.rejected_log_records``) and why."""

    rejected: int = 0
    error_message: str = ""


class Unavailable(Exception):
    """Retryable refusal (relay channel saturated, bridge stopping):
    503 + ``Retry-After`` / ``UNAVAILABLE`` + RetryInfo."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BadRequest(Exception):
    """A request answered with an HTTP error status (400, 413, 415)."""

    def __init__(self, status: int, message: str, counter: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.counter = counter


Export = Callable[[list[FlatRecord | None], list[str]], Awaitable[Accepted]]


def response_message(result: Accepted) -> ExportLogsServiceResponse:
    resp = ExportLogsServiceResponse()
    if result.rejected or result.error_message:
        resp.partial_success.rejected_log_records = result.rejected
        resp.partial_success.error_message = result.error_message
    return resp


# --------------------------------------------------------------------------- decoding (pure)

def gunzip_capped(data: bytes, limit: int) -> bytes:
    """Inflate a gzip body (one or more members, RFC 1952) to at most
    ``limit`` bytes. Raises :class:`BadRequest` 413 when the output would
    exceed ``limit`` (it stops inflating there: no bomb inflates unbounded)
    and 400 for a corrupt or truncated stream."""
    out = bytearray()
    rest = data
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = d.decompress(rest, limit - len(out) + 1)
        except zlib.error as e:
            raise BadRequest(400, f"invalid gzip body: {e}", "otlp.bad_gzip") from None
        out += chunk
        if len(out) > limit or d.unconsumed_tail:
            raise BadRequest(413, f"inflated body exceeds {limit} bytes", "otlp.too_large")
        if not d.eof:
            raise BadRequest(400, "truncated gzip body", "otlp.bad_gzip")
        rest = d.unused_data
        if not rest.strip(b"\x00"):  # trailing zero padding is tolerated (gzip(1) does)
            return bytes(out)


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode_http_body(content_type: str | None, content_encoding: str | None, body: bytes,
                     limit: int, notes: list[str]) -> tuple[bool, list[FlatRecord | None]]:
    """An OTLP/HTTP logs body -> ``(is_json, records)``. Raises
    :class:`BadRequest` (415 unsupported type/encoding, 413 too large, 400
    undecodable or not an OTLP export request)."""
    mt = media_type(content_type)
    if mt in _PROTOBUF_TYPES:
        is_json = False
    elif mt in _JSON_TYPES:
        is_json = True
    else:
        raise BadRequest(415, f"unsupported Content-Type {mt or '(none)'!r}; use "
                              "application/x-protobuf or application/json",
                         "otlp.unsupported_media_type")
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("gzip", "x-gzip"):
        body = gunzip_capped(body, limit)
    elif enc not in ("identity", ""):
        raise BadRequest(415, f"unsupported Content-Encoding {enc!r}; use gzip or none",
                         "otlp.unsupported_encoding")
    if is_json:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            raise BadRequest(400, f"body is not JSON: {type(e).__name__}",
                             "otlp.undecodable") from None
        try:
            return True, flatten.records_from_json(doc, notes)
        except NotOtlp as e:
            raise BadRequest(400, f"not an OTLP logs export request: {e}",
                             "otlp.undecodable") from None
    return False, decode_proto(body, notes)


def decode_proto(body: bytes, notes: list[str]) -> list[FlatRecord | None]:
    """Protobuf ``ExportLogsServiceRequest`` bytes -> records; 400 on a
    corrupt or truncated message."""
    try:
        req = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as e:
        raise BadRequest(400, f"undecodable protobuf: {str(e)[:200]}", "otlp.undecodable") from None
    return list(flatten.records_from_proto(req, notes))


def _status_body(is_json: bool, code: int, message: str) -> tuple[bytes, str]:
    st = status_pb2.Status(code=code, message=message)
    if is_json:
        return json_format.MessageToJson(st, indent=None).encode(), "application/json"
    return st.SerializeToString(), "application/x-protobuf"


# --------------------------------------------------------------------------- HTTP (ASGI)

class HttpReceiver:
    """The ASGI app behind hypercorn: ``POST /v1/logs`` only (404 elsewhere,
    405 for other methods). ``on_problem(counter, line)`` is told about each
    refused request (never with body content)."""

    def __init__(self, export: Export, *, max_body: int,
                 on_problem: Callable[[str, str], None]) -> None:
        self.export = export
        self.max_body = max_body
        self.on_problem = on_problem

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if path.rstrip("/") != LOGS_PATH:
            # Codex posts to its configured endpoint verbatim: a base URL
            # without the signal path lands here, so say where logs go.
            await _respond(send, 404, b"not found: OTLP logs are accepted at POST /v1/logs\n",
                           "text/plain")
            return
        if scope.get("method") != "POST":
            await _respond(send, 405, b"method not allowed\n", "text/plain",
                           extra=[(b"allow", b"POST")])
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        is_json = media_type(headers.get("content-type")) in _JSON_TYPES
        try:
            body = await self._read_body(headers, receive)
            notes: list[str] = []
            is_json, records = decode_http_body(headers.get("content-type"),
                                                headers.get("content-encoding"), body,
                                                self.max_body, notes)
            result = await self.export(records, notes)
        except BadRequest as e:
            self.on_problem(e.counter, f"HTTP {e.status}: {e.message}")
            code = _RESOURCE_EXHAUSTED if e.status == 413 else _INVALID_ARGUMENT
            payload, ctype = _status_body(is_json, code, e.message)
            await _respond(send, e.status, payload, ctype)
            return
        except Unavailable as e:
            payload, ctype = _status_body(is_json, _UNAVAILABLE, str(e))
            await _respond(send, 503, payload, ctype,
                           extra=[(b"retry-after", str(e.retry_after).encode())])
            return
        resp = response_message(result)
        if is_json:
            await _respond(send, 200, json_format.MessageToJson(resp, indent=None).encode(),
                           "application/json")
        else:
            await _respond(send, 200, resp.SerializeToString(), "application/x-protobuf")

    async def _read_body(self, headers: dict[str, str], receive: Any) -> bytes:
        declared = headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_body:
            raise BadRequest(413, f"body of {int(declared)} bytes exceeds {self.max_body}",
                             "otlp.too_large")
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise BadRequest(400, "client disconnected mid-body", "otlp.disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise BadRequest(413, f"body exceeds {self.max_body} bytes", "otlp.too_large")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)


async def _respond(send: Any, status: int, body: bytes, ctype: str,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- gRPC

class GrpcReceiver:
    """``LogsService/Export`` on a grpcio server. grpcio runs handlers on
    its own thread pool; each request is decoded there (pure), then handed
    to the trio-side ``export`` with :func:`trio.from_thread.run` and the
    token captured in the bridge's ``run``. The export coroutine bounds its
    own wait for room on the relay channel, so a handler thread waits at
    most that long (plus scheduling)."""

    def __init__(self, export: Export, token: trio.lowlevel.TrioToken, *, max_body: int,
                 on_problem: Callable[[str, str], None], workers: int = 4) -> None:
        self.export = export
        self.token = token
        self.max_body = max_body
        self.on_problem = on_problem
        self.workers = workers
        self.server: grpc.Server | None = None

    def start(self, host: str, port: int) -> int:
        """Bind and start; returns the bound port. Raises ``OSError`` when
        the address cannot be bound."""
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="otlp-grpc"),
            handlers=[grpc.method_handlers_generic_handler(SERVICE, {
                # Raw bytes in: we decode ourselves so a corrupt payload is
                # INVALID_ARGUMENT (grpcio's own deserializer answers INTERNAL).
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export, request_deserializer=None,
                    response_serializer=ExportLogsServiceResponse.SerializeToString),
            })],
            options=[("grpc.max_receive_message_length", self.max_body),
                     ("grpc.so_reuseport", 0)],  # a taken port must fail, not be shared
            maximum_concurrent_rpcs=self.workers * 4)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as e:
            raise OSError(f"cannot bind gRPC listener {target}: {e}") from None
        if not bound:
            raise OSError(f"cannot bind gRPC listener {target}")
        server.start()
        self.server = server
        return bound

    def stop(self, grace: float) -> Any:
        """Stop accepting; in-flight RPCs get ``grace`` seconds. Returns a
        ``threading.Event`` set once the server has fully stopped."""
        assert self.server is not None
        return self.server.stop(grace)

    def _export(self, body: bytes, context: grpc.ServicerContext) -> ExportLogsServiceResponse:
        notes: list[str] = []
        try:
            records = decode_proto(body, notes)
        except BadRequest as e:
            self.on_problem(e.counter, f"gRPC INVALID_ARGUMENT: {e.message}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, e.message)
        try:
            result = trio.from_thread.run(self.export, records, notes, trio_token=self.token)
        except Unavailable as e:
            info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=e.retry_after))
            context.set_trailing_metadata((("google.rpc.retryinfo-bin",
                                            info.SerializeToString()),))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except trio.RunFinishedError:
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver is shutting down")
        return response_message(result)
