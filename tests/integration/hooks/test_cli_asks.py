"""``aep-bridges respond`` against the real daemon and its Claude Code hook
bridge (issue 27's trial, findings 2 and 4): a late answer to an ask
answered at the terminal says why at the default ``metadata`` capture (the
nack's ``code``; its ``detail`` is capture-gated and dropped), and
``respond --pending`` / ``respond`` with no id find the open asks instead
of a recipe that took the oldest ask ever logged."""
from __future__ import annotations

import subprocess
import uuid

import pytest

from tests.integration.hooks.test_daemon import BASH, TOKEN, Background, HookDaemon, ask_of, moment
from tests.support.daemon import console_script, send_command


def cli(d: HookDaemon, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(console_script() + [*args, "--url", d.url], capture_output=True,
                          text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "AEP_TOKEN": TOKEN, "COLUMNS": "200"})


@pytest.fixture
def daemon(tmp_path):
    d = HookDaemon(tmp_path / "state", AEP_CLAUDE_CODE_CONTROL="1", AEP_CLAUDE_CODE_HOLD_S="60")
    d.start()
    stream = d.subscribe()
    yield d, stream
    stream.close()
    assert d.stop() == 0


def test_a_late_respond_to_an_ask_answered_at_the_terminal_says_why(daemon):
    d, stream = daemon
    s = f"s-oob-{uuid.uuid4().hex[:6]}"
    d.post(moment(s, "UserPromptSubmit", prompt="list"))
    held = Background(d, moment(s, "PermissionRequest", **BASH))
    ask = ask_of(stream, s)
    # the person at the terminal allowed it: the tool ran
    d.post(moment(s, "PostToolUse", tool_use_id="toolu_t", tool_response={"stdout": "x"}, **BASH))
    stream.first(lambda e: e.get("session") == s and e["type"] == "attention.resolved")
    assert held.result().json() == {}
    late = cli(d, "respond", s, ask["id"], "--option", "allow")
    assert late.returncode == 3, (late.stdout, late.stderr)
    # the stream says it ended (trial issue 27 #3): nothing is sent
    assert "already resolved: answered (via oob; attention.resolved " in late.stderr
    assert "accepted" not in late.stdout
    # a command sent anyway is refused with the bridge's code, said in words
    status, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                             data={"answer": {"option": "allow"}})
    assert status == "refused"
    nack = stream.first(lambda e: e.get("session") == s and e["type"] == "control.rejected")
    assert nack["data"]["code"] == "answered-oob" and "detail" not in nack["data"]
    assert nack["capture"] == "metadata"
    # a newer ask of the session makes the bridge forget the closed one: still said
    second = Background(d, moment(s, "PermissionRequest", tool_name="Bash",
                                  tool_input={"command": "pwd"}))
    ask2 = stream.first(lambda e: e.get("session") == s and e["type"] == "attention.requested"
                        and e["id"] != ask["id"])
    again = cli(d, "respond", ask["id"], "--option", "deny")
    assert again.returncode == 3 and "already resolved: answered (via oob" in again.stderr, \
        again.stderr
    status, _ = send_command(d, "control.attention.respond", s, subject=ask2["id"],
                             data={"answer": {"option": "allow"}})
    assert status == "accepted"
    assert second.result().json()["hookSpecificOutput"]["decision"]["behavior"] == "allow"


