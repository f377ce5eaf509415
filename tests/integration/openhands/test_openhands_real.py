"""The OpenHands bridge in-process (a real ``BridgeContext``; the test plays the
relay) against the REAL ``openhands-agent-server`` (PyPI, pinned in
``tests/support/openhands.py``) and the mock chat-completions model.

One server for the module; every test creates its own conversations (their
ids scope every assertion). The test's own REST calls drive the vendor the
way a user of the server would (create, send a message, approve on the
vendor side); the bridge's writes are only ever the five gated ones, and the
server's own access log is read to prove which POSTs it received.
"""
from __future__ import annotations

import logging
import re

import pytest
import trio

from bridges.openhands.control import RETRIES
from tests.support.openhands import (
    AgentClient,
    AgentServer,
    MockModel,
    Rig,
    dead_url,
    model_and_client,
    require_agent_server,
    run_wound_down,
    server_posts,
)
from tests.support.schema import validate_event, validated

pytestmark = pytest.mark.vendor
TOKEN = "test-token-0123456789"


@pytest.fixture(scope="module")
def server():
    srv = AgentServer(require_agent_server()).start()
    yield srv
    srv.cleanup()


def bridge_env(server: AgentServer, tmp_path, *, control: bool = False, key: str | None = None,
               **extra: str) -> dict[str, str]:
    env = {"AEP_OPENHANDS_URL": server.url,
           "AEP_OPENHANDS_SESSION_API_KEY": key if key is not None else server.key,
           "AEP_OPENHANDS_POLL": "0.5", "AEP_STATE_DIR": str(tmp_path / "state")}
    if control:
        env.update({"AEP_OPENHANDS_CONTROL": "1", "AEP_TOKEN": TOKEN})
    env.update(extra)
    return env


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


async def wait_status(rig: Rig, cid: str, status: str, timeout: float = 60) -> None:
    with trio.fail_after(timeout):
        while True:
            conv = rig.receiver.conversations.get(cid) if rig.receiver else None
            if conv is not None and conv.status == status:
                return
            await trio.sleep(0.05)


# --------------------------------------------------------------------------- observe (gate off)

async def test_discovers_a_new_conversation_and_synthesizes_the_run(server, tmp_path):
    """Scenario 1 (in-process): a conversation created after the bridge started
    is discovered; run.started ... run.finished from the real status facts;
    the confirmation is observed read-only (no options, no respond path) and
    approved on the vendor side (scenario 4: observed, no control claim)."""
    rig = Rig(bridge_env(server, tmp_path))
    async with model_and_client(server, rig) as (mock, vendor):
        cid = await vendor.create()
        await rig.wait(lambda e: rig.of(cid, "session.started"), what="session.started")
        await vendor.say(cid, "list the files [mark]")
        req = await rig.wait(lambda e: rig.of(cid, "attention.requested"), what="attention.requested")
        await rig.wait(lambda e: run_wound_down(rig.of(cid)), what="the vendor's run wound down")
        await vendor.confirm(cid)
        await rig.wait(lambda e: rig.of(cid, "run.finished"), what="run.finished")
        evs = validated(rig.of(cid))
    t = types(evs)
    assert t[0] == "session.started" and evs[0]["data"]["client"] == {"name": "openhands-agent-server"}
    assert t.index("run.started") < t.index("tool.requested") < t.index("attention.requested") \
        < t.index("attention.resolved") < t.index("tool.completed") < t.index("run.finished")
    run_id = rig.of(cid, "run.started")[0]["run"]
    assert run_id == f"run:{cid}:1"
    assert all(e.get("run") == run_id for e in evs if e["type"].startswith(("tool.", "attention.")))
    r = req[0]
    assert r["data"]["kind"] == "permission" and "options" not in r["data"] and "respond_via" not in r["data"]
    res = rig.of(cid, "attention.resolved")[0]
    assert res["subject"] == r["id"] and res["data"]["resolution"] == "answered"
    assert not rig.of(cid, "attention.answered"), "a vendor-side approval makes no control claim"
    tool_req = [e for e in rig.of(cid, "tool.requested") if e["subject"] == "terminal"][0]
    assert tool_req["step"].startswith("chatcmpl-aep-") and tool_req["data"]["tool"]["name"] == "terminal"
    done = [e for e in rig.of(cid, "tool.completed") if e["subject"] == "terminal"][0]
    assert "T" in done["data"]["vendor_ts"] and not done["data"]["vendor_ts"].endswith("Z")
    assert done["time"].endswith("Z")  # receive time, RFC 3339 UTC; the naive vendor time rides at data
    vendor_ids = [e["data"]["vendor_event_id"] for e in evs if "vendor_event_id" in (e.get("data") or {})]
    assert len(vendor_ids) == len(set(vendor_ids)), "a vendor event mapped twice"
    assert rig.health.public()["source"] is True


