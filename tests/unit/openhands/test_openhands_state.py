"""The OpenHands receiver's persistence (issue 11, third round): one state
document + journal per agent server (``bridges/core/statefile.py``, the SSE
bridges' own), an entry per conversation (``Conversation.persisted()``).

A restarted daemon (a fresh ``Receiver`` on the same state directory, as
the fleet builds one per run) finds every conversation as last saved; a
torn journal tail loses only the torn line; a vanished conversation's entry
is gone; the old layout (a file per conversation) is carried over once; and
a property test holds the journal (one write for every queued conversation,
entries read from memory at attach) equal to the old per-conversation files
it replaces (each file = the conversation's last ``persisted()``)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core import statefile as state_mod
from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.core.statefile import StateFile
from bridges.openhands import receiver as R
from bridges.openhands import store
from bridges.openhands.receiver import Conversation, Receiver, Settings

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "openhands_real"
KEY = "aep-test-session-key-0123456789abcdef"
CID = "c0ffee00-0000-4000-8000-0000000000{:02d}"


def frames(name: str) -> list[dict]:
    return json.loads((REAL / f"{name}.json").read_text())["frames"]


def receiver(state_dir: Path | None) -> tuple[Receiver, BridgeHealth, trio.MemoryReceiveChannel]:
    send, recv = trio.open_memory_channel(100_000)
    _, crecv = trio.open_memory_channel(1)
    health = BridgeHealth()
    ctx = BridgeContext("openhands", Stamper("openhands", epoch=3, host="h", policy=CapturePolicy()),
                        send, crecv, health, logging.getLogger("t"))
    rx = Receiver(Settings(url="http://127.0.0.1:1", key=KEY, state_dir=state_dir), Posture(), ctx, None)
    return rx, health, recv


async def feed(rx: Receiver, conv: Conversation, items) -> None:
    rx.conversations[conv.id] = conv
    for f in items:
        await rx.handle_raw(conv, json.dumps(f))


def document(state_dir: Path) -> Path:
    return state_dir / "openhands" / "127.0.0.1_1.json"


def legacy(state_dir: Path) -> Path:
    return state_dir / "openhands" / "127.0.0.1_1"


def saved(state_dir: Path) -> dict:
    doc = StateFile(document(state_dir)).load()
    return doc["sessions"] if isinstance(doc, dict) else {}


def same(a: Conversation, b: Conversation) -> bool:
    return json.dumps(a.persisted(), sort_keys=True) == json.dumps(b.persisted(), sort_keys=True)


# --------------------------------------------------------------------------- restart


async def test_a_restart_finds_every_conversation_as_last_saved(tmp_path):
    """Mid-run (an open run and a pending ask, its stamped envelopes kept
    for re-announcing) and finished conversations, saved through the writer;
    a fresh receiver on the same directory restores them (no file per
    conversation: one document and its journal)."""
    rx, _, _ = receiver(tmp_path)
    ask = [f for f in frames("approve") if R.M.status_of(f) != "finished"]
    mid, done = Conversation(CID.format(1)), Conversation(CID.format(2))
    async with trio.open_nursery() as n:
        await n.start(rx.persist)
        await feed(rx, mid, ask[:len(ask) // 2 + 3])
        await feed(rx, done, frames("approve"))
        await rx._apply_pending(done)
        n.cancel_scope.cancel()  # the daemon stops: the writer writes what is queued
    assert mid.run_id is not None and done.status == "finished"
    again, _, _ = receiver(tmp_path)
    for conv in (mid, done):
        back = again._load(conv.id)
        assert same(back, conv)
        assert back.reannounce_due == (conv.run_envelope is not None or conv.attention_envelope is not None)
    assert again._load(CID.format(3)).persisted() == Conversation(CID.format(3)).persisted()
    files = sorted(p.name for p in (tmp_path / "openhands").iterdir())
    assert files == ["127.0.0.1_1.json.journal"], files  # nothing compacted yet: the journal alone


async def test_every_queued_conversation_is_one_journal_write(tmp_path, autojump_clock):
    """A burst over many conversations within STATE_LINGER: one ``write``
    (the old layout made one file each), and a task's end writes at once."""
    rx, _, _ = receiver(tmp_path)
    convs = [Conversation(CID.format(i)) for i in range(40)]
    async with trio.open_nursery() as n:
        await n.start(rx.persist)
        for c in convs:
            await feed(rx, c, frames("reject"))
        assert rx._state.counters["appends"] == 0
        await trio.sleep(store.STATE_LINGER * 2)
        assert rx._state.counters["appends"] == 1
        assert set(saved(tmp_path)) == {c.id for c in convs}
        convs[0].anchor, convs[0].dirty = "2030-01-01T00:00:00", True
        rx._flush(convs[0], force=True, now=True)  # a task's end: not queued
        assert rx._state.counters["appends"] == 2
        assert saved(tmp_path)[convs[0].id]["anchor"] == "2030-01-01T00:00:00"
        n.cancel_scope.cancel()


