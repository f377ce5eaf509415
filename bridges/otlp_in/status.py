"""The one error -> status map of both OTLP transports (pure: no sockets).

Per the OTLP specification ("OTLP/HTTP" and "OTLP/gRPC", "Failures" and
"Throttling"): a request is either *accepted*, maybe with some LogRecords
rejected (``partial_success``; the sender must not retry those), or
*refused* whole, retryably or not:

====================================  ===============  ====================  =========
outcome (:class:`Refusal`)            HTTP             gRPC                  retryable
====================================  ===============  ====================  =========
accepted (:class:`Accepted`)          200 + response   OK + response         (n/a)
``MALFORMED``: undecodable payload    400              INVALID_ARGUMENT      no
``UNSUPPORTED``: Content-Type/-Enc.   415              INVALID_ARGUMENT (1)  no
``TOO_LARGE``: body over the limit    413              RESOURCE_EXHAUSTED    no (2)
``UNAVAILABLE``: relay saturated,     503 +            UNAVAILABLE +         yes
receiver stopping                     ``Retry-After``  ``RetryInfo``
====================================  ===============  ====================  =========

(1) gRPC has no media types; the row only names the ``google.rpc.Status``
code of the HTTP error body. (2) RESOURCE_EXHAUSTED is retryable only with a
``RetryInfo``, which a too-large request never gets: a retry would be just as
large.

HTTP error bodies are a ``google.rpc.Status`` (``code`` = the gRPC code,
``message``), encoded like the request (protobuf or JSON); a retryable gRPC
refusal carries ``google.rpc.RetryInfo`` in the ``google.rpc.retryinfo-bin``
trailer. :mod:`bridges.otlp_in.http` and :mod:`bridges.otlp_in.grpc` only
put these answers on the wire.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

RETRY_INFO_KEY = "google.rpc.retryinfo-bin"


class Refusal(enum.Enum):
    """Why a request is refused whole: its HTTP status, its gRPC status
    code, and whether the sender may retry it unchanged."""

    MALFORMED = (400, grpc.StatusCode.INVALID_ARGUMENT, False)
    UNSUPPORTED = (415, grpc.StatusCode.INVALID_ARGUMENT, False)
    TOO_LARGE = (413, grpc.StatusCode.RESOURCE_EXHAUSTED, False)
    UNAVAILABLE = (503, grpc.StatusCode.UNAVAILABLE, True)
    TIMEOUT = (408, grpc.StatusCode.DEADLINE_EXCEEDED, False)
    """OTLP/HTTP only: the body did not arrive in time (issue 10 #6)."""

    def __init__(self, http: int, grpc_code: grpc.StatusCode, retryable: bool) -> None:
        self.http = http
        self.grpc_code = grpc_code
        self.retryable = retryable

    @property
    def rpc_code(self) -> int:
        """The ``google.rpc.Code`` number (``Status.code`` of an HTTP error body)."""
        code: int = self.grpc_code.value[0]
        return code


@dataclass(frozen=True)
class Accepted:
    """The export outcome: ``rejected`` LogRecords that could not be mapped
    or admitted (``partial_success.rejected_log_records``) and why
    (``partial_success.error_message``)."""

    rejected: int = 0
    error_message: str = ""


class Refused(Exception):
    """A request refused whole. ``refusal``: the row of the map;
    ``message``: the human line sent back (never body content);
    ``retry_after``: seconds suggested to a retryable refusal's sender
    (``None``: no suggestion, the sender's own backoff applies)."""

    def __init__(self, refusal: Refusal, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.message = message
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        """The HTTP status."""
        return self.refusal.http


def detached(err: Refused) -> Refused:
    """``err`` without its traceback, cause and context, to be returned
    from a decoding thread as a value (not raised across the hand-off):
    a raised refusal carried the decoding frames (the body, a parsed
    request's upb arena: about 250 MB for 2,000,000 messages) into a
    reference cycle that only a full collection frees, and C memory never
    triggers one (RSS reached 10.7 GB under a flood of refused bodies: a
    fifteenth outside attack on issue 25)."""
    err.__traceback__ = None
    err.__cause__ = None
    err.__context__ = None
    return err


class BadRequest(Refused):
    """A request the sender must not retry unchanged (400, 413, 415);
    ``counter``: the ``BridgeHealth`` counter it is counted under."""

    def __init__(self, refusal: Refusal, message: str, counter: str) -> None:
        super().__init__(refusal, message)
        self.counter = counter


class Unavailable(Refused):
    """Retryable refusal (relay channel saturated, bridge stopping):
    503 + ``Retry-After`` / ``UNAVAILABLE`` + ``RetryInfo`` (both only when
    ``retry_after`` is given)."""

    def __init__(self, message: str, retry_after: int | None = 1) -> None:
        super().__init__(Refusal.UNAVAILABLE, message, retry_after)


def response_message(result: Accepted) -> ExportLogsServiceResponse:
    """The ``ExportLogsServiceResponse`` of an accepted request
    (``partial_success`` only when something was rejected)."""
    resp = ExportLogsServiceResponse()
    if result.rejected or result.error_message:
        resp.partial_success.rejected_log_records = result.rejected
        resp.partial_success.error_message = result.error_message
    return resp


@dataclass(frozen=True)
class HttpAnswer:
    """One complete HTTP response: ``status``, ``body`` bytes, its
    ``content_type`` and any ``headers`` beyond those two."""

    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


def _encode(message: ExportLogsServiceResponse | status_pb2.Status, is_json: bool
            ) -> tuple[bytes, str]:
    if is_json:
        return json_format.MessageToJson(message, indent=None).encode(), "application/json"
    return message.SerializeToString(), "application/x-protobuf"


def http_accepted(result: Accepted, *, is_json: bool) -> HttpAnswer:
    """200 with the response message, encoded like the request."""
    return HttpAnswer(200, *_encode(response_message(result), is_json))


def http_refused(err: Refused, *, is_json: bool) -> HttpAnswer:
    """The error status with a ``google.rpc.Status`` body encoded like the
    request, plus ``Retry-After`` on a retryable refusal."""
    body, ctype = _encode(status_pb2.Status(code=err.refusal.rpc_code, message=err.message),
                          is_json)
    extra: tuple[tuple[bytes, bytes], ...] = ()
    if err.refusal.retryable and err.retry_after is not None:
        extra = ((b"retry-after", str(err.retry_after).encode()),)
    return HttpAnswer(err.refusal.http, body, ctype, extra)


@dataclass(frozen=True)
class GrpcAnswer:
    """A refused RPC: the status ``code``, its ``details`` line and the
    ``trailing`` metadata (``RetryInfo`` on a retryable refusal)."""

    code: grpc.StatusCode
    details: str
    trailing: tuple[tuple[str, bytes], ...] = ()


def grpc_refused(err: Refused) -> GrpcAnswer:
    """The gRPC status of a refusal, with ``google.rpc.retryinfo-bin``
    (``retry_delay`` = ``retry_after`` seconds) when it is retryable."""
    trailing: tuple[tuple[str, bytes], ...] = ()
    if err.refusal.retryable and err.retry_after is not None:
        info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=err.retry_after))
        trailing = ((RETRY_INFO_KEY, info.SerializeToString()),)
    return GrpcAnswer(err.refusal.grpc_code, err.message, trailing)
