"""Bad input and faults (issue section 5) with a stub speaking the agent
server's protocol (``tests/support/openhands.py`` ``StubAgentServer``): each
has a defined, tested answer, every drop is counted, no task dies. Also the
posture proofs that need to see the wire: the events socket carries the auth
frame and nothing else (gate on or off), gated off nothing is POSTed, gated
on only the five enumerated writes are, and the key never rides a URL."""
from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager

import pytest
import trio

from bridges.core.statefile import StateFile
from tests.support.openhands import SESSION_KEY, Rig, StubAgentServer, state_frame
from tests.support.schema import validate_event, validate_stream

TOKEN = "fault-token-0123456789"
TS = "2026-11-30T10:00:0{}.000001"


def env_for(stub: StubAgentServer, tmp_path, *, control: bool = False, **extra) -> dict[str, str]:
    env = {"AEP_OPENHANDS_URL": stub.url, "AEP_OPENHANDS_SESSION_API_KEY": SESSION_KEY,
           "AEP_OPENHANDS_POLL": "0.2", "AEP_STATE_DIR": str(tmp_path / "state")}
    if control:
        env.update({"AEP_OPENHANDS_CONTROL": "1", "AEP_TOKEN": TOKEN})
    env.update(extra)
    return env


@asynccontextmanager
async def running(stub: StubAgentServer, tmp_path, **kw):
    """The stub serving, then the bridge (in-process) pointed at it."""
    async with trio.open_nursery() as n:
        await n.start(stub.serve)
        rig = Rig(env_for(stub, tmp_path, **kw))
        await n.start(rig.run)
        yield rig
        n.cancel_scope.cancel()


async def until(pred, timeout: float = 20, what: str = "condition"):
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


def running_conv(stub: StubAgentServer, status: str = "running"):
    return stub.add(frames=[state_frame("full_state", {"execution_status": status}, TS.format(1))])


def auth_frame() -> str:
    return json.dumps({"type": "auth", "session_api_key": SESSION_KEY})


# --------------------------------------------------------------------------- frames

async def test_unknown_kinds_and_unexpected_fields_degrade_to_visibility(tmp_path):
    stub = StubAgentServer()
    conv = stub.add(frames=[
        {"kind": "SandboxCheckpointEvent", "id": "u1", "timestamp": TS.format(1), "anything": [1, {"a": None}]},
        {"kind": "ActionEvent", "id": "u2", "timestamp": TS.format(2), "action": "not-an-object"},
        {"kind": "ObservationEvent", "id": "u3", "timestamp": TS.format(3), "tool_name": "terminal",
         "observation": ["not", "an", "object"]},
        {"kind": "ConversationStateUpdateEvent", "id": "u4", "timestamp": TS.format(4), "key": 7,
         "value": {"deep": {"deeper": [1, 2]}}},
        {"kind": "MessageEvent", "id": "u5", "timestamp": "not a time", "llm_message": "just a string"},
        {"kind": "ConversationStateUpdateEvent", "id": "u6", "timestamp": TS.format(5),
         "key": "execution_status", "value": {"not": "a string"}},
    ])
    async with running(stub, tmp_path) as rig:
        await rig.wait(lambda e: len(rig.of(conv.id)) >= 7, what="all frames mapped")
    evs = rig.of(conv.id)
    for e in evs:
        validate_event(e)
    validate_stream(evs)
    assert [e["type"] for e in evs] == ["session.started", "x.openhands.sandbox.checkpoint",
                                        "x.openhands.action.event", "x.openhands.observation.event",
                                        "state.delta", "x.openhands.message.event", "state.delta"]
    assert rig.receiver.conversations[conv.id].status is None
    assert rig.health.public()["source"] is True