async def test_gate_off_declares_nothing_and_writes_nothing(server, tmp_path):
    """Gated off: accepts [] and every command is nacked unsupported; the
    server's own access log shows no POST for the conversation but the
    test's own."""
    rig = Rig(bridge_env(server, tmp_path))
    assert rig.bridge.capabilities()["control"] == {"accepts": [], "ack_window_ms": 10000}
    async with model_and_client(server, rig) as (mock, vendor):
        cid = await vendor.create()
        await vendor.say(cid, "wait for me [hold]")
        await wait_status(rig, cid, "running")
        await mock.wait_held()
        before = server_posts(server, cid)
        for t in ("control.pause", "x.openhands.control.interrupt", "x.openhands.control.send_input"):
            cmd = await rig.command(t, cid, data={"text": "hi"} if "send_input" in t else {})
            ack = await rig.ack_for(cmd)
            assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "unsupported"
        mock.release()
        req = await rig.wait(lambda e: rig.of(cid, "attention.requested"))
        cmd = await rig.command("control.attention.respond", cid, subject=req[0]["id"],
                                data={"answer": {"option": "approve"}})
        assert (await rig.ack_for(cmd))["data"]["reason"] == "unsupported"
        await trio.sleep(1)
        assert server_posts(server, cid) == before == [f"/api/conversations/{cid}/events"]
        assert rig.receiver.conversations[cid].status == "waiting_for_confirmation"


async def test_first_attach_replays_the_history(server, tmp_path):
    """A conversation that ran to the end before the bridge started: the
    first attach (resend_mode=all) replays it and the run is synthesized
    from the replayed status facts, not from the connect snapshot."""
    async with trio.open_nursery() as n:
        mock = MockModel()
        await n.start(mock.serve)
        vendor = AgentClient(server, mock.url)
        cid = await vendor.create()
        await vendor.say(cid, "just talk [chat]")
        with trio.fail_after(60):
            while await vendor.status(cid) != "finished":
                await trio.sleep(0.2)
        rig = Rig(bridge_env(server, tmp_path))
        await n.start(rig.run)
        await rig.wait(lambda e: rig.of(cid, "run.finished"), what="the replayed run")
        await trio.sleep(1)
        evs = validated(rig.of(cid))
        n.cancel_scope.cancel()
    t = types(evs)
    assert t[:2] == ["session.started", "state.snapshot"]
    assert t.count("run.started") == 1 and t.count("run.finished") == 1
    assert t.index("run.started") < t.index("run.finished")
    msgs = [e for e in evs if e["type"] == "x.openhands.message.event"]
    assert [m["data"]["role"] for m in msgs] == ["user", "assistant"]
    assert all(m["severity"] == "debug" for m in msgs)


