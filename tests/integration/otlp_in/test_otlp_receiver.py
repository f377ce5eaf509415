"""The OTLP inbound bridge in-process on loopback: a real ``BridgeContext``
(memory channel + ``Stamper`` + ``BridgeHealth``), real clients (httpx,
grpcio stubs), real Codex 0.171.0 export bodies
(``tests/fixtures/codex_otel_real/``). OTLP spec answers (200 +
partial_success, 400/INVALID_ARGUMENT, 413, 415, 503/UNAVAILABLE +
Retry-After), saturation, shutdown, two vendors at once, preflight."""
from __future__ import annotations

import gzip
import json
import socket
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import httpx
import pytest
import trio
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from bridges.core.bridge import BridgeContext
from bridges.core.capture import CapturePolicy
from bridges.otlp_in import OtlpConfig, OtlpInBridge, from_env
from tests.support.net import free_port
from tests.support.otlp_in import bridge_context, drain, otlp_bridge
from tests.support.shared import fixture

try:
    from tests.support.schema import validate_event
except ImportError:  # pragma: no cover
    validate_event = None  # type: ignore[assignment]

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real"
MANIFEST = json.loads((REAL / "manifest.json").read_text())
PB = (REAL / "otlp-http-protobuf" / "export-000.pb").read_bytes()
PB_CONV = MANIFEST["scenarios"]["otlp-http-protobuf"]["conversation_id"]
JSON_BODY = (REAL / "otlp-http-json" / "export-000.json").read_bytes()
JSON_CONV = MANIFEST["scenarios"]["otlp-http-json"]["conversation_id"]
N_PB = sum(len(sl.log_records) for rl in ExportLogsServiceRequest.FromString(PB).resource_logs
           for sl in rl.scope_logs)

PROTO = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}


@asynccontextmanager
async def running(bridge: OtlpInBridge, *, channel: int = 1000,
                  policy: CapturePolicy | None = None):
    ctx, recv = bridge_context(bridge.name, bridge.agent, channel=channel, policy=policy)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(20):
            await nursery.start(bridge.run, ctx)
        yield ctx, recv
        nursery.cancel_scope.cancel()


def local() -> OtlpInBridge:
    return otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0")


def url(b: OtlpInBridge, path: str = "/v1/logs") -> str:
    return f"http://127.0.0.1:{b.http_address[1]}{path}"


