"""Receiver state without sockets: the real server's captured frame sequences
(``tests/fixtures/openhands_real/``) fed through ``Receiver.handle_raw`` with
a real ``BridgeContext``: run synthesis, the attention loop, dedupe, the
replay anchor, the connect snapshot's ordering, persistence and bounds."""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.core.statefile import StateFile
from bridges.openhands import mapping as M
from bridges.openhands.conversation import SEEN_IDS, Conversation, _parse_ts
from bridges.openhands.receiver import Receiver, Settings
from tests.support.schema import validate_event, validate_stream

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "openhands_real"


def frames(name: str) -> list[dict]:
    return json.loads((REAL / f"{name}.json").read_text())["frames"]


class Harness:
    def __init__(self, tmp_path=None) -> None:
        self.send, self.recv = trio.open_memory_channel(100_000)
        _, crecv = trio.open_memory_channel(1)
        self.health = BridgeHealth()
        self.ctx = BridgeContext("openhands", Stamper("openhands", epoch=3, host="h", policy=CapturePolicy()),
                                 self.send, crecv, self.health, logging.getLogger("t"))
        self.rx = Receiver(Settings(url="http://127.0.0.1:1", state_dir=tmp_path), Posture(), self.ctx, None)
        self.conv = Conversation("c0ffee00-0000-4000-8000-000000000001")
        self.rx.conversations[self.conv.id] = self.conv

    async def feed(self, items) -> list[dict]:
        for f in items:
            await self.rx.handle_raw(self.conv, f if isinstance(f, str) else json.dumps(f))
        await self.rx._apply_pending(self.conv)  # the socket's quiet timer
        out = []
        while True:
            try:
                out.append(self.recv.receive_nowait().event)
            except trio.WouldBlock:
                return out


def types(evs):
    return [e["type"] for e in evs]


def core(evs):
    return [t for t in types(evs) if t.startswith(("run.", "attention.", "session.", "tool."))]


async def test_approve_sequence():
    h = Harness()
    evs = await h.feed(frames("approve"))
    for e in evs:
        validate_event(e)
    validate_stream(evs)
    assert core(evs) == ["run.started", "tool.requested", "attention.requested", "attention.resolved",
                         "tool.completed", "tool.requested", "tool.completed", "run.finished"]
    persisted = [f for f in frames("approve") if not M.is_ephemeral(f)]
    assert h.conv.anchor == persisted[-1]["timestamp"], "the snapshot never anchors a replay"
    assert h.conv.status == "finished" and h.conv.run_id is None and h.conv.attention_id is None


async def test_reject_closes_the_run_on_idle():
    evs = await Harness().feed(frames("reject"))
    validate_stream(evs)
    assert core(evs) == ["run.started", "tool.requested", "attention.requested", "attention.resolved",
                         "run.finished"]
    assert [e for e in evs if e["type"] == "run.finished"][0]["data"] == {"reason": "idle"}
    assert types(evs)[-1] == "x.openhands.user_reject.observation"


async def test_pause_then_waiting_then_run():
    """Real: running -> paused -> (the in-flight step lands) waiting -> running
    -> finished: one run, an ask raised from paused, resolved on the run."""
    evs = await Harness().feed(frames("pause_resume"))
    validate_stream(evs)
    assert core(evs) == ["run.started", "tool.requested", "attention.requested", "attention.resolved",
                         "tool.completed", "tool.requested", "tool.completed", "run.finished"]


async def test_idle_pause_then_run_opens_a_run():
    """Real: idle -> paused (a pause from idle) -> running: the table's
    paused->running opens nothing, but no run was open, so one opens."""
    evs = await Harness().feed(frames("idle_pause_and_409"))
    validate_stream(evs)
    assert core(evs).count("run.started") == 1 and core(evs).count("run.finished") == 1
    assert core(evs)[0] == "run.started"


async def test_model_error_fails_the_run():
    evs = await Harness().feed(frames("model_500"))
    validate_stream(evs)
    assert core(evs) == ["run.started", "run.failed"]
    assert "error.raised" in types(evs)


