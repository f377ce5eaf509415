"""Issue 25, re-attack: the hook endpoints (``POST /hooks/<agent>``) and
their spool, on the real daemon, with absurdly nested JSON.

- A body of 200,000 ``[`` made the endpoint raise ``RecursionError``: a
  ``500`` and a full traceback in the log per request (unbounded), where
  any other bad body is a counted ``400``.
- One spool line the daemon cannot parse for depth (a hook payload nested a
  little deeper than the daemon's listener task can decode answers ``500``,
  so the real shim spools it; or any line in the spool) crashed the hook
  bridge at every spool sweep. The claimed ``.ingesting-*`` file is taken
  first at each restart, so the bridge crash-looped for good: every later
  hook got ``404`` (and was spooled behind it) until someone deleted the file.
"""
from __future__ import annotations

import json
import time

import httpx

from tests.support.daemon import DaemonProcess

TOKEN = "hooks-depth-token"
DEEP = 200_000


def _counters(d: DaemonProcess) -> dict:
    return d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]


def _wait(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_deep_hook_body_is_a_counted_400_without_traceback(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1"}, token=TOKEN)
    d.start()
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        for _ in range(3):  # bounded: a few requests show the per-request cost
            r = httpx.post(f"{d.url}/hooks/claude-code", content=b"[" * DEEP, headers=auth,
                           timeout=30)
            assert r.status_code == 400, r.status_code
        assert _counters(d)["hooks_bad_body"] == 3
        assert "Traceback" not in d.log()
    finally:
        d.stop(timeout=20)


def test_a_deep_spool_line_does_not_crash_the_hook_bridge(tmp_path):
    state = tmp_path / "state"
    spool = state / "hooks-spool"
    spool.mkdir(parents=True, mode=0o700)
    good = {"session_id": "s-good", "hook_event_name": "Notification", "message": "hi",
            "notification_type": "other"}
    lines = [
        b'{"id":"deep-line","agent":"claude-code","spooled_at_ms":1,"payload":'
        + b"[" * DEEP + b"\n",
        json.dumps({"id": "deep-str", "agent": "claude-code", "spooled_at_ms": 1,
                    "payload": "[" * DEEP}).encode() + b"\n",
        json.dumps({"id": "good", "agent": "claude-code", "spooled_at_ms": 1,
                    "payload": good}).encode() + b"\n",
    ]
    path = spool / "claude-code.jsonl"
    path.write_bytes(b"".join(lines))
    path.chmod(0o600)
    d = DaemonProcess(state, {"AEP_BRIDGE_CLAUDE_CODE": "1"}, token=TOKEN)
    d.start(healthy=False)
    try:
        _wait(lambda: _counters(d)["hooks_spool_malformed"] >= 2
              or "bridge claude_code crashed" in d.log())
        assert "bridge claude_code crashed" not in d.log()
        c = _counters(d)
        assert c["hooks_spool_malformed"] == 2 and c["hooks_spooled_ingested"] == 1, c
        assert not list(spool.glob("claude-code.jsonl*")), "the claimed file stays"
        r = httpx.post(f"{d.url}/hooks/claude-code", json=dict(good, session_id="s-live"),
                       headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert r.status_code == 200
        assert d.healthz(TOKEN)["bridges"]["claude_code"]["source"] is True
    finally:
        d.stop(timeout=20)


def test_a_body_of_millions_of_arrays_is_a_counted_400_before_the_parse(tmp_path):
    """A tenth outside attack: 4 MiB of ``[[],...]`` in a hook body held the
    loop about a second (a gated hook sent meanwhile failed open); it opens
    over MAX_CONTAINERS arrays, so it is refused before the parse."""
    from bridges.core.aep import MAX_CONTAINERS
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1"}, token=TOKEN)
    d.start()
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        body = json.dumps({"session_id": "s-many", "hook_event_name": "PostToolUse",
                           "tool_name": "Bash", "tool_response": [[]] * (MAX_CONTAINERS + 1)})
        r = httpx.post(f"{d.url}/hooks/claude-code", content=body, headers=auth, timeout=30)
        assert r.status_code == 400 and "JSON arrays and objects" in r.text, r.text
        assert _counters(d)["hooks_bad_body"] == 1
        code = json.dumps({"session_id": "s-code", "hook_event_name": "PostToolUse",
                           "tool_name": "Read", "tool_response": "[{" * (MAX_CONTAINERS + 1)})
        r = httpx.post(f"{d.url}/hooks/claude-code", content=code, headers=auth, timeout=30)
        assert r.status_code == 200, r.text  # brackets in a string are text
    finally:
        d.stop(timeout=20)
