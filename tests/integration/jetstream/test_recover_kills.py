"""Issue 25 rows 7 and 8: an OTLP export the daemon acknowledged reaches
the stream after any sequence of NATS down / daemon SIGKILL / restarts,
whatever its OTLP timestamps. Each start reads the session logs back (no
marker decides whether to), so:

- a daemon started while NATS is down acknowledges exports, is SIGKILLed;
  NATS comes back, the daemon restarts: every acknowledged event is stored;
- SIGKILLed with an outbox holding a session whose OTLP timestamps are 10
  days old (older than ``AEP_NATS_MAX_AGE``): every one is stored;
- NATS down -> ack -> SIGKILL -> restart, NATS still down -> ack ->
  SIGKILL -> NATS up -> restart: both runs' events stored.

The real daemon, fed by the real OpenTelemetry SDK's OTLP/HTTP exporter
(its results counted: acknowledged = ``SUCCESS``), a real nats-server
stopped and started. Counted at the end: the stream holds exactly the
logged events (every one from an acknowledged export), no duplicates,
each session in log order; a further clean restart publishes nothing."""
from __future__ import annotations

import time
import warnings

import pytest
import trio

try:
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import (
        LogRecordExporter,
        LogRecordExportResult,
        SimpleLogRecordProcessor,
    )
    from opentelemetry.sdk.resources import Resource
except ImportError as e:  # pragma: no cover - the dev install has them
    warnings.warn(f"OpenTelemetry SDK exporters not installed ({e}); SKIPPED", stacklevel=1)
    pytest.skip("opentelemetry-sdk / -exporter-otlp-proto-http not installed",
                allow_module_level=True)

from supervisor.jetstream.config import from_env
from supervisor.jetstream.link import open_link
from tests.integration.jetstream.fleet_support import decoded
from tests.integration.jetstream.test_daemon import TOKEN, _jsonl
from tests.support.daemon import DaemonProcess
from tests.support.hardening import otlp_json, otlp_record, post_otlp
from tests.support.nats import NatsCluster, stream_messages

DAY_NS = 86400 * 10**9