@pytest.mark.parametrize("replay_delay", [0.0, 2.0], ids=["prompt", "late-replay"])
async def test_a_run_that_ended_before_the_attach_is_seen_however_late_the_replay(tmp_path,
                                                                                 replay_delay):
    """The captured unreachable-model conversation (already ``error`` when
    the bridge attaches: the connect snapshot says so, then the replay tells
    running -> error). ``late-replay``: the server sends its replay seconds
    after the snapshot (a loaded machine reading its event files), longer
    than any quiet timer; the run is still started and failed, in order."""
    from pathlib import Path
    captured = Path(__file__).parents[2] / "fixtures" / "openhands_real" / "model_unreachable.json"
    frames = json.loads(captured.read_text())["frames"]
    snapshots = [f for f in frames if f.get("key") == "full_state"]
    assert snapshots[-1]["value"]["execution_status"] == "error"
    # attached after the end: the present (the last snapshot), then the past
    stub = StubAgentServer(replay_delay=replay_delay)
    conv = stub.add(frames=[snapshots[-1]] + [f for f in frames if f.get("key") != "full_state"],
                    status="error")
    async with running(stub, tmp_path) as rig:
        await rig.wait(lambda e: rig.of(conv.id, "run.failed") and rig.of(conv.id, "error.raised"),
                       what="run.failed and error.raised")
        await until(lambda: rig.receiver.conversations[conv.id].pending_snap is None,
                    what="the snapshot applied")
    evs = rig.of(conv.id)
    validate_stream(evs)
    kinds = [e["type"] for e in evs if e["type"].startswith("run.")]
    assert kinds == ["run.started", "run.failed"], kinds
    assert rig.of(conv.id, "run.failed")[0]["data"] == {"reason": "error"}
    assert rig.receiver.conversations[conv.id].status == "error"


async def test_non_json_frames_are_counted_and_the_socket_goes_on(tmp_path):
    stub = StubAgentServer(socket_garbage=True)
    conv = running_conv(stub)
    async with running(stub, tmp_path) as rig:
        await rig.wait(lambda e: rig.of(conv.id, "run.started"), what="the valid frame after the garbage")
    assert rig.health.counters["frames_not_json"] == 4
    assert rig.health.counters.get("socket_errors", 0) == 0