async def test_a_torn_journal_tail_loses_only_the_torn_line(tmp_path, caplog):
    rx, _, _ = receiver(tmp_path)
    plain, _, _ = receiver(None)  # feeds without saving: one journal line each below
    a, b, c = (Conversation(CID.format(i)) for i in (1, 2, 3))
    await feed(plain, a, frames("approve"))
    rx._write_state(a)
    await feed(plain, b, frames("reject"))
    rx._write_state(b)
    journal = document(tmp_path).with_name("127.0.0.1_1.json.journal")
    raw = journal.read_bytes()
    journal.write_bytes(raw[:-20])  # a crash in the middle of b's line
    caplog.set_level(logging.WARNING)
    again, health, _ = receiver(tmp_path)
    assert same(again._load(a.id), a)
    assert again._load(b.id).persisted() == Conversation(b.id).persisted()
    assert again._state.counters["torn_tail"] == 1
    assert "torn line" in caplog.text
    await feed(plain, c, frames("model_500"))
    again._write_state(c)  # never appended after a torn line: compacted instead
    assert again._state.counters["compactions"] == 1 and health.counters.get("state_write_errors") is None
    assert set(saved(tmp_path)) == {a.id, c.id}
    third, _, _ = receiver(tmp_path)
    assert same(third._load(c.id), c) and third._state.counters["torn_tail"] == 0


async def test_a_vanished_conversation_is_forgotten_across_a_restart(tmp_path):
    rx, _, _ = receiver(tmp_path)
    a, b = Conversation(CID.format(1)), Conversation(CID.format(2))
    for conv in (a, b):
        await feed(rx, conv, frames("approve"))
        rx._write_state(conv)
    appends = rx._state.counters["appends"]
    rx._forget(a.id)
    rx._forget(a.id)  # twice: nothing more to write
    assert rx._state.counters["appends"] == appends + 1
    again, _, _ = receiver(tmp_path)
    assert again._load(a.id).persisted() == Conversation(a.id).persisted()
    assert same(again._load(b.id), b)


async def test_unreadable_state_starts_fresh_with_one_warning(tmp_path, caplog):
    document(tmp_path).parent.mkdir(parents=True)
    document(tmp_path).write_text('{"version": 1, "sessions": {')
    caplog.set_level(logging.WARNING)
    rx, health, _ = receiver(tmp_path)
    conv = rx._load(CID.format(1))
    assert conv.persisted() == Conversation(CID.format(1)).persisted()
    assert rx._load(CID.format(2)).status is None
    assert caplog.text.count("unreadable (JSONDecodeError)") == 1
    await feed(rx, conv, frames("reject"))
    rx._write_state(conv)  # the garbage is replaced by a whole document
    assert health.counters.get("state_write_errors") is None
    assert set(saved(tmp_path)) == {conv.id}


