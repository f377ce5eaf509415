"""A restarted ``aep-bridges tail`` against the real daemon (issue 29):
it shows the sessions that began while it was closed (an ask raised then
included), not the old ones it never showed, and goes live; and SIGTERM
or SIGHUP saves its position as Ctrl-C does, so nothing is shown twice."""
from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import DaemonProcess, console_script

TOKEN = "tail-resume-token-0123456789"
_ids = iter(range(1, 1 << 30))


def now(delta_s: float = 0.0) -> str:
    t = datetime.now(timezone.utc) + timedelta(seconds=delta_s)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ev(session: str, seq: int, type_: str = "progress.updated", *, at: str | None = None,
       **kw) -> dict:
    return {"aep": "0.1", "id": f"01JRESUME{next(_ids):017d}", "type": type_,
            "time": at or now(), "source": f"aep://box/agent/my-agent/session/{session}",
            "agent": "my-agent", "session": session, "seq": seq, "epoch": 1, "data": {}, **kw}


def ask(session: str, seq: int, prompt: str, *, at: str | None = None) -> dict:
    return ev(session, seq, "attention.requested", at=at, severity="notice", subject="bash",
              data={"kind": "permission", "prompt": prompt,
                    "options": [{"id": "once"}, {"id": "reject"}]})


def post(daemon: DaemonProcess, events: list[dict]) -> None:
    r = httpx.post(daemon.url + "/events", content="\n".join(json.dumps(e) for e in events),
                   headers={"content-type": "application/x-ndjson", "aep-version": "0.1",
                            "authorization": f"Bearer {TOKEN}"}, timeout=10, trust_env=False)
    assert r.status_code == 202, r.text


class Tail:
    """``aep-bridges tail --json`` as a subprocess: its stdout events and
    stderr lines read by threads, waited on with a deadline."""

    def __init__(self, daemon: DaemonProcess, state: Path, *args: str) -> None:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "AEP_STATE_DIR": str(state),
               "AEP_TOKEN": TOKEN}
        self.proc = subprocess.Popen(console_script() + ["tail", "--url", daemon.url, "--json",
                                                         *args],
                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.events: list[dict] = []
        self.errs: list[str] = []
        self._q: queue.Queue[tuple[str, str]] = queue.Queue()
        for name, pipe in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            threading.Thread(target=self._read, args=(name, pipe), daemon=True).start()

    def _read(self, name: str, pipe) -> None:
        for line in pipe:
            self._q.put((name, line))

    def until(self, done, timeout: float = 30.0) -> None:
        """Read until ``done(self)`` holds; ``AssertionError`` past ``timeout``."""
        deadline = time.monotonic() + timeout
        while not done(self):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out: events {[e['id'] for e in self.events]}, " \
                             f"stderr {self.errs}"
            try:
                name, line = self._q.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if name == "out":
                self.events.append(json.loads(line))
            else:
                self.errs.append(line)

    def stop(self, signum: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def saved_positions(state: Path) -> dict[str, int]:
    files = list((state / "tail").glob("*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    return {p["session"]: p["seq"] for p in doc["positions"]}


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path / "daemon", {"AEP_BRIDGE_OTLP_IN": "0"}, token=TOKEN).start()
    yield d
    assert d.stop() == 0


def test_a_restarted_tail_shows_the_sessions_begun_while_it_was_closed(daemon, tmp_path):
    state = tmp_path / "tail-state"
    # held before the first tail, never shown by it (it starts live): not shown later either
    old = [ev("s-old", 1, at=now(-7200)), ev("s-old", 2, at=now(-7100))]
    post(daemon, old)
    first = Tail(daemon, state)
    try:
        first.until(lambda t: any("connected to" in x for x in t.errs))
        seen = [ev("s1", 1), ev("s1", 2)]
        post(daemon, seen)
        first.until(lambda t: len(t.events) == 2)
    finally:
        assert first.stop() == 0
    assert [e["id"] for e in first.events] == [e["id"] for e in seen]
    assert saved_positions(state) == {"s1": 2}

    # while it is closed: the saved session goes on, new sessions begin, one
    # raises an ask (as respond --pending lists it), and one whose clock is
    # off by a day raises one too (an open ask counts whatever its clock says)
    later = ev("s1", 3)
    s7 = [ev("s7", 1, "session.started"), ev("s7", 2)]
    s8 = [ev("s8", 1, "session.started")]
    s9 = [ev("s9", 1, "session.started"), ask("s9", 2, "may I?")]
    skewed = [ask("s-skew", 1, "from yesterday", at=now(-86400))]
    post(daemon, [later, *s7, *s8, *s9, *skewed])
    pending = subprocess.run(console_script() + ["respond", "--pending", "--url", daemon.url],
                             env={"PATH": "/usr/bin:/bin", "AEP_TOKEN": TOKEN},
                             capture_output=True, text=True, timeout=30)
    assert "session s9" in pending.stdout and "may I?" in pending.stdout, pending

    again = Tail(daemon, state)
    try:
        again.until(lambda t: any("connected to" in x for x in t.errs))
        # then live: an event of the saved session, after what was caught up
        live = ev("s1", 4)
        post(daemon, [live])
        again.until(lambda t: any(e["id"] == live["id"] for e in t.events))
    finally:
        assert again.stop() == 0
    shown = [e["id"] for e in again.events]
    missed = {e["id"] for e in [*s7, *s8, *s9, *skewed]}
    assert len(shown) == len(set(shown)), shown  # nothing twice
    assert set(shown) == missed | {later["id"], live["id"]}, (shown, again.errs)
    assert shown[-1] == live["id"]
    assert not {e["id"] for e in old} & set(shown)
    assert any("4 session(s) not in the saved position" in x for x in again.errs), again.errs
    # each new session from its start, in order
    for story in (s7, s9):
        ids = [e["id"] for e in story]
        assert [i for i in shown if i in ids] == ids
    # the caught-up sessions are in the position now: a third tail shows nothing again
    assert saved_positions(state) == {"s1": 4, "s7": 2, "s8": 1, "s9": 2, "s-skew": 1}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_save_the_position_as_ctrl_c_does(daemon, tmp_path, signum):
    state = tmp_path / "tail-state"
    story = [ev("s6", 1, "session.started"), ev("s6", 2), ev("s6", 3, "run.finished")]
    post(daemon, story)
    first = Tail(daemon, state, "--from", "all")
    try:
        first.until(lambda t: len(t.events) == len(story))
    finally:
        assert first.stop(signum) == 0
    assert saved_positions(state) == {"s6": 3}
    # the next tail shows what came after, nothing twice
    after = ev("s6", 4)
    post(daemon, [after])
    again = Tail(daemon, state)
    try:
        again.until(lambda t: len(t.events) >= 1)
    finally:
        again.stop()
    assert [e["id"] for e in again.events] == [after["id"]]