async def test_duplicates_are_dropped_and_counted():
    h = Harness()
    first = await h.feed(frames("approve"))
    again = await h.feed(frames("approve"))
    assert again == [] and h.health.counters["frames_duplicate"] == len(frames("approve"))
    assert first


async def test_since_reconnect_overlap_is_absorbed():
    """Real reconnect with since=<last persisted ts>: a fresh snapshot plus
    the event AT the anchor (already seen): only the snapshot maps."""
    h = Harness()
    await h.feed(frames("approve"))
    evs = await h.feed(frames("reconnect_since"))
    assert types(evs) == ["state.snapshot"]


async def test_history_after_the_connect_snapshot():
    """First attach to a conversation that already finished: the snapshot
    (the present, newest timestamp) comes first, the replayed history after;
    runs come from the history, the snapshot applies last as a no-op."""
    hist = [f for f in frames("approve") if not M.is_snapshot(f)]
    snap = dict(frames("reconnect_since")[0])  # finished, timestamped after the history
    evs = await Harness().feed([snap] + hist)
    validate_stream(evs)
    assert core(evs) == ["run.started", "tool.requested", "attention.requested", "attention.resolved",
                         "tool.completed", "tool.requested", "tool.completed", "run.finished"]


async def test_attached_mid_step_the_live_ask_comes_with_its_run():
    """The real server's order when a socket attaches while a step holds
    the conversation's lock: it subscribes the socket at once but makes the
    connect snapshot under the lock, so the step's LIVE frames (the action,
    the flip to waiting_for_confirmation) come first, then the snapshot,
    then the replay of the past (its flip to running now stale: not
    applied). The ask still has its run, and the run closes once
    (tests/integration/openhands: the window widened on the real server)."""
    f = frames("approve")
    live, snap, past, rest = f[5:8], dict(f[8]), f[1:8], f[9:]
    h = Harness()
    evs = await h.feed(live + [snap] + past + rest)
    validate_stream(evs)
    t = types(evs)
    assert t.count("run.started") == 1 and t.index("run.started") < t.index("attention.requested")
    ask = next(e for e in evs if e["type"] == "attention.requested")
    run = next(e for e in evs if e["type"] == "run.started")["run"]
    assert ask["run"] == run and [e["run"] for e in evs if e["type"] == "run.finished"] == [run]
    assert h.conv.status == "finished" and h.conv.run_id is None and h.conv.attention_id is None


async def test_a_stale_status_fact_is_mapped_but_not_applied():
    h = Harness()
    await h.feed([M_state("execution_status", "running", "2026-01-01T10:00:05")])
    evs = await h.feed([M_state("execution_status", "finished", "2026-01-01T10:00:01")])
    assert types(evs) == ["state.delta"] and h.conv.status == "running"


async def test_snapshot_applies_on_the_first_newer_frame():
    h = Harness()
    h.conv.status, h.conv.status_ts = "idle", "2026-01-01T10:00:00"
    await h.rx.handle_raw(h.conv, json.dumps(M_state("full_state", {"execution_status": "running"},
                                                     "2026-01-01T10:00:05")))
    assert h.conv.status == "idle" and h.conv.pending_snap is not None
    await h.rx.handle_raw(h.conv, json.dumps({"kind": "PauseEvent", "id": "p1",
                                              "timestamp": "2026-01-01T10:00:06"}))
    assert h.conv.status == "running" and h.conv.run_id is not None


async def test_not_json_and_malformed_frames_are_counted():
    h = Harness()
    evs = await h.feed(["not json", "[1,2]", json.dumps({"kind": 5}), json.dumps({"no": "kind"}),
                        json.dumps({"kind": "BrandNewEvent", "id": "n1", "timestamp": "2026-01-01T00:00:00",
                                    "weird": {"nested": [1, {"x": None}]}})])
    assert types(evs) == ["x.openhands.brand.new"]  # the mechanical rule
    assert h.health.counters["frames_not_json"] == 1 and h.health.counters["frames_malformed"] == 3