async def test_a_write_failure_is_counted_once_logged_and_no_key_anywhere(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    rx, health, _ = receiver(tmp_path)
    conv = Conversation(CID.format(1))
    await feed(rx, conv, frames("approve"))
    rx._write_state(conv)
    journal = document(tmp_path).with_name("127.0.0.1_1.json.journal")
    text = journal.read_text()
    assert conv.id in text and KEY not in text
    # the journal cannot be written (a directory in its place): the next saves fail, counted
    journal.unlink()
    journal.mkdir()
    try:
        for i in range(3):
            conv.anchor = f"2030-01-0{i + 1}T00:00:00"
            rx._write_state(conv)
    finally:
        journal.rmdir()
    assert health.counters["state_write_errors"] >= 2
    assert caplog.text.count("cannot be written") + caplog.text.count("cannot be replaced") == 1
    assert KEY not in caplog.text
    rx._write_state(conv)  # writable again: the whole document is written
    assert saved(tmp_path)[conv.id]["anchor"] == "2030-01-03T00:00:00"


async def test_the_compactor_runs_beside_the_writer(tmp_path, autojump_clock, monkeypatch):
    """Past COMPACT_MIN the journal is compacted in steps by the compactor
    task persist runs; a restart finds what was saved last."""
    monkeypatch.setattr(state_mod, "COMPACT_MIN", 2000)
    monkeypatch.setattr(state_mod, "COMPACT_CHUNK", 2)
    rx, _, _ = receiver(tmp_path)
    convs = [Conversation(CID.format(i)) for i in range(12)]
    async with trio.open_nursery() as n:
        await n.start(rx.persist)
        for round_ in range(4):
            for c in convs:
                c.anchor, c.dirty = f"2030-01-01T00:00:0{round_}", True
                rx._flush(c, force=True)
            await trio.sleep(store.STATE_LINGER * 2)
        n.cancel_scope.cancel()
    assert rx._state.counters["compactions"] >= 1
    assert document(tmp_path).exists()
    again, _, _ = receiver(tmp_path)
    for c in convs:
        assert same(again._load(c.id), c)


# --------------------------------------------------------------------------- migration


def write_legacy(state_dir: Path, conv: Conversation) -> Path:
    """A conversation's file as the old layout wrote it (``write_atomic``
    of ``json.dumps(conv.persisted())``)."""
    d = legacy(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{conv.id}.json"
    path.write_text(json.dumps(conv.persisted()))
    return path


async def test_the_old_layout_is_carried_into_the_journal_once(tmp_path, caplog):
    old, _, _ = receiver(None)
    convs = [Conversation(CID.format(i)) for i in range(3)]
    await feed(old, convs[0], [f for f in frames("approve") if R.M.status_of(f) != "finished"])
    await feed(old, convs[1], frames("reject"))
    await feed(old, convs[2], frames("model_500"))
    convs[2].ended = True  # an ended conversation stays ended (never reattached)
    for c in convs:
        write_legacy(tmp_path, c)
    bad = legacy(tmp_path) / f"{CID.format(9)}.json"
    bad.write_text("{not json")
    (legacy(tmp_path) / f".{CID.format(1)}.json.abc123").write_text("half")  # a crash's temp file
    caplog.set_level(logging.INFO)
    rx, health, _ = receiver(tmp_path)
    for c in convs:
        assert same(rx._load(c.id), c)
    assert rx._load(CID.format(9)).persisted() == Conversation(CID.format(9)).persisted()
    assert "unreadable" in caplog.text and KEY not in caplog.text
    assert not legacy(tmp_path).exists(), "the old directory is removed once carried"
    assert rx._state.counters["appends"] == 1, "carried in one write"
    assert set(saved(tmp_path)) == {c.id for c in convs}
    again, _, _ = receiver(tmp_path)
    for c in convs:
        assert same(again._load(c.id), c)
    assert again._state.counters["appends"] == 0 and health.counters.get("state_write_errors") is None


async def test_a_file_carried_before_a_crash_does_not_set_the_document_back(tmp_path):
    """A crash after the carry's write but before the removal: the file is
    older than (or as new as) the document's entry, which wins."""
    rx, _, _ = receiver(tmp_path)
    conv = Conversation(CID.format(1))
    await feed(rx, conv, [f for f in frames("approve") if R.M.status_of(f) != "finished"])
    write_legacy(tmp_path, conv)  # the old file, as carried
    rx._load(conv.id)  # carried and removed
    await feed(rx, conv, frames("approve"))
    rx._write_state(conv)  # the conversation moved on
    stale = Conversation.restore(json.loads(json.dumps(conv.persisted())), conv.id)
    stale.status, stale.anchor = "running", "2000-01-01T00:00:00"
    write_legacy(tmp_path, stale)  # as if its removal had not happened
    (legacy(tmp_path) / "notes.txt").write_text("not ours")
    again, _, _ = receiver(tmp_path)
    assert same(again._load(conv.id), conv)
    assert sorted(p.name for p in legacy(tmp_path).iterdir()) == ["notes.txt"], \
        "the stale file is removed, what is not ours is left alone"


async def test_a_failed_carry_removes_nothing(tmp_path):
    conv = Conversation(CID.format(1))
    conv.anchor = "2026-01-01T00:00:00"
    path = write_legacy(tmp_path, conv)
    document(tmp_path).with_name("127.0.0.1_1.json.journal").mkdir()  # the journal cannot be opened
    rx, health, _ = receiver(tmp_path)
    assert rx._load(conv.id).anchor == conv.anchor  # still read
    assert health.counters["state_write_errors"] >= 1
    assert path.exists(), "kept for the next start"


# --------------------------------------------------------------------------- the property

_STATUS = st.sampled_from([None, "idle", "running", "paused", "waiting_for_confirmation", "finished"])
_CID = st.integers(0, 3)  # few conversations: the ops meet on the same ones
_CHANGE = st.tuples(st.just("change"), _CID, _STATUS, st.integers(0, 60))  # queued for the writer
_DRAIN = st.tuples(st.just("drain"))  # the writer wakes (STATE_LINGER later)
_FORGET = st.tuples(st.just("forget"), _CID)  # vanished from the server
_OPS = st.lists(st.one_of(  # (listed twice: drawn more often than a restart)
    _CHANGE, _CHANGE, _CHANGE, _DRAIN, _DRAIN, _FORGET, _FORGET,
    st.tuples(st.just("now"), _CID),  # a task's end: written at once
    st.tuples(st.just("stop")),  # the daemon stops: the writer writes what is queued, restart
    st.tuples(st.just("crash")),  # killed: what is queued is lost, restart
    st.tuples(st.just("leftover"), _CID),  # an old-layout file carried, crash, restart
), max_size=60)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS, legacy_ids=st.sets(_CID, max_size=3))
def test_the_journal_restores_what_per_conversation_files_would(tmp_path_factory, ops, legacy_ids):
    """The slow path is the old layout: each conversation's file holds its
    last written ``persisted()``, a forgotten one has none, a restart reads
    each file. The model keeps exactly that; after every restart each
    conversation the new receiver loads equals ``Conversation.restore`` of
    the model's file (compactions forced often: COMPACT_MIN 600 bytes)."""
    state_dir = tmp_path_factory.mktemp("prop")
    real_min = state_mod.COMPACT_MIN
    state_mod.COMPACT_MIN = 600
    try:
        files: dict[str, dict] = {}  # the old layout: cid -> the file's JSON
        for i in legacy_ids:
            c = Conversation(CID.format(i))
            c.status, c.anchor, c.started = "idle", f"2025-01-01T00:00:{i:02d}", True
            write_legacy(state_dir, c)
            files[c.id] = json.loads(json.dumps(c.persisted()))

        def restart() -> tuple[Receiver, dict[str, Conversation]]:
            rx, _, _ = receiver(state_dir)
            convs = {}
            for i in range(5):  # (4: never saved)
                cid = CID.format(i)
                convs[cid] = back = rx._load(cid)
                want = Conversation.restore(files.get(cid), cid)
                assert same(back, want), (cid, back.persisted(), files.get(cid))
            return rx, convs

        async def scenario() -> None:  # (_flush reads trio's clock)
            nonlocal files
            rx, convs = restart()
            rx._persisting = True  # as while persist runs: changes are queued
            queued: dict[str, Conversation] = {}  # the model's own queue (the writer's)

            def written(c: Conversation) -> None:
                files[c.id] = json.loads(json.dumps(c.persisted()))

            for op in ops:
                if op[0] == "change":
                    _, i, status, n = op
                    c = convs[CID.format(i)]
                    c.status, c.anchor, c.started = status, f"2026-01-01T00:{n:02d}:00", True
                    c.remember(f"ev-{i}-{n}")
                    if status == "running" and c.run_id is None:
                        c.run_n += 1
                        c.run_id = f"run:{c.id}:{c.run_n}"
                        c.run_envelope = {"id": f"env-{n}", "run": c.run_id, "type": "run.started"}
                    elif status != "running":
                        c.run_id, c.run_envelope = None, None
                    c.dirty = True
                    rx._flush(c, force=True)
                    queued[c.id] = c
                elif op[0] == "now":
                    c = convs[CID.format(op[1])]
                    c.dirty = True
                    rx._flush(c, force=True, now=True)
                    queued.pop(c.id, None)
                    written(c)
                elif op[0] in ("drain", "stop"):
                    rx._write_due()
                    for c in queued.values():
                        written(c)
                    queued.clear()
                    if op[0] == "stop":
                        rx, convs = restart()
                        rx._persisting = True
                elif op[0] == "forget":
                    cid = CID.format(op[1])
                    rx._forget(cid)
                    files.pop(cid, None)
                    queued.pop(cid, None)
                elif op[0] == "leftover":  # carried, then a crash before the file's removal
                    cid = CID.format(op[1])
                    if cid in files:  # (a stale copy: the document's entry must win)
                        stale = Conversation(cid)
                        stale.status, stale.anchor = "idle", "1999-01-01T00:00:00"
                        write_legacy(state_dir, stale)
                    queued.clear()
                    rx, convs = restart()
                    rx._persisting = True
                else:  # crash: queued changes never reached a file
                    queued.clear()
                    rx, convs = restart()
                    rx._persisting = True
            rx._write_due()
            for c in queued.values():
                written(c)
            restart()

        trio.run(scenario)
        assert set(saved(state_dir)) == set(files)
    finally:
        state_mod.COMPACT_MIN = real_min