async def test_deltas_only_with_the_opt_in(server, tmp_path):
    """A streaming model makes the real server publish StreamingDeltaEvent;
    they map only with AEP_OPENHANDS_DELTAS=1."""
    off = Rig(bridge_env(server, tmp_path / "off"))
    on = Rig(bridge_env(server, tmp_path / "on", AEP_OPENHANDS_DELTAS="1"))
    async with model_and_client(server, off, on) as (mock, vendor):
        cid = await vendor.create(stream=True)
        await on.wait(lambda e: on.of(cid, "session.started") and off.of(cid, "session.started"))
        await vendor.say(cid, "just talk [chat]")
        await on.wait(lambda e: on.of(cid, "run.finished"))
        await off.wait(lambda e: off.of(cid, "run.finished"))
    assert len(on.of(cid, "x.openhands.streaming.delta")) >= 1
    assert not off.of(cid, "x.openhands.streaming.delta")
    # same everything else (state.* differ only by each socket's own connect snapshot)
    def core(evs):
        return [e["type"] for e in evs if not e["type"].startswith(("state.", "x.openhands.streaming."))]
    assert core(on.of(cid)) == core(off.of(cid))


async def test_model_unreachable_fails_the_run(server, tmp_path):
    """Scenario 7 (in-process): run.failed {reason: error} and error.raised."""
    rig = Rig(bridge_env(server, tmp_path))
    async with trio.open_nursery() as n:
        await n.start(rig.run)
        vendor = AgentClient(server, dead_url())
        cid = await vendor.create()
        await vendor.say(cid, "list the files [mark]")
        await rig.wait(lambda e: rig.of(cid, "run.failed"), what="run.failed")
        await rig.wait(lambda e: rig.of(cid, "error.raised"), what="error.raised")
        validated(rig.of(cid))
        n.cancel_scope.cancel()
    failed = rig.of(cid, "run.failed")[0]
    assert failed["data"] == {"reason": "error"} and failed["severity"] == "error"
    err = rig.of(cid, "error.raised")[0]
    assert err["data"]["code"] == "LLMServiceUnavailableError" and "error" not in err["data"]


async def test_deleted_conversation_ends_the_session(server, tmp_path):
    """The real server deletes without broadcasting ``deleting``; the vanish
    from search (confirmed 404) closes the session: run cancelled, attention
    dismissed, session.ended killed."""
    rig = Rig(bridge_env(server, tmp_path))
    async with model_and_client(server, rig) as (mock, vendor):
        cid = await vendor.create()
        await vendor.say(cid, "list the files [mark]")
        await rig.wait(lambda e: rig.of(cid, "attention.requested"))
        (await vendor.http.delete(f"/api/conversations/{cid}")).raise_for_status()
        await rig.wait(lambda e: rig.of(cid, "session.ended"), what="session.ended")
        evs = validated(rig.of(cid))
    t = types(evs)
    assert t[-3:] == ["attention.resolved", "run.cancelled", "session.ended"]
    assert evs[-3]["data"]["resolution"] == "dismissed"
    # run.cancelled.reason is [redacted] (AEP-0002 §5.3): gone at the metadata ceiling
    assert "data" not in evs[-2] and evs[-1]["data"] == {"reason": "killed"}
    assert cid not in rig.receiver.conversations


async def test_wrong_key_is_a_clear_line_and_source_false(server, tmp_path, caplog):
    """Scenario 9 (in-process): the key never appears in the log."""
    caplog.set_level(logging.INFO)
    rig = Rig(bridge_env(server, tmp_path, key="definitely-wrong-key"))
    async with trio.open_nursery() as n:
        await n.start(rig.run)
        with trio.fail_after(20):
            while rig.health.counters.get("search_errors", 0) < 2:
                await trio.sleep(0.1)
        n.cancel_scope.cancel()
    assert rig.health.public()["source"] is False
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("aep.bridge.openhands")]
    assert sum("refused the session API key" in m for m in lines) == 1, lines
    assert "AEP_OPENHANDS_SESSION_API_KEY" in next(m for m in lines if "refused" in m)
    assert not any("definitely-wrong-key" in r.getMessage() for r in caplog.records)
    assert not rig.events


# --------------------------------------------------------------------------- the gate on

