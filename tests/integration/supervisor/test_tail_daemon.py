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
from tests.support.net import free_port
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


def tail(daemon: DaemonProcess, *args: str, token: str | None = TOKEN,
         state: str | None = None) -> subprocess.CompletedProcess:
    # the resume positions go under a state directory of the test's own
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "AEP_STATE_DIR": state or str(daemon.state.parent / "tail-state")}
    if token:
        env["AEP_TOKEN"] = token
    return subprocess.run(console_script() + ["tail", "--url", daemon.url, *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_tail_prints_the_timeline(daemon):
    out = tail(daemon, "--from", "all", "--limit", str(len(STORY)), "--no-resume")
    assert out.returncode == 0, out.stderr
    day, *lines = out.stdout.splitlines()
    # the events are not from today: the date is said once, the columns stay
    assert day == "── 2026-12-01 ──", out.stdout
    assert len(lines) == len(STORY), out.stdout
    assert "\x1b[" not in out.stdout  # a pipe gets no colors
    for line, e in zip(lines, STORY, strict=True):
        assert re.match(rf"09:31:{e['seq']:02d}\.250 opencode +…000demo +{re.escape(e['type'])} ", line), line
    gist = {e["type"]: line.split(e["type"], 1)[1].strip() for line, e in zip(lines, STORY, strict=True)}
    # answered in the same replay: its outcome, never PENDING
    assert gist["attention.requested"] == \
        "permission: Permission requested: bash — echo hi  [once|reject]  → answered"
    assert gist["attention.resolved"].startswith("resolved: answered ← Permission requested")
    assert gist["tool.completed"] == "bash ✓ completed (31 ms)"
    assert gist["run.finished"] == "finished ok (1200 ms)"
    # the type column is aligned: every gist starts in the same column
    starts = {len(line) - len(line.split(e["type"], 1)[1].lstrip()) for line, e in zip(lines, STORY, strict=True)}
    assert len(starts) == 1, lines


def test_a_replayed_ask_is_pending_only_when_the_replay_does_not_settle_it(tmp_path):
    """``--from all``: an ask answered, one timed out and one dismissed in
    the replay show their outcome; the one still open is ``PENDING``, and
    the count of those still pending after an outcome line is right."""
    s = "ses_tail_replayed_asks"

    def ask(seq: int, prompt: str) -> dict:
        return ev(seq, "attention.requested", session=s, subject="bash", severity="notice",
                  data={"kind": "permission", "prompt": prompt,
                        "options": [{"id": "once"}, {"id": "reject"}]})

    def out_(seq: int, type_: str, of: int, **data) -> dict:
        return ev(seq, type_, session=s, subject=f"01JTAIL{of:019d}", data=data)

    story = [ask(1, "first ask"), ask(2, "second ask"), ask(3, "third ask"), ask(4, "fourth ask"),
             out_(5, "attention.answered", 1, answer={"option": "once"}, via="control"),
             out_(6, "attention.resolved", 1, resolution="answered"),
             out_(7, "attention.timeout", 2, after_ms=1000),
             out_(8, "attention.resolved", 4, resolution="dismissed")]
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_OTLP_IN": "0"}, token=TOKEN).start()
    try:
        post(d, story)
        out = tail(d, "--from", "all", "--limit", str(len(story)), "--no-resume")
    finally:
        assert d.stop() == 0
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if not ln.startswith("── ")]
    assert len(lines) == len(story), out.stdout
    asks = {ln.split("permission: ", 1)[1].split("  [", 1)[0]: ln for ln in lines[:4]}
    assert asks["first ask"].endswith("[once|reject]  → answered"), asks
    assert asks["second ask"].endswith("[once|reject]  → timed out"), asks
    assert asks["third ask"].endswith("[once|reject]  PENDING"), asks
    assert asks["fourth ask"].endswith("[once|reject]  → dismissed"), asks
    assert sum("PENDING" in ln for ln in lines) == 1
    # each outcome line names its ask; only the third is left pending
    assert "← first ask" in lines[5] and lines[5].endswith("(1 still pending)"), lines[5]
    assert "← second ask" in lines[6] and "← fourth ask" in lines[7], lines


def test_tail_filter_and_json(daemon):
    out = tail(daemon, "--from", "all", "--json", "--filter", "type=attention.*", "--limit", "2",
               "--no-resume")
    assert out.returncode == 0, out.stderr
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [e["id"] for e in got] == [STORY[2]["id"], STORY[3]["id"]]
    assert got[0]["data"]["options"] == STORY[2]["data"]["options"]


def test_tail_without_the_token_is_refused_with_a_hint(daemon):
    out = tail(daemon, "--from", "all", token=None)
    assert out.returncode == 1
    assert "HTTP 401" in out.stderr and "--token" in out.stderr


def test_tail_says_connected_and_keeps_its_position_per_endpoint(daemon, tmp_path):
    state = str(tmp_path / "state")
    first = tail(daemon, "--from", "all", "--limit", "2", state=state)
    assert first.returncode == 0, first.stderr
    assert f"connected to {daemon.url} (1 session)" in first.stderr, first.stderr
    saved = list((tmp_path / "state" / "tail").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["url"] == daemon.url
    # a restarted tail starts after what it showed: the third event, not the first
    again = tail(daemon, "--limit", "1", "--json", state=state)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["id"] == STORY[2]["id"]
    assert "resuming 1 session(s)" in again.stderr
    # --no-resume neither reads nor writes it
    fresh = tmp_path / "fresh"
    out = tail(daemon, "--from", "all", "--limit", "1", "--json", "--no-resume", state=str(fresh))
    assert out.returncode == 0 and json.loads(out.stdout)["id"] == STORY[0]["id"]
    assert not fresh.exists()


def test_tail_into_a_pipe_shows_whole_type_names(tmp_path):
    long_type = "x.opencode.session.compaction.summary_written"
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_OTLP_IN": "0"}, token=TOKEN).start()
    try:  # a daemon of its own: the module's one keeps its story
        post(d, [ev(1, long_type, session="ses_tail_long_types", data={"k": "v"})])
        out = tail(d, "--from", "all", "--limit", "1", "--no-resume")
    finally:
        assert d.stop() == 0
    assert out.returncode == 0, out.stderr
    assert f" {long_type} k=v" in out.stdout, out.stdout


def test_tail_without_a_daemon_shows_each_retry(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "AEP_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(console_script() + ["tail", "--url", url], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # bounded: the SDK retries within 0.25 s .. 5 s
            lines.append(line)
            if "attempt 3" in line:
                break
    finally:
        proc.kill()
        proc.wait()
    assert [("attempt 1" in x, "attempt 2" in x, "attempt 3" in x) for x in lines] == \
        [(True, False, False), (False, True, False), (False, False, True)], lines
    assert all(url in x and "retrying" in x for x in lines)


def test_tail_under_a_real_terminal(daemon, tmp_path):
    tmux = require("tmux")
    sock = str(tmp_path / "tmux.sock")
    cmd = " ".join(console_script() + ["tail", "--url", daemon.url, "--from", "all", "--no-resume"])
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
        # the timeline's lines: not the stderr notes, not the date line
        plain = [ln for ln in pane().splitlines()
                 if ln.strip() and not ln.startswith(("aep-bridges tail:", "── "))]
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
