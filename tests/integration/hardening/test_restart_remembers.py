"""Issue 25 row 9: a restart forgets nothing that was written.

The real daemon (``aep-bridges run``, the OTLP bridge and the embedded
relay) under load from OTLP exports and ``POST /events`` is SIGKILLed and
started again on the same state dir. Every acknowledged OTLP record and
every event ``POST /events`` answered 202 is in the session logs, and the
restarted relay serves them again: ``from=all`` returns them with the same
ids and the same ``epoch:seq``, and the SDK consumer that was reading
before the kill resumes (its own ``from`` positions) with no gap and no
duplicate.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.daemon import Collector, DaemonProcess
from tests.support.hardening import event, otlp_json, otlp_record, post_events, post_otlp

TOKEN = "restart-token"
POSTED = [f"posted-{i}" for i in range(3)]
CONVS = [f"conv-{i}" for i in range(3)]


def _stream_all(url: str) -> list[dict[str, Any]]:
    """Every buffered event (``from=all``, ``live=0``)."""
    out = []
    with httpx.stream("GET", url + "/stream", params={"from": "all", "live": "0"},
                      headers={"authorization": f"Bearer {TOKEN}"}, timeout=60,
                      trust_env=False) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def _logged(state: Path) -> dict[str, tuple[int, int]]:
    """``id -> (epoch, seq)`` of every sequenced event in the session logs."""
    out = {}
    for f in (state / "logs").glob("*/*.jsonl"):
        for ln in f.read_bytes().splitlines():
            ev = json.loads(ln)
            if "seq" in ev:
                out[ev["id"]] = (ev.get("epoch", 0), ev["seq"])
    return out


class _Load:
    """POST /events batches and OTLP exports from a thread until the daemon
    is gone (bounded); what was acknowledged is kept."""

    def __init__(self, d: DaemonProcess) -> None:
        self.d = d
        self.posted: list[dict[str, Any]] = []  # events answered 202
        self.otlp_acked = 0  # records answered 200
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = {s: 0 for s in POSTED}
        for k in range(2000):
            if self.stop.is_set():
                return
            s = POSTED[k % len(POSTED)]
            batch = []
            for _ in range(50):
                seq[s] += 1
                batch.append(event(seq[s], s, agent="remote"))
            try:
                if post_events(self.d.url, batch, token=TOKEN, timeout=10).status_code == 202:
                    self.posted.extend(batch)
                conv = CONVS[k % len(CONVS)]
                recs = [otlp_record(conv) for _ in range(5)]
                if post_otlp(self.d.http_port, otlp_json(recs), timeout=10).status_code == 200:
                    self.otlp_acked += len(recs)
            except httpx.HTTPError:
                return  # the daemon is gone


def test_sigkill_under_load_then_restart_serves_everything_written(tmp_path):
    state = tmp_path / "state"
    d = DaemonProcess(state, {"AEP_OTLP_PRIMARY": "1"}, token=TOKEN).start()
    port = d.port
    reader = Collector(d.url, token=TOKEN, from_="all", timeout_ms=60_000)
    load = _Load(d)
    try:
        load.thread.start()
        deadline = time.monotonic() + 120
        while (len(load.posted) < 1500 or load.otlp_acked < 60) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(load.posted) >= 1500 and load.otlp_acked >= 60
        before = {e["id"]: (e.get("epoch", 0), e["seq"]) for e in reader.events if "seq" in e}
        d.kill()  # SIGKILL under load
        load.stop.set()
        load.thread.join(30)
        logged = _logged(state)
        # durability: every event POST /events answered 202 is in the logs
        missing = [e["id"] for e in load.posted if e["id"] not in logged]
        assert not missing, f"{len(missing)} acknowledged events are in no log"
        assert sum(1 for i in logged if not i.startswith("remote-")) >= load.otlp_acked

        streams = reader.connections  # the reader's streams on the first daemon (gone now)
        # the same listener again, so the SDK reader's own reconnect resumes
        d2 = DaemonProcess(state, {"AEP_OTLP_PRIMARY": "1", "AEP_LISTEN": f"127.0.0.1:{port}"},
                           token=TOKEN)
        d2.start()
        try:
            served = {e["id"]: (e.get("epoch", 0), e["seq"]) for e in _stream_all(d2.url)
                      if "seq" in e}
            # from=all: everything written, positions exactly as before
            assert {i: served.get(i) for i in logged} == logged
            assert {i: served.get(i) for i in before} == before
            # the reader resumes: a new event arrives, nothing repeats, nothing lost.
            # Its resume names only the sessions it has seen (AEP-0003 §3.3
            # `from`), so the new session's event is posted once it is
            # subscribed again: posted before, it would be neither replayed
            # (not named) nor live (admitted before the subscription)
            reader.wait_connected(streams + 1, timeout=60)
            after = event(1, "after-restart", agent="remote")
            assert post_events(d2.url, [after], token=TOKEN).status_code == 202
            reader.first(lambda e: e.get("id") == after["id"], timeout=60, what="the new event")
            got = [e["id"] for e in reader.drain(1.0) if "seq" in e]
            assert len(got) == len(set(got)), "the resumed reader saw duplicates"
            assert set(logged) <= set(got)
        finally:
            d2.stop(timeout=20)
    finally:
        reader.close()
        load.stop.set()
        d.kill()


def test_a_posted_event_is_written_before_its_202(tmp_path):
    """What ``202`` promises: on disk (the session log) before the answer."""
    state = tmp_path / "state"
    d = DaemonProcess(state, args=("relay",), token=TOKEN).start()
    try:
        batch = [event(i, "durable-1", agent="remote") for i in range(1, 6)]
        assert post_events(d.url, batch, token=TOKEN).status_code == 202
        # no wait, no flush: the answer came after the write
        assert set(_logged(state)) >= {e["id"] for e in batch}
        d.kill()
        d.start()
        served = [e["id"] for e in _stream_all(d.url) if e.get("session") == "durable-1"]
        assert served == [e["id"] for e in batch]
    finally:
        d.kill()
