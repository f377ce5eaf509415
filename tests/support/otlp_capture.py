"""A tiny OTLP capture receiver: stores the raw export requests a real exporter sends.

It is the "what does the vendor really put on the wire" instrument behind
``tests/fixtures/codex_otel_real/``: no decoding on receipt, bytes exactly as
received, so the fixtures can be replayed at the real bridge later.

- OTLP/HTTP (hypercorn, trio worker): any ``POST`` is recorded with its path,
  ``content-type``, ``content-encoding`` and raw body (still compressed if the
  exporter compressed it); ``/v1/logs`` answers an empty
  ``ExportLogsServiceResponse`` in the request's encoding (protobuf or JSON),
  ``/v1/traces`` and ``/v1/metrics`` likewise, anything else 404.
- OTLP/gRPC (grpcio, its own thread pool as grpcio demands): the
  ``LogsService``/``TraceService``/``MetricsService`` ``Export`` methods are
  registered with identity (de)serializers, so the handler sees the raw
  request message bytes; each capture is handed back to trio with
  ``trio.from_thread.run_sync`` and the trio token taken at start.

Use::

    cap = OtlpCapture()
    async with trio.open_nursery() as n:
        await n.start(cap.serve)          # both listeners up; cap.http_url, cap.grpc_url
        ...
        await cap.wait_for(lambda c: c.logs(), timeout=30)
        n.cancel_scope.cancel()
"""
from __future__ import annotations

import gzip
import json
from concurrent import futures
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import grpc
import trio
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from bridges.core.asgi import headers as request_headers
from bridges.core.asgi import send_bytes
from tests.support.net import http_body, serve_loopback

#: OTLP signal per gRPC service / HTTP path
_GRPC_SERVICES = {
    "opentelemetry.proto.collector.logs.v1.LogsService": "logs",
    "opentelemetry.proto.collector.trace.v1.TraceService": "traces",
    "opentelemetry.proto.collector.metrics.v1.MetricsService": "metrics",
}
_HTTP_PATHS = {"/v1/logs": "logs", "/v1/traces": "traces", "/v1/metrics": "metrics"}


@dataclass
class Captured:
    """One export request exactly as received.

    Attributes:
        transport: ``"grpc"`` or ``"http"``.
        signal: ``"logs"``, ``"traces"``, ``"metrics"`` or ``"unknown"``.
        path: HTTP path, or the gRPC method path (``/pkg.Service/Export``).
        content_type: the HTTP ``content-type`` (``application/grpc`` for gRPC).
        content_encoding: the HTTP ``content-encoding`` header, ``""`` if none.
        body: raw body bytes (HTTP: as sent, possibly gzip; gRPC: the message).
        metadata: request headers / gRPC invocation metadata (lower-cased keys).
    """

    transport: str
    signal: str
    path: str
    content_type: str
    content_encoding: str
    body: bytes
    metadata: dict[str, str] = field(default_factory=dict)

    def decoded_body(self) -> bytes:
        """The body with any ``gzip`` content-encoding removed."""
        if self.content_encoding.lower() == "gzip":
            return gzip.decompress(self.body)
        return self.body

    def is_json(self) -> bool:
        return "json" in self.content_type.lower()