async def test_frames_over_check_json_caps_or_too_deep_are_not_json():
    """Round 12 of issue 25: a frame over :func:`bridges.core.aep.check_json`'s
    caps (65,538 arrays) is refused before the parse, and one nested too deep
    for the parser (``RecursionError``) is not JSON, not a dead socket."""
    h = Harness()
    wide = "[" + ",".join(["[]"] * 65_537) + "]"
    evs = await h.feed([json.dumps({"kind": "PauseEvent", "id": "p1", "timestamp": "2026-01-01T00:00:00"})[:-1]
                        + ', "x": ' + wide + "}", "[" * 2000 + "]" * 2000])
    assert evs == [] and h.health.counters["frames_not_json"] == 2


async def test_state_is_bounded():
    h = Harness()
    await h.feed([{"kind": "PauseEvent", "id": f"id-{i}", "timestamp": f"2026-01-01T10:{i // 60:02d}:{i % 60:02d}"}
                  for i in range(1000)])
    assert len(h.conv.seen) == SEEN_IDS
    assert len(json.dumps(h.conv.persisted())) < 4096


async def test_persistence_round_trip(tmp_path):
    h = Harness(tmp_path)
    await h.feed([f for f in frames("approve") if M.status_of(f) != "finished"])
    h.rx._flush(h.conv, force=True)
    h.conv.dirty = True
    h.rx._flush(h.conv, force=True)
    back = h.rx._load(h.conv.id)
    assert (back.status, back.run_id, back.run_n, back.anchor, back.started) == \
        (h.conv.status, h.conv.run_id, h.conv.run_n, h.conv.anchor, h.conv.started)
    assert back.run_id is not None
    assert list(back.seen) == list(h.conv.seen)[-32:]


def test_restore_rejects_garbage():
    for body in (None, [], {"v": 99}, {"v": 1, "id": "other"}, {"v": 1, "id": "c", "run_n": -3, "seen": [1, None]}):
        c = Conversation.restore(body, "c")
        assert c.run_n == 0 and c.status is None and not c.seen


def M_state(key, value, ts):
    return {"kind": "ConversationStateUpdateEvent", "id": f"{key}-{ts}", "timestamp": ts,
            "source": "environment", "key": key, "value": value}


async def test_a_frame_stuck_on_a_full_channel_is_counted_not_fatal(autojump_clock):
    """The relay channel never drains: the frame's emissions give up after
    FRAME_DEADLINE (shielded from the bridge's own cancellation until then),
    the loss is counted, and the receiver carries on."""
    send, _recv = trio.open_memory_channel(0)
    _, crecv = trio.open_memory_channel(1)
    health = BridgeHealth()
    ctx = BridgeContext("openhands", Stamper("openhands", epoch=1, host="h"), send, crecv, health,
                        logging.getLogger("t"))
    rx = Receiver(Settings(url="http://127.0.0.1:1"), Posture(), ctx, None)
    conv = Conversation("c0ffee00-0000-4000-8000-000000000002")
    await rx.handle_raw(conv, json.dumps({"kind": "PauseEvent", "id": "p1", "timestamp": "2026-01-01T00:00:00"}))
    assert health.counters["frames_timed_out"] == 1
    await rx.handle_raw(conv, json.dumps({"kind": "PauseEvent", "id": "p2", "timestamp": "2026-01-01T00:00:01"}))
    assert health.counters["frames_timed_out"] == 2
    assert conv.anchor is None  # an undelivered frame never advances the replay anchor