async def test_approve_over_control(server, tmp_path):
    """Scenario 2 (in-process): respond approve -> accepted, the command runs,
    answered + resolved cause-linked to the command, the tool events follow."""
    rig = Rig(bridge_env(server, tmp_path, control=True))
    assert rig.bridge.capabilities()["control"]["accepts"] == [
        "control.attention.respond", "control.pause", "control.resume",
        "x.openhands.control.send_input", "x.openhands.control.interrupt"]
    async with model_and_client(server, rig) as (mock, vendor):
        cid = await vendor.create()
        await vendor.say(cid, "list the files [mark]")
        req = (await rig.wait(lambda e: rig.of(cid, "attention.requested")))[0]
        assert req["data"]["options"] == [{"id": "approve", "label": "Approve"}, {"id": "deny", "label": "Deny"}]
        assert req["data"]["respond_via"] == ["control"]
        # the wrong subject is refused and writes nothing
        bad = await rig.command("control.attention.respond", cid, subject="not-the-request",
                                data={"answer": {"option": "approve"}})
        assert (await rig.ack_for(bad))["data"]["reason"] == "refused"
        cmd = await rig.command("control.attention.respond", cid, subject=req["id"],
                                data={"answer": {"text": "  APPROVE "}})
        ack = await rig.ack_for(cmd)
        assert ack["type"] == "control.accepted"
        await rig.wait(lambda e: rig.of(cid, "run.finished"))
        evs = validated(rig.of(cid))
        # one write, and one more for each time the bridge saw the vendor drop it (a
        # snapshot while still waiting: under load the status can trail the snapshot;
        # a repeat is a no-op for the vendor) -- each rewrite's request logged too
        path = f"/api/conversations/{cid}/events/respond_to_confirmation"
        with trio.fail_after(30):
            while True:
                rewrites = rig.health.counters.get("control_respond_rewritten", 0)
                posts = [p for p in server_posts(server, cid) if "confirmation" in p]
                if len(posts) >= 1 + rewrites:
                    break
                await trio.sleep(0.1)
    assert posts == [path] * (1 + rewrites) and rewrites <= RETRIES
    ans, res = rig.of(cid, "attention.answered")[0], rig.of(cid, "attention.resolved")[0]
    assert ans["cause"] == res["cause"] == cmd["id"]
    assert ans["subject"] == res["subject"] == req["id"]
    assert ans["data"] == {"answer": {"option": "approve"}, "via": "control"}
    assert res["data"]["resolution"] == "answered"
    t = types(evs)
    assert t.index("control.accepted") < t.index("attention.answered") < t.index("attention.resolved") \
        < t.index("tool.completed")
    assert mock.requests and any(m.get("role") == "tool" for m in mock.requests[-1]["messages"])


async def test_deny_over_control_with_text(server, tmp_path):
    """Scenario 3 (in-process): unmatched text denies with the text as the
    reason (AEP-0008); the vendor's user rejection maps per the record; the
    run closes when the status lands on idle."""
    rig = Rig(bridge_env(server, tmp_path, control=True, AEP_CAPTURE="redacted"))
    async with model_and_client(server, rig) as (mock, vendor):
        cid = await vendor.create()
        await vendor.say(cid, "list the files [mark]")
        req = (await rig.wait(lambda e: rig.of(cid, "attention.requested")))[0]
        cmd = await rig.command("control.attention.respond", cid, subject=req["id"],
                                data={"answer": {"text": "Not on this machine, please."}})
        assert (await rig.ack_for(cmd))["type"] == "control.accepted"
        rej = await rig.wait(lambda e: rig.of(cid, "x.openhands.user_reject.observation"))
        await rig.wait(lambda e: rig.of(cid, "run.finished"))
        validated(rig.of(cid))
    ans = rig.of(cid, "attention.answered")[0]
    assert ans["data"]["answer"] == {"option": "deny", "text": "Not on this machine, please."}
    assert ans["cause"] == cmd["id"]
    assert rej[0]["data"]["reason"] == "Not on this machine, please."  # the vendor got our reason
    assert rig.of(cid, "run.finished")[0]["data"] == {"reason": "idle"}
    assert not rig.of(cid, "tool.completed")


