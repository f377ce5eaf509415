"""A turn open across a real daemon restart (issue 27's trial, finding 1):
the command shim hands the turn's first moments to the running daemon, the
daemon stops (SIGTERM) mid-turn, the shim spools the turn's last moments
while it is down, and the restarted daemon, having read its open runs back
from its state file, closes the run it opened with the spooled ``Stop``."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from bridges.hooks_common import shim
from tests.integration.hooks.test_daemon import BASH, TOKEN, HookDaemon, moment
from tests.support.schema import validated


def run_shim(d: HookDaemon, spool: Path, m: dict[str, Any]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", "-E", shim.__file__, "claude-code",
                           "--daemon", d.url, "--spool", str(spool)],
                          input=json.dumps(m).encode(), capture_output=True, timeout=60,
                          env={"AEP_TOKEN": TOKEN, "PATH": "/usr/bin:/bin",
                               "AEP_HOOK_BUDGET_MS": "30000"})


def logged(state: Path, session: str) -> list[dict[str, Any]]:
    return [e for p in sorted((state / "logs").rglob("*.jsonl"))
            for line in p.read_text().splitlines() if line.strip()
            for e in [json.loads(line)] if e.get("session") == session]


def test_a_stop_spooled_across_a_restart_closes_the_run_it_opened(tmp_path):
    state = tmp_path / "state"
    spool = state / "hooks-spool"
    s = f"s-restart-{uuid.uuid4().hex[:6]}"
    d = HookDaemon(state)
    d.start()
    stream = d.subscribe()
    try:
        for m in (moment(s, "UserPromptSubmit", prompt="hi"),
                  moment(s, "PreToolUse", tool_use_id="toolu_r", **BASH)):
            assert run_shim(d, spool, m).returncode == 0
        stream.first(lambda e: e.get("session") == s and e["type"] == "tool.requested")
    finally:
        stream.close()
    assert d.stop() == 0  # mid-turn
    for m in (moment(s, "PostToolUse", tool_use_id="toolu_r", tool_response={"stdout": "x"},
                     **BASH), moment(s, "Stop")):
        assert run_shim(d, spool, m).returncode == 0  # the daemon is down: spooled
    assert len((spool / "claude-code.jsonl").read_text().splitlines()) == 2
    d.start()
    stream = d.subscribe()
    try:
        stream.first(lambda e: e.get("session") == s and e["type"] == "run.finished", timeout=60)
    finally:
        stream.close()
        assert d.stop() == 0
    evs = validated(logged(state, s))
    types = [e["type"] for e in evs]
    assert types == ["run.started", "tool.requested", "tool.completed", "run.finished"], types
    started, requested, completed, finished = evs
    assert completed["cause"] == requested["id"]
    assert finished["run"] == completed["run"] == started["run"]
    assert finished["cause"] == started["id"]
    assert finished["data"]["duration_ms"] >= 0