async def test_a_frame_waiting_for_room_lands_whole_when_the_bridge_is_cancelled():
    """The frame's shield lives only around the wait for channel room (no
    scope per frame, issue 11), yet a bridge cancelled while a frame waits
    still delivers all of that frame's emissions, and nothing times out."""
    send, recv = trio.open_memory_channel(0)  # every emission waits for the reader
    _, crecv = trio.open_memory_channel(1)
    health = BridgeHealth()
    ctx = BridgeContext("openhands", Stamper("openhands", epoch=1, host="h"), send, crecv, health,
                        logging.getLogger("t"))
    rx = Receiver(Settings(url="http://127.0.0.1:1"), Posture(), ctx, None)
    conv = Conversation("c0ffee00-0000-4000-8000-000000000003")
    frame = json.dumps(M_state("execution_status", "running", "2026-01-01T00:00:00"))
    scopes: list[trio.CancelScope] = []

    async def bridge() -> None:
        with trio.CancelScope() as scope:
            scopes.append(scope)
            await rx.handle_raw(conv, frame)

    async with trio.open_nursery() as n:
        n.start_soon(bridge)
        await trio.testing.wait_all_tasks_blocked()
        scopes[0].cancel()  # the bridge is stopped while the frame waits for room
        with trio.fail_after(5):
            got = [await recv.receive(), await recv.receive()]
    assert [o.event["type"] for o in got] == ["state.delta", "run.started"]
    assert health.counters.get("frames_timed_out", 0) == 0 and not conv.in_frame
    assert conv.anchor == "2026-01-01T00:00:00"


def _parse_ts_uncached(value):
    """The receiver's timestamp rule, written out without its memo."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt


_TS = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2100, 1, 1),
                   timezones=st.none() | st.timezones()).map(lambda d: d.isoformat())


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_TS | st.text(max_size=30) | st.none() | st.integers(), min_size=1, max_size=40),
       picks=st.lists(st.integers(0, 1000), max_size=80))
def test_memoized_timestamps_equal_the_plain_parse(values, picks):
    """The memo returns what parsing returns, for fresh and repeated texts
    in any order (valid naive and aware ISO forms, garbage, non-strings)."""
    for v in values + [values[i % len(values)] for i in picks]:
        assert _parse_ts(v) == _parse_ts_uncached(v)


def saved(tmp_path) -> dict:
    """The conversations' entries a restarted daemon finds (the server's
    state document with its journal replayed, read by a fresh StateFile)."""
    doc = StateFile(tmp_path / "openhands" / "127.0.0.1_1.json").load()
    return doc["sessions"] if isinstance(doc, dict) else {}


async def test_state_writer_coalesces_a_burst_into_the_last_state(tmp_path, autojump_clock):
    """With the writer running, a conversation's burst of status changes is
    one journal write, made STATE_LINGER after the first change, and the
    state holds exactly what an immediate write at the end of the burst
    would hold."""
    from bridges.openhands import store
    h = Harness(tmp_path)
    async with trio.open_nursery() as n:
        await n.start(h.rx.persist)
        await h.feed(frames("approve"))
        appends = h.rx._state.counters["appends"]
        assert appends == 0 and saved(tmp_path) == {}, "queued, not written inside the burst"
        await trio.sleep(store.STATE_LINGER * 2)
        assert h.rx._state.counters["appends"] == 1
        on_disk = saved(tmp_path)[h.conv.id]
        assert on_disk == json.loads(json.dumps(h.conv.persisted()))
        assert on_disk["status"] == "finished" and on_disk["anchor"] == h.conv.anchor
        # the immediate path (no writer) saves the same entry
        h.conv.dirty = True
        h.rx._flush(h.conv, force=True, now=True)
        assert saved(tmp_path)[h.conv.id] == on_disk
        n.cancel_scope.cancel()


async def test_state_writer_writes_what_is_queued_when_cancelled_and_never_a_forgotten_one(
        tmp_path, autojump_clock):
    h = Harness(tmp_path)
    other = Conversation("c0ffee00-0000-4000-8000-000000000002")
    h.rx.conversations[other.id] = other
    async with trio.open_nursery() as n:
        await n.start(h.rx.persist)
        await h.feed(frames("approve"))
        other.dirty = True
        h.rx._flush(other, force=True)
        h.rx._forget(other.id)  # vanished meanwhile: the queued write must not resurrect it
        n.cancel_scope.cancel()
    assert set(saved(tmp_path)) == {h.conv.id}