async def test_pause_resume_and_the_refusals(server, tmp_path):
    """Scenario 5 (in-process). Refused with no write to the vendor: pause
    and resume from idle, resume from waiting_for_confirmation (the detail
    names the respond verb). Accepted and cause-linked: pause while running.
    Real-server facts this pins: the vendor flips to paused at once but the
    in-flight step still completes, so a resume sent before it has is
    refused BY THE VENDOR (409 -> refused, its detail carried), and under
    AlwaysConfirm the completed step lands waiting_for_confirmation (where
    resume is ours to refuse). The resumable pause -> resume -> finish is
    exercised on a conversation without confirmation."""
    rig = Rig(bridge_env(server, tmp_path, control=True, AEP_CAPTURE="redacted"))  # nack details ride
    async with model_and_client(server, rig) as (mock, vendor):
        cid = await vendor.create()
        await wait_status(rig, cid, "idle")
        for t in ("control.pause", "control.resume", "x.openhands.control.interrupt"):
            ack = await rig.ack_for(await rig.command(t, cid))
            assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "refused"
            assert "idle" in ack["data"]["detail"]
        assert server_posts(server, cid) == []
        await vendor.say(cid, "wait for me [hold]")
        await wait_status(rig, cid, "running")
        await mock.wait_held()
        pause = await rig.command("control.pause", cid)
        assert (await rig.ack_for(pause))["type"] == "control.accepted"
        await wait_status(rig, cid, "paused")
        early = await rig.command("control.resume", cid)
        early_ack = await rig.ack_for(early)
        assert early_ack["type"] == "control.rejected" and early_ack["data"]["reason"] == "refused"
        mock.release()
        await wait_status(rig, cid, "waiting_for_confirmation")
        posts = server_posts(server, cid)
        waiting = await rig.command("control.resume", cid)
        ack = await rig.ack_for(waiting)
        assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "refused"
        assert server_posts(server, cid) == posts, "a refused command wrote to the vendor"
        req = rig.of(cid, "attention.requested")[-1]
        await rig.ack_for(await rig.command("control.attention.respond", cid, subject=req["id"],
                                            data={"answer": {"option": "approve"}}))
        await rig.wait(lambda e: rig.of(cid, "run.finished"))
        evs = validated(rig.of(cid))

        # the resumable pause, on a conversation that does not confirm
        mock.rearm()
        cid2 = await vendor.create(confirm=False)
        await vendor.say(cid2, "wait for me [hold]")
        await wait_status(rig, cid2, "running")
        await mock.wait_held()
        pause2 = await rig.command("control.pause", cid2)
        assert (await rig.ack_for(pause2))["type"] == "control.accepted"
        await wait_status(rig, cid2, "paused")
        mock.release()
        await rig.wait(lambda e: rig.of(cid2, "tool.completed"), what="the in-flight step")
        await trio.sleep(0.5)
        assert rig.receiver.conversations[cid2].status == "paused"
        resume = await rig.command("control.resume", cid2)
        assert (await rig.ack_for(resume))["type"] == "control.accepted"
        await rig.wait(lambda e: rig.of(cid2, "run.finished"))
        evs2 = validated(rig.of(cid2))
    flips = [e for e in evs if e["type"] == "state.delta" and e["data"].get("key") == "execution_status"]
    assert [f for f in flips if f.get("cause") == pause["id"]], "the paused flip is cause-linked"
    assert "HTTP 409" in early_ack["data"]["detail"]
    assert posts == [f"/api/conversations/{cid}/events", f"/api/conversations/{cid}/pause",
                     f"/api/conversations/{cid}/run"]
    assert "control.attention.respond" in ack["data"]["detail"]
    flips2 = {e.get("cause") for e in evs2 if e["type"] == "state.delta"
              and e["data"].get("key") == "execution_status"}
    assert pause2["id"] in flips2 and resume["id"] in flips2
    assert sum(1 for e in evs2 if e["type"] == "run.started") == 1, "a resumed run is the same run"
    assert [e["type"] for e in evs2 if e["type"].startswith("run.")] == ["run.started", "run.finished"]


