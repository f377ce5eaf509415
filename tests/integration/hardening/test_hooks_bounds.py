"""Issue 25, the fifth outside attack, on the real daemon and the real shim
(``/tmp/attack5``: ``elicit_big.py``, ``spool_poison.sh``).

- A Claude Code ``Elicitation`` whose MCP schema enum holds 1,000,000
  values (a 4.0 MB body, under the hook body cap) made a 23 MB
  ``attention.requested`` (session log, every ``/stream``) and held the
  event loop ~6 s. Now the form carries a bounded number of choices and
  says so (``x-truncated``); the event is small.
- A ``PostToolUse`` whose ``tool_response`` nested 980 deep was a
  ``RecursionError`` (500); the shim spooled it, and the spooled copy was
  dropped as a duplicate of the failed attempt: the moment was lost. Now
  the moment is cut at its depth bound and goes out at once.
"""
from __future__ import annotations

import json
import subprocess
import time

import httpx

from bridges.hooks_common import forms
from tests.support.daemon import DaemonProcess, console_script

TOKEN = "hooks-bounds-token"


def _counters(d: DaemonProcess) -> dict:
    return d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]


def _lines(d: DaemonProcess, sid: str) -> list[bytes]:
    path = d.state / "logs" / "claude-code" / f"{sid}.jsonl"
    return path.read_bytes().splitlines() if path.exists() else []


def _wait(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_a_huge_enum_makes_a_small_bounded_form(tmp_path):
    """100,000 choices make a form of the first few (and a body of a
    million, past ``MAX_VALUES``, is refused before it is parsed: 400,
    counted ``hooks_bad_body``)."""
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1"}, token=TOKEN)
    d.start()
    sid = "elbig"

    def body(n: int) -> bytes:
        moment = {"hook_event_name": "Elicitation", "session_id": sid, "mcp_server_name": "evil",
                  "message": "pick one",
                  "requested_schema": {"type": "object",
                                       "properties": {"a": {"type": "string",
                                                            "enum": ["a"] * n}}}}
        return json.dumps(moment, separators=(",", ":")).encode()
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    try:
        huge = body(1_000_000)
        assert len(huge) < 4 * 1024 * 1024  # under the body cap
        r = httpx.post(f"{d.url}/hooks/claude-code", content=huge, timeout=60, headers=auth)
        assert r.status_code == 400 and "JSON values" in r.json()["error"], r.text
        assert d.healthz(TOKEN)["bridges"]["claude_code"]["counters"]["hooks_bad_body"] == 1
        r = httpx.post(f"{d.url}/hooks/claude-code", content=body(100_000), timeout=60,
                       headers=auth)
        assert r.status_code == 200
        lines = _lines(d, sid)
        asks = [json.loads(x) for x in lines if b'"attention.requested"' in x]
        assert len(asks) == 1
        (field,) = asks[0]["data"]["fields"]
        assert len(field["choices"]) == forms.CHOICES_MAX
        assert field["x-truncated"] == {"choices": 100_000}
        assert sum(len(x) for x in lines) < 64 * 1024  # was 23 MB (a million choices)
    finally:
        d.stop(timeout=20)


def test_a_deep_tool_response_through_the_real_shim_is_logged_not_lost(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1"}, token=TOKEN)
    d.start()
    sid = "s-poison"
    raw = ('{"hook_event_name":"PostToolUse","session_id":"%s","tool_name":"Read",'
           '"tool_use_id":"tp","tool_input":{},"tool_response":%s}'
           % (sid, "[" * 980 + "]" * 980))
    try:
        shim = subprocess.run([*console_script(), "hook", "claude-code", "--daemon", d.url],
                              input=raw.encode(), capture_output=True, timeout=60,
                              env={**d.env, "AEP_TOKEN": TOKEN})
        assert shim.returncode == 0, shim.stderr
        _wait(lambda: any(b'"tool.completed"' in x for x in _lines(d, sid)))
        c = _counters(d)
        assert (c["hooks_too_deep"], c["hooks_duplicate"], c["hooks_map_failed"]) == (1, 0, 0), c
        assert not list((d.state / "hooks-spool").glob("claude-code.jsonl*"))
        assert "RecursionError" not in d.log()
    finally:
        d.stop(timeout=20)
