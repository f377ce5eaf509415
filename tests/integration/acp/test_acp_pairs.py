"""Real ACP SDK pairs through the tee, with the real daemon (``AEP_BRIDGE_ACP=1``)
reading what the tees observe, and the protocol's SDK consumer on its stream.

- Python: ``agent-client-protocol==0.12.1`` agent (``peers/py_agent.py``,
  the library's ``Agent`` API) and client (``peers/py_client.py``,
  ``spawn_agent_process``, answering permissions): the client's whole view
  is identical direct and through the tee, for three turns (allowed,
  rejected, cancelled), and the stream shows the mapped story.
- TypeScript: ``@agentclientprotocol/sdk@2.4.0`` (its 2.x ``agent()`` API,
  plain ESM on Node) as the agent behind the tee, driven by the Python
  client; and a TypeScript client (``peers/ts_client.mjs``) that SIGTERMs the
  tee without closing its stdin.
- Fail-open: the daemon killed mid-session changes nothing for the client;
  the tee reconnects to the restarted daemon and delivers what it queued.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import time

from tests.integration.acp.peers.py_client import drive
from tests.support.acp import DAEMON_ENV, py_agent, tee, ts_agent, ts_env
from tests.support.daemon import DaemonProcess, run_daemon
from tests.support.net import free_port
from tests.support.schema import validate_event, validate_stream

ANSWERS = ["allow_once", "reject_once", None]  # allowed, rejected, cancelled


def core(events, session):
    return [e for e in events if e.get("session") == session and not e["type"].startswith("x.")]


def wait_story(col, session, timeout=60.0):
    """Every event of ``session`` once its ``session.ended`` arrived."""
    col.first(lambda e: e.get("session") == session and e["type"] == "session.ended",
              timeout, what=f"session.ended for {session}")
    return [e for e in col.events if e.get("session") == session]


def wait_attached(d: DaemonProcess, n: int, name: str = "acp", timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = d.healthz()["bridges"][name]["counters"]
            if c["tees_attached"] == n:
                return c
        except Exception:  # noqa: BLE001 -- not up yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"never {n} tee(s) attached: {d.healthz()}")


def assert_python_story(events, session="sess-1", exit_reason="normal"):
    """The mapped story of three scripted turns (allowed, rejected, cancelled)."""
    for ev in events:
        validate_event(ev)
    validate_stream(events)
    types = [e["type"] for e in core(events, session)]
    turn = ["run.started", "tool.requested", "attention.requested"]
    assert types == (["session.started"]
                     + turn + ["attention.answered", "attention.resolved", "tool.completed",
                               "run.finished"]
                     + turn + ["attention.answered", "attention.resolved", "tool.failed",
                               "run.finished"]
                     + turn + ["attention.resolved", "tool.failed", "run.cancelled"]
                     + ["session.ended"]), types
    story = core(events, session)
    runs = [e["run"] for e in story if e["type"] == "run.started"]
    assert len(set(runs)) == 3
    answered = [e for e in story if e["type"] == "attention.answered"]
    assert [a["data"] for a in answered] == [{"answer": {"option": "allow_once"}, "via": "oob"},
                                             {"answer": {"option": "reject_once"}, "via": "oob"}]
    asks = [e for e in story if e["type"] == "attention.requested"]
    assert all(a["data"]["kind"] == "permission" and a["data"]["options_count"] == 2 and
               "options" not in a["data"] and "respond_via" not in a["data"] for a in asks)
    resolved = [e for e in story if e["type"] == "attention.resolved"]
    assert [r["data"]["resolution"] for r in resolved] == ["answered", "answered", "dismissed"]
    assert [r["subject"] for r in resolved] == [a["id"] for a in asks]
    assert story[-1]["data"] == {"reason": exit_reason}
    finished = [e for e in story if e["type"] == "run.finished"]
    assert [f["data"] for f in finished] == [{"stop_reason": "end_turn"}] * 2
    vendor = [e for e in events if e.get("session") == session and e["type"].startswith("x.")]
    plans = [e for e in vendor if e["type"] == "x.acp.plan.updated"]
    assert len(plans) == 3 and plans[0]["data"] == {"entries_pending": 3}
    assert all(e.get("severity") == "debug" for e in vendor)
    assert not any(e["type"].endswith(".chunk") for e in vendor)  # deltas off


def test_python_pair_identical_view_and_mapped_story(tmp_path):
    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        col = d.subscribe()
        try:
            direct = asyncio.run(drive(py_agent(), ANSWERS))
            teed = asyncio.run(drive(tee(d.url) + py_agent(), ANSWERS))
            assert teed == direct
            assert len(direct) > 30 and direct[-1] == ["exit", 0]
            events = wait_story(col, "sess-1")
            assert_python_story(events)
            assert {e["agent"] for e in events} == {"acp"}
            usage = [e for e in events if e["type"] == "x.acp.usage.updated"]
            assert usage[0]["data"] == {"context_used_tokens": 1000, "context_size_tokens": 200000}
            c = d.healthz()["bridges"]["acp"]["counters"]
            assert c["tees_seen"] == 1 and c["tee_drops"] == 0 and c["malformed"] == 0
        finally:
            col.close()


def test_python_pair_with_deltas_at_redacted(tmp_path):
    env = {**DAEMON_ENV, "AEP_ACP_DELTAS": "1", "AEP_CAPTURE": "redacted"}
    with run_daemon(tmp_path, env, healthy=True) as d:
        col = d.subscribe()
        try:
            asyncio.run(drive(tee(d.url) + py_agent(), ANSWERS[:1], prompts=["one turn"]))
            events = wait_story(col, "sess-1")
            for ev in events:
                validate_event(ev)
            chunks = [e for e in events if e["type"] == "x.acp.agent.message.chunk"]
            assert [c["data"]["delta"] for c in chunks[:2]] == [
                "Looking at the build", " \u2028 with a line separator."]
            thoughts = [e for e in events if e["type"] == "x.acp.agent.thought.chunk"]
            assert thoughts[0]["data"]["delta"] == "turn 1: thinking about it"
            started = next(e for e in events if e["type"] == "run.started")
            assert started["data"]["prompt"] == "one turn" and started["capture"] == "redacted"
            req = next(e for e in events if e["type"] == "tool.requested")
            assert req["data"]["args_redacted"] == {"command": "pytest -q", "turn": 1}
        finally:
            col.close()


def test_typescript_agent_behind_the_tee_driven_by_the_python_client(tmp_path):
    env = ts_env()
    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        col = d.subscribe()
        try:
            direct = asyncio.run(drive(ts_agent(), ANSWERS, env=env))
            teed = asyncio.run(drive(tee(d.url) + ts_agent(), ANSWERS, env=env))
            assert teed == direct
            events = wait_story(col, "ts-sess-1")
            for ev in events:
                validate_event(ev)
            validate_stream(events)
            types = [e["type"] for e in core(events, "ts-sess-1")]
            assert types.count("run.started") == 3
            assert [t for t in types if t.startswith("run.") and t != "run.started"] == [
                "run.finished", "run.finished", "run.cancelled"]
            assert types.count("tool.completed") == 1 and types.count("tool.failed") == 2
            completed = next(e for e in events if e["type"] == "tool.completed")
            assert completed["data"]["tool"] == {"name": "edit file", "call_id": "ts-call-1"}
            plan = next(e for e in events if e["type"] == "x.acp.plan.updated")
            assert plan["data"] == {"entries_in_progress": 1, "entries_pending": 1}
        finally:
            col.close()


def ts_client(answer: str, command: list[str]) -> tuple[list, str]:
    from tests.support.acp import PEERS, node
    p = subprocess.run([node(), str(PEERS / "ts_client.mjs"), answer, "--", *command],
                       capture_output=True, env={**ts_env(), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return json.loads(p.stdout), p.stderr.decode(errors="replace")


def test_typescript_client_sigterms_the_tee_without_closing_stdin(tmp_path):
    """The TS client kills its agent command with SIGTERM and never closes
    its stdin: the tee forwards it and exits promptly with 128+15, no
    "Fatal Python error", and the story ends (killed)."""
    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        col = d.subscribe()
        try:
            direct, _ = ts_client("allow_once", ts_agent())
            teed, err = ts_client("allow_once", tee(d.url) + ts_agent())
            assert direct[-1] == ["exit", {"code": None, "signal": "SIGTERM"}]
            assert teed[-1] == ["exit", {"code": 143, "signal": None}]  # the tee's 128+N
            assert teed[:-1] == direct[:-1]
            assert "Fatal Python error" not in err and "Traceback" not in err
            events = wait_story(col, "ts-sess-1")
            story = core(events, "ts-sess-1")
            assert [e["type"] for e in story] == [
                "session.started", "run.started", "tool.requested", "attention.requested",
                "attention.answered", "attention.resolved", "tool.completed", "run.finished",
                "session.ended"]
            assert story[-1]["data"] == {"reason": "killed"}
            validate_stream(events)
        finally:
            col.close()


def test_the_daemon_killed_mid_session_changes_nothing_for_the_client(tmp_path):
    """SIGKILL the daemon after turn 1, run turn 2 with no daemon, restart
    it on the same port, then turn 3: the client's view is the direct one;
    the tee reconnected (shared backoff) and the new daemon got turn 2
    from the tee's queue and turn 3 live, under run ids the first daemon
    never saw."""
    port = free_port()
    d = DaemonProcess(tmp_path / "state", {**DAEMON_ENV, "AEP_LISTEN": f"127.0.0.1:{port}"})
    d.start(healthy=True)
    cols = [d.subscribe()]
    first: list[dict] = []

    def between(turn: int) -> None:
        if turn == 1:
            cols[0].first(lambda e: e["type"] == "run.finished", 30)
            cols[0].close()  # (it would resubscribe to the restarted daemon on the same port)
            first.extend(e for e in cols[0].events if e.get("session") == "sess-1")
            d.kill()
        elif turn == 2:
            d.start(healthy=True)
            wait_attached(d, 1)
            cols.append(d.subscribe())

    try:
        direct = asyncio.run(drive(py_agent(), ANSWERS))
        teed = asyncio.run(drive(tee(f"http://127.0.0.1:{port}") + py_agent(), ANSWERS,
                                 between=between))
        assert teed == direct
        # the new daemon's events (its relay also replays the first one's
        # logged history, issue 25 row 9: a later epoch tells them apart)
        old_epoch = max(e["epoch"] for e in first)
        second = [e for e in wait_story(cols[1], "sess-1") if e.get("epoch", 0) > old_epoch]
        runs1 = {e["run"] for e in first if e["type"] == "run.started"}
        runs2 = {e["run"] for e in second if e["type"] == "run.started"}
        assert len(runs1) == 1 and len(runs2) == 2 and runs1.isdisjoint(runs2)
        terminals = [e["type"] for e in second if e["type"] in ("run.finished", "run.cancelled")]
        assert terminals == ["run.finished", "run.cancelled"]
        for ev in second:
            validate_event(ev)
    finally:
        for c in cols:
            c.close()
        d.stop(timeout=10)