async def test_send_input_and_interrupt(server, tmp_path):
    """Scenario 6 (in-process): send_input appends a user message (run pinned
    false: an idle conversation stays idle), its outcome never echoes the
    text; interrupt while running lands paused, cause-linked."""
    rig = Rig(bridge_env(server, tmp_path, control=True))
    secret_text = "please also check the README"
    async with model_and_client(server, rig) as (mock, vendor):
        cid = await vendor.create()
        await wait_status(rig, cid, "idle")
        send = await rig.command("x.openhands.control.send_input", cid, data={"text": secret_text})
        assert (await rig.ack_for(send))["type"] == "control.accepted"
        sent = await rig.wait(lambda e: rig.of(cid, "x.openhands.input.sent"))
        await rig.wait(lambda e: [m for m in rig.of(cid, "x.openhands.message.event")
                                  if m["data"].get("role") == "user"])
        too_long = await rig.command("x.openhands.control.send_input", cid, data={"text": "x" * 4001})
        assert (await rig.ack_for(too_long))["data"]["reason"] == "invalid"
        await trio.sleep(0.5)
        assert rig.receiver.conversations[cid].status == "idle"
        assert not rig.of(cid, "run.started"), "send_input never starts work"
        await vendor.say(cid, "wait for me [hold]")
        await wait_status(rig, cid, "running")
        await mock.wait_held()
        intr = await rig.command("x.openhands.control.interrupt", cid)
        assert (await rig.ack_for(intr))["type"] == "control.accepted"
        await wait_status(rig, cid, "paused")
        await rig.wait(lambda e: rig.of(cid, "x.openhands.interrupt.event"))
        mock.release()
        evs = validated(rig.of(cid))
    assert sent[0]["cause"] == send["id"] and "data" not in sent[0]
    assert secret_text not in str(evs)
    flips = [e for e in evs if e["type"] == "state.delta" and e.get("cause") == intr["id"]]
    assert len(flips) == 1 and flips[0]["data"]["key"] == "execution_status"
    assert server_posts(server, cid).count(f"/api/conversations/{cid}/interrupt") == 1


async def test_restart_reattaches_without_duplicates(server, tmp_path):
    """Scenario 8 (in-process): the bridge stopped while a confirmation is
    pending, restarted on the same state dir: since-replay, no duplicate
    vendor event, no second session.started, the same run and attention are
    re-announced, then closed."""
    env = bridge_env(server, tmp_path)
    first = Rig(env)
    async with trio.open_nursery() as n:
        mock = MockModel()
        await n.start(mock.serve)
        vendor = AgentClient(server, mock.url)
        await n.start(first.run)
        cid = await vendor.create()
        await vendor.say(cid, "list the files [mark]")
        req = (await first.wait(lambda e: first.of(cid, "attention.requested")))[0]
        await first.wait(lambda e: run_wound_down(first.of(cid)), what="the vendor's run wound down")
        await trio.sleep(0.7)
        first.stop()
        await trio.sleep(0.2)
        await vendor.confirm(cid)  # happens while nobody observes
        second = Rig(env)
        await n.start(second.run)
        await second.wait(lambda e: second.of(cid, "run.finished"), what="run.finished after restart")
        await trio.sleep(1)
        n.cancel_scope.cancel()
    a, b = first.of(cid), second.of(cid)
    assert not [e for e in b if e["type"] == "session.started"]
    ids_a = {e["data"]["vendor_event_id"] for e in a if "vendor_event_id" in (e.get("data") or {})}
    dup = [e for e in b if (e.get("data") or {}).get("vendor_event_id") in ids_a
           and e["type"] != "state.snapshot"]
    assert not dup, dup
    res = second.of(cid, "attention.resolved")
    assert len(res) == 1 and res[0]["subject"] == req["id"]
    run_id = first.of(cid, "run.started")[0]["run"]
    assert second.of(cid, "run.finished")[0]["run"] == run_id
    # the open run and ask are re-announced (the very envelopes of the first
    # run, review of issue 8 finding 1), never started or requested anew
    ids = {e["id"] for e in a}
    again = [e for e in b if e["id"] in ids]
    assert again == [e for e in a if e["type"] in ("run.started", "attention.requested")]
    b = [e for e in b if e["id"] not in ids]
    assert not [e for e in b if e["type"] == "run.started"]
    for e in a + b:
        validate_event(e)
    # one stream across the restart: epochs differ, each stamper's seq restarts
    merged = a + b
    assert sum(e["type"] == "attention.requested" for e in merged) == \
        sum(e["type"] == "attention.resolved" for e in merged) == 1


