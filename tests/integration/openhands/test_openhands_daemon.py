"""The nine OpenHands scenarios end to end: the REAL ``openhands-agent-server``
(PyPI, pinned), the daemon (``aep-bridges run``, its own process, the
embedded relay), the SDK consumer (``aep_sdk.subscribe`` on ``/stream``) and
the SDK ``ControlClient`` through the relay.

One agent server for the module. Scenarios 1-7 share one gated-on daemon
and one SDK reader (every assertion is scoped to the test's own
conversation ids); scenario 8 restarts its own daemon; scenario 9 runs one
with a wrong key. The ``aep_sdk`` clients are thread-based by design; the
blocking ControlClient calls are handed to a worker thread with
``trio.to_thread.run_sync``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from bridges.core.statefile import StateFile
from tests.support.daemon import Collector, command
from tests.support.openhands import (
    AgentClient,
    AgentServer,
    OpenHandsDaemon,
    dead_url,
    model_and_client,
    require_agent_server,
    run_wound_down,
    server_posts,
)
from tests.support.schema import validated

pytestmark = pytest.mark.vendor


@pytest.fixture(scope="module")
def server():
    srv = AgentServer(require_agent_server()).start()
    yield srv
    srv.cleanup()


@pytest.fixture(scope="module")
def daemon(server, tmp_path_factory):
    d = OpenHandsDaemon(server, tmp_path_factory.mktemp("oh-daemon") / "state",
                        {"AEP_OPENHANDS_CONTROL": "1", "AEP_CAPTURE": "redacted"}).start()
    yield d
    status = d.stop()
    assert status == 0, d.log()


@pytest.fixture(scope="module")
def stream(daemon):
    reader = daemon.subscribe()
    yield reader
    reader.close()


async def until_status(stream: Collector, cid: str, status: str, timeout: float = 60) -> dict:
    """The state.delta that carried the flip to ``status`` (the last one)."""
    def find(s: Collector):
        flips = [e for e in s.of(cid, "state.delta") if (e.get("data") or {}).get("key") == "execution_status"
                 and (e["data"].get("delta") or [{}])[0].get("value") == status]
        return flips[-1] if flips else None
    return await stream.wait_for(find, timeout, f"{cid[:8]} -> {status}")


def kinds(evs: list[dict]) -> list[str]:
    return [e["type"] for e in evs]


# --------------------------------------------------------------------------- 1 and 4

async def test_1_and_4_new_conversation_observed_and_vendor_side_approval(server, daemon, stream):
    """1: a conversation created after the daemon started is discovered and
    observed, run.started ... run.finished from the real status facts.
    4: approved on the vendor side directly: observed, no control claim."""
    async with model_and_client(server) as (mock, vendor):
        cid = await vendor.create()
        await stream.wait_for(lambda s: s.of(cid, "session.started"), what="session.started")
        await vendor.say(cid, "list the files [mark]")
        req = (await stream.wait_for(lambda s: s.of(cid, "attention.requested")))[0]
        await stream.wait_for(lambda s: run_wound_down(s.of(cid)), what="the vendor's run wound down")
        await vendor.confirm(cid)
        await stream.wait_for(lambda s: s.of(cid, "run.finished"), what="run.finished")
    evs = validated(stream.of(cid))
    t = kinds(evs)
    assert t[0] == "session.started" and evs[0]["agent"] == "openhands"
    assert evs[0]["source"].endswith(f"/agent/openhands/session/{cid}")
    assert t.index("run.started") < t.index("attention.requested") < t.index("attention.resolved") \
        < t.index("tool.completed") < t.index("run.finished")
    assert req["data"]["options"] == [{"id": "approve", "label": "Approve"}, {"id": "deny", "label": "Deny"}]
    res = stream.of(cid, "attention.resolved")[0]
    assert res["subject"] == req["id"] and res["data"]["resolution"] == "answered"
    assert not stream.of(cid, "attention.answered"), "the vendor-side approval is observed, never claimed"
    assert not any(e["type"].startswith("control.") for e in evs)
    assert all(p.endswith(("/events", "/respond_to_confirmation")) for p in server_posts(server, cid))


# --------------------------------------------------------------------------- 2 and 3

async def test_2_approve_over_aep(server, daemon, stream):
    async with model_and_client(server) as (mock, vendor):
        cid = await vendor.create()
        await vendor.say(cid, "list the files [mark]")
        req = (await stream.wait_for(lambda s: s.of(cid, "attention.requested")))[0]
        verdict, ack = await command(daemon, "control.attention.respond", cid, subject=req["id"],
                                     cause=req["id"], data={"answer": {"option": "approve"}})
        assert verdict == "accepted", ack
        await stream.wait_for(lambda s: s.of(cid, "run.finished"))
    evs = validated(stream.of(cid))
    cmd_id = ack["cause"]
    ans, res = stream.of(cid, "attention.answered")[0], stream.of(cid, "attention.resolved")[0]
    assert ans["cause"] == res["cause"] == cmd_id and ans["subject"] == res["subject"] == req["id"]
    assert ans["data"] == {"answer": {"option": "approve"}, "via": "control"}
    done = [e for e in stream.of(cid, "tool.completed") if e["subject"] == "terminal"]
    assert done and done[0]["data"]["result_redacted"] == "aep-mock-ran"  # the command really ran
    t = kinds(evs)
    assert t.index("control.accepted") < t.index("attention.answered") < t.index("tool.completed")


async def test_3_deny_over_aep_with_text(server, daemon, stream):
    async with model_and_client(server) as (mock, vendor):
        cid = await vendor.create()
        await vendor.say(cid, "list the files [mark]")
        req = (await stream.wait_for(lambda s: s.of(cid, "attention.requested")))[0]
        verdict, ack = await command(daemon, "control.attention.respond", cid, subject=req["id"],
                                     data={"answer": {"text": "use the staging box instead"}},
                                     capture="redacted")
        assert verdict == "accepted", ack
        rej = await stream.wait_for(lambda s: s.of(cid, "x.openhands.user_reject.observation"))
        await stream.wait_for(lambda s: s.of(cid, "run.finished"))
    validated(stream.of(cid))
    assert rej[0]["data"]["reason"] == "use the staging box instead"  # the vendor's own rejection
    assert rej[0]["severity"] == "debug" and rej[0]["subject"] == "terminal"
    assert not stream.of(cid, "tool.denied"), "a user rejection is not a policy block"
    ans = stream.of(cid, "attention.answered")[0]
    assert ans["data"]["answer"] == {"option": "deny", "text": "use the staging box instead"}
    assert not [e for e in stream.of(cid, "tool.completed") if e["subject"] == "terminal"]


# --------------------------------------------------------------------------- 5

async def test_5_pause_resume_and_refusals(server, daemon, stream):
    """Pause while running and resume: accepted, the flips cause-linked (on a
    conversation without confirmation: under AlwaysConfirm the vendor's
    in-flight step lands waiting_for_confirmation, see the in-process test).
    Pause from idle, resume from idle and from waiting_for_confirmation:
    refused, and the vendor receives no write."""
    async with model_and_client(server) as (mock, vendor):
        idle = await vendor.create()
        await stream.wait_for(lambda s: s.of(idle, "state.snapshot"), what="attached")
        with trio.fail_after(10):
            while True:  # the daemon's view of the status settles after the connect snapshot
                v = await command(daemon, "control.pause", idle)
                if v[0] == "refused" and "idle" in (v[1] or ""):
                    break
                await trio.sleep(0.2)
        refused_resume = await command(daemon, "control.resume", idle)
        assert server_posts(server, idle) == []

        waiting = await vendor.create()
        await vendor.say(waiting, "list the files [mark]")
        req = (await stream.wait_for(lambda s: s.of(waiting, "attention.requested")))[0]
        posts = server_posts(server, waiting)
        refused_waiting = await command(daemon, "control.resume", waiting)
        assert server_posts(server, waiting) == posts

        cid = await vendor.create(confirm=False)
        await vendor.say(cid, "wait for me [hold]")
        await until_status(stream, cid, "running")
        await mock.wait_held()
        paused = await command(daemon, "control.pause", cid)
        assert paused[0] == "accepted", paused
        await until_status(stream, cid, "paused")
        mock.release()
        await stream.wait_for(lambda s: s.of(cid, "tool.completed"), what="the in-flight step")
        with trio.fail_after(20):
            while await vendor.status(cid) != "paused":
                await trio.sleep(0.1)
        await trio.sleep(0.5)
        resumed = await command(daemon, "control.resume", cid)
        assert resumed[0] == "accepted", resumed
        await stream.wait_for(lambda s: s.of(cid, "run.finished"))
        await vendor.confirm(waiting)
    assert refused_resume[0] == "refused" and "idle" in refused_resume[1]
    assert refused_waiting[0] == "refused" and "control.attention.respond" in refused_waiting[1]
    assert req["data"]["respond_via"] == ["control"]
    evs = validated(stream.of(cid))
    causes = {e.get("cause") for e in evs if e["type"] == "state.delta"
              and e["data"].get("key") == "execution_status"}
    assert paused[1]["cause"] in causes and resumed[1]["cause"] in causes
    assert [e["type"] for e in evs if e["type"].startswith("run.")] == ["run.started", "run.finished"]
    assert server_posts(server, cid) == [f"/api/conversations/{cid}/events", f"/api/conversations/{cid}/pause",
                                         f"/api/conversations/{cid}/run"]


# --------------------------------------------------------------------------- 6

async def test_6_send_input_and_interrupt(server, daemon, stream):
    async with model_and_client(server) as (mock, vendor):
        cid = await vendor.create()
        await stream.wait_for(lambda s: s.of(cid, "state.snapshot"), what="attached")
        sent = await command(daemon, "x.openhands.control.send_input", cid,
                             data={"text": "remember the release notes"}, capture="redacted")
        assert sent[0] == "accepted", sent
        out = await stream.wait_for(lambda s: s.of(cid, "x.openhands.input.sent"))
        user_msgs = await stream.wait_for(lambda s: [m for m in s.of(cid, "x.openhands.message.event")
                                                     if m["data"].get("role") == "user"])
        assert await vendor.status(cid) == "idle", "run pinned false: the input never starts work"
        await vendor.say(cid, "wait for me [hold]")
        await until_status(stream, cid, "running")
        await mock.wait_held()
        intr = await command(daemon, "x.openhands.control.interrupt", cid)
        assert intr[0] == "accepted", intr
        flip = await until_status(stream, cid, "paused")
        await stream.wait_for(lambda s: s.of(cid, "x.openhands.interrupt.event"))
        mock.release()
    validated(stream.of(cid))
    assert out[0]["cause"] == sent[1]["cause"] and "data" not in out[0]
    assert "remember the release notes" not in json.dumps(out)
    assert user_msgs[0]["data"]["content"] == "remember the release notes"  # the vendor's own message
    assert flip["cause"] == intr[1]["cause"]
    assert not stream.of(cid, "run.cancelled"), "interrupt is a resumable pause, never a cancel"


# --------------------------------------------------------------------------- 7

async def test_7_model_unreachable(server, daemon, stream):
    vendor = AgentClient(server, dead_url())
    cid = await vendor.create()
    await vendor.say(cid, "list the files [mark]")
    await stream.wait_for(lambda s: s.of(cid, "run.failed") and s.of(cid, "error.raised"))
    validated(stream.of(cid))
    assert stream.of(cid, "run.failed")[0]["data"] == {"reason": "error"}
    err = stream.of(cid, "error.raised")[0]
    assert err["data"]["code"] == "LLMServiceUnavailableError" and "Connection error" in err["data"]["error"]["message"]


# --------------------------------------------------------------------------- 8

@pytest.mark.parametrize("layout", ["journal", "old layout"])
async def test_8_daemon_restarted_mid_conversation(server, tmp_path, layout):
    """The daemon stopped (SIGTERM) while a confirmation is pending and the
    vendor moves on meanwhile; restarted on the same state dir it reattaches
    (since-replay): no duplicate on the stream, no dangling run or attention;
    the open run and ask are re-announced first (review of issue 8, finding 1).
    ``old layout``: the state the first daemon left is rewritten, while it
    is stopped, as the previous release kept it (a file per conversation):
    the restarted daemon carries it over and behaves the same."""
    d = OpenHandsDaemon(server, tmp_path / "state", {"AEP_OPENHANDS_CONTROL": "1"})
    await trio.to_thread.run_sync(d.start)
    reader = d.subscribe()
    try:
        async with model_and_client(server) as (mock, vendor):
            cid = await vendor.create()
            await vendor.say(cid, "list the files [mark]")
            req = (await reader.wait_for(lambda s: s.of(cid, "attention.requested")))[0]
            await reader.wait_for(lambda s: run_wound_down(s.of(cid)), what="the vendor's run wound down")
            await trio.sleep(1)
            before = reader.of(cid)
            reader.close()
            assert await trio.to_thread.run_sync(d.stop) == 0, d.log()
            assert cid in openhands_state(tmp_path / "state")
            if layout == "old layout":
                to_old_layout(tmp_path / "state")
            await vendor.confirm(cid)  # nobody observes this
            with trio.fail_after(30):
                while await vendor.status(cid) != "finished":
                    await trio.sleep(0.2)
            await trio.to_thread.run_sync(d.start)
            reader = d.subscribe()
            await reader.wait_for(lambda s: s.of(cid, "run.finished"), what="run.finished after the restart")
            await trio.sleep(1.5)
        # the restarted relay replays the session's logged history (issue 25
        # row 9), and the daemon re-announces from its state file the open
        # run and the pending ask: the very envelopes (same id, epoch, seq)
        evs = reader.of(cid)
        before_ids = {e["id"] for e in before}
        by_id = {e["id"]: e for e in before}
        again = [e for e in evs if e["id"] in before_ids]
        assert all(e == by_id[e["id"]] for e in again)
        assert {e["id"] for e in again} >= {
            e["id"] for e in before if e["type"] in ("run.started", "attention.requested")}
        evs = [e for e in evs if e["id"] not in before_ids]
        validated(before + evs)
        assert not [e for e in evs if e["type"] == "session.started"]
        seen = {e["data"]["vendor_event_id"] for e in before if "vendor_event_id" in (e.get("data") or {})}
        dup = [e for e in evs if (e.get("data") or {}).get("vendor_event_id") in seen]
        assert not dup, dup
        assert [e["subject"] for e in evs if e["type"] == "attention.resolved"] == [req["id"]]
        run_id = [e for e in before if e["type"] == "run.started"][0]["run"]
        assert [e["run"] for e in evs if e["type"] == "run.finished"] == [run_id]
        assert min(e["epoch"] for e in evs) > max(e["epoch"] for e in before)
        assert openhands_state(tmp_path / "state")[cid]["status"] == "finished"
        assert [p.name for p in (tmp_path / "state" / "openhands").iterdir() if p.is_dir()] == []
    finally:
        reader.close()
        d.stop()


def openhands_state(state: Path) -> dict:
    """The OpenHands conversations' entries in the daemon's state directory
    (one document + journal per agent server, bridges/core/statefile.py)."""
    docs = {p.with_name(p.name.removesuffix(".journal")) for p in (state / "openhands").glob("*.json*")}
    assert len(docs) == 1, docs  # one agent server
    doc = StateFile(docs.pop()).load()
    return doc["sessions"] if isinstance(doc, dict) else {}


def to_old_layout(state: Path) -> None:
    """Rewrite the OpenHands state as the previous release kept it:
    ``openhands/{server}/{cid}.json`` each, no document, no journal."""
    entries = openhands_state(state)
    for p in list((state / "openhands").glob("*.json*")):
        server = p.name.partition(".json")[0]
        p.unlink()
    for cid, entry in entries.items():
        old = state / "openhands" / server / f"{cid}.json"
        old.parent.mkdir(exist_ok=True)
        old.write_text(json.dumps(entry))


# --------------------------------------------------------------------------- 9

async def test_9_wrong_key(server, tmp_path):
    """A clear log line (once, naming the setting, never the key),
    /healthz source false, and backoff (it keeps retrying)."""
    d = OpenHandsDaemon(server, tmp_path / "state",
                        {"AEP_OPENHANDS_SESSION_API_KEY": "not-the-key-at-all"})
    await trio.to_thread.run_sync(lambda: d.start(healthy=False))
    try:
        with trio.fail_after(30):
            while (d.healthz()["bridges"]["openhands"].get("counters") or {}).get("search_errors", 0) < 3:
                await trio.sleep(0.2)
        body = d.healthz()
        oh = body["bridges"]["openhands"]
        assert oh["source"] is False and oh["ok"] is False and body["ok"] is False
        assert oh["control"] is False
        log = d.log()
        lines = [ln for ln in log.splitlines() if "refused the session API key" in ln]
        assert len(lines) == 1 and "AEP_OPENHANDS_SESSION_API_KEY" in lines[0]
        assert "not-the-key-at-all" not in log
    finally:
        assert d.stop() == 0
