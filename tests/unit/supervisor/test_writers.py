"""Issue 25, sixth outside attack: two ways around retention by writer.

1. Stem alias: a session named ``{S}.{UTC}`` (a rotated segment's stamp)
   had the file name of a segment of session ``S``, so retention charged
   it to ``S``'s writer (a fleet bridge) and the relay's restore read it as
   ``S``'s history. No session id's file name ends in the stamp now
   (:func:`supervisor.sessionlog.jsonlog.safe_name`).
2. First writer decides: a session whose first line came from an open
   writer (the unauthenticated OTLP receiver) stayed in that writer's
   group after the authenticated hook bridge wrote it. An authenticated
   writer outranks an open one now, across restarts."""
from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.aep import dumps
from supervisor.relay.restore import read_tails
from supervisor.sessionlog.jsonlog import SessionLog, safe_name
from supervisor.sessionlog.retention import RetainingSessionLog, RetentionPolicy, segment_name
from supervisor.sessionlog.writers import INDEX_NAME, WriterIndex, stem_of

_STAMPS = st.from_regex(r"\.[0-9]{8}T[0-9]{6}\.[0-9]{6}Z", fullmatch=True)
_PLAIN = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)
#: session ids: anything, and the shapes that end like a segment (plain or not)
_IDS = st.one_of(
    st.text(max_size=40),
    st.builds(str.__add__, _PLAIN, _STAMPS),
    st.builds(str.__add__, st.text(max_size=20), _STAMPS),
    st.builds(lambda a, s1, s2: a + s1 + s2, _PLAIN, _STAMPS, _STAMPS),
    st.builds(lambda a, s: a + s + ".jsonl", _PLAIN, _STAMPS),
)


def _files_of(name: str) -> list[str]:
    """Every file name the session log and retention make for a session
    whose file-name form is ``name``: the live file, a torn tail kept
    aside, a rotated segment, its ``.gz`` and the compression's temporary."""
    live = f"{name}.jsonl"
    seg = segment_name(Path(live), 1_796_000_000.25).name
    return [live, live + ".torn", seg, seg + ".gz", seg + ".gz.tmp"]


@settings(max_examples=400, deadline=None)
@given(_IDS, _IDS)
def test_no_session_id_names_a_file_that_belongs_to_another_session(a, b):
    # the property: the stem retention groups a file by is its own session's
    # alone (stem_of of any of x's files is x's; distinct ids, distinct stems)
    for x in (a, b):
        name = safe_name(x)
        for f in _files_of(name):
            assert stem_of("claude-code", f) == f"claude-code/{name}", (x, f)
    if a != b:
        assert safe_name(a) != safe_name(b)
        assert stem_of("claude-code", f"{safe_name(a)}.jsonl") != \
            stem_of("claude-code", _files_of(safe_name(b))[2])


def test_a_segment_shaped_session_id_has_a_name_of_its_own_and_ordinary_ids_keep_theirs():
    fleet = "b5dda942-4abc-404a-a0bf-df74576c75a6"
    alias = f"{fleet}.20260101T000001.000000Z"
    name = safe_name(alias)
    assert name.startswith("~") and stem_of("claude-code", f"{name}.jsonl") != \
        f"claude-code/{fleet}"
    assert urllib.parse.unquote(name[1:]) == alias  # still the id, percent-decoded
    # logs written before keep their names: ordinary ids are named as they always were
    for sid in (fleet, "01J9ZK3W8Q0D7T1M2N3P4R5S6V", "a.b_c-d", "x.20260101T000001"):
        assert safe_name(sid) == sid
    for sid in ("has space", "ünï", "a/b"):
        assert safe_name(sid) == "~" + urllib.parse.quote(sid, safe="")


def _ev(session: str, seq: int, agent: str = "claude-code") -> dict:
    return {"aep": "0.1", "id": f"{session}-{seq}", "type": "tool.completed",
            "time": "2026-12-01T10:00:00.000Z", "source": f"aep://h/agent/x/session/{seq}",
            "agent": agent, "session": session, "epoch": 1, "seq": seq}


def test_the_alias_is_neither_grouped_with_the_fleet_session_nor_restored_as_its_history(tmp_path):
    fleet = "b5dda942-4abc-404a-a0bf-df74576c75a6"
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_total_bytes=None))
    log.write(_ev(fleet, 1), writer="claude_code")
    assert log.rotate(tmp_path / "claude-code" / f"{fleet}.jsonl") is not None  # a real segment
    log.write(_ev(fleet, 2), writer="claude_code")
    aliases = [f"{fleet}.20260101T0000{k:02d}.000000Z" for k in range(3)]
    for k, alias in enumerate(aliases):
        log.write(_ev(alias, 10 + k), writer="relay:emitter:alice")
    log.check()
    group = log._grouper()
    files = sorted((tmp_path / "claude-code").iterdir())
    groups = {f.name: group(f) for f in files}
    fleet_files = [n for n, g in groups.items() if g == "w:claude_code"]
    assert len(fleet_files) == 2 and all(n.startswith(fleet) for n in fleet_files), groups
    assert sum(g == "w:relay:emitter:alice" for g in groups.values()) == 3, groups
    log.close()
    # the relay's restore: the fleet session's history is its own files alone
    chosen, counts = read_tails(tmp_path, depth=100, buffer_bytes=1 << 20,
                                total_bytes=1 << 24, max_sessions=10)
    assert counts["sessions"] == 4
    by_session: dict[str, list[int]] = {}
    for lines in chosen:
        evs = [json.loads(ln) for ln in lines]
        assert len({e["session"] for e in evs}) == 1, evs  # one session's lines per group
        by_session[evs[0]["session"]] = [e["seq"] for e in evs]
    assert by_session[fleet] == [1, 2]