# --------------------------------------------------------------------------- attaching mid-step

_LATE_SNAPSHOT = """\
import asyncio, runpy
from openhands.agent_server import event_service as es
made = es.EventService._create_state_update_event
async def late(self):
    await asyncio.sleep(DELAY)
    return await made(self)
es.EventService._create_state_update_event = late
runpy.run_module("openhands.agent_server", run_name="__main__", alter_sys=True)
"""


class LateSnapshotServer(AgentServer):
    """The real agent server whose connect snapshot comes ``delay`` s after
    the socket is subscribed (fault injection: what the server's own lock
    does while a step holds it, widened so the test can hit it)."""

    def __init__(self, python, delay: float) -> None:
        super().__init__(python)
        self.delay = delay

    def argv(self) -> list[str]:
        shim = self.scratch / "late_snapshot.py"
        shim.write_text(_LATE_SNAPSHOT.replace("DELAY", repr(self.delay)))
        return [str(self.python), str(shim), "--host", "127.0.0.1", "--port", str(self.port)]


async def test_live_frames_before_the_connect_snapshot_the_ask_has_its_run(tmp_path):
    """The real server subscribes a new socket at once but makes its connect
    snapshot under the conversation's lock, which an agent step holds
    between the model's answer and the flip to waiting_for_confirmation: a
    bridge attaching then gets the step's LIVE frames (the action, the flip
    to waiting_for_confirmation) BEFORE the snapshot and before the replay
    of the past (the flip to running, then stale). The window is widened
    here (the snapshot 6 s late, the step needs ~0.1 s). The ask still has its run: run.started
    before attention.requested, the ask on that run, one run (the race
    behind a flaky test_8_daemon_restarted_mid_conversation: the old
    bridge raised the ask with no run)."""
    srv = await trio.to_thread.run_sync(LateSnapshotServer(require_agent_server(), 6.0).start)
    try:
        async with trio.open_nursery() as n:
            mock = MockModel()
            await n.start(mock.serve)
            vendor = AgentClient(srv, mock.url)
            cid = await vendor.create()
            await vendor.say(cid, "list the files [hold]")
            await mock.wait_held()
            rig = Rig(bridge_env(srv, tmp_path))
            await n.start(rig.run)
            connected = f"Event Websocket Connected: {cid}"
            with trio.fail_after(30):  # the server took the bridge's socket; the snapshot is late
                while connected not in re.sub(r"\s*\n\s*", " ", srv.log_path.read_text(errors="replace")):
                    await trio.sleep(0.05)
            mock.release()
            await rig.wait(lambda e: rig.of(cid, "attention.requested"), what="attention.requested")
            await rig.wait(lambda e: rig.of(cid, "state.snapshot"), what="the late snapshot")
            with trio.fail_after(30):  # the replay is past the snapshot
                while rig.receiver.conversations[cid].pending_snap is not None:
                    await trio.sleep(0.05)
            evs = validated(rig.of(cid))
            await vendor.http.aclose()
            n.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(srv.cleanup)
    t = types(evs)
    assert t.index("state.snapshot") > t.index("attention.requested"), "the window was not hit"
    assert t.count("run.started") == 1 and t.index("run.started") < t.index("attention.requested"), t
    run_id = rig.of(cid, "run.started")[0]["run"]
    assert rig.of(cid, "attention.requested")[0]["run"] == run_id


