"""``GET /metrics`` on the real daemon, scraped and parsed with
``prometheus-client``'s own parser: real Codex OTLP records in, a command
answered, subscribers, the session log; behind the token like the
``/healthz`` counts (and on the bare health app in uplink mode)."""
from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import DaemonProcess, send_command

TOKEN = "metrics-test-token-0123456789"
EXPORT = "tests/fixtures/codex_otel_real/otlp-http-json/export-000.json"


def scrape(daemon: DaemonProcess, token: str | None = TOKEN) -> dict[tuple[str, tuple], float]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(daemon.url + "/metrics", headers=headers, timeout=10, trust_env=False)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_scraped_and_parsed(tmp_path):
    from tests.support.daemon import ROOT
    d = DaemonProcess(tmp_path / "state", {"AEP_OTLP_PRIMARY": "1"}, token=TOKEN).start()
    stream = None
    try:
        # without the token: refused, like the /healthz counts
        r = httpx.get(d.url + "/metrics", timeout=10, trust_env=False)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(d.url + "/metrics?access_token=" + TOKEN, trust_env=False).status_code == 200

        body = (ROOT / EXPORT).read_bytes()
        r = httpx.post(f"http://127.0.0.1:{d.http_port}/v1/logs", content=body,
                       headers={"content-type": "application/json"}, timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        records = sum(len(sl["logRecords"]) for rl in json.loads(body)["resourceLogs"]
                      for sl in rl["scopeLogs"])
        stream = d.subscribe()
        conv = stream.first(lambda e: e["type"] == "session.started")["session"]
        events = stream.drain()
        # a command to the Codex session: the OTLP bridge accepts none, the relay refuses it
        status, detail = send_command(d, "control.cancel", conv, data={})
        assert status == "unsupported", (status, detail)
        m = scrape(d)
    finally:
        if stream is not None:
            stream.close()
        assert d.stop() == 0, d.log()[-3000:]

    bridge = "otlp_in.codex"
    families = {}
    for e in events:
        fam = e["type"].split(".", 1)[0]
        families[fam] = families.get(fam, 0) + 1
    for fam, n in families.items():
        assert value(m, "aep_bridges_events_emitted_total", bridge=bridge, family=fam) >= n
    assert sum(families.values()) == records  # one event per LogRecord
    assert value(m, "aep_bridges_otlp_requests_total", bridge=bridge, outcome="admitted") == 1
    assert value(m, "aep_bridges_relay_commands_total", outcome="refused") == 1
    assert value(m, "aep_bridges_relay_commands_total", outcome="routed") == 0
    assert value(m, "aep_bridges_command_ack_latency_seconds_count") == 0  # no bridge acked
    assert value(m, "aep_bridges_relay_subscribers") >= 1
    assert value(m, "aep_bridges_relay_replay_buffer_bytes") > 0
    assert value(m, "aep_bridges_session_log_lines_total") == records
    assert value(m, "aep_bridges_session_log_bytes") > 0
    assert value(m, "aep_bridges_bridge_up", bridge=bridge) == 1
    for sev in ("debug", "info"):
        assert value(m, "aep_bridges_events_dropped_total", reason="relay-slow-consumer",
                     severity=sev) == 0
    assert value(m, "process_open_fds") > 0 and value(m, "process_resident_memory_bytes") > 1 << 20


def test_metrics_on_the_uplink_health_app(tmp_path):
    """With AEP_RELAY_URL the listener is the bare health app; /metrics is there too."""
    d = DaemonProcess(tmp_path / "state", {"AEP_RELAY_URL": "http://127.0.0.1:9"}).start(healthy=False)
    try:
        m = scrape(d, token=None)
        assert value(m, "aep_bridges_uplink_outbox_events", bridge="otlp_in.codex") == 0
        assert ("aep_bridges_relay_subscribers", ()) not in m  # no embedded relay
        # the scraper may ask for OpenMetrics; only GET/HEAD
        r = httpx.get(d.url + "/metrics", headers={"accept": "application/openmetrics-text; "
                                                   "version=1.0.0"}, trust_env=False)
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.rstrip().endswith("# EOF")
        assert httpx.post(d.url + "/metrics", trust_env=False).status_code == 405
    finally:
        d.stop()


@pytest.mark.vendor
async def test_command_acks_and_latency_with_the_real_opencode_server(tmp_path):
    """A permission ask answered over AEP (accepted) and a second answer to
    the same ask after it settled (rejected): both acks counted by decision,
    both latencies observed."""
    import trio

    from tests.support.daemon import command
    from tests.support.opencode import OPENCODE, MockProviderProcess, SseDaemon, VendorServer, install
    provider = MockProviderProcess().start()
    server = VendorServer(OPENCODE, install(OPENCODE), tmp_path / "server", provider.base_url)
    daemon = stream = None
    try:
        server.start_sync()
        daemon = SseDaemon(server, tmp_path / "state").start().wait_source()
        stream = daemon.subscribe()
        async with server.client() as c:
            sid = await server.new_session(c)
            await server.prompt_async(c, sid, "AEP_BASH echo metrics")
        ask = (await stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
        answer = {"answer": {"option": "once"}}
        status, _ = await command(daemon, "control.attention.respond", sid, subject=ask["id"],
                                  data=answer)
        assert status == "accepted"
        await stream.wait_for(lambda s: s.of(sid, "run.finished"))
        status, _ = await command(daemon, "control.attention.respond", sid, subject=ask["id"],
                                  data=answer)
        assert status != "accepted"
        with trio.fail_after(20):
            while True:
                m = await trio.to_thread.run_sync(lambda: scrape(daemon, token=daemon.token))
                rejected = {k: v for k, v in m.items() if k[0] == "aep_bridges_command_acks_total"
                            and ("decision", "rejected") in k[1]}
                if rejected:
                    break
                await trio.sleep(0.2)
    finally:
        if stream is not None:
            stream.close()
        status = daemon.stop() if daemon is not None else 0
        server.stop()
        provider.stop()
    assert status == 0
    assert value(m, "aep_bridges_command_acks_total", bridge="opencode_sse", decision="accepted",
                 reason="") == 1
    assert sum(rejected.values()) == 1, rejected
    assert value(m, "aep_bridges_command_ack_latency_seconds_count") == 2
    assert value(m, "aep_bridges_command_ack_latency_seconds_bucket", le="10.0") == 2
    assert value(m, "aep_bridges_command_ack_latency_seconds_sum") > 0
    assert value(m, "aep_bridges_relay_commands_total", outcome="routed") == 2
    assert value(m, "aep_bridges_events_emitted_total", bridge="opencode_sse", family="attention") >= 3
    assert value(m, "aep_bridges_vendor_reconnects_total", bridge="opencode_sse") >= 0


def test_replay_trimmed_counts_the_byte_budget_too(tmp_path):
    """``relay-replay-trimmed`` stayed 0 while the relay trimmed POSTed
    events by its byte budget (fresh-user review): both trims count."""
    d = DaemonProcess(tmp_path / "state", {"AEP_BUFFER": "10000", "AEP_BUFFER_BYTES": "4096",
                                           "AEP_BUFFER_TOTAL_BYTES": "4096"}, token=TOKEN).start()
    try:
        events = [{"aep": "0.1", "id": f"01M8S7MJ4TS57S28JBY8D7{i:04d}", "type": "run.started",
                   "time": "2026-12-01T12:00:00.000Z", "source": "aep://t/agent/a/session/s1",
                   "agent": "a", "session": "s1", "seq": i, "epoch": 1, "capture": "metadata",
                   "data": {"pad": "x" * 200}} for i in range(40)]
        r = httpx.post(d.url + "/events", content="\n".join(json.dumps(e) for e in events),
                       headers={"content-type": "application/x-ndjson", "AEP-Version": "0.1",
                                "authorization": f"Bearer {TOKEN}"}, timeout=10, trust_env=False)
        assert r.status_code == 202, r.text
        m = scrape(d)
    finally:
        assert d.stop() == 0, d.log()[-3000:]
    trimmed = value(m, "aep_bridges_events_dropped_total", reason="relay-replay-trimmed", severity="*")
    assert trimmed >= 30  # 40 events of ~450 bytes through a 4 KiB budget


def test_a_new_sessions_log_file_is_a_spare_linked_into_place(tmp_path):
    """The daemon keeps spare session log files made off the event loop
    (``supervisor.sessionlog.spares``, ``AEP_LOG_SPARES`` of them); a new session's file is one of them linked,
    counted on ``/metrics``, and the pool is refilled."""
    import os
    import stat
    import time

    from supervisor.sessionlog.spares import CHUNK
    from tests.support.daemon import ROOT
    target = 2 * CHUNK + 7  # AEP_LOG_SPARES: a pool made in three worker-thread calls
    d = DaemonProcess(tmp_path / "state", {"AEP_OTLP_PRIMARY": "1", "AEP_LOG_SPARES": str(target)},
                      token=TOKEN).start()
    spare = "aep_bridges_session_log_spare_files_total"
    try:
        deadline = time.monotonic() + 30
        while value(scrape(d), spare, outcome="made") < target:  # the first fill, in a worker thread
            assert time.monotonic() < deadline, "no spares were made"
            time.sleep(0.05)
        body = (ROOT / EXPORT).read_bytes()
        r = httpx.post(f"http://127.0.0.1:{d.http_port}/v1/logs", content=body,
                       headers={"content-type": "application/json"}, timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        m = scrape(d)
    finally:
        assert d.stop() == 0, d.log()[-3000:]
    assert value(m, spare, outcome="taken") == 1  # one conversation, one new file
    assert value(m, spare, outcome="missed") == 0 and value(m, spare, outcome="errors") == 0
    logs = tmp_path / "state" / "logs"
    (session_file,) = (logs / "codex").glob("*.jsonl")
    assert stat.S_IMODE(session_file.stat().st_mode) == 0o600
    assert session_file.read_text().count("\n") == value(m, "aep_bridges_session_log_lines_total")
    left = sorted(os.listdir(logs / ".spare"))
    # one taken; the keeper may have made one more once the pool was quiet (0.25 s)
    assert len(left) in (target - 1, target) and all(n.endswith(".spare") for n in left)
    assert stat.S_IMODE((logs / ".spare").stat().st_mode) == 0o700
