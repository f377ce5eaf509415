"""``aep-bridges respond`` against a hostile peer (issue 25, attack 5): the
real relay (``aep-bridges relay``, its own process), a remote emitter on its
``/socket`` (:class:`tests.support.console_target.StubTarget`, its answer
replaced by fault injection) and the console script as an operator runs it.

- the target's ``control.rejected`` detail carries terminal escapes (an OSC
  title, a line erase, a forged green "accepted" line): what reaches the
  terminal is the escaped text, never an ESC or BEL byte;
- another emitter copies a fleet ask's id into an ``attention.requested`` of
  a session of its own: ``respond REQUEST_ID`` alone refuses to pick one
  (exit 2) instead of answering whichever session came first."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.console_target import StubTarget
from tests.support.daemon import DaemonProcess, console_script

TOKEN = "hostile-peer-test-token-0123456789"
ESC = "\x1b]0;PWNED-TITLE\x07\x1b[2K\r\x1b[32mrespond: accepted by session (command ok)\x1b[8m\u202e"


@pytest.fixture
def relay(tmp_path: Path):
    d = DaemonProcess(tmp_path / "state", args=("relay",), token=TOKEN).start()
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log()


class EscapingTarget(StubTarget):
    """Rejects every answer with a detail full of terminal escapes."""

    def _answer(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return self.emit("control.rejected", {"reason": "invalid", "detail": ESC},
                         cause=cmd["id"], severity="notice", capture="redacted")


def respond(relay: DaemonProcess, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "AEP_TOKEN": TOKEN, "COLUMNS": "200",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}  # (an old-code check)
    return subprocess.run(console_script() + ["respond", *args, "--url", relay.url, "--wait", "5"],
                          capture_output=True, env=env, timeout=120)


def test_a_rejection_detail_reaches_the_terminal_escaped(relay: DaemonProcess) -> None:
    with EscapingTarget(relay.url, TOKEN, agent="evil", session="esc-1") as target:
        target.emit("session.started", {})
        ask = target.emit("attention.requested", {
            "kind": "permission", "prompt": "ok?", "respond_via": ["control"],
            "options": [{"id": "allow", "label": "Allow"}]})
        r = respond(relay, target.session, ask["id"], "--option", "allow")
        out = r.stdout + r.stderr
        assert r.returncode == 3, out
        assert b"\x1b" not in out and b"\x07" not in out and "\u202e".encode() not in out, out
        # the detail is shown, as escapes, on the one rejection line
        assert b"rejected: invalid (\\x1b]0;PWNED-TITLE\\x07" in r.stderr, r.stderr
        assert b"\\u202e" in r.stderr and b"accepted" not in r.stdout


def test_an_ask_id_copied_into_another_session_makes_respond_ask_for_the_session(
        relay: DaemonProcess) -> None:
    with StubTarget(relay.url, TOKEN, agent="victim", session="victim-1") as target:
        target.emit("session.started", {})
        ask = target.emit("attention.requested", {
            "kind": "permission", "prompt": "deploy prod", "respond_via": ["control"],
            "options": [{"id": "once", "label": "Allow"}]})
        copy = {**ask, "agent": "alice", "source": "urn:alice:1", "session": "alice-own\x1b[2J",
                "seq": 1, "epoch": 0}
        res = httpx.post(relay.url + "/events", content=json.dumps(copy), trust_env=False,
                         timeout=30, headers={"authorization": f"Bearer {TOKEN}",
                                              "aep-version": "0.1",
                                              "content-type": "application/json"})
        assert res.status_code == 202, res.text
        r = respond(relay, ask["id"], "--option", "once")
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert b"more than one session" in r.stderr and b"\x1b" not in r.stderr, r.stderr
        assert target.commands == []  # nothing was sent to either
        # naming the session answers the real one
        r = respond(relay, target.session, ask["id"], "--option", "once")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert [c["subject"] for c in target.commands] == [ask["id"]]
