"""The one error -> status map of both OTLP transports, without sockets
(OTLP spec "OTLP/HTTP" / "OTLP/gRPC": Failures, Throttling)."""
from __future__ import annotations

import json

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from bridges.otlp_in.status import (
    RETRY_INFO_KEY,
    Accepted,
    BadRequest,
    Refusal,
    Unavailable,
    grpc_refused,
    http_accepted,
    http_refused,
)

# the OTLP specification's table, written out independently of the code
SPEC = [
    (Refusal.MALFORMED, 400, grpc.StatusCode.INVALID_ARGUMENT, 3, False),
    (Refusal.UNSUPPORTED, 415, grpc.StatusCode.INVALID_ARGUMENT, 3, False),
    (Refusal.TOO_LARGE, 413, grpc.StatusCode.RESOURCE_EXHAUSTED, 8, False),
    (Refusal.UNAVAILABLE, 503, grpc.StatusCode.UNAVAILABLE, 14, True),
]


@pytest.mark.parametrize("refusal,http,code,rpc,retryable", SPEC)
def test_the_map(refusal, http, code, rpc, retryable):
    assert (refusal.http, refusal.grpc_code, refusal.rpc_code, refusal.retryable) == \
        (http, code, rpc, retryable)


@pytest.mark.parametrize("refusal", [Refusal.MALFORMED, Refusal.UNSUPPORTED, Refusal.TOO_LARGE])
def test_non_retryable_refusals_suggest_no_retry(refusal):
    err = BadRequest(refusal, "nope", "otlp.x")
    a = http_refused(err, is_json=False)
    assert a.status == refusal.http and a.headers == ()
    assert status_pb2.Status.FromString(a.body) == status_pb2.Status(code=refusal.rpc_code,
                                                                     message="nope")
    g = grpc_refused(err)
    assert (g.code, g.details, g.trailing) == (refusal.grpc_code, "nope", ())


def test_unavailable_carries_retry_after_and_retry_info():
    err = Unavailable("relay channel saturated; retry later", 7)
    a = http_refused(err, is_json=True)
    assert (a.status, a.content_type, a.headers) == (503, "application/json",
                                                     ((b"retry-after", b"7"),))
    assert json.loads(a.body) == {"code": 14, "message": "relay channel saturated; retry later"}
    g = grpc_refused(err)
    assert g.code == grpc.StatusCode.UNAVAILABLE
    ((key, raw),) = g.trailing
    assert key == RETRY_INFO_KEY
    assert error_details_pb2.RetryInfo.FromString(raw).retry_delay.seconds == 7


def test_unavailable_without_a_suggestion_leaves_the_backoff_to_the_sender():
    err = Unavailable("receiver is shutting down", retry_after=None)
    assert http_refused(err, is_json=False).headers == () and grpc_refused(err).trailing == ()


def test_accepted_answers_partial_success_only_when_something_was_rejected():
    ok = http_accepted(Accepted(), is_json=False)
    assert (ok.status, ok.body, ok.content_type) == (200, b"", "application/x-protobuf")
    part = http_accepted(Accepted(2, "2 LogRecords rejected: no session key"), is_json=True)
    assert json.loads(part.body) == {"partialSuccess": {
        "rejectedLogRecords": "2", "errorMessage": "2 LogRecords rejected: no session key"}}
    resp = ExportLogsServiceResponse.FromString(
        http_accepted(Accepted(2, "x"), is_json=False).body)
    assert resp.partial_success.rejected_log_records == 2