async def test_socket_that_closes_on_auth(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    stub = StubAgentServer(socket_close_on_auth=True)
    conv = running_conv(stub)
    async with running(stub, tmp_path) as rig:
        await until(lambda: rig.health.counters.get("socket_auth_failed", 0) >= 3, what="reconnects")
        assert rig.health.public()["source"] is False
        assert conv.id in rig.receiver.conversations  # the task lives on, backing off
        stub.socket_close_on_auth = False
        await rig.wait(lambda e: rig.of(conv.id, "run.started"), timeout=30, what="recovery")
        await until(lambda: rig.health.public()["source"] is True, what="source back")
    refusals = [r for r in caplog.records if "refused the session API key" in r.getMessage()]
    assert len(refusals) == 1 and SESSION_KEY not in caplog.text


async def test_search_that_pages_forever(tmp_path):
    """Capped at MAX_PAGES; the listing counts as incomplete, so nothing is
    detached on its evidence."""
    stub = StubAgentServer(page_size=1, search_forever=True)
    a, b = running_conv(stub), running_conv(stub)
    async with running(stub, tmp_path) as rig:
        await rig.wait(lambda e: rig.of(a.id, "run.started") and rig.of(b.id, "run.started"))
        del stub.conversations[b.id]
        await until(lambda: rig.health.counters.get("search_pages_capped", 0) >= 3, timeout=60)
    assert b.id in rig.receiver.conversations and not rig.of(b.id, "session.ended")


async def test_search_500_then_recovery(tmp_path):
    stub = StubAgentServer(search_status=500)
    conv = running_conv(stub)
    async with running(stub, tmp_path) as rig:
        await until(lambda: rig.health.counters.get("search_errors", 0) >= 2)
        assert rig.health.public()["source"] == "degraded" and not rig.events
        stub.search_status = 200
        await rig.wait(lambda e: rig.of(conv.id, "run.started"), timeout=30)
        assert rig.health.public()["source"] is True
        stub.search_garbage = True
        errors = rig.health.counters["search_errors"]
        await until(lambda: rig.health.counters["search_errors"] > errors)
    assert conv.id in rig.receiver.conversations  # a bad page detaches nothing


async def test_vanished_conversation_is_detached(tmp_path):
    stub = StubAgentServer()
    conv = stub.add(frames=[state_frame("execution_status", "running", TS.format(1)),
                            state_frame("execution_status", "waiting_for_confirmation", TS.format(2))])
    async with running(stub, tmp_path) as rig:
        await rig.wait(lambda e: rig.of(conv.id, "attention.requested"))
        # saved by the state writer within STATE_LINGER of the change
        await until(lambda: conv.id in saved(tmp_path))
        del stub.conversations[conv.id]
        await rig.wait(lambda e: rig.of(conv.id, "session.ended"))
    evs = rig.of(conv.id)
    validate_stream(evs)
    assert [e["type"] for e in evs][-3:] == ["attention.resolved", "run.cancelled", "session.ended"]
    assert conv.id not in saved(tmp_path) and conv.id not in rig.receiver.conversations


def saved(tmp_path) -> dict:
    """The conversations a restarted daemon would find (the server's state
    document with its journal, read by a fresh StateFile)."""
    paths = {p.with_name(p.name.removesuffix(".journal"))  # (the document comes with a compaction)
             for p in (tmp_path / "state" / "openhands").glob("*.json*")}
    assert len(paths) <= 1, paths  # one agent server: one document
    doc = StateFile(paths.pop()).load() if paths else None
    return doc["sessions"] if isinstance(doc, dict) else {}


# --------------------------------------------------------------------------- writes

@pytest.mark.parametrize("status, reason", [(409, "refused"), (429, "refused"), (401, "refused"),
                                            (500, "busy"), (503, "busy")])
async def test_rest_write_errors_become_nacks(tmp_path, status, reason):
    stub = StubAgentServer(post_status=status)
    conv = running_conv(stub)
    async with running(stub, tmp_path, control=True, AEP_CAPTURE="redacted") as rig:
        await rig.wait(lambda e: rig.of(conv.id, "run.started"))
        cmd = await rig.command("control.pause", conv.id)
        ack = await rig.ack_for(cmd)
    assert ack["type"] == "control.rejected" and ack["data"]["reason"] == reason
    assert f"HTTP {status}" in ack["data"]["detail"]
    assert rig.receiver.conversations[conv.id].notes == {}, "a failed write disarms its note"
    assert [p for p, _ in stub.posts] == [f"/api/conversations/{conv.id}/pause"]


async def test_rest_write_that_hangs_past_the_guard_is_accepted(tmp_path):
    """Guard expiry -> accepted (will-try); the note stays armed for the
    outcome the vendor may still produce."""
    stub = StubAgentServer(post_hang=True)
    conv = running_conv(stub)
    async with running(stub, tmp_path, control=True, AEP_OPENHANDS_ACK_GUARD_MS="300") as rig:
        await rig.wait(lambda e: rig.of(conv.id, "run.started"))
        cmd = await rig.command("x.openhands.control.interrupt", conv.id)
        ack = await rig.ack_for(cmd)
        assert ack["type"] == "control.accepted"
        assert rig.receiver.conversations[conv.id].notes == {"interrupt": cmd["id"]}
        assert rig.health.counters["control_guard_expired"] == 1


async def test_the_socket_is_auth_frame_only_and_writes_are_exactly_the_five(tmp_path):
    """Gate on: every command type, accepted ones included, and the socket
    still carried exactly one frame per connection (the auth frame); the
    only POSTs are the five enumerated routes. The key rides no URL."""
    stub = StubAgentServer()
    conv = stub.add(frames=[state_frame("execution_status", "running", TS.format(1)),
                            state_frame("execution_status", "waiting_for_confirmation", TS.format(2))])
    other = running_conv(stub)
    async with running(stub, tmp_path, control=True) as rig:
        req = (await rig.wait(lambda e: rig.of(conv.id, "attention.requested")))[0]
        await rig.wait(lambda e: rig.of(other.id, "run.started"))
        acks = []
        for t, sess, kw in [
            ("control.attention.respond", conv.id, {"subject": req["id"], "data": {"answer": {"option": "deny"}}}),
            ("x.openhands.control.send_input", conv.id, {"data": {"text": "hello"}}),
            ("control.pause", other.id, {}),
            ("x.openhands.control.interrupt", other.id, {}),
            ("control.cancel", other.id, {"data": {"scope": "run"}}),
        ]:
            acks.append(await rig.ack_for(await rig.command(t, sess, **kw)))
        rig.receiver.conversations[other.id].status = "paused"  # as if the pause had landed
        acks.append(await rig.ack_for(await rig.command("control.resume", other.id)))
        await trio.sleep(0.5)
    assert [a["type"] for a in acks] == ["control.accepted"] * 4 + ["control.rejected", "control.accepted"]
    assert acks[4]["data"]["reason"] == "unsupported"  # cancel is not declared
    assert sorted(p for p, _ in stub.posts) == sorted([
        f"/api/conversations/{conv.id}/events/respond_to_confirmation",
        f"/api/conversations/{conv.id}/events", f"/api/conversations/{other.id}/pause",
        f"/api/conversations/{other.id}/interrupt", f"/api/conversations/{other.id}/run"])
    bodies = dict(stub.posts)
    assert bodies[f"/api/conversations/{conv.id}/events"] == {
        "role": "user", "content": [{"type": "text", "text": "hello"}], "run": False}
    assert bodies[f"/api/conversations/{conv.id}/events/respond_to_confirmation"] == {"accept": False}
    assert stub.inbound and all(frames == [auth_frame()] for frames in stub.inbound)
    assert all(SESSION_KEY not in u for u in stub.socket_urls)
    assert all(SESSION_KEY not in line for _, line in stub.requests)


async def test_gate_off_writes_nothing_at_all(tmp_path):
    stub = StubAgentServer()
    conv = stub.add(frames=[state_frame("execution_status", "running", TS.format(1)),
                            state_frame("execution_status", "waiting_for_confirmation", TS.format(2))])
    async with running(stub, tmp_path, AEP_TOKEN=TOKEN) as rig:  # a token, but no opt-in
        req = (await rig.wait(lambda e: rig.of(conv.id, "attention.requested")))[0]
        assert "options" not in req["data"] and "respond_via" not in req["data"]
        for t in ("control.attention.respond", "control.pause", "control.resume",
                  "x.openhands.control.send_input", "x.openhands.control.interrupt"):
            ack = await rig.ack_for(await rig.command(t, conv.id, subject=req["id"],
                                                      data={"answer": {"option": "approve"}, "text": "x"}))
            assert ack["data"]["reason"] == "unsupported"
        await trio.sleep(0.5)
    assert stub.posts == [] and all(m == "GET" for m, _ in stub.requests)
    assert all(frames == [auth_frame()] for frames in stub.inbound)
    assert rig.health.public()["control"] is False


async def test_a_listing_of_many_new_conversations_is_attached_a_hundred_a_poll(tmp_path):
    """Round 16 of issue 25: each new conversation opens a socket and reads
    the server; a listing of thousands attached them all in one poll. At
    most ATTACH_PER_POLL (100) a poll, the rest counted and attached later."""
    from bridges.openhands.discovery import ATTACH_PER_POLL

    stub = StubAgentServer()
    convs = [running_conv(stub) for _ in range(ATTACH_PER_POLL + 5)]
    async with running(stub, tmp_path) as rig:
        await until(lambda: rig.health.counters.get("conversations_deferred", 0) >= 5,
                    what="the first poll deferring five", timeout=60)
        assert rig.health.counters["conversations_attached"] >= ATTACH_PER_POLL
        await until(lambda: all(c.id in rig.receiver.conversations for c in convs),
                    what="every conversation attached over the next polls", timeout=60)
    assert rig.health.counters["conversations_attached"] == len(convs)
