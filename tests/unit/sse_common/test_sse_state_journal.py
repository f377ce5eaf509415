"""The SSE bridge's incremental state file (``bridges/sse_common/state.py``,
issue 11): the journal replays to exactly what the tracker's whole
snapshot says, a torn tail loses only the torn line, compaction is crash-safe,
and a save writes what changed, not what is open (counts, not times)."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as hs

from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.sse_common import state as state_mod
from bridges.sse_common.state import StateFile
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
            sf.save_changes(tr.changes(), tr.snapshot)
            assert fresh_load(path) == json.loads(json.dumps(tr.snapshot(), sort_keys=True))["sessions"]
            checked += 1
    assert checked > 5 and sf.counters["appends"] > 0


def test_a_torn_journal_tail_loses_only_the_torn_line_and_the_next_save_compacts(tmp_path):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    model = {"a": entry("r1"), "b": entry("r2")}
    sf.save_changes(dict(model), lambda: {"version": 1, "sessions": model})
    assert sf.journal.exists() and not path.exists()  # appended, not rewritten
    with open(sf.journal, "ab") as f:  # a crash mid-write: half a line
        f.write(b'["c",{"directory":"/w","ru')
    again = StateFile(path)
    assert again.load()["sessions"] == model
    assert again.counters["torn_tail"] == 1
    model["c"] = entry("r3")
    again.save_changes({"c": model["c"]}, lambda: {"version": 1, "sessions": model})
    # never appended after the fragment: compacted into the document instead
    assert again.counters == {"appends": 0, "compactions": 1, "torn_tail": 1}
    assert not again.journal.exists()
    assert fresh_load(path) == model
    assert json.loads(path.read_text())["sessions"] == model


def test_an_unparsable_line_ends_the_replay(tmp_path):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    sf.save_changes({"a": entry("r1")}, lambda: {})
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
        sf.save_changes({sid: model[sid]}, lambda: {"version": 1, "sessions": dict(model)})
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
    restarted.save_changes({"s1": model["s1"]}, lambda: {"version": 1, "sessions": dict(model)})
    assert restarted.counters["compactions"] == 1  # never appended to the stale journal
    assert fresh_load(path) == model


def test_gone_sessions_leave_the_file_and_unchanged_ones_are_not_rewritten(tmp_path):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    sf.save_changes({"a": entry("r1"), "b": entry("r2")}, lambda: {})
    size = sf.journal.stat().st_size
    sf.save_changes({"a": entry("r1"), "zz": None}, lambda: {})  # nothing changed, nothing known gone
    assert sf.journal.stat().st_size == size and sf.counters["appends"] == 1
    sf.save_changes({"a": None}, lambda: {})
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
        sf.save_changes({sid: model[sid]}, lambda: {"version": 1, "sessions": model})
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
            sf.save_changes({sid: model.get(sid)}, lambda: {"version": 1, "sessions": dict(model)})
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