def grpc_call(port: int, body: bytes, *, compression=None, timeout: float = 15.0):
    """One raw-bytes LogsService/Export over loopback; returns
    ``(response | None, code, details, trailing)``."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        export = ch.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                                request_serializer=None,
                                response_deserializer=ExportLogsServiceResponse.FromString)
        try:
            resp = export(body, timeout=timeout, compression=compression)
            return resp, grpc.StatusCode.OK, "", ()
        except grpc.RpcError as e:
            return None, e.code(), e.details(), e.trailing_metadata() or ()


def check(events: list[dict]) -> None:
    for ev in events:
        if validate_event is not None:
            validate_event(ev)


# --------------------------------------------------------------------------- happy paths

async def test_http_protobuf_real_codex_export():
    b = local()
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        r = await c.post(url(b), content=PB, headers=PROTO)
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/x-protobuf"
        resp = ExportLogsServiceResponse.FromString(r.content)
        assert not resp.HasField("partial_success")
        events = drain(recv)
        assert ctx.health.source is True
    assert ctx.health.source is False
    assert len(events) == N_PB
    check(events)
    assert {e["session"] for e in events} == {PB_CONV}
    assert [e["seq"] for e in events] == list(range(N_PB))
    assert all(e["agent"] == "codex" and e["epoch"] == 3 for e in events)
    assert events[0]["type"] == "x.codex.otel.conversation_starts"
    assert events[0]["source"] == f"aep://test-host/agent/codex/session/{PB_CONV}"
    assert not any(e["type"] == "x.codex.otel.unknown" for e in events)
    assert ctx.health.counters["otlp.emitted"] == N_PB


async def test_http_json_real_codex_export_answers_json():
    b = local()
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        r = await c.post(url(b), content=JSON_BODY, headers=JSON)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json() == {}
        events = drain(recv)
    check(events)
    assert {e["session"] for e in events} == {JSON_CONV}
    # time_unix_nano is 0 on 0.171: the envelope time is the vendor's event.timestamp
    doc = json.loads(JSON_BODY)
    stamps = [next(a["value"]["stringValue"] for a in lr["attributes"]
                   if a["key"] == "event.timestamp")
              for lr in doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"]]
    assert [e["time"] for e in events] == stamps


async def test_http_gzip_body_accepted():
    b = local()
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        r = await c.post(url(b), content=gzip.compress(PB),
                         headers={**PROTO, "content-encoding": "gzip"})
        assert r.status_code == 200
        assert len(drain(recv)) == N_PB


async def test_grpc_real_codex_export_plain_and_gzip():
    b = local()
    async with running(b) as (ctx, recv):
        resp, code, _, _ = await trio.to_thread.run_sync(grpc_call, b.grpc_address[1], PB)
        assert code == grpc.StatusCode.OK and not resp.HasField("partial_success")
        assert len(drain(recv)) == N_PB
        resp, code, _, _ = await trio.to_thread.run_sync(
            lambda: grpc_call(b.grpc_address[1], PB, compression=grpc.Compression.Gzip))
        assert code == grpc.StatusCode.OK
        events = drain(recv)
    assert len(events) == N_PB and {e["session"] for e in events} == {PB_CONV}
    check(events)


async def test_grpc_generated_stub():
    b = local()

    def call():
        with grpc.insecure_channel(f"127.0.0.1:{b.grpc_address[1]}") as ch:
            return logs_service_pb2_grpc.LogsServiceStub(ch).Export(
                ExportLogsServiceRequest.FromString(PB), timeout=15)

    async with running(b) as (ctx, recv):
        resp = await trio.to_thread.run_sync(call)
        assert resp == ExportLogsServiceResponse()
        assert len(drain(recv)) == N_PB


async def test_primary_mode_over_the_wire():
    b = otlp_bridge(grpc="off", http="127.0.0.1:0", primary=True)
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        assert (await c.post(url(b), content=PB, headers=PROTO)).status_code == 200
        events = drain(recv)
    check(events)
    types = [e["type"] for e in events]
    assert types[0] == "session.started" and "tool.completed" in types
    started = events[0]
    assert started["data"] == {"client": {"name": "codex"},
                               "gen_ai.request.model": "mock-codex-model"}
    assert started["severity"] == "notice"
    assert b.capabilities()["emits"] == ["session", "tool", "x.codex.otel"]


# --------------------------------------------------------------------------- partial success

async def test_partial_success_counts_records_that_cannot_be_mapped():
    doc = {"resourceLogs": [{"resource": {}, "scopeLogs": [{"logRecords": [
        {"attributes": [{"key": "event.name", "value": {"stringValue": "codex.turn_ttft"}},
                        {"key": "conversation.id", "value": {"stringValue": "c1"}}]},
        {"attributes": [{"key": "event.name", "value": {"stringValue": "codex.turn_ttft"}}]},
        "not a record",
        {"attributes": [{"key": "conversation.id", "value": {"stringValue": "c1"}},
                        {"key": "odd", "value": {"intValue": "NaN"}}]},
    ]}]}]}
    b = local()
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        r = await c.post(url(b), json=doc)
        assert r.status_code == 200
        ps = r.json()["partialSuccess"]
        assert ps["rejectedLogRecords"] == "2"  # int64 as a string (OTLP/JSON)
        assert "no session key" in ps["errorMessage"] and "not a LogRecord" in ps["errorMessage"]
        events = drain(recv)
    # the nameless record degrades to the fallback type, counted
    assert [e["type"] for e in events] == ["x.codex.otel.turn_ttft", "x.codex.otel.unknown"]
    counters = ctx.health.counters
    assert counters["otlp.no_session"] == 1 and counters["otlp.record_malformed"] == 1
    assert counters["otlp.no_event_name"] == 1 and counters["otlp.value_unexpected"] == 1
    assert counters["otlp.rejected"] == 2


async def test_grpc_partial_success():
    req = ExportLogsServiceRequest()
    lr = req.resource_logs.add().scope_logs.add().log_records.add()
    lr.event_name = "codex.turn_ttft"  # no conversation.id
    b = local()
    async with running(b) as (ctx, recv):
        resp, code, _, _ = await trio.to_thread.run_sync(grpc_call, b.grpc_address[1],
                                                         req.SerializeToString())
    assert code == grpc.StatusCode.OK
    assert resp.partial_success.rejected_log_records == 1
    assert "no session key" in resp.partial_success.error_message


# --------------------------------------------------------------------------- bad input

BAD_HTTP = [
    ("garbage bytes", PROTO, b"\x00\xffgarbage\xfe", 400, "otlp.undecodable"),
    ("truncated protobuf", PROTO, PB[: len(PB) // 2], 400, "otlp.undecodable"),
    ("json that is not otlp", JSON, b'[{"resourceLogs": []}]', 400, "otlp.undecodable"),
    ("not json", JSON, b"{{{", 400, "otlp.undecodable"),
    ("wrong content type", {"content-type": "text/plain"}, PB, 415,
     "otlp.unsupported_media_type"),
    ("no content type", {}, PB, 415, "otlp.unsupported_media_type"),
    ("brotli", {**PROTO, "content-encoding": "br"}, PB, 415, "otlp.unsupported_encoding"),
    ("bad gzip", {**PROTO, "content-encoding": "gzip"}, b"\x1f\x8bnope", 400, "otlp.bad_gzip"),
]


@pytest.mark.parametrize("what,headers,body,status,counter", BAD_HTTP, ids=[x[0] for x in BAD_HTTP])
async def test_http_bad_input(what, headers, body, status, counter):
    b = local()
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        r = await c.post(url(b), content=body, headers=headers)
        assert r.status_code == status
        if status == 400:
            # google.rpc.Status in the request's encoding
            if headers is JSON:
                assert r.json()["code"] == 3 and r.json()["message"]
            else:
                st = status_pb2.Status.FromString(r.content)
                assert st.code == 3 and st.message
        assert ctx.health.counters[counter] == 1
        assert drain(recv) == []
        # nothing crashed: the next good request is served
        assert (await c.post(url(b), content=PB, headers=PROTO)).status_code == 200
        assert len(drain(recv)) == N_PB


async def test_http_routes_and_methods():
    b = local()
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        assert (await c.post(url(b, "/v1/traces"), content=PB, headers=PROTO)).status_code == 404
        r = await c.post(url(b, "/"), content=PB, headers=PROTO)
        assert r.status_code == 404 and b"POST /v1/logs" in r.content
        r = await c.get(url(b))
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert (await c.post(url(b, "/v1/logs/"), content=PB, headers=PROTO)).status_code == 200


async def test_http_oversized_declared_streamed_and_inflated():
    b = otlp_bridge(grpc="off", http="127.0.0.1:0", max_body=64 * 1024)
    big = b"\x00" * (64 * 1024 + 1)

    async def chunks():
        for _ in range(200):
            yield b"\x00" * 1024

    bomb = gzip.compress(b"\x00" * (8 << 20))  # 8 MiB of zeros in ~8 KiB
    async with running(b) as (ctx, recv), httpx.AsyncClient() as c:
        assert (await c.post(url(b), content=big, headers=PROTO)).status_code == 413
        assert (await c.post(url(b), content=chunks(), headers=PROTO)).status_code == 413
        r = await c.post(url(b), content=bomb, headers={**PROTO, "content-encoding": "gzip"})
        assert r.status_code == 413 and len(bomb) < 64 * 1024
        assert ctx.health.counters["otlp.too_large"] == 3
        assert drain(recv) == []
        assert (await c.post(url(b), content=PB, headers=PROTO)).status_code == 200


async def test_grpc_bad_input():
    b = otlp_bridge(grpc="127.0.0.1:0", http="off", max_body=64 * 1024)
    async with running(b) as (ctx, recv):
        port = b.grpc_address[1]
        _, code, details, _ = await trio.to_thread.run_sync(grpc_call, port, b"\x00\xffgarbage")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "undecodable" in details
        _, code, _, _ = await trio.to_thread.run_sync(grpc_call, port, PB[:-5])
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        _, code, _, _ = await trio.to_thread.run_sync(grpc_call, port, b"\x00" * (70 * 1024))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a gzip bomb on gRPC compression: the limit holds on the inflated message
        req = ExportLogsServiceRequest()
        lr = req.resource_logs.add().scope_logs.add().log_records.add()
        lr.body.string_value = "a" * (4 << 20)
        _, code, _, _ = await trio.to_thread.run_sync(
            lambda: grpc_call(port, req.SerializeToString(), compression=grpc.Compression.Gzip))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ctx.health.counters["otlp.undecodable"] == 2
        assert drain(recv) == []
        resp, code, _, _ = await trio.to_thread.run_sync(grpc_call, port, PB)
        assert code == grpc.StatusCode.OK and len(drain(recv)) == N_PB


# --------------------------------------------------------------------------- saturation

def fill(ctx: BridgeContext) -> None:
    n = 0
    while not ctx.saturated():
        ctx.emit_nowait("filler", {"type": "x.codex.otel.unknown"})
        n += 1
    assert n


async def test_saturated_channel_answers_retryable_and_emits_nothing():
    b = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0", emit_grace=0.2)
    async with running(b, channel=8) as (ctx, recv), httpx.AsyncClient() as c:
        fill(ctx)
        r = await c.post(url(b), content=PB, headers=PROTO)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert status_pb2.Status.FromString(r.content).code == 14
        r = await c.post(url(b), content=JSON_BODY, headers=JSON)
        assert r.status_code == 503 and r.json()["code"] == 14
        _, code, _, trailing = await trio.to_thread.run_sync(grpc_call, b.grpc_address[1], PB)
        assert code == grpc.StatusCode.UNAVAILABLE
        info = error_details_pb2.RetryInfo.FromString(dict(trailing)["google.rpc.retryinfo-bin"])
        assert info.retry_delay.seconds == 1
        assert ctx.health.counters["otlp.saturated"] == 3
        assert all(e["session"] == "filler" for e in drain(recv))  # nothing else got in
        # the retry after the relay drained goes through, whole
        r = await c.post(url(b), content=JSON_BODY, headers=JSON)
        assert r.status_code == 200


async def test_momentary_saturation_is_waited_out_not_refused():
    # Codex never retries a refused export (tests/fixtures/codex_otel_real/
    # README.md, "Delivery"): a relay that drains within emit_grace must not
    # cost its whole run.
    b = local()
    async with running(b, channel=8) as (ctx, recv), httpx.AsyncClient() as c:
        fill(ctx)
        got: list[dict] = []

        async def relay_soon():
            await trio.sleep(0.3)
            async for out in recv:
                got.append(out.event)

        async with trio.open_nursery() as n:
            n.start_soon(relay_soon)
            r = await c.post(url(b), content=PB, headers=PROTO)
            assert r.status_code == 200
            _, code, _, _ = await trio.to_thread.run_sync(grpc_call, b.grpc_address[1], PB)
            assert code == grpc.StatusCode.OK
            with trio.fail_after(10):
                while len([e for e in got if e["session"] == PB_CONV]) < 2 * N_PB:
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()
        assert "otlp.saturated" not in ctx.health.counters


async def test_channel_filling_mid_request_waits_for_room():
    b = local()
    async with running(b, channel=4) as (ctx, recv), httpx.AsyncClient() as c:
        got: list[dict] = []

        async def consumer():
            async for out in recv:
                got.append(out.event)
                await trio.sleep(0.001)  # a slow but live relay

        async with trio.open_nursery() as n:
            n.start_soon(consumer)
            r = await c.post(url(b), content=PB, headers=PROTO)
            assert r.status_code == 200
            assert not ExportLogsServiceResponse.FromString(r.content).HasField("partial_success")
            with trio.fail_after(10):
                while len(got) < N_PB:
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()
        assert [e["seq"] for e in got] == list(range(N_PB))  # no gap, no loss


async def test_channel_stuck_mid_request_reports_partial_success_not_silence():
    b = otlp_bridge(grpc="off", http="127.0.0.1:0", emit_grace=0.2)
    async with running(b, channel=5) as (ctx, recv), httpx.AsyncClient() as c:
        r = await c.post(url(b), content=PB, headers=PROTO)
        assert r.status_code == 200
        ps = ExportLogsServiceResponse.FromString(r.content).partial_success
        assert ps.rejected_log_records == N_PB - 5
        assert "saturated" in ps.error_message
        assert ctx.health.counters["otlp.rejected_saturated"] == N_PB - 5
        assert len(drain(recv)) == 5


# --------------------------------------------------------------------------- lifecycle

def _connect_refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_cancellation_stops_both_servers_and_frees_the_ports():
    b = local()
    async with running(b) as (ctx, recv):
        gport, hport = b.grpc_address[1], b.http_address[1]
        resp, code, _, _ = await trio.to_thread.run_sync(grpc_call, gport, PB)
        assert code == grpc.StatusCode.OK
    assert ctx.health.source is False
    assert _connect_refused(gport) and _connect_refused(hport)
    _, code, _, _ = await trio.to_thread.run_sync(lambda: grpc_call(gport, PB, timeout=3))
    assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    # and the same bridge object can run again (supervisor restart)
    async with running(b) as (ctx2, recv2):
        resp, code, _, _ = await trio.to_thread.run_sync(grpc_call, b.grpc_address[1], PB)
        assert code == grpc.StatusCode.OK and len(drain(recv2)) == N_PB


async def test_cancellation_with_an_export_in_flight():
    # The relay never drains; a gRPC export is waiting for room when the
    # bridge is cancelled: the client gets an answer, the bridge stops.
    b = otlp_bridge(grpc="127.0.0.1:0", http="off", emit_grace=30)
    result = {}
    async with trio.open_nursery() as outer:
        async with running(b, channel=3) as (ctx, recv):
            port = b.grpc_address[1]

            async def call():
                result["r"] = await trio.to_thread.run_sync(grpc_call, port, PB)

            outer.start_soon(call)
            with trio.fail_after(10):
                while ctx.health.counters.get("otlp.requests", 0) < 1:
                    await trio.sleep(0.01)
            await trio.sleep(0.1)
        with trio.fail_after(15):
            while "r" not in result:
                await trio.sleep(0.05)
    resp, code, _, _ = result["r"]
    assert code == grpc.StatusCode.OK  # the admitted part went out before the stop
    assert resp.partial_success.rejected_log_records == N_PB - 3
    assert "receiver stopping" in resp.partial_success.error_message
    assert ctx.health.counters["otlp.rejected_stopping"] == N_PB - 3
    assert _connect_refused(port)


async def _http_export_across_a_stop(channel: int, *, wait_for, after_stop=None):
    """POST the real export over OTLP/HTTP, stop the run once ``wait_for(ctx)``
    holds (what the fleet's drain does first: cancel the bridges) and, while
    the run stops, take what was emitted and call ``after_stop(ctx, sent)``
    (the drain's pump, which runs beside the bridges' stop); return what the
    client got, the events emitted and the context."""
    b = otlp_bridge(grpc="off", http="127.0.0.1:0", emit_grace=30)
    result: dict = {}
    sent: list = []

    async def pump():
        await trio.sleep(0.1)  # the bridges are stopping now
        sent.extend(drain(recv))
        if after_stop is not None:
            after_stop(ctx, sent)

    async with trio.open_nursery() as outer:
        async with running(b, channel=channel) as (ctx, recv):
            port = b.http_address[1]

            async def call():
                async with httpx.AsyncClient() as c:
                    try:
                        result["r"] = await c.post(url(b), content=PB, headers=PROTO, timeout=15)
                    except httpx.HTTPError as e:
                        result["r"] = e

            outer.start_soon(call)
            with trio.fail_after(10):
                while not wait_for(ctx):
                    await trio.sleep(0.01)
            await trio.sleep(0.1)
            outer.start_soon(pump)
        with trio.fail_after(15):
            while "r" not in result:
                await trio.sleep(0.05)
    assert _connect_refused(port)
    return result["r"], sent, ctx


async def test_an_http_export_waiting_for_room_at_the_stop_is_answered():
    # The HTTP counterpart of the gRPC case above: the run's stop reaches the
    # server as a graceful shutdown, not a cancel that dropped the connection
    # after 3 events had gone out (the exporter's retry repeated them)
    r, sent, ctx = await _http_export_across_a_stop(
        3, wait_for=lambda ctx: ctx.health.counters.get("otlp.requests", 0) >= 1)
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 200 and len(sent) == 3
    resp = ExportLogsServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_log_records == N_PB - 3
    assert "receiver stopping" in resp.partial_success.error_message
    assert ctx.health.counters["otlp.rejected_stopping"] == N_PB - 3


async def test_an_http_export_waiting_on_its_log_verdict_at_the_stop_is_answered():
    # Every event went out; the export waits for the session log's verdict
    # when the run stops; the drain's pump writes them a moment later
    def logged(ctx, sent):
        ctx.log_results(len(sent))

    def emitted_all(ctx):
        if not getattr(ctx, "_test_attached", False):
            ctx.attach_log(lambda: True)
            ctx._test_attached = True
        return ctx.log_mark() >= N_PB

    r, sent, ctx = await _http_export_across_a_stop(1000, wait_for=emitted_all,
                                                    after_stop=logged)
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 200 and len(sent) == N_PB
    resp = ExportLogsServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_log_records == 0


async def test_an_http_export_whose_verdict_outlasts_the_stop_is_answered_503():
    # The drain's pump never confirms within the servers' grace: the export
    # is answered 503 (its events went out: counted, and the retry may
    # repeat them) before hypercorn's grace would cut its connection
    def never(ctx):
        if not getattr(ctx, "_test_attached", False):
            ctx.attach_log(lambda: True)
            ctx._test_attached = True
        return ctx.log_mark() >= N_PB

    r, sent, ctx = await _http_export_across_a_stop(1000, wait_for=never)
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 503 and len(sent) == N_PB
    assert b"went out to the relay" in r.content  # told apart from a 503 that sent nothing
    assert ctx.health.counters["otlp.log_unconfirmed_at_stop"] == 1
    assert "otlp.log_unwritten" not in ctx.health.counters


@pytest.mark.parametrize("checkpoints", [0, 1, 3])
async def test_a_run_cancelled_before_it_started_ends_and_leaves_nothing_listening(checkpoints):
    # A drain reaching a bridge that is still binding (a restart): the
    # shielded HTTP server must still hear the stop, not serve on forever
    port = free_port()
    b = otlp_bridge(grpc="off", http=f"127.0.0.1:{port}")
    ctx, _ = bridge_context(b.name, b.agent)
    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            n.start_soon(b.run, ctx)
            for _ in range(checkpoints):
                await trio.lowlevel.checkpoint()
            n.cancel_scope.cancel()
    assert _connect_refused(port)


async def test_a_run_whose_start_is_cancelled_ends():
    b = otlp_bridge(grpc="off", http="127.0.0.1:0")
    ctx, _ = bridge_context(b.name, b.agent)
    with trio.fail_after(5), trio.CancelScope() as cs:
        async with trio.open_nursery() as n:
            cs.cancel()
            await n.start(b.run, ctx)


async def test_a_restart_starts_clean():
    # Run state lives on the per-run object, not the bridge (issue 7): a run
    # stopped while an export was waiting (its admission closing) leaves
    # nothing behind; the next run has its own context, listeners, admission.
    b = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0", emit_grace=30)
    assert b.listeners() == {"grpc": ("127.0.0.1", 0), "http": ("127.0.0.1", 0)}
    result = {}
    async with trio.open_nursery() as outer:
        async with running(b, channel=3) as (ctx1, recv1):
            first = b.listeners()
            assert first["grpc"][1] != 0 and first["http"][1] != 0
            assert (b.grpc_address, b.http_address) == (first["grpc"], first["http"])

            async def call():
                result["r"] = await trio.to_thread.run_sync(grpc_call, first["grpc"][1], PB)

            outer.start_soon(call)
            with trio.fail_after(10):
                while ctx1.health.counters.get("otlp.requests", 0) < 1:
                    await trio.sleep(0.01)
        with trio.fail_after(15):
            while "r" not in result:
                await trio.sleep(0.05)
    assert result["r"][0].partial_success.rejected_log_records == N_PB - 3
    # stopped: nothing bound, the configured listeners again
    assert b.listeners() == {"grpc": ("127.0.0.1", 0), "http": ("127.0.0.1", 0)}
    assert b.grpc_address is None and b.http_address is None
    async with running(b) as (ctx2, recv2), httpx.AsyncClient() as c:
        assert b.listeners()["http"] == b.http_address and b.http_address[1] != 0
        r = await c.post(url(b), content=PB, headers=PROTO)
        assert r.status_code == 200  # not "receiver is stopping"
        assert not ExportLogsServiceResponse.FromString(r.content).HasField("partial_success")
        second = drain(recv2)
    assert len(second) == N_PB and ctx2.health.counters["otlp.requests"] == 1
    assert len(drain(recv1)) == 3  # the first run's channel got nothing more
    assert "otlp.rejected_stopping" not in ctx2.health.counters


@pytest.mark.parametrize("kind", ["grpc", "http"])
async def test_bind_failure_raises_a_plain_oserror(kind):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = "127.0.0.1:0"
        b = otlp_bridge(grpc=f"127.0.0.1:{port}" if kind == "grpc" else other,
                        http=f"127.0.0.1:{port}" if kind == "http" else other)
        setting = "AEP_OTLP_GRPC_LISTEN" if kind == "grpc" else "AEP_OTLP_HTTP_LISTEN"
        assert b.preflight() == [f"{setting}=127.0.0.1:{port}: address in use or not bindable"]
        ctx, _ = bridge_context(b.name, b.agent, channel=10)
        with pytest.raises(OSError), trio.fail_after(15):
            await b.run(ctx)
        assert ctx.health.source is False


# --------------------------------------------------------------------------- two vendors

async def test_codex_and_vscode_at_once_each_its_own_emitter():
    env = {"AEP_OTLP_VENDOR": "codex,vscode", "AEP_OTLP_GRPC_LISTEN": "127.0.0.1:0",
           "AEP_OTLP_HTTP_LISTEN": "127.0.0.1:0", "AEP_OTLP_VSCODE_GRPC_LISTEN": "off",
           "AEP_OTLP_VSCODE_HTTP_LISTEN": "127.0.0.1:0", "AEP_OTLP_PRIMARY": "0"}
    codex_b, vscode_b = from_env(env, policy=CapturePolicy())
    assert (codex_b.name, codex_b.agent) == ("otlp_in.codex", "codex")
    assert (vscode_b.name, vscode_b.agent) == ("otlp_in.vscode", "vscode")
    assert codex_b.preflight() == [] and vscode_b.preflight() == []
    pin = fixture("mappings/vscode-otel.json")["records"]["tool_call_ok"]["input"]
    doc = {"resourceLogs": [{
        "resource": {"attributes": [{"key": k, "value": {"stringValue": v}}
                                    for k, v in pin["resource"].items()]},
        "scopeLogs": [{"logRecords": [{"attributes": [
            {"key": "event.name", "value": {"stringValue": "copilot_chat.tool.call"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "readFile"}},
            {"key": "duration_ms", "value": {"intValue": "63"}},
            {"key": "success", "value": {"boolValue": True}}]}]}]}]}
    async with running(codex_b) as (cctx, crecv), running(vscode_b) as (vctx, vrecv), \
            httpx.AsyncClient() as c:
        assert codex_b.http_address != vscode_b.http_address
        assert (await c.post(url(vscode_b), json=doc)).status_code == 200
        assert (await c.post(url(codex_b), content=PB, headers=PROTO)).status_code == 200
        (vev,) = drain(vrecv)
        cevs = drain(crecv)
    assert vev["agent"] == "vscode" and vev["session"] == "vsc_fix_1"
    assert vev["type"] == "x.vscode.otel.tool.call"
    assert vev["data"] == {"gen_ai.tool.name": "readFile", "duration_ms": 63, "success": True}
    assert vev["source"] == "aep://test-host/agent/vscode/session/vsc_fix_1"
    assert len(cevs) == N_PB and all(e["agent"] == "codex" for e in cevs)


# --------------------------------------------------------------------------- configuration

def test_from_env_defaults():
    # primary mode by default (issue 29: what the demo runs), companion on request
    (b,) = from_env({})
    assert b.config == OtlpConfig("codex", ("127.0.0.1", 4317), ("127.0.0.1", 4318), True,
                                  4 * 1024 * 1024)
    assert (b.vendor, b.primary) == ("codex", True)
    assert b.listeners() == {"grpc": ("127.0.0.1", 4317), "http": ("127.0.0.1", 4318)}
    assert b.capabilities()["emits"] == ["session", "tool", "x.codex.otel"]
    (c,) = from_env({"AEP_OTLP_PRIMARY": "0"})
    assert (c.vendor, c.primary) == ("codex", False)
    assert c.capabilities() == {"emits": ["x.codex.otel"], "capture": ["none", "metadata"]}
    (p,) = from_env({"AEP_OTLP_PRIMARY": "1", "AEP_OTLP_VENDOR": "vscode"})
    assert p.primary and p.name == "otlp_in.vscode"
    assert p.capabilities()["emits"] == ["session", "tool", "x.vscode.otel"]


def test_preflight_problems_one_line_each():
    # Configuration problems (tests/unit/otlp_in/test_otlp_config.py has the
    # table) surface once, through the first bridge; the supervisor prints
    # every bridge's preflight lines, so each problem is printed once.
    env = {"AEP_OTLP_VENDOR": "codex,vscode,cursor", "AEP_OTLP_GRPC_LISTEN": "localhost",
           "AEP_OTLP_HTTP_LISTEN": "127.0.0.1:0", "AEP_OTLP_MAX_BODY": "lots"}
    codex_b, vscode_b, cursor_b = from_env(env)
    assert codex_b.preflight() == [
        "AEP_OTLP_MAX_BODY='lots': must be a whole number of bytes, at least 1024",
        "AEP_OTLP_GRPC_LISTEN='localhost': 'localhost' is not host:port "
        "(e.g. 127.0.0.1:4317) or off",
        # the second profile must get its own listeners, named by its own settings
        "AEP_OTLP_VSCODE_GRPC_LISTEN: not set; every OTLP vendor after the first needs its own "
        "listeners (host:port or off)",
        "AEP_OTLP_VSCODE_HTTP_LISTEN: not set; every OTLP vendor after the first needs its own "
        "listeners (host:port or off)",
        "AEP_OTLP_CURSOR_GRPC_LISTEN: not set; every OTLP vendor after the first needs its own "
        "listeners (host:port or off)",
        "AEP_OTLP_CURSOR_HTTP_LISTEN: not set; every OTLP vendor after the first needs its own "
        "listeners (host:port or off)",
        "AEP_OTLP_VENDOR: unknown vendor 'cursor' (known: codex, vscode)"]
    assert vscode_b.preflight() == [] and cursor_b.preflight() == []
    # a bridge built from a config alone checks that config
    both_off = otlp_bridge(grpc="off", http="off")
    assert both_off.preflight() == ["AEP_OTLP_GRPC_LISTEN and AEP_OTLP_HTTP_LISTEN are both "
                                    "off: the codex profile would receive nothing"]
    same = otlp_bridge(grpc="127.0.0.1:4999", http="127.0.0.1:4999")
    assert "AEP_OTLP_GRPC_LISTEN and AEP_OTLP_HTTP_LISTEN are both 127.0.0.1:4999: use two " \
           "ports" in same.preflight()


def test_preflight_two_profiles_on_one_address():
    env = {"AEP_OTLP_VENDOR": "codex,vscode", "AEP_OTLP_VSCODE_GRPC_LISTEN": "127.0.0.1:4317",
           "AEP_OTLP_VSCODE_HTTP_LISTEN": "off"}
    codex_b, vscode_b = from_env(env)
    assert codex_b.preflight(check_ports=False) == [
        "AEP_OTLP_VSCODE_GRPC_LISTEN=127.0.0.1:4317: also used by AEP_OTLP_GRPC_LISTEN; each "
        "OTLP vendor needs its own listeners"]
    assert vscode_b.preflight(check_ports=False) == []
