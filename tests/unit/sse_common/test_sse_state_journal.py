"""The SSE bridge's incremental state file (``bridges/core/statefile.py``,
issue 11): the journal replays to exactly what the tracker's whole
snapshot says, a torn tail loses only the torn line, compaction is crash-safe,
and a save writes what changed, not what is open (counts, not times)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as hs

from bridges.core import statefile as state_mod
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.core.statefile import StateFile
from bridges.sse_common.tracker import Tracker
from tests.support.opencode_fixtures import global_events
from tests.unit.sse_common.test_sse_tracker import stamp


def entry(run: str) -> dict:
    return {"directory": "/w", "run": run, "started": True, "closed_runs": [], "settled": [],
            "cancel": None, "run_envelope": None, "asks": []}


def fresh_load(path) -> dict:
    """The sessions a restarted daemon would restore from ``path``."""
    doc = StateFile(path).load()
    assert doc is None or isinstance(doc, dict)
    return (doc or {}).get("sessions") or {}


def test_replaying_the_real_capture_persists_what_the_snapshot_says(tmp_path):
    """Every frame of the real OpenCode capture, persisted incrementally after
    each (as the receiver does): a fresh load equals the tracker's whole
    snapshot, at every step (restart recovery reads the same document)."""
    path = tmp_path / "oc.json"
    sf = StateFile(path)
    tr = Tracker(Posture(agent="opencode", mode="primary"))
    st = Stamper("opencode", epoch=1, host="t")
    checked = 0
    for ev in global_events("opencode"):
        for o in tr.feed(ev):
            stamp([o], st)
            tr.touch(o.session)
        if tr.dirty:
            tr.dirty = False
            sf.save_changes(tr.changes())
            assert fresh_load(path) == json.loads(json.dumps(tr.snapshot(), sort_keys=True))["sessions"]
            checked += 1
    assert checked > 5 and sf.counters["appends"] > 0


def test_a_torn_journal_tail_loses_only_the_torn_line_and_the_next_save_compacts(tmp_path):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model = {"a": entry("r1"), "b": entry("r2")}
    sf.save_changes(dict(model))
    assert sf.journal.exists() and not path.exists()  # appended, not rewritten
    with open(sf.journal, "ab") as f:  # a crash mid-write: half a line
        f.write(b'["c",{"directory":"/w","ru')
    again = StateFile(path)
    assert again.load()["sessions"] == model
    assert again.counters["torn_tail"] == 1
    model["c"] = entry("r3")
    again.save_changes({"c": model["c"]})
    # never appended after the fragment: compacted into the document instead
    assert again.counters == {"appends": 0, "compactions": 1, "torn_tail": 1}
    assert not again.journal.exists()
    assert fresh_load(path) == model
    assert json.loads(path.read_text())["sessions"] == model


def test_an_unparsable_line_ends_the_replay(tmp_path):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    sf.save_changes({"a": entry("r1")})
    with open(sf.journal, "ab") as f:
        f.write(b"garbage\n" + json.dumps(["b", entry("r2")]).encode() + b"\n")
    loaded = StateFile(path)
    assert loaded.load()["sessions"] == {"a": entry("r1")}
    assert loaded.counters["torn_tail"] == 1


def test_a_crash_between_compaction_and_journal_removal_changes_nothing(tmp_path, monkeypatch):
    """A compaction replaces the document, then removes the journal; a crash
    in between leaves the old journal beside the new document. It is of an
    older generation and never replayed: replaying it would set ``s0``
    back to its first run (the compacting save changed it)."""
    monkeypatch.setattr(state_mod, "COMPACT_MIN", 300)
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model: dict = {}
    stale = b""
    for i in range(40):
        sid = f"s{i % 3}"
        model[sid] = entry(f"r{i}")
        before = sf.journal.read_bytes() if sf.journal.exists() else b""
        sf.save_changes({sid: model[sid]})
        if sf.counters["compactions"] == 1 and not stale:
            stale = before  # what the crash would have left
            kept = dict(model)
            break
    assert stale and b'"s0"' in stale
    sf.journal.write_bytes(stale)
    assert fresh_load(path) == kept
    restarted = StateFile(path)
    restarted.load()
    model["s1"] = entry("later")
    restarted.save_changes({"s1": model["s1"]})
    assert restarted.counters["compactions"] == 1  # never appended to the stale journal
    assert fresh_load(path) == model


def test_gone_sessions_leave_the_file_and_unchanged_ones_are_not_rewritten(tmp_path):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    sf.save_changes({"a": entry("r1"), "b": entry("r2")})
    size = sf.journal.stat().st_size
    sf.save_changes({"a": entry("r1"), "zz": None})  # nothing changed, nothing known gone
    assert sf.journal.stat().st_size == size and sf.counters["appends"] == 1
    sf.save_changes({"a": None})
    assert fresh_load(path) == {"b": entry("r2")}


def test_a_save_writes_the_changed_entry_not_every_open_run(tmp_path):
    """5,000 open runs, then one session changes: one journal line, whose
    size does not depend on how many runs are open."""
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model = {f"ses_{i:05d}": entry(f"msg_{i:05d}") for i in range(5000)}
    sf.save(dict(version=1, sessions=model))
    doc = path.read_bytes()
    for sid in ("ses_00003", "ses_00007"):
        before = sf.journal.stat().st_size if sf.journal.exists() else 0
        model[sid] = dict(entry("msg_x"), settled=["per_1"])
        sf.save_changes({sid: model[sid]})
        line = sf.journal.read_bytes()[before:]
        assert line.endswith(b"\n") and line.count(b"\n") <= 2  # its line (+ the journal's header)
        assert sid.encode() in line and b"ses_00008" not in line
    assert path.read_bytes() == doc  # the document was not rewritten
    assert fresh_load(path) == model


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from(["a", "b", "c", "d", "e"]),
                          hs.one_of(hs.none(), hs.sampled_from(["r1", "r2", "r3"]))),
                min_size=1, max_size=40),
       hs.integers(min_value=0, max_value=40))
def test_any_sequence_of_saves_and_compactions_loads_to_the_model(tmp_path_factory, ops, torn_at):
    state_mod_compact = state_mod.COMPACT_MIN
    state_mod.COMPACT_MIN = 300  # compact often
    try:
        path = tmp_path_factory.mktemp("j") / "s.json"
        sf = StateFile(path)
        model: dict = {}
        for i, (sid, run) in enumerate(ops):
            if run is None:
                model.pop(sid, None)
            else:
                model[sid] = entry(run)
            sf.save_changes({sid: model.get(sid)})
            if i == torn_at and sf.journal.exists():  # a torn tail, then a restart
                with open(sf.journal, "ab") as f:
                    f.write(b'["x",{')
                sf = StateFile(path)
                sf.load()
                assert fresh_load(path) == model
        assert fresh_load(path) == model
        assert list(fresh_load(path)) == sorted(model)  # restored in id order, as the document keeps them
    finally:
        state_mod.COMPACT_MIN = state_mod_compact


class Crash(BaseException):
    """A crash at a chosen moment (not an ``OSError``: nothing handles it)."""


def _chunked(monkeypatch, sf: StateFile, model: dict, during: list[tuple[str, str | None]]):
    """One chunked compaction of ``sf`` with the saves ``during`` made
    between its steps (``model`` kept in step)."""
    monkeypatch.setattr(state_mod, "COMPACT_CHUNK", 3)
    steps = sf.compaction()
    for sid, run in during:
        next(steps)
        if run is None:
            model.pop(sid, None)
        else:
            model[sid] = entry(run)
        sf.save_changes({sid: model.get(sid)})
    for _ in steps:
        pass


def test_saves_made_during_a_chunked_compaction_are_kept(tmp_path, monkeypatch):
    """The compaction writes the document a few sessions per step; what is
    saved between steps (changed, new, gone sessions) goes on to the old
    journal, then into the new generation's: a fresh load is the model, the
    document is every entry as of the compaction's start, and later saves
    append to the new journal."""
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model = {f"s{i:02d}": entry(f"r{i}") for i in range(12)}
    sf.save_changes(dict(model))
    start = dict(model)
    _chunked(monkeypatch, sf, model, [("s01", "x1"), ("s99", "new"), ("s05", None), ("s01", "x2")])
    assert sf.counters["compactions"] == 1 and not sf.journal_next.exists()
    assert json.loads(path.read_text())["sessions"] == start
    assert fresh_load(path) == model
    model["s02"] = entry("later")
    sf.save_changes({"s02": model["s02"]})
    assert fresh_load(path) == model
    assert sf.compacted(7) == state_mod._dumps({"journal": 7, "sessions": model, "version": 1})


def test_a_compaction_with_nothing_saved_meanwhile_removes_the_journal(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model = {f"s{i}": entry(f"r{i}") for i in range(7)}
    sf.save_changes(dict(model))
    _chunked(monkeypatch, sf, model, [])
    assert not sf.journal.exists() and not sf.journal_next.exists()
    assert path.read_text() == state_mod._dumps({"journal": 1, "sessions": model, "version": 1})


@pytest.mark.parametrize("crash_at", [1, 2])
def test_a_crash_at_any_step_of_a_chunked_compaction_loses_nothing(tmp_path, monkeypatch,
                                                                   crash_at):
    """A crash once the new journal is written, before the document's
    replace (1), or between the replace and the journal's move (2): a
    restart loads the model each time (the old journal, then the new one),
    and its saves never append to a journal that is not in place."""
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model = {f"s{i:02d}": entry(f"r{i}") for i in range(10)}
    sf.save_changes(dict(model))
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == crash_at:
            raise Crash()
        real_replace(src, dst)
    monkeypatch.setattr(state_mod.os, "replace", replace)
    with pytest.raises(Crash):
        _chunked(monkeypatch, sf, model, [("s03", "x"), ("s11", "new"), ("s00", None)])
    monkeypatch.setattr(state_mod.os, "replace", real_replace)
    assert [Path(c).name for c in calls][-1] == ["s.json", "s.json.journal"][crash_at - 1]
    assert sf.journal_next.exists()
    assert fresh_load(path) == model
    restarted = StateFile(path)
    restarted.load()
    model["s04"] = entry("after")
    restarted.save_changes({"s04": model["s04"]})
    assert fresh_load(path) == model
    model["s05"] = entry("after2")
    restarted.save_changes({"s05": model["s05"]})
    assert fresh_load(path) == model
    # a `.journal.next` left behind (crash 1) is of a generation the document
    # reaches only through a compaction, which replaces or removes it first
    for _ in restarted.compaction():
        pass
    assert fresh_load(path) == model and not restarted.journal_next.exists()


async def test_the_compactor_task_compacts_between_checkpoints(tmp_path, monkeypatch):
    """With the bridge's compactor running, a save that finds the journal
    due only wakes it: the compaction happens in steps at later checkpoints,
    saves keep going meanwhile, and the file ends as the model."""
    monkeypatch.setattr(state_mod, "COMPACT_MIN", 300)
    monkeypatch.setattr(state_mod, "COMPACT_CHUNK", 2)
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model: dict = {}
    woke = 0
    async with trio.open_nursery() as n:
        n.start_soon(sf.compactor)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(200):
            sid = f"s{i % 13:02d}"
            model[sid] = entry(f"r{i}")
            before = sf.counters["compactions"]
            sf.save_changes({sid: model[sid]})
            assert sf.counters["compactions"] == before  # never inside the save
            woke += sf._wake is not None and sf._wake.is_set()  # noqa: SLF001 (due, not yet run)
            await trio.lowlevel.checkpoint()
        await trio.testing.wait_all_tasks_blocked()
        n.cancel_scope.cancel()
    assert sf.counters["compactions"] >= 3 and woke >= 3
    assert fresh_load(path) == model


@settings(max_examples=80, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from(["a", "b", "c", "d", "e", "f", "g"]),
                          hs.one_of(hs.none(), hs.sampled_from(["r1", "r2", "r3"])),
                          hs.sampled_from(["save", "start", "step", "step", "restart"])),
                min_size=1, max_size=40))
def test_any_interleaving_of_saves_and_compaction_steps_loads_to_the_model(tmp_path_factory, ops):
    """Saves, compactions started, advanced a step, or cut short by a
    restart, in any order: a fresh load is the model after every save."""
    chunk = state_mod.COMPACT_CHUNK
    state_mod.COMPACT_CHUNK = 2
    try:
        path = tmp_path_factory.mktemp("c") / "s.json"
        sf = StateFile(path)
        model: dict = {}
        steps = None
        for sid, run, what in ops:
            if what == "start" and steps is None:
                steps = sf.compaction()
            elif what == "step" and steps is not None:
                if next(steps, "done") == "done":
                    steps = None
            elif what == "restart":
                if steps is not None:
                    steps.close()  # the process died mid-compaction
                    steps = None
                sf = StateFile(path)
                sf.load()
            if run is None:
                model.pop(sid, None)
            else:
                model[sid] = entry(run)
            sf.save_changes({sid: model.get(sid)})
            assert fresh_load(path) == model
        if steps is not None:
            for _ in steps:
                pass
        assert fresh_load(path) == model
        assert list(fresh_load(path)) == sorted(model)
    finally:
        state_mod.COMPACT_CHUNK = chunk