def test_a_log_written_by_the_old_naming_still_restores(tmp_path):
    # a session rotated under the naming before this change (ordinary ids
    # keep their names, the segment shape is unchanged): read as it was
    d = tmp_path / "claude-code"
    d.mkdir()
    (d / "s1.20261201T100000.000001Z.jsonl").write_bytes(dumps(_ev("s1", 1)) + b"\n")
    (d / "s1.jsonl").write_bytes(dumps(_ev("s1", 2)) + b"\n")
    chosen, counts = read_tails(tmp_path, depth=100, buffer_bytes=1 << 20,
                                total_bytes=1 << 24, max_sessions=10)
    assert counts["sessions"] == 1 and [json.loads(ln)["seq"] for ln in chosen[0]] == [1, 2]
    log = SessionLog(tmp_path)
    assert log.path_for(_ev("s1", 3)) == d / "s1.jsonl"  # appended to the same file


# -- 2. an authenticated writer outranks an open one ------------------------------------------


def _log(root: Path) -> RetainingSessionLog:
    log = RetainingSessionLog(root, RetentionPolicy(max_total_bytes=None), max_open=8)
    assert log.writers is not None
    log.writers.open_writers.add("otlp_in.codex")  # as the fleet says (open_sessions)
    log.writers.open_prefixes += ("relay:",)  # as the daemon says (the relay's posters)
    return log


def _written(root: Path) -> dict[str, str]:
    again = WriterIndex(root)  # what a restart reads back
    return {s: again.get(s) for s in ("codex/v", "codex/c", "codex/o", "codex/b") if again.get(s)}


def test_an_authenticated_writer_takes_a_session_an_open_writer_opened_and_a_restart_keeps_it(
        tmp_path):
    log = _log(tmp_path)
    log.write(_ev("v", 1, "codex"), writer="otlp_in.codex")  # Codex's export (or anyone) first
    log.write(_ev("v", 2, "codex"), writer="codex_hooks")  # the same descriptor, still open
    log.write(_ev("v", 3, "codex"), writer="otlp_in.codex")  # the open writer again: no effect
    log.write(_ev("c", 1, "codex"), writer="codex_hooks")  # the control: hooks first
    log.write(_ev("c", 2, "codex"), writer="otlp_in.codex")
    log.write(_ev("o", 1, "codex"), writer="otlp_in.codex")  # open writers only: the first's
    log.write(_ev("o", 2, "codex"), writer="relay:emitter:alice")
    # one batch whose first line is the open writer's
    log.write_raw_batch([(_ev("b", 1, "codex"), dumps(_ev("b", 1, "codex"))),
                         (_ev("b", 2, "codex"), dumps(_ev("b", 2, "codex")))],
                        ["otlp_in.codex", "codex_hooks"])
    group = log._grouper()
    assert group(tmp_path / "codex" / "v.jsonl") == "w:codex_hooks"
    log.check()  # the index on disk
    assert _written(tmp_path) == {"codex/v": "codex_hooks", "codex/c": "codex_hooks",
                                  "codex/o": "otlp_in.codex", "codex/b": "codex_hooks"}
    log.close()
    # after a restart: an open writer still cannot take the hook sessions back
    log = _log(tmp_path)
    for s in ("v", "c", "b"):
        log.write(_ev(s, 9, "codex"), writer="otlp_in.codex")
    log.close()
    assert _written(tmp_path) == {"codex/v": "codex_hooks", "codex/c": "codex_hooks",
                                  "codex/o": "otlp_in.codex", "codex/b": "codex_hooks"}


def test_an_index_written_before_ranks_is_read_and_ranked(tmp_path):
    # lines from before this change ([stem, writer]): an open writer's is
    # taken by an authenticated writer, an authenticated writer's is kept
    (tmp_path / INDEX_NAME).write_text(json.dumps(["codex/v", "otlp_in.codex"]) + "\n"
                                       + json.dumps(["codex/c", "codex_hooks"]) + "\n")
    idx = WriterIndex(tmp_path)
    idx.open_writers.add("otlp_in.codex")
    assert idx.note("codex/v", "codex_hooks") is True
    assert idx.note("codex/c", "other_bridge") is True  # settled: kept by its first writer
    assert idx.note("codex/n", "otlp_in.codex") is False  # a new stem an open writer opens
    idx.close()
    again = WriterIndex(tmp_path)  # no rank known at load: the recorded ones decide
    assert (again.get("codex/v"), again.get("codex/c"), again.get("codex/n")) == \
        ("codex_hooks", "codex_hooks", "otlp_in.codex")
    # a rewrite (prune) keeps the ranks
    for i in range(600):
        again.note(f"codex/x{i}", "otlp_in.codex")
    again.flush()
    again.prune({"codex/v", "codex/c", "codex/n"})  # noted since the last: kept this time
    again.prune({"codex/v", "codex/c", "codex/n"})
    again.close()
    assert len((tmp_path / INDEX_NAME).read_text().splitlines()) == 3  # rewritten
    last = WriterIndex(tmp_path)
    last.open_writers.add("otlp_in.codex")
    assert last.note("codex/v", "otlp_in.codex") is True and last.get("codex/v") == "codex_hooks"
    assert last.note("codex/n", "codex_hooks") is True and last.get("codex/n") == "codex_hooks"
