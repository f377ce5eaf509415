"""Issue 25, the outside attack: a flood of new ``session_id``s on ``POST
/hooks/<agent>``, on the real daemon. Each new session is a session log
file; with no bound 3,000 files appeared in 20 s, where OTLP and ACP have a
new-session bucket. Now ``AEP_CLAUDE_CODE_NEW_SESSIONS_PER_S`` bounds them
(bursts of ``BURST_S`` seconds of it): the rest are answered ``{}`` (no
decision, the agent goes on), not logged, counted ``sessions_refused``
(and in ``/metrics``); a known session's moments still pass."""
from __future__ import annotations

import json
import time

import httpx

from bridges.core.limits import BURST_S
from tests.support.daemon import DaemonProcess

TOKEN = "hooks-flood-token"
RATE = 2
FLOOD = 2_000


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{want}}} in /metrics")


def _prompt(session: str, i: int) -> dict:
    return {"hook_event_name": "UserPromptSubmit", "session_id": session, "cwd": "/w",
            "prompt": f"p{i}"}


def test_a_flood_of_new_session_ids_is_bounded_and_known_sessions_pass(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1",
                                           "AEP_CLAUDE_CODE_NEW_SESSIONS_PER_S": str(RATE)},
                      token=TOKEN)
    d.start()
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        known_prompts = 0
        started = time.monotonic()
        with httpx.Client(base_url=d.url, headers=auth, timeout=30, trust_env=False) as c:
            def post(moment: dict) -> None:
                r = c.post("/hooks/claude-code", json=moment)
                assert (r.status_code, r.json()) == (200, {}), (r.status_code, r.text)

            post(_prompt("s-known", -1))
            known_prompts += 1
            for i in range(FLOOD):  # bounded: 2,000 POSTs, each a new session_id
                post(_prompt(f"flood-{i}", i))
                if i % 500 == 499:  # the known session, with the bucket long empty
                    post(_prompt("s-known", i))
                    known_prompts += 1
        elapsed = time.monotonic() - started
        files = list((d.state / "logs").rglob("*.jsonl"))
        flooded = [f for f in files if "flood-" in f.name]
        # the burst plus the refill over the elapsed time (the known session's file apart)
        assert len(flooded) <= RATE * BURST_S + RATE * elapsed + 1, (len(flooded), elapsed)
        counters = d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]
        assert counters["sessions_refused"] == FLOOD - len(flooded), (counters, len(flooded))
        known = [f for f in files if "s-known" in f.name]
        assert len(known) == 1, files
        types = [json.loads(line)["type"] for line in known[0].read_text().splitlines()]
        assert types.count("run.started") == known_prompts, types
        text = httpx.get(d.url + "/metrics", headers=auth, timeout=10, trust_env=False).text
        assert _metric(text, "aep_bridges_events_dropped_total", reason="session-refused",
                       severity="*") == counters["sessions_refused"]
        assert "Traceback" not in d.log()
        assert d.log().count("new sessions arrive faster than") <= 1 + elapsed / 60 + 1
    finally:
        d.stop(timeout=20)
