"""Round 14 of issue 25: eight unauthenticated OTLP senders (four HTTP,
four gRPC) repeating a 4 MB body of 2,000,000 empty ResourceLogs, refused
413 each time, kept six decoding threads in C protobuf parses that hold the
GIL; the event loop starved and 8-11 of 50 gated hooks failed open. Both
transports now decode in the process's one lane
(``bridges/otlp_in/lane.py``), in arrival order, and a request that gets no
turn within ``LANE_WAIT_S`` is answered retryable and counted."""
from __future__ import annotations

import gc
import gzip
import threading
import types
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import grpc
import httpx
import trio
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from bridges.otlp_in import grpc as otlp_grpc
from bridges.otlp_in import http as otlp_http
from bridges.otlp_in.lane import LANE
from tests.support.otlp_in import bridge_context, drain, otlp_bridge

PB = (Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real" / "otlp-http-protobuf"
      / "export-000.pb").read_bytes()
N_PB = sum(len(sl.log_records) for rl in ExportLogsServiceRequest.FromString(PB).resource_logs
           for sl in rl.scope_logs)
PROTO = {"content-type": "application/x-protobuf"}


@asynccontextmanager
async def running(bridge):
    ctx, recv = bridge_context(bridge.name, bridge.agent)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(20):
            await nursery.start(bridge.run, ctx)
        yield ctx, recv
        nursery.cancel_scope.cancel()


