"""Two daemons, as an operator deploys them: ``aep-bridges relay`` (the relay
alone) and ``aep-bridges run`` uplinking to it (``AEP_RELAY_URL``). OTLP
in at the fleet daemon, events out of the remote relay's ``/stream`` read
with the SDK consumer; the remote relay killed and restarted mid-stream: no
event is lost and the consumer resumes by ``(epoch, seq)`` without
duplicates."""
from __future__ import annotations

import signal
import time

import httpx

from tests.support.daemon import Collector, run_daemon
from tests.support.net import free_port
from tests.support.schema import validate_event

TOKEN = "uplink-daemon-token-0123456789"


def post_conversation(d, conv: str, n: int, start: int = 0) -> None:
    http = d.env["AEP_OTLP_HTTP_LISTEN"]
    for i in range(start, start + n):
        body = {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"logRecords": [{
            "timeUnixNano": str(time.time_ns()),
            "attributes": [
                {"key": "event.name", "value": {"stringValue": "codex.api_request"}},
                {"key": "conversation.id", "value": {"stringValue": conv}},
                {"key": "attempt", "value": {"intValue": str(i)}},
            ]}]}]}]}
        r = httpx.post(f"http://{http}/v1/logs", json=body, timeout=10)
        assert r.status_code == 200, r.text


def test_fleet_uplinks_to_a_remote_relay_that_dies_and_returns(tmp_path):
    relay_port = free_port()
    relay_env = {"AEP_LISTEN": f"127.0.0.1:{relay_port}", "AEP_TOKEN": TOKEN}
    fleet_env = {"AEP_RELAY_URL": f"http://127.0.0.1:{relay_port}", "AEP_TOKEN": TOKEN}
    with run_daemon(tmp_path / "r1", relay_env, args=("relay",)) as relay, \
            run_daemon(tmp_path / "fleet", fleet_env) as fleet:
        col = Collector(relay.url, token=TOKEN, filter={"agent": "codex"})
        try:
            deadline = time.monotonic() + 20
            while not fleet.healthz()["relay"]:  # the uplink's hello completed
                assert time.monotonic() < deadline, fleet.log()
                time.sleep(0.1)
            time.sleep(0.5)
            post_conversation(fleet, "conv-up", 20)
            col.first(lambda e: e.get("data", {}).get("attempt") in (19, "19"), what="first 20")

            relay.proc.send_signal(signal.SIGKILL)  # abrupt: no closing frame
            relay.proc.wait(timeout=10)
            post_conversation(fleet, "conv-up", 20, start=20)  # while the relay is down
            deadline = time.monotonic() + 20
            while fleet.healthz()["relay"]:  # the uplink noticed (dead peer / closed)
                assert time.monotonic() < deadline, "uplink never reported the relay down"
                time.sleep(0.1)

            with run_daemon(tmp_path / "r2", relay_env, args=("relay",)):
                col.first(lambda e: e.get("data", {}).get("attempt") in (39, "39"),
                             timeout=60, what="events sent while the relay was down")
                events = col.drain(1.0)
        finally:
            col.close()
        assert fleet.stop() == 0, fleet.log()
    attempts = [int(e["data"]["attempt"]) for e in events if e["session"] == "conv-up"]
    assert sorted(set(attempts)) == list(range(40)), attempts  # none lost
    assert len(attempts) == len(set(attempts))  # the SDK consumer deduped on (source, id)
    seqs = [e["seq"] for e in events if e["session"] == "conv-up"]
    assert seqs == sorted(seqs) and len({e["epoch"] for e in events}) == 1
    for e in events:
        validate_event(e)
    assert TOKEN not in fleet.log() and TOKEN not in relay.log()
