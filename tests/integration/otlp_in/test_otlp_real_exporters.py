"""The real OpenTelemetry Python SDK exporters (``opentelemetry-exporter-
otlp-proto-grpc`` and ``-http``, from PyPI) export LogRecords into the
bridge over loopback: gRPC, HTTP protobuf, with and without gzip, and their
retry on a saturated relay (503 + Retry-After / UNAVAILABLE + RetryInfo)
delivers without loss. The SDK's exporters are synchronous; they run in a
worker thread (``trio.to_thread``)."""
from __future__ import annotations

import warnings

import pytest
import trio

try:
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
except ImportError as e:  # pragma: no cover - the dev install has them
    warnings.warn(f"OpenTelemetry SDK exporters not installed ({e}); real-exporter tests "
                  "SKIPPED", stacklevel=1)
    pytest.skip("opentelemetry-sdk / opentelemetry-exporter-otlp-proto-{grpc,http} are not "
                "installed", allow_module_level=True)

import grpc

from bridges.otlp_in import OtlpInBridge
from tests.support.otlp_in import bridge_context, drain, otlp_bridge

try:
    from tests.support.schema import validate_event
except ImportError:  # pragma: no cover
    def validate_event(ev):  # type: ignore[misc]
        assert ev["aep"] == "0.1"

CONV = "01a22c8f-0000-7000-8000-000000000001"
RECORDS = [
    ("codex.conversation_starts", {"model": "gpt-5.2-codex", "approval_policy": "on-request",
                                   "sandbox_policy": "workspace-write"}),
    ("codex.tool_result", {"tool_name": "shell", "success": "true", "duration_ms": "412"}),
    ("codex.tool_decision", {"tool_name": "shell", "decision": "deny", "source": "config"}),
]


def _export(exporter, *, use_attribute: bool) -> None:
    """Emit RECORDS through a real LoggerProvider and flush (blocking)."""
    provider = LoggerProvider(resource=Resource.create(
        {"service.name": "codex_exec", "host.name": "exporter-host"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("codex_otel.log_only")
    for name, attrs in RECORDS:
        attributes = {"conversation.id": CONV, **attrs}
        if use_attribute:  # Codex's way: the event.name attribute
            logger.emit(attributes={"event.name": name, **attributes})
        else:  # the OTel Events model: the LogRecord's own event_name field
            logger.emit(event_name=name, attributes=attributes)
    provider.shutdown()


async def _run(bridge: OtlpInBridge, exporter_factory, *, use_attribute: bool, channel=100,
               before=None):
    ctx, recv = bridge_context(bridge.name, "codex", channel=channel, epoch=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run, ctx)
        if before is not None:
            await before(ctx, recv)
        with trio.fail_after(60):
            await trio.to_thread.run_sync(lambda: _export(exporter_factory(),
                                                          use_attribute=use_attribute))
        got = drain(recv)
        nursery.cancel_scope.cancel()
    return ctx, got


def _check(got: list[dict], *, primary: bool = False) -> None:
    got = [e for e in got if e["session"] == CONV]
    for ev in got:
        validate_event(ev)
    if primary:
        assert [e["type"] for e in got] == ["session.started", "tool.completed", "tool.denied"]
        assert got[1]["data"] == {"tool": {"name": "shell"}, "duration_ms": 412}
        assert got[2]["data"] == {"tool": {"name": "shell"}, "by": "policy"}
    else:
        assert [e["type"] for e in got] == ["x.codex.otel.conversation_starts",
                                            "x.codex.otel.tool_result",
                                            "x.codex.otel.tool_decision"]
        assert got[0]["data"] == dict(RECORDS[0][1])
    assert [e["seq"] for e in got] == [0, 1, 2]


@pytest.mark.parametrize("compression", [None, grpc.Compression.Gzip], ids=["plain", "gzip"])
@pytest.mark.parametrize("use_attribute", [True, False], ids=["event.name", "event_name"])
async def test_real_grpc_exporter(compression, use_attribute):
    b = otlp_bridge(grpc="127.0.0.1:0", http="off")
    _, got = await _run(b, lambda: GrpcLogExporter(
        endpoint=f"127.0.0.1:{b.grpc_address[1]}", insecure=True, timeout=20,
        compression=compression), use_attribute=use_attribute)
    _check(got)


@pytest.mark.parametrize("compression", [HttpCompression.NoCompression, HttpCompression.Gzip],
                         ids=["plain", "gzip"])
@pytest.mark.parametrize("use_attribute", [True, False], ids=["event.name", "event_name"])
async def test_real_http_protobuf_exporter(compression, use_attribute):
    b = otlp_bridge(grpc="off", http="127.0.0.1:0", primary=True)
    _, got = await _run(b, lambda: HttpLogExporter(
        endpoint=f"http://127.0.0.1:{b.http_address[1]}/v1/logs", timeout=20,
        compression=compression), use_attribute=use_attribute)
    _check(got, primary=True)


def _saturate_then_relay_later(sink: list[dict]):
    async def before(ctx, recv):
        while not ctx.saturated():
            ctx.emit_nowait("filler", {"type": "x.codex.otel.unknown"})

        async def relay_later():
            # The relay stays stalled until the bridge has refused the exporter's first
            # attempt (a fixed sleep raced a slow exporter start on a loaded machine: the
            # channel was drained before the first export arrived).
            with trio.move_on_after(30):
                while not ctx.health.counters.get("otlp.saturated"):
                    await trio.sleep(0.01)
            async for out in recv:  # then a live relay drains everything
                sink.append(out.event)

        trio.lowlevel.spawn_system_task(relay_later)
    return before


@pytest.mark.parametrize("kind", ["grpc", "http"])
async def test_real_exporter_retries_through_saturation_without_loss(kind):
    # emit_grace shorter than the relay's stall, so the first attempt is refused
    b = otlp_bridge(grpc="127.0.0.1:0" if kind == "grpc" else "off",
                    http="127.0.0.1:0" if kind == "http" else "off", emit_grace=0.1)

    def factory():
        if kind == "grpc":
            return GrpcLogExporter(endpoint=f"127.0.0.1:{b.grpc_address[1]}", insecure=True,
                                   timeout=30)
        return HttpLogExporter(endpoint=f"http://127.0.0.1:{b.http_address[1]}/v1/logs",
                               timeout=30)

    relayed: list[dict] = []
    ctx, got = await _run(b, factory, use_attribute=True, channel=4,
                          before=_saturate_then_relay_later(relayed))
    got = relayed + got
    assert ctx.health.counters["otlp.saturated"] >= 1  # refused at least once...
    _check(got)  # ...and everything arrived, once, in order
    assert "otlp.rejected" not in ctx.health.counters