@contextmanager
def lane_held():
    """The process lane held by a plain thread until the block ends or
    the yielded event is set."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with LANE.held(30):
            entered.set()
            release.wait(60)

    t = threading.Thread(target=hold, name="test-lane-holder")
    t.start()
    try:
        assert entered.wait(30)
        yield release
    finally:
        release.set()
        t.join(30)


def grpc_export(port: int, body: bytes):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        export = ch.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                                request_serializer=None,
                                response_deserializer=ExportLogsServiceResponse.FromString)
        try:
            export(body, timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def patient(monkeypatch) -> None:
    """Requests wait for their turn as long as a test needs: queued
    decodes, each resting after it, can outlast the 5 s a request waits
    (and the 10 s OTLP/HTTP deadline) on a loaded machine, which is not
    what these tests are about."""
    monkeypatch.setattr(otlp_http, "LANE_WAIT_S", 120.0)
    monkeypatch.setattr(otlp_grpc, "LANE_WAIT_S", 120.0)
    monkeypatch.setattr(otlp_http, "DECODE_DEADLINE_S", 240.0)


async def test_http_and_grpc_exports_decode_one_at_a_time_in_the_one_lane(monkeypatch):
    patient(monkeypatch)
    b = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0")
    answers: dict[str, object] = {}
    async with running(b) as (ctx, recv), httpx.AsyncClient(timeout=30) as c:
        async def post() -> None:
            answers["http"] = (await c.post(f"http://127.0.0.1:{b.http_address[1]}/v1/logs",
                                            content=PB, headers=PROTO)).status_code

        async def call() -> None:
            answers["grpc"] = await trio.to_thread.run_sync(grpc_export, b.grpc_address[1], PB)

        with lane_held() as release:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                nursery.start_soon(call)
                with trio.fail_after(20):  # both wait for the lane, neither decodes beside it
                    while LANE.waiting < 2:
                        await trio.sleep(0.01)
                assert drain(recv) == [] and answers == {}
                release.set()
        assert len(drain(recv)) == 2 * N_PB
    assert answers == {"http": 200, "grpc": grpc.StatusCode.OK}
    assert LANE.waiting == 0 and not LANE.busy


async def test_an_export_without_a_turn_is_answered_retryable_and_counted(monkeypatch):
    monkeypatch.setattr(otlp_http, "LANE_WAIT_S", 0.2)
    monkeypatch.setattr(otlp_grpc, "LANE_WAIT_S", 0.2)
    b = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0")
    async with running(b) as (ctx, recv), httpx.AsyncClient(timeout=30) as c:
        url = f"http://127.0.0.1:{b.http_address[1]}/v1/logs"
        with lane_held():
            r = await c.post(url, content=PB, headers=PROTO)
            code = await trio.to_thread.run_sync(grpc_export, b.grpc_address[1], PB)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        st = status_pb2.Status.FromString(r.content)
        assert st.code == 14 and "no turn to decode" in st.message
        assert code == grpc.StatusCode.UNAVAILABLE
        assert ctx.health.counters["otlp.decode_timeout"] == 2
        assert drain(recv) == []
        # the lane free again, the same export goes through
        assert (await c.post(url, content=PB, headers=PROTO)).status_code == 200
        assert len(drain(recv)) == N_PB


# ---------------------------------------------------------------- round 15

REFUSED = b"\x0a\x00" * 2_000_000  # 2,000,000 empty ResourceLogs: 413 past MAX_ITEMS
_DECODING = {"decode_http_body", "decode_proto", "_check_size", "_decode", "_answer",
             "_read_body", "_export", "__call__"}


def _decoding_frames() -> list[str]:
    """Finished frames of the OTLP receivers still reachable from some
    object (with the collector off: from a reference cycle)."""
    return [f"{o.f_code.co_filename.rsplit('/', 1)[-1]}:{o.f_code.co_name}"
            for o in gc.get_objects()
            if isinstance(o, types.FrameType) and "/bridges/otlp_in/" in o.f_code.co_filename
            and o.f_code.co_name in _DECODING]


async def test_a_refused_export_leaves_no_decoding_frame_behind(monkeypatch):
    """Round 15 of issue 25: a refused body's exception carried the decoding
    frames (the 4 MB body, the parsed request's upb arena of 2,000,000
    messages) into a reference cycle through trio's thread hand-off; only a
    full collection frees it, and the arena's C memory never triggers one:
    eight senders drove the daemon's RSS to 10.7 GB. With the collector off,
    nothing of a refused request may stay reachable."""
    monkeypatch.setattr(otlp_http, "LANE_WAIT_S", 0.2)
    monkeypatch.setattr(otlp_grpc, "LANE_WAIT_S", 0.2)
    b = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0")
    async with running(b) as (ctx, recv), httpx.AsyncClient(timeout=60) as c:
        url = f"http://127.0.0.1:{b.http_address[1]}/v1/logs"
        gc.collect()
        gc.disable()
        try:
            statuses = [(await c.post(url, content=body, headers=PROTO)).status_code
                        for body in (REFUSED, REFUSED, b"\x00\xffgarbage", PB[: len(PB) // 2],
                                     b"\x0a" * (5 << 20))]
            codes = [await trio.to_thread.run_sync(grpc_export, b.grpc_address[1], body)
                     for body in (REFUSED, b"\x00\xffgarbage")]
            with lane_held():
                statuses.append((await c.post(url, content=PB, headers=PROTO)).status_code)
                codes.append(await trio.to_thread.run_sync(grpc_export, b.grpc_address[1], PB))
            left = _decoding_frames()
        finally:
            gc.enable()
        assert statuses == [413, 413, 400, 400, 413, 503]
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT,
                         grpc.StatusCode.UNAVAILABLE]
        assert left == []
        assert drain(recv) == []


async def test_every_admitted_export_queues_in_the_lane_where_small_ones_go_first(monkeypatch):
    """Round 15: two slow HTTP bodies held the HTTP receiver's two decoding
    threads and four gRPC ones its four handler threads, so a small
    legitimate export never reached the lane, where it would go first; it
    waited 2-10 s (HTTP answered 503). Now each admitted request (16 per
    transport) waits in the lane itself."""
    patient(monkeypatch)
    b = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0")
    answers: list[object] = []
    async with running(b) as (ctx, recv), httpx.AsyncClient(timeout=60) as c:
        url = f"http://127.0.0.1:{b.http_address[1]}/v1/logs"

        async def post(body: bytes) -> None:
            answers.append((await c.post(url, content=body, headers=PROTO)).status_code)

        async def call(body: bytes) -> None:
            answers.append(await trio.to_thread.run_sync(grpc_export, b.grpc_address[1], body))

        with lane_held() as release:
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(post, REFUSED)
                for _ in range(5):
                    nursery.start_soon(call, REFUSED)
                nursery.start_soon(post, PB)
                with trio.fail_after(30):
                    while LANE.waiting < 9:
                        await trio.sleep(0.01)
                release.set()
        assert sorted(map(str, answers)) == sorted(
            ["200"] + ["413"] * 3 + [str(grpc.StatusCode.RESOURCE_EXHAUSTED)] * 5)
        assert len(drain(recv)) == N_PB


async def test_a_gzip_body_takes_its_turn_by_the_size_it_inflates_to(monkeypatch):
    """Round 16: a few KB of gzip inflating to 4 MB of slow records passed
    the lane's small-first order as small, and legitimate exports waited
    4.5-5 s. The body is inflated before it queues."""
    sizes: list[int] = []
    held = LANE.held

    def spy(timeout: float, size: int = 0):
        sizes.append(size)
        return held(timeout, size=size)

    monkeypatch.setattr(LANE, "held", spy)
    b = otlp_bridge(grpc="127.0.0.1:0", http="127.0.0.1:0")
    async with running(b) as (ctx, recv), httpx.AsyncClient(timeout=60) as c:
        packed = gzip.compress(REFUSED)
        assert len(packed) < 10_000
        r = await c.post(f"http://127.0.0.1:{b.http_address[1]}/v1/logs", content=packed,
                         headers={**PROTO, "content-encoding": "gzip"})
        assert r.status_code == 413
        assert sizes == [len(REFUSED)]
        assert drain(recv) == []
