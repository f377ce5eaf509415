"""Issue 25 attacked again: the restart path (row 9's fix re-admits the
session logs' tails at start, :mod:`supervisor.relay.restore`).

A token holder's ``POST /events`` is written to the session log, and the
restore at start reads back what was written, within a per-session byte
share of ``AEP_BUFFER_TOTAL_BYTES`` (256 MiB over at most 500 sessions:
512 KiB each when the relay holds 500). The real ``aep-bridges relay``
subprocess with a token and its default settings; the attack over real
loopback HTTP.
"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, post_events

TOKEN = "restore-token"


def _from_all(url: str) -> list[dict[str, Any]]:
    """Every event ``/stream?from=all&live=0`` replays."""
    out = []
    with httpx.stream("GET", url + "/stream", params={"from": "all", "live": "0"},
                      headers={"authorization": f"Bearer {TOKEN}"},
                      timeout=httpx.Timeout(30), trust_env=False) as r:
        assert r.status_code == 200, r.read()
        for ln in r.iter_lines():
            if ln.startswith("data:"):
                out.append(json.loads(ln[5:]))
    return out


def test_one_big_event_does_not_wipe_a_sessions_history_at_restart(tmp_path):
    """A session whose newest log line is bigger than its restore share
    (~650 KiB once 400 sessions are on disk) restored none of its history
    at start: one posted 1 MiB event wiped another session's replay across
    a restart. Now the line is passed over (counted) and the rest restored.
    (400 new sessions in one batch: past the default new-session budget,
    raised here; the budget is the next test's.)"""
    d = DaemonProcess(tmp_path / "state", {"AEP_RELAY_MAX_NEW_SESSIONS": "1000"},
                      args=("relay",), token=TOKEN)
    d.start()
    try:
        victim = "victim-session"
        assert post_events(d.url, [event(i, victim, agent="victim") for i in range(1, 51)],
                           token=TOKEN).status_code == 202
        # 400 other sessions, one small event each (one batch): the share is 256 MiB / 402
        assert post_events(d.url, [event(1, f"other-{i}", agent="other") for i in range(400)],
                           token=TOKEN).status_code == 202
        # one event of 1 MiB in the victim's session, under the poster's own source
        big = event(1, victim, agent="victim", source="aep://elsewhere/poster", id="big",
                    data={"pad": "x" * 1_000_000})
        assert post_events(d.url, [big], token=TOKEN).status_code == 202
        served = [e["id"] for e in _from_all(d.url) if e["session"] == victim]
        assert len(served) == 51, len(served)
        d.restart()
        again = [e["id"] for e in _from_all(d.url) if e["session"] == victim]
        # its 50 events at least (the big one may be left out, counted)
        assert set(served) - {"big"} <= set(again), (len(served), len(again))
    finally:
        d.stop(timeout=20)


def test_one_request_cannot_open_thousands_of_session_files(tmp_path):
    """One poster's batch of 2,000 one-event sessions: each became a
    session log file (and one more file for every later start to open and
    stat: 100,000 of them made the next start take 32 s). Now the relay's
    remote ingest is bounded like OTLP's: at most
    ``AEP_RELAY_MAX_NEW_SESSIONS`` (100) new sessions a request and
    ``AEP_RELAY_NEW_SESSIONS_PER_S`` (50) a second, bursting to 100; the
    rest refused whole (429 ``too-many-sessions``, counted)."""
    d = DaemonProcess(tmp_path / "state", args=("relay",), token=TOKEN)
    d.start()
    try:
        logs = tmp_path / "state" / "logs"
        r = post_events(d.url, [event(1, f"flood-{i}", agent="flood") for i in range(2000)],
                        token=TOKEN)
        assert r.status_code == 429 and r.json()["error"] == "too-many-sessions", r.text
        assert int(r.headers["retry-after"]) >= 1
        assert list(logs.rglob("flood-*.jsonl")) == []
        # then as fast as it can: 40 batches of 100 new sessions each (bounded)
        began = time.monotonic()
        statuses = [post_events(d.url, [event(1, f"flood-{b}-{i}", agent="flood")
                                        for i in range(100)], token=TOKEN).status_code
                    for b in range(40)]
        took = time.monotonic() - began
        files = len(list(logs.rglob("flood-*.jsonl")))
        # the burst plus what the rate refilled meanwhile (an upper bound that
        # only grows on a slow machine), whole batches of 100 each
        assert files == 100 * statuses.count(202), (files, statuses)
        assert files <= 100 + 50 * took + 100, (files, took)
        assert 429 in statuses, statuses
        counters = d.healthz()["relay_counts"]["counters"]
        assert counters["refused_new_sessions"] == 2000 + 100 * statuses.count(429)
        # a session already known is never refused, budget spent or not
        assert post_events(d.url, [event(2, "flood-0-0", agent="flood")],
                           token=TOKEN).status_code == 202
        d.restart()
        # the restored sessions are known after the restart too
        assert post_events(d.url, [event(3, "flood-0-0", agent="flood")],
                           token=TOKEN).status_code == 202
    finally:
        d.stop(timeout=20)