class _Counting(LogRecordExporter):
    """The real exporter, its answers counted (records per result)."""

    def __init__(self, inner: OTLPLogExporter) -> None:
        self.inner = inner
        self.acked = 0
        self.failed = 0

    def export(self, batch):  # type: ignore[no-untyped-def]
        r = self.inner.export(batch)
        if r == LogRecordExportResult.SUCCESS:
            self.acked += len(batch)
        else:
            self.failed += len(batch)
        return r

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _export(d: DaemonProcess, tag: str, sessions: int, per: int, *,
            age_ns: int = 0) -> int:
    """``sessions`` x ``per`` Codex records through the SDK (blocking);
    returns how many the daemon acknowledged (every one must be)."""
    port = d.env["AEP_OTLP_HTTP_LISTEN"]
    counting = _Counting(OTLPLogExporter(endpoint=f"http://{port}/v1/logs", timeout=20))
    provider = LoggerProvider(resource=Resource.create({"service.name": "codex_exec"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(counting))
    logger = provider.get_logger("codex_otel.log_only")
    for s in range(sessions):
        for i in range(per):
            ts = time.time_ns() - age_ns
            logger.emit(timestamp=ts, observed_timestamp=ts,
                        attributes={"event.name": "codex.user_prompt",
                                    "conversation.id": f"{tag}-conv-{s}", "prompt_length": str(i)})
    provider.shutdown()
    assert counting.failed == 0
    return counting.acked


async def _until(pred, timeout: float = 90.0):
    with trio.fail_after(timeout):
        while (got := await trio.to_thread.run_sync(pred)) is None:
            await trio.sleep(0.2)
    return got


def _start(state, c: NatsCluster) -> DaemonProcess:
    d = DaemonProcess(state, {"AEP_NATS_URL": c.url, "AEP_OTLP_PRIMARY": "1"}, token=TOKEN)
    d.start(healthy=False)
    return d


def _drained(d: DaemonProcess):
    """Connected, the recovery done and every event acknowledged: the
    publish counters then (else ``None``)."""
    h = d.healthz()["nats"]
    p = h.get("publish") or {}
    if h["connected"] and p.get("recovering") == 0 and p["outbox"] == 0:
        return p
    return None


async def _settle_and_count(state, c: NatsCluster, acked: int) -> None:
    """Restart with NATS up; then the stream holds every logged event once,
    in log order per session, and a clean restart after publishes nothing."""
    d = await trio.to_thread.run_sync(_start, state, c)
    try:
        got = await _until(lambda: _drained(d))
        assert got["recovered"] >= acked, got
    finally:
        assert await trio.to_thread.run_sync(d.stop) == 0
    logged = [e for e in _jsonl(state) if e.get("type") != "agent.started"]
    cfg, _ = from_env({"AEP_NATS_URL": c.url})
    async with open_link(cfg) as link:
        events = decoded(await stream_messages(link, "AEP"))
    key = [(e["source"], e["id"]) for e in events]
    assert len(key) == len(set(key)), "an event stored twice"
    stored = set(key)
    missing = [e for e in logged if (e["source"], e["id"]) not in stored]
    assert not missing, f"{len(missing)} logged (acknowledged) events not in the stream"
    prompts = [e for e in events if e.get("session", "").count("-conv-")]
    assert len(prompts) >= acked  # every acknowledged record is in the stream
    for session in {e.get("session") for e in logged}:
        want = [e["id"] for e in logged if e.get("session") == session]
        assert [e["id"] for e in events if e.get("session") == session] == want, session

    d = await trio.to_thread.run_sync(_start, state, c)  # nothing missing: nothing sent
    try:
        got = await _until(lambda: _drained(d))
        assert got["recovered"] == 0, got
    finally:
        assert await trio.to_thread.run_sync(d.stop) == 0
    async with open_link(cfg) as link:
        assert len(await stream_messages(link, "AEP")) == len(events)


@pytest.mark.parametrize("before", ["first-run", "after-a-clean-stop"])
async def test_started_while_nats_is_down_acked_then_killed(tmp_path, before) -> None:
    """Row 7: 100 of 100 acknowledged events were never published (the
    marker was absent on a first run, or said clean after a clean stop)."""
    state = tmp_path / "state"
    c = NatsCluster(1, tmp_path / "nats")  # not started: NATS is down
    try:
        earlier = 0
        if before == "after-a-clean-stop":
            await trio.to_thread.run_sync(c.start)
            d = await trio.to_thread.run_sync(_start, state, c)
            try:
                earlier = await trio.to_thread.run_sync(_export, d, "clean", 2, 5)
                await _until(lambda: (p := _drained(d)) and p["acked"] >= earlier or None)
            finally:
                assert await trio.to_thread.run_sync(d.stop) == 0
            await trio.to_thread.run_sync(c.kill, 0)
        d = await trio.to_thread.run_sync(_start, state, c)
        try:
            acked = await trio.to_thread.run_sync(_export, d, "r7", 5, 20)
            assert acked == 100
        finally:
            await trio.to_thread.run_sync(d.kill)  # SIGKILL: the outbox is gone
        await trio.to_thread.run_sync(c.start)
        await _settle_and_count(state, c, acked)
    finally:
        c.close()


async def test_killed_with_a_session_whose_otlp_timestamps_are_ten_days_old(tmp_path) -> None:
    """Row 8: 10 of 10 events stamped 10 days ago by the vendor (older than
    AEP_NATS_MAX_AGE) never reached the stream."""
    state = tmp_path / "state"
    with NatsCluster(1, tmp_path / "nats") as c:
        d = await trio.to_thread.run_sync(_start, state, c)
        try:
            await _until(lambda: _drained(d))  # connected, the stream made
            before = await trio.to_thread.run_sync(_export, d, "fresh", 1, 3)
            await _until(lambda: (p := _drained(d)) and p["acked"] >= before or None)
            await trio.to_thread.run_sync(c.kill, 0)
            await _until(lambda: d.healthz()["nats"]["connected"] is False or None)
            acked = await trio.to_thread.run_sync(
                lambda: _export(d, "r8", 1, 10, age_ns=10 * DAY_NS))
            assert acked == 10
            assert await _until(lambda: d.healthz(TOKEN)["nats"]["publish"]["outbox"] or None)
        finally:
            await trio.to_thread.run_sync(d.kill)
        assert sum(e.get("session") == "r8-conv-0" for e in _jsonl(state)) >= 10
        await trio.to_thread.run_sync(c.start, 0)
        await _settle_and_count(state, c, acked)


async def test_down_ack_kill_restart_still_down_ack_kill_then_up(tmp_path) -> None:
    """The combined sequence: two killed runs that never saw NATS."""
    state = tmp_path / "state"
    c = NatsCluster(1, tmp_path / "nats")
    try:
        acked = 0
        for run in ("a", "b"):
            d = await trio.to_thread.run_sync(_start, state, c)
            try:
                acked += await trio.to_thread.run_sync(_export, d, run, 3, 10)
            finally:
                await trio.to_thread.run_sync(d.kill)
        assert acked == 60
        await trio.to_thread.run_sync(c.start)
        await _settle_and_count(state, c, acked)
    finally:
        c.close()


def _export_big(d: DaemonProcess, session: str, n: int, pad: int) -> int:
    port = int(d.env["AEP_OTLP_HTTP_LISTEN"].rpartition(":")[2])
    done = 0
    while done < n:
        k = min(200, n - done)
        recs = [otlp_record(session, event_name="codex.user_prompt",
                            extra={"prompt_length": "x" * pad}) for _ in range(k)]
        assert post_otlp(port, otlp_json(recs)).status_code == 200
        done += k
    return done


async def test_a_session_the_stream_aged_out_is_not_sent_again(tmp_path) -> None:
    """Reading the logs back at every start must not re-send what the
    stream stored and then removed (here pushed out by AEP_NATS_MAX_BYTES):
    a session the stream holds nothing of gets only its events stamped
    after the stream's oldest stored message."""
    state = tmp_path / "state"
    with NatsCluster(1, tmp_path / "nats") as c:
        env = {"AEP_NATS_URL": c.url, "AEP_OTLP_PRIMARY": "1", "AEP_NATS_MAX_BYTES": str(1 << 20)}
        d = DaemonProcess(state, env, token=TOKEN)
        await trio.to_thread.run_sync(d.start)
        try:
            await trio.to_thread.run_sync(_export_big, d, "aged", 50, 1000)
            await _until(lambda: (p := _drained(d)) and p["acked"] >= 50 or None)
            await trio.to_thread.run_sync(_export_big, d, "pushing", 1600, 1000)
            await _until(lambda: (p := _drained(d)) and p["acked"] >= 1650 or None)
        finally:
            assert await trio.to_thread.run_sync(d.stop) == 0
        cfg, _ = from_env({"AEP_NATS_URL": c.url})
        async with open_link(cfg) as link:
            before = decoded(await stream_messages(link, "AEP"))
        assert not [e for e in before if e.get("session") == "aged"]  # all pushed out
        assert sum(e.get("session") == "aged" for e in _jsonl(state)) >= 50

        d = DaemonProcess(state, env, token=TOKEN)
        await trio.to_thread.run_sync(d.start)
        try:
            got = await _until(lambda: _drained(d))
            assert got["recovered"] == 0, got
        finally:
            assert await trio.to_thread.run_sync(d.stop) == 0
        async with open_link(cfg) as link:
            after = decoded(await stream_messages(link, "AEP"))
        assert [e["id"] for e in after] == [e["id"] for e in before]