# --------------------------------------------------------------------------- approving while the run winds down

_SLOW_WIND_DOWN = """\
import runpy, time
from openhands.sdk.utils import async_utils as au
waited = au.AsyncCallbackWrapper.wait_for_pending
def slow(self, timeout=None):
    time.sleep(DELAY)
    return waited(self, timeout)
au.AsyncCallbackWrapper.wait_for_pending = slow
runpy.run_module("openhands.agent_server", run_name="__main__", alter_sys=True)
"""


class SlowWindDownServer(AgentServer):
    """The real agent server whose run task winds down ``delay`` s late
    (fault injection: its wait for pending callbacks, which runs after the
    flip to waiting_for_confirmation and before the task is cleared and the
    end-of-run snapshot published, slowed the way a loaded machine does)."""

    def __init__(self, python, delay: float) -> None:
        super().__init__(python)
        self.delay = delay

    def argv(self) -> list[str]:
        shim = self.scratch / "slow_wind_down.py"
        shim.write_text(_SLOW_WIND_DOWN.replace("DELAY", repr(self.delay)))
        return [str(self.python), str(shim), "--host", "127.0.0.1", "--port", str(self.port)]


@pytest.mark.parametrize("attach", ["before the run", "while the run winds down"])
async def test_approve_while_the_vendors_run_winds_down(tmp_path, attach):
    """The race behind a flaky test_approve_over_control: the ask is raised
    on the flip to waiting_for_confirmation, but the server's run task lives
    on until its callbacks drain; an approval posted then is answered 200
    and dropped (respond_to_confirmation takes the live task for "already
    running"), and the run never finished. The window is widened here (3 s).
    Attached before the run, the bridge saw the flip live: the approval
    waits for the end-of-run snapshot and is written once. Attached inside
    the window, its connect snapshot cannot tell: the end-of-run snapshot
    with the ask still pending makes it write the approval again."""
    srv = await trio.to_thread.run_sync(SlowWindDownServer(require_agent_server(), 3.0).start)
    try:
        rig = Rig(bridge_env(srv, tmp_path, control=True))
        async with trio.open_nursery() as n:
            mock = MockModel()
            await n.start(mock.serve)
            vendor = AgentClient(srv, mock.url)
            cid = await vendor.create()
            if attach == "before the run":
                await n.start(rig.run)
                await rig.wait(lambda e: rig.of(cid, "session.started"), what="session.started")
            await vendor.say(cid, "list the files [mark]")
            if attach != "before the run":
                with trio.fail_after(30):
                    while await vendor.status(cid) != "waiting_for_confirmation":
                        await trio.sleep(0.05)
                await n.start(rig.run)
            req = (await rig.wait(lambda e: rig.of(cid, "attention.requested")))[0]
            cmd = await rig.command("control.attention.respond", cid, subject=req["id"],
                                    data={"answer": {"option": "approve"}})
            assert (await rig.ack_for(cmd))["type"] == "control.accepted"
            await rig.wait(lambda e: rig.of(cid, "run.finished"), what="run.finished")
            evs = validated(rig.of(cid))
            responds = [p for p in server_posts(srv, cid) if "confirmation" in p]
            await vendor.http.aclose()
            n.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(srv.cleanup)
    t = types(evs)
    assert t.index("control.accepted") < t.index("attention.answered") < t.index("tool.completed")
    assert rig.of(cid, "attention.answered")[0]["cause"] == cmd["id"]
    if attach == "before the run":
        assert responds == [f"/api/conversations/{cid}/events/respond_to_confirmation"]
    else:  # the window was hit: the connect snapshot was made after the flip
        flip = next(e for e in evs if e["id"] == req["cause"])  # the flip that raised the ask
        assert t[1] == "state.snapshot" and evs[1]["data"]["vendor_ts"] > flip["data"]["vendor_ts"]
        assert 1 <= len(responds) <= 3
