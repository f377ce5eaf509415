"""``aep-bridges run`` with ``AEP_NATS_URL`` (issue 14), the real daemon as
a subprocess with its real OTLP bridge fed the real Codex OTLP/HTTP export
(tests/fixtures/codex_otel_real): every event of the JSONL session log is
in the stream, on a 1-node server and a 3-node cluster with an R3 stream;
/healthz and /metrics count it; ``aep-bridges check`` says whether the
servers answer and refuses an unreadable credentials file."""
from __future__ import annotations

import json
import subprocess

import httpx
import pytest
import trio

from supervisor.jetstream.config import from_env
from supervisor.jetstream.link import open_link
from tests.integration.jetstream.fleet_support import decoded
from tests.support.daemon import ROOT, DaemonProcess, console_script
from tests.support.hardening import otlp_json, otlp_record
from tests.support.nats import NatsCluster, stream_messages
from tests.support.net import free_port

TOKEN = "nats-daemon-token-0123456789abcdef"
EXPORT = ROOT / "tests/fixtures/codex_otel_real/otlp-http-json/export-000.json"


def _jsonl(state) -> list[dict]:
    out = []
    for p in sorted((state / "logs").rglob("*.jsonl")):
        out += [json.loads(line) for line in p.read_text().splitlines()]
    return out


@pytest.mark.parametrize("nodes", [1, 3], ids=["1-node", "3-node-R3"])
async def test_run_publishes_every_logged_event(tmp_path, nodes) -> None:
    with NatsCluster(nodes, tmp_path) as c:
        d = DaemonProcess(tmp_path / "state", {"AEP_NATS_URL": c.url,
                                               "AEP_NATS_REPLICAS": str(nodes),
                                               "AEP_OTLP_PRIMARY": "1"}, token=TOKEN)
        await trio.to_thread.run_sync(d.start)
        try:
            http = d.env["AEP_OTLP_HTTP_LISTEN"]
            docs = [EXPORT.read_bytes()] + [
                json.dumps(otlp_json([otlp_record(f"conv-{i}", event_name=name)
                                      for name in ("codex.conversation_starts",
                                                   "codex.user_prompt")])).encode()
                for i in range(5)]
            for body in docs:
                r = await trio.to_thread.run_sync(lambda b=body: httpx.post(
                    f"http://{http}/v1/logs", content=b, timeout=10, trust_env=False,
                    headers={"content-type": "application/json"}))
                assert r.status_code == 200, r.text

            def settled():
                h = d.healthz()
                pub = h["nats"]["publish"]
                lines = h["counts"]["jsonl_lines"]
                return h if lines and pub["acked"] >= lines and pub["outbox"] == 0 else None
            with trio.fail_after(60):
                while (health := await trio.to_thread.run_sync(settled)) is None:
                    await trio.sleep(0.1)
            assert health["ok"] is True and health["nats"]["connected"] is True
            assert health["nats"]["stream_state"] == "created"
            assert "connected" in d.healthz("")["nats"] and "publish" not in d.healthz("")["nats"]
            metrics = await trio.to_thread.run_sync(lambda: httpx.get(
                d.url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"},
                timeout=10, trust_env=False).text)
            assert "aep_bridges_nats_connected 1.0" in metrics
            assert f"aep_bridges_nats_acked_total {float(health['nats']['publish']['acked'])}" \
                in metrics
        finally:
            await trio.to_thread.run_sync(d.stop)
        logged = _jsonl(tmp_path / "state")
        cfg, _ = from_env({"AEP_NATS_URL": c.url})
        async with open_link(cfg) as link:
            events = decoded(await stream_messages(link, "AEP"))
        assert len(logged) > 5
        assert sorted((e["source"], e["id"]) for e in events) == \
            sorted((e["source"], e["id"]) for e in logged)
        assert TOKEN not in d.log()


def _check(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AEP_")}
    return subprocess.run(console_script() + ["check", "--no-ports"], env={**base, **env},
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))


def test_check_says_whether_the_servers_answer(tmp_path) -> None:
    state = {"AEP_STATE_DIR": str(tmp_path / "state")}
    with NatsCluster(1, tmp_path) as c:
        up = _check({**state, "AEP_NATS_URL": c.url.replace("nats://", "nats://u:s3cret@")})
        assert up.returncode == 0, up.stderr
        assert "answers, JetStream on, stream AEP absent" in up.stdout
        assert "s3cret" not in up.stdout + up.stderr
    down = _check({**state, "AEP_NATS_URL": f"nats://127.0.0.1:{free_port()}"})
    assert down.returncode == 0 and "no server of" in down.stdout
    bad = _check({**state, "AEP_NATS_URL": "nats://127.0.0.1:4222",
                  "AEP_NATS_CREDS": str(tmp_path / "missing.creds")})
    assert bad.returncode == 2 and "AEP_NATS_CREDS=" in bad.stderr \
        and "not a readable file" in bad.stderr


async def test_nats_down_with_a_full_outbox_holds_the_pump_and_shutdown_exits_clean(tmp_path) -> None:
    """No server answers and the outbox (16) fills with notice+ events: the
    pump waits (backpressure, nothing dropped), the daemon keeps answering
    /healthz, and SIGTERM still exits 0 within the drain deadline; every
    event the OTLP bridge acknowledged is in the JSONL log."""
    d = DaemonProcess(tmp_path / "state", {"AEP_NATS_URL": f"nats://127.0.0.1:{free_port()}",
                                           "AEP_NATS_OUTBOX": "16",
                                           "AEP_OTLP_PRIMARY": "1"}, token=TOKEN)
    await trio.to_thread.run_sync(lambda: d.start(healthy=False))
    try:
        http = d.env["AEP_OTLP_HTTP_LISTEN"]

        def post(i: int) -> int:
            body = json.dumps(otlp_json([otlp_record(f"conv-full-{i}",
                                                     event_name="codex.conversation_starts")]))
            try:
                return httpx.post(f"http://{http}/v1/logs", content=body.encode(), timeout=3,
                                  trust_env=False,
                                  headers={"content-type": "application/json"}).status_code
            except httpx.HTTPError:
                return 0
        codes = [await trio.to_thread.run_sync(post, i) for i in range(24)]
        h = await trio.to_thread.run_sync(d.healthz)
        assert h["ok"] is False and h["nats"]["connected"] is False
        pub = h["nats"]["publish"]
        assert pub["outbox"] == 16 and pub["dropped"] == 0
        assert codes.count(200) >= 8
    finally:
        status = await trio.to_thread.run_sync(d.stop)
    assert status == 0, d.log()[-3000:]
    logged = {e["session"] for e in _jsonl(tmp_path / "state") if e["type"] == "session.started"}
    assert len(logged) >= codes.count(200)
