"""The shared state file (``bridges/core/statefile.py``) beyond what the SSE
bridge's tests cover (``tests/unit/sse_common/test_sse_state_journal.py``:
journal replay, torn tails, compaction and its crash safety): what the
OpenHands receiver adds to its use, one entry read at attach and a
compactor task that ends before the saves do (the writer's last write)."""
from __future__ import annotations

import json

import trio
import trio.testing

from bridges.core import statefile as state_mod
from bridges.core.statefile import StateFile


def entry(n: int) -> dict:
    return {"v": 1, "anchor": f"2026-01-01T00:00:{n % 60:02d}", "seen": [f"id-{n}"] * 4}


def test_entry_reads_what_the_file_holds_as_a_fresh_copy(tmp_path):
    path = tmp_path / "s.json"
    sf = StateFile(path)
    sf.load()
    assert sf.entry("a") is None
    sf.save_changes({"a": entry(1), "b": entry(2)})
    got = sf.entry("a")
    assert got == entry(1)
    got["anchor"] = "changed"  # the caller's copy: the file's text is untouched
    assert sf.entry("a") == entry(1)
    sf.save_changes({"a": None})
    assert sf.entry("a") is None
    again = StateFile(path)
    again.load()
    assert again.entry("a") is None and again.entry("b") == entry(2)


async def test_a_save_after_the_compactor_ended_compacts_at_once(tmp_path, monkeypatch):
    """The compactor cancelled (the writer's nursery ends) before the last
    save: that save finds no task to wake and compacts itself, instead of
    setting an event nobody waits for (the journal would grow until the
    next start)."""
    monkeypatch.setattr(state_mod, "COMPACT_MIN", 300)
    path = tmp_path / "s.json"
    sf = StateFile(path)
    sf.load()
    async with trio.open_nursery() as n:
        n.start_soon(sf.compactor)
        await trio.testing.wait_all_tasks_blocked()
        assert sf._wake is not None  # noqa: SLF001 (the task waits for work)
        n.cancel_scope.cancel()
    assert sf._wake is None  # noqa: SLF001
    for i in range(20):
        sf.save_changes({f"s{i}": entry(i)})
    assert sf.counters["compactions"] >= 1
    doc = json.loads(path.read_text())
    assert doc["journal"] == sf._gen  # noqa: SLF001
    fresh = StateFile(path).load()
    assert isinstance(fresh, dict) and fresh["sessions"] == {f"s{i}": entry(i) for i in range(20)}


def test_a_crash_mid_compaction_leaves_no_temporary_document_behind(tmp_path):
    """The compaction writes its new document to ``.{name}.XXXXXXXX`` before
    the replace; a kill -9 in between left one per crash (break-it review:
    ~30 after 40 kills). ``load`` removes them; the document, its journal
    and other files stay."""
    path = tmp_path / "srv.json"
    first = StateFile(path)
    first.load()
    first.save_changes({"a": entry(1)})
    for junk in (".srv.json.abc12345", ".srv.json.zz"):
        (tmp_path / junk).write_text('{"version": 1, "sess')
    (tmp_path / ".other.json.abc12345").write_text("not this file's")
    before = {p.name for p in tmp_path.iterdir()} - {".srv.json.abc12345", ".srv.json.zz"}
    again = StateFile(path)
    again.load()
    assert {p.name for p in tmp_path.iterdir()} == before
    assert again.entry("a") == entry(1)