def test_respond_pending_lists_the_open_asks_and_no_id_picks_only_one(daemon):
    d, stream = daemon
    s1, s2 = (f"s-pend{i}-{uuid.uuid4().hex[:6]}" for i in (1, 2))
    assert "no pending asks" in cli(d, "respond", "--pending").stdout
    h1 = Background(d, moment(s1, "PermissionRequest", **BASH))
    a1 = ask_of(stream, s1)
    h2 = Background(d, moment(s2, "PermissionRequest", tool_name="Bash",
                              tool_input={"command": "rm -rf build"}))
    a2 = ask_of(stream, s2)
    listed = cli(d, "respond", "--pending")
    assert listed.returncode == 0, listed.stderr
    lines = [ln for ln in listed.stdout.splitlines() if ln.startswith(("0", "1", "2", "3", "4",
                                                                       "5", "6", "7", "8", "9"))]
    assert [ln.split()[0] for ln in lines] == [a1["id"], a2["id"]]  # oldest first
    assert all("claude-code" in ln for ln in lines)
    assert f"session {s1}" in lines[0] and f"session {s2}" in lines[1]
    # each ask's option ids, as timeline shows them (trial issue 27 #4)
    ids = [o["id"] for o in a1["data"]["options"]]
    assert len(ids) >= 2 and f"[{'|'.join(ids)}]" in lines[0], lines[0]
    bogus = cli(d, "respond", a1["id"], "--option", "bogus")
    assert bogus.returncode == 2, (bogus.stdout, bogus.stderr)
    assert f"--option bogus: not an option of this ask; its options: {', '.join(ids)}" \
        in bogus.stderr
    assert "accepted" not in bogus.stdout
    several = cli(d, "respond", "--option", "allow")
    assert several.returncode == 2
    assert "2 asks are pending" in several.stderr
    assert a1["id"] in several.stderr and a2["id"] in several.stderr
    status, _ = send_command(d, "control.attention.respond", s1, subject=a1["id"],
                             data={"answer": {"option": "deny"}})
    assert status == "accepted"
    assert h1.result().json()["hookSpecificOutput"]["decision"]["behavior"] == "deny"
    stream.first(lambda e: e.get("session") == s1 and e["type"] == "attention.resolved")
    one = cli(d, "respond", "--option", "allow")
    assert one.returncode == 0, (one.stdout, one.stderr)
    assert f"accepted by session {s2}" in one.stdout
    assert h2.result().json()["hookSpecificOutput"]["decision"]["behavior"] == "allow"
    assert "no pending asks" in cli(d, "respond", "--pending").stdout


def test_a_wrong_token_is_said_as_unauthorized_not_unreachable(daemon):
    """Trial issue 27: `respond --pending` and `respond` with a wrong token said
    `cannot reach URL (Client error '401 ' ...)` and exited 1 (unreachable)."""
    d, stream = daemon
    s = f"s-tok-{uuid.uuid4().hex[:6]}"
    held = Background(d, moment(s, "PermissionRequest", **BASH))
    ask = ask_of(stream, s)
    wrong = {"PATH": "/usr/bin:/bin", "AEP_TOKEN": "not-the-daemons", "COLUMNS": "200"}
    for args in (["respond", "--pending"], ["respond", ask["id"], "--option", "allow"],
                 ["respond", s, ask["id"], "--option", "allow"]):
        p = subprocess.run(console_script() + [*args, "--url", d.url], capture_output=True,
                           text=True, timeout=120, env=wrong)
        assert p.returncode == 6, (args, p.stdout, p.stderr)
        assert "unauthorized: pass --token or set AEP_TOKEN (the daemon's)" in p.stderr, p.stderr
        assert "cannot reach" not in p.stderr and "not-the-daemons" not in p.stderr
    status, _ = send_command(d, "control.attention.respond", s, subject=ask["id"],
                             data={"answer": {"option": "deny"}})
    assert status == "accepted"  # nothing was answered with the wrong token
    assert held.result().json()["hookSpecificOutput"]["decision"]["behavior"] == "deny"


def test_respond_after_a_restart_says_the_ask_was_dismissed(tmp_path):
    """Trial issue 27 #3: an ask dismissed at the daemon's shutdown, answered
    after its restart, said `rejected: invalid (no-route: ...)`; the relay
    still replays its attention.resolved, so respond says how it ended and
    sends nothing."""
    d = HookDaemon(tmp_path / "state", AEP_CLAUDE_CODE_CONTROL="1", AEP_CLAUDE_CODE_HOLD_S="60")
    d.start()
    stream = d.subscribe()
    try:
        s = f"s-restart-{uuid.uuid4().hex[:6]}"
        held = Background(d, moment(s, "PermissionRequest", **BASH))
        ask = ask_of(stream, s)
        stream.close()
        assert d.stop() == 0
        held.thread.join(60)
        d.start()
        late = cli(d, "respond", ask["id"], "--option", "allow")
        assert late.returncode == 3, (late.stdout, late.stderr)
        assert "already resolved: dismissed (attention.resolved " in late.stderr, late.stderr
        assert "no-route" not in late.stderr and "accepted" not in late.stdout
    finally:
        assert d.stop() == 0
