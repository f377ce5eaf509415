"""A daemon SIGKILLed mid-outage (issue 14's leftover: the outbox is
memory): the events it logged but could not publish are published at its
next start, from its JSONL logs, before anything new, so the stream ends
up holding every logged event once, each session in log order. The real
daemon, its real OTLP bridge, a real nats-server stopped and started."""
from __future__ import annotations

import json

import httpx
import trio

from supervisor.jetstream import recover as R
from supervisor.jetstream.config import from_env
from supervisor.jetstream.link import open_link
from tests.integration.jetstream.fleet_support import decoded
from tests.integration.jetstream.test_daemon import TOKEN, _jsonl
from tests.support.daemon import DaemonProcess
from tests.support.hardening import otlp_json, otlp_record
from tests.support.nats import NatsCluster, stream_messages


def _post(d: DaemonProcess, convs: range) -> None:
    body = json.dumps(otlp_json([otlp_record(f"conv-{i}", event_name=name)
                                 for i in convs for name in ("codex.conversation_starts",
                                                             "codex.user_prompt")])).encode()
    r = httpx.post(f"http://{d.env['AEP_OTLP_HTTP_LISTEN']}/v1/logs", content=body, timeout=10,
                   trust_env=False, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


async def _until(pred, timeout: float = 60.0):
    with trio.fail_after(timeout):
        while (got := await trio.to_thread.run_sync(pred)) is None:
            await trio.sleep(0.1)
    return got


async def test_a_daemon_killed_mid_outage_publishes_its_logged_tail_at_the_next_start(
        tmp_path) -> None:
    state = tmp_path / "state"
    with NatsCluster(1, tmp_path / "nats") as c:
        env = {"AEP_NATS_URL": c.url, "AEP_OTLP_PRIMARY": "1"}
        d = DaemonProcess(state, env, token=TOKEN)
        await trio.to_thread.run_sync(d.start)
        try:
            await trio.to_thread.run_sync(_post, d, range(0, 3))
            await _until(lambda: (h := d.healthz())["nats"]["publish"]["acked"] > 0
                         and h["nats"]["publish"]["outbox"] == 0 or None)
            first = d.healthz()["nats"]["publish"]
            stored_before = first["acked"]
            assert first.get("recovered", 0) == 0  # a first run back-fills nothing
            await trio.to_thread.run_sync(c.kill, 0)
            await _until(lambda: d.healthz()["nats"]["connected"] is False or None)
            await trio.to_thread.run_sync(_post, d, range(1, 6))  # sessions old and new
            held = await _until(lambda: (n := d.healthz()["nats"]["publish"]["outbox"]) > 0
                                and n or None)
        finally:
            await trio.to_thread.run_sync(d.kill)  # SIGKILL: the outbox is gone
        assert json.loads(R.marker(state).read_text())["since"] > 0  # noted before it logged
        logged = _jsonl(state)
        assert len(logged) > stored_before and held > 0
        await trio.to_thread.run_sync(c.start, 0)

        d2 = DaemonProcess(state, env, token=TOKEN)
        await trio.to_thread.run_sync(d2.start)
        try:
            await trio.to_thread.run_sync(_post, d2, range(2, 4))  # the new run's events
            got = await _until(lambda: (h := d2.healthz())["nats"]["publish"].get("recovered")
                               and h["nats"]["publish"]["outbox"] == 0 and h or None)
            assert got["nats"]["publish"]["recovered"] >= held
        finally:
            assert await trio.to_thread.run_sync(d2.stop) == 0

        logged = _jsonl(state)  # both runs
        cfg, _ = from_env({"AEP_NATS_URL": c.url})
        async with open_link(cfg) as link:
            msgs = await stream_messages(link, "AEP")
        events = decoded(msgs)
        key = [(e["source"], e["id"]) for e in events]
        assert len(key) == len(set(key)), "an event stored twice"
        assert sorted(key) == sorted((e["source"], e["id"]) for e in logged)
        # each session in the stream in its log order
        for session in {e.get("session") for e in logged}:
            want = [e["id"] for e in logged if e.get("session") == session]
            assert [e["id"] for e in events if e.get("session") == session] == want, session
