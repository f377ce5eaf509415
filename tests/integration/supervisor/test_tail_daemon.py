"""``aep-bridges tail`` against the real daemon's embedded relay: its
printed timeline (a pipe), ``--json`` (the raw events), a refused token,
and the same timeline under a real terminal (``tmux``, read back with
``capture-pane``, colors included)."""
from __future__ import annotations

import json
import re
import subprocess
import time

import httpx
import pytest

from tests.support.daemon import DaemonProcess, console_script
from tests.support.system import require

TOKEN = "tail-test-token-0123456789"


def ev(seq: int, type_: str, session: str = "ses_tail0000demo", **kw) -> dict:
    agent = kw.pop("agent", "opencode")
    return {"aep": "0.1", "id": f"01JTAIL{seq:019d}", "type": type_,
            "time": f"2026-12-01T09:31:{seq:02d}.250Z",
            "source": f"aep://box/agent/{agent}/session/{session}", "agent": agent,
            "session": session, "seq": seq, "capture": "redacted", **kw}


STORY = [
    ev(1, "session.started", data={"client": {"name": "opencode"}}),
    ev(2, "run.started", run="msg_1", data={"trigger": "user"}),
    ev(3, "attention.requested", run="msg_1", subject="bash", severity="notice",
       data={"kind": "permission", "prompt": "Permission requested: bash — echo hi",
             "options": [{"id": "once", "label": "Allow once"}, {"id": "reject", "label": "Reject"}]}),
    ev(4, "attention.resolved", run="msg_1", subject="01JTAIL0000000000000000003",
       data={"resolution": "answered"}),
    ev(5, "tool.completed", run="msg_1", data={"tool": {"name": "bash"}, "status": "completed",
                                               "duration_ms": 31}),
    ev(6, "run.finished", run="msg_1", data={"duration_ms": 1200}),
]


def post(daemon: DaemonProcess, events: list[dict]) -> None:
    r = httpx.post(daemon.url + "/events", content="\n".join(json.dumps(e) for e in events),
                   headers={"content-type": "application/x-ndjson", "aep-version": "0.1",
                            "authorization": f"Bearer {TOKEN}"}, timeout=10, trust_env=False)
    assert r.status_code == 202, r.text


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("tail") / "state", {"AEP_BRIDGE_OTLP_IN": "0"},
                      token=TOKEN).start()
    post(d, STORY)
    yield d
    assert d.stop() == 0


def tail(daemon: DaemonProcess, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if token:
        env["AEP_TOKEN"] = token
    return subprocess.run(console_script() + ["tail", "--url", daemon.url, *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_tail_prints_the_timeline(daemon):
    out = tail(daemon, "--from", "all", "--limit", str(len(STORY)))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(STORY), out.stdout
    assert "\x1b[" not in out.stdout  # a pipe gets no colors
    for line, e in zip(lines, STORY, strict=True):
        assert re.match(rf"09:31:{e['seq']:02d}\.250 opencode +…000demo +{re.escape(e['type'])} ", line), line
    gist = {e["type"]: line.split(e["type"], 1)[1].strip() for line, e in zip(lines, STORY, strict=True)}
    assert gist["attention.requested"] == \
        "permission: Permission requested: bash — echo hi  [once|reject]  PENDING"
    assert gist["attention.resolved"].startswith("resolved: answered ← Permission requested")
    assert gist["tool.completed"] == "bash ✓ completed (31 ms)"
    assert gist["run.finished"] == "finished ok (1200 ms)"
    # the type column is aligned: every gist starts in the same column
    starts = {len(line) - len(line.split(e["type"], 1)[1].lstrip()) for line, e in zip(lines, STORY, strict=True)}
    assert len(starts) == 1, lines


def test_tail_filter_and_json(daemon):
    out = tail(daemon, "--from", "all", "--json", "--filter", "type=attention.*", "--limit", "2")
    assert out.returncode == 0, out.stderr
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [e["id"] for e in got] == [STORY[2]["id"], STORY[3]["id"]]
    assert got[0]["data"]["options"] == STORY[2]["data"]["options"]


def test_tail_without_the_token_is_refused_with_a_hint(daemon):
    out = tail(daemon, "--from", "all", token=None)
    assert out.returncode == 1
    assert "HTTP 401" in out.stderr and "--token" in out.stderr


def test_tail_under_a_real_terminal(daemon, tmp_path):
    tmux = require("tmux")
    sock = str(tmp_path / "tmux.sock")
    cmd = " ".join(console_script() + ["tail", "--url", daemon.url, "--from", "all"])
    subprocess.run([tmux, "-S", sock, "-f", "/dev/null", "new-session", "-d", "-x", "150",
                    "-y", "30", f"env -u COLUMNS -u LINES TERM=xterm-256color AEP_TOKEN={TOKEN} {cmd}"], check=True)
    try:
        def pane(*flags: str) -> str:
            return subprocess.run([tmux, "-S", sock, "capture-pane", "-p", *flags],
                                  capture_output=True, text=True, check=True).stdout

        live = [ev(7, "attention.requested", session="ses_tail0000live", subject="bash",
                   severity="notice", data={"kind": "permission", "prompt": "rm -rf build?",
                                            "options": [{"id": "once"}, {"id": "reject"}]}),
                ev(8, "tool.failed", session="ses_tail0000live",
                   data={"tool": {"name": "bash"}, "error": {"message": "exit 1"}})]
        deadline = time.monotonic() + 30
        while "finished ok" not in pane() and time.monotonic() < deadline:
            time.sleep(0.2)
        post(daemon, live)  # and two arriving live
        while "exit 1" not in pane() and time.monotonic() < deadline:
            time.sleep(0.2)
        plain = [ln for ln in pane().splitlines() if ln.strip()]
        colored = pane("-e")
    finally:
        subprocess.run([tmux, "-S", sock, "kill-server"], check=False)
    assert len(plain) == len(STORY) + 2, "\n".join(plain)
    assert plain[-2].endswith("permission: rm -rf build?  [once|reject]  PENDING"), plain[-2]
    assert plain[-1].endswith("bash ✗ failed: exit 1"), plain[-1]
    assert "…000live " in plain[-1]
    # the pending ask is drawn on a yellow background (SGR 43), the failure in red (31)
    ask_line = next(ln for ln in colored.splitlines() if "rm -rf build?" in ln)
    assert "\x1b[43m" in ask_line or ";43m" in ask_line, repr(ask_line)
    fail_line = next(ln for ln in colored.splitlines() if "exit 1" in ln)
    assert re.search(r"\x1b\[(?:[0-9;]*;)?31m", fail_line) or "\x1b[1m\x1b[31m" in fail_line, repr(fail_line)
