"""Issue 25, fifth outside attack: an unauthenticated OTLP sender evicted a
held ask from the relay.

With a Claude Code ``PermissionRequest`` held, OTLP exports naming a new
``conversation.id`` per record (inside the OTLP bridge's documented
new-sessions budget) pushed the embedded relay to its session cap
(``AEP_MAX_SESSIONS``), and the cap evicted the least recently written
buffers, the victim's among them: ``/stream?from=all`` then served none of
its events, ``aep-bridges respond <ask id>`` failed "holds no
attention.requested", and a console opening later never saw the ask while
the agent still waited. Now a buffer holding an open ask is pinned and the
open kind (the OTLP bridge's sessions) goes first
(``supervisor/relay/pins.py``): the ask stays on ``from=all``, ``respond``
answers it, and the evictions are counted by kind.

The real daemon (``aep-bridges run``: the Claude Code hook bridge with its
gate on, the OTLP bridge, the embedded relay), real-shaped hook payloads,
raw OTLP/JSON exports, the real ``aep-bridges respond``.
"""
from __future__ import annotations

import subprocess
import uuid

import httpx

from tests.integration.hooks.test_daemon import BASH, Background, HookDaemon, ask_of, moment
from tests.support.daemon import console_script
from tests.support.hardening import otlp_json, otlp_record, post_otlp, stream_events

SESSION = "victim-cc"
CAP = 20  # AEP_MAX_SESSIONS: the flood is a few times it


def _counters(d: HookDaemon) -> dict:
    return d.healthz(d.token)["relay_counts"]["counters"]


def test_an_otlp_flood_of_new_sessions_does_not_evict_a_held_ask(tmp_path):
    d = HookDaemon(tmp_path / "state", AEP_BRIDGE_OTLP_IN="1", AEP_CLAUDE_CODE_CONTROL="1",
                   AEP_CLAUDE_CODE_GATE_TOOLS="Bash", AEP_CLAUDE_CODE_HOLD_S="120",
                   AEP_MAX_SESSIONS=str(CAP))
    d.start()
    stream = d.subscribe()
    held = None
    try:
        assert d.post(moment(SESSION, "SessionStart", source="startup")).status_code == 200
        held = Background(d, moment(SESSION, "PermissionRequest", **BASH))
        ask = ask_of(stream, SESSION)
        assert held.headers_seen.wait(30), "the held hook's response start never came"
        # anyone on the OTLP port, no token: 3 x CAP new conversations, a
        # request of 20 at a time (within the per-request and per-second budget)
        flooded = 0
        for _ in range(200):  # bounded: a request the budget refuses is sent again
            if flooded >= 3 * CAP:
                break
            batch = [otlp_record(f"flood-{uuid.uuid4()}", event_name="codex.conversation_starts")
                     for _ in range(20)]
            r = post_otlp(d.http_port, otlp_json(batch))
            if r.status_code == 200 and "rejected" not in r.text:
                flooded += len(batch)
        assert flooded >= 3 * CAP
        # a console opening now: the ask is on from=all
        ids = [e["id"] for e in stream_events(d.url, d.token)
               if e.get("session") == SESSION and e["type"] == "attention.requested"]
        assert ids == [ask["id"]], ids
        out = subprocess.run(console_script() + ["respond", ask["id"], "--option", "allow",
                                                 "--url", d.url, "--wait", "30"],
                             env={"PATH": "/usr/bin:/bin", "AEP_TOKEN": d.token, "COLUMNS": "200"},
                             capture_output=True, text=True, timeout=120)
        assert "holds no attention.requested" not in out.stderr, out.stderr
        assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
        got = held.result()
        assert got.status_code == 200, got.text
        assert got.json()["hookSpecificOutput"]["decision"]["behavior"] == "allow", got.text
        counters = _counters(d)  # the flood's buffers went, counted by kind
        assert counters["sessions_evicted_open"] >= 2 * CAP, counters
        assert counters["sessions_evicted_fleet"] == 0, counters
        metrics = httpx.get(d.url + "/metrics", headers={"authorization": f"Bearer {d.token}"},
                            timeout=10, trust_env=False).text
        open_evicted = [line for line in metrics.splitlines() if line.startswith(
            'aep_bridges_relay_sessions_evicted_total{kind="open"}')]
        assert open_evicted and float(open_evicted[0].split()[-1]) >= 2 * CAP, open_evicted
    finally:
        stream.close()
        d.stop(timeout=20)
        if held is not None:
            held.thread.join(10)
