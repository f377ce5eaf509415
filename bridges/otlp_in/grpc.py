"""The OTLP/gRPC transport: ``opentelemetry.proto.collector.logs.v1.LogsService/Export``
on a grpcio server (OTLP spec "OTLP/gRPC").

grpcio demands its own thread pool: each RPC runs on one of
``workers`` handler threads, which decodes the request there (pure,
:class:`bridges.otlp_in.decode.ProtoDecoder`; grpcio has already inflated a
gzip-compressed message and enforced ``max_body`` as
``grpc.max_receive_message_length``, answering RESOURCE_EXHAUSTED above it)
and then hands the records back to trio explicitly with
:func:`trio.from_thread.run` and the token captured when the run started:
the export path itself runs only in trio. The export coroutine bounds its
own wait for room on the relay channel, so a handler thread waits at most
that long (plus scheduling). Answers go through the one error -> status map
(:mod:`bridges.otlp_in.status`): OK + ``ExportLogsServiceResponse``,
INVALID_ARGUMENT, UNAVAILABLE + ``google.rpc.RetryInfo``.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import grpc
import trio
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from bridges.core.settings import Address

from .decode import ALL, ProtoDecoder, Reads
from .export import Export, OnProblem
from .lane import LANE, LANE_WAIT_S, Lane, LaneBusy
from .status import BadRequest, Refused, Unavailable, detached, grpc_refused, response_message

SERVICE = logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name


class GrpcReceiver:
    """``LogsService/Export`` on a grpcio server. ``export``: the trio-side
    export coroutine, called through ``token``; ``max_body``: the message
    limit in bytes; ``on_problem``: told about each non-retryable refusal
    (:data:`bridges.otlp_in.export.OnProblem`); ``workers``: handler threads
    (as many RPCs are admitted at once; past them ``RESOURCE_EXHAUSTED``); ``reads``: the
    attributes to flatten (:class:`~bridges.otlp_in.decode.Reads`)."""

    def __init__(self, export: Export, token: trio.lowlevel.TrioToken, *, max_body: int,
                 on_problem: OnProblem, workers: int = 16, reads: Reads = ALL,
                 lane: Lane = LANE) -> None:
        self.export = export
        self.lane = lane
        self.reads = reads
        self.decode = ProtoDecoder(reads)
        self.token = token
        self.max_body = max_body
        self.on_problem = on_problem
        self.workers = workers
        self.server: grpc.Server | None = None

    def start(self, listen: Address) -> Address:
        """Bind and start; returns the bound ``(host, port)``. Raises
        ``OSError`` when the address cannot be bound."""
        host, port = listen
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
            # every admitted call has its thread, so the decoding lane, not
            # the executor's queue, orders the decodes (small before large)
            maximum_concurrent_rpcs=self.workers)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(target)
        except RuntimeError as e:
            raise OSError(f"cannot bind gRPC listener {target}: {e}") from None
        if not bound:
            raise OSError(f"cannot bind gRPC listener {target}")
        server.start()
        self.server = server
        return host, bound

    async def stop(self, grace: float = 1.0, wait: float = 5.0) -> None:
        """Stop accepting; in-flight RPCs get ``grace`` seconds. Waits (at
        most ``wait`` s, in a worker thread, shielded: this runs on the way
        out of a cancelled run) until grpcio has fully stopped."""
        if self.server is None:
            return
        with trio.CancelScope(shield=True):
            stopped: threading.Event = self.server.stop(grace)
            await trio.to_thread.run_sync(stopped.wait, wait)
        self.server = None

    def _export(self, body: bytes, context: grpc.ServicerContext) -> ExportLogsServiceResponse:
        """The handler (on a grpcio thread). A refusal is aborted with
        outside the ``except`` that caught it, :func:`detached` from the
        decoding frames, so grpcio's abort exception does not carry them
        (the body, the parsed request) as its context."""
        notes: list[str] = []
        refusal: Refused
        try:
            with self.lane.held(LANE_WAIT_S, size=len(body)):  # one decode at a time
                records = self.decode(body, notes)
            return response_message(trio.from_thread.run(self.export, records, notes,
                                                          trio_token=self.token))
        except Refused as e:
            refusal = detached(e)
        except LaneBusy as e:
            self.on_problem("otlp.decode_timeout", str(e))
            refusal = Unavailable(f"{e}; retry later")
        except trio.RunFinishedError:
            refusal = Unavailable("receiver is shutting down", retry_after=None)
        del body
        if isinstance(refusal, BadRequest):
            self.on_problem(refusal.counter,
                            f"gRPC {refusal.refusal.grpc_code.name}: {refusal.message}")
        _abort(context, refusal)


def _abort(context: grpc.ServicerContext, err: Refused) -> NoReturn:
    answer = grpc_refused(err)
    if answer.trailing:
        context.set_trailing_metadata(answer.trailing)
    context.abort(answer.code, answer.details)
    raise AssertionError("unreachable: ServicerContext.abort raises")  # grpc is untyped