@dataclass
class OtlpCapture:
    """Both OTLP listeners on loopback with OS-chosen ports; see the module docstring."""

    captures: list[Captured] = field(default_factory=list)
    #: answer this many export requests with a retryable refusal (HTTP 503 +
    #: ``Retry-After: 1``, gRPC ``UNAVAILABLE``) before accepting: does the exporter retry?
    refuse_first: int = 0
    refused: int = 0
    http_url: str | None = None   # http://127.0.0.1:<port>  (append /v1/logs)
    grpc_url: str | None = None   # http://127.0.0.1:<port>
    _changed: trio.Event = field(default_factory=trio.Event)

    def logs(self) -> list[Captured]:
        return [c for c in self.captures if c.signal == "logs"]

    def _refuse(self, cap: Captured) -> bool:
        """Record ``cap``; True when it is to be refused (see ``refuse_first``)."""
        self._add(cap)
        if self.refused < self.refuse_first:
            self.refused += 1
            return True
        return False

    def _add(self, cap: Captured) -> None:
        self.captures.append(cap)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[["OtlpCapture"], object],
                       timeout: float = 60) -> None:
        """Wait until ``predicate(self)`` is truthy; ``trio.TooSlowError`` after ``timeout`` s."""
        with trio.fail_after(timeout):
            while not predicate(self):
                await self._changed.wait()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run both listeners until cancelled; ``task_status.started(self)`` once bound."""
        grpc_server, port = self._start_grpc(trio.lowlevel.current_trio_token())
        self.grpc_url = f"http://127.0.0.1:{port}"
        try:
            async with trio.open_nursery() as nursery:
                self.http_url = await nursery.start(partial(serve_loopback, self._http_app,
                                                            graceful_timeout=0.5))
                task_status.started(self)
        finally:
            # stop() returns an Event; waiting for it blocks, so do it off the trio thread
            done = grpc_server.stop(grace=0)
            await trio.to_thread.run_sync(done.wait, 5)

    # -- gRPC ---------------------------------------------------------------
    def _start_grpc(self, token) -> tuple[grpc.Server, int]:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        for service, signal in _GRPC_SERVICES.items():
            def export(request: bytes, context, *, _signal=signal, _service=service):
                md = {k.lower(): (v if isinstance(v, str) else repr(v))
                      for k, v in context.invocation_metadata()}
                cap = Captured("grpc", _signal, f"/{_service}/Export", "application/grpc",
                               md.get("grpc-encoding", ""), request, md)
                if trio.from_thread.run_sync(self._refuse, cap, trio_token=token):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "capture: refused (test)")
                return b""  # an empty Export*ServiceResponse encodes to zero bytes
            handler = grpc.method_handlers_generic_handler(service, {
                "Export": grpc.unary_unary_rpc_method_handler(
                    export, request_deserializer=None, response_serializer=None)})
            server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        return server, port

    # -- HTTP ---------------------------------------------------------------
    async def _http_app(self, scope, receive, send) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        headers = request_headers(scope)
        signal = _HTTP_PATHS.get(scope["path"], "unknown")
        ctype = headers.get("content-type", "")
        refuse = False
        if scope["method"] == "POST":
            refuse = self._refuse(Captured("http", signal, scope["path"], ctype,
                                           headers.get("content-encoding", ""), body, headers))
        if refuse:
            await send_bytes(send, 503, b"refused (test)", "text/plain", [(b"retry-after", b"1")])
        elif scope["method"] != "POST" or signal == "unknown":
            await send_bytes(send, 404, b"not found", "text/plain")
        elif "json" in ctype:
            await send_bytes(send, 200, b"{}", "application/json")
        else:
            await send_bytes(send, 200,
                             logs_service_pb2.ExportLogsServiceResponse().SerializeToString(),
                             "application/x-protobuf")




def decode_logs(cap: Captured):
    """Parse a logs capture into an ``ExportLogsServiceRequest`` (protobuf or OTLP/JSON)."""
    from google.protobuf import json_format
    msg = logs_service_pb2.ExportLogsServiceRequest()
    raw = cap.decoded_body()
    if cap.is_json():
        json_format.Parse(raw.decode(), msg, ignore_unknown_fields=True)
    else:
        msg.ParseFromString(raw)
    return msg


def log_records(cap: Captured) -> list[dict]:
    """Flatten a logs capture to ``[{resource, scope, record}]`` dicts (via
    ``MessageToDict``, the OTLP/JSON shape) for quick assertions and analysis."""
    from google.protobuf import json_format
    if cap.is_json():
        data = json.loads(cap.decoded_body())
    else:
        data = json_format.MessageToDict(decode_logs(cap))
    out = []
    for rl in data.get("resourceLogs", []):
        for sl in rl.get("scopeLogs", []):
            for rec in sl.get("logRecords", []):
                out.append({"resource": rl.get("resource", {}), "scope": sl.get("scope", {}),
                            "record": rec})
    return out
