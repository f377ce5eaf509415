"""The session log's file handling on the hot path (issue 11): each agent
directory made once (remembered, no ``mkdir`` and no exception per new
file), ``os.open`` on a ``str`` path, batches grouped by ``(agent,
session)``, the descriptor bound kept, and a directory removed under the
log made again. Held to a model (every file holds exactly the lines
written for its session, in order) and to one ``write`` per event."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.sessionlog import jsonlog
from supervisor.sessionlog.jsonlog import SessionLog, encode_line

_AGENTS = st.sampled_from(["codex", "openhands", "a/b", None])
_SESSIONS = st.sampled_from(["s1", "s2", "ses 3", "../x", None, "s5", "s6"])


def _ev(agent, session, n):
    ev = {"aep": "0.1", "id": f"e{n}", "type": "x.t.e", "seq": n}
    if agent is not None:
        ev["agent"] = agent
    if session is not None:
        ev["session"] = session
    return ev


def _files(root: Path) -> dict[str, list[int]]:
    out = {}
    for p in sorted(root.rglob("*.jsonl")):
        out[str(p.relative_to(root))] = [json.loads(x)["seq"] for x in
                                         p.read_text().splitlines()]
    return out


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(_AGENTS, _SESSIONS), min_size=1, max_size=8),
                        max_size=12),
       max_open=st.integers(1, 4))
def test_batched_writes_equal_one_write_per_event(batches, max_open):
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        batched, single = SessionLog(Path(a), max_open=max_open), SessionLog(Path(b))
        n = 0
        for batch in batches:
            evs = []
            for agent, session in batch:
                evs.append(_ev(agent, session, n))
                n += 1
            assert batched.write_batch([(e, encode_line(e)) for e in evs]) == [True] * len(evs)
            for e in evs:
                assert single.write(e) is True
            assert len(batched._fds) <= max_open
        batched.close()
        single.close()
        assert _files(Path(a)) == _files(Path(b))
        assert batched.lines == single.lines == n
        # each file's path is the one path_for names
        for batch in batches:
            for agent, session in batch:
                assert batched.path_for(_ev(agent, session, 0)).is_relative_to(Path(a))


def test_a_directory_is_made_once_and_a_new_file_raises_nothing(tmp_path, monkeypatch):
    made = []
    real = jsonlog.make_private_dirs
    monkeypatch.setattr(jsonlog, "make_private_dirs", lambda p: (made.append(p), real(p)))
    sl = SessionLog(tmp_path, max_open=4)
    for i in range(40):
        assert sl.write(_ev("codex", f"s{i}", i))
        assert sl.write(_ev("kimi", f"s{i}", i))
    assert sorted(made) == [str(tmp_path / "codex"), str(tmp_path / "kimi")]
    assert sl.counters["files_opened"] == 80
    sl.close()


def test_a_directory_removed_under_the_log_is_made_again(tmp_path):
    sl = SessionLog(tmp_path, max_open=1)
    assert sl.write(_ev("codex", "s1", 0))
    assert sl.write(_ev("other", "s1", 1))  # evicts codex/s1's descriptor
    shutil.rmtree(tmp_path / "codex")
    assert sl.write(_ev("codex", "s1", 2)) is True and not sl.failing
    assert sl.write(_ev("codex", "s2", 3)) is True
    sl.close()
    assert _files(tmp_path) == {"codex/s1.jsonl": [2], "codex/s2.jsonl": [3],
                                "other/s1.jsonl": [1]}


def test_a_directory_that_cannot_be_made_is_retried_on_the_next_write(tmp_path):
    (tmp_path / "codex").write_text("a file where the agent dir should be")
    sl = SessionLog(tmp_path)
    assert sl.write(_ev("codex", "s", 0)) is False and sl.failing
    (tmp_path / "codex").unlink()
    assert sl.write(_ev("codex", "s", 1)) is True and not sl.failing
    sl.close()
    assert _files(tmp_path) == {"codex/s.jsonl": [1]}


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(_AGENTS, _SESSIONS), min_size=1, max_size=8),
                        max_size=12),
       max_open=st.integers(1, 4), full=st.sets(st.integers(0, 11), max_size=3))
def test_raw_batches_equal_newline_batches(batches, max_open, full):
    """``write_raw_batch`` (the pump's: the wire bytes without a newline,
    runs of one session taken without a lookup) writes the same bytes and
    answers the same verdicts as ``write_batch`` of newline-ended lines,
    a full disk included (``full``: the batches whose writes fail)."""
    from bridges.core.aep import dumps
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        raw_log, line_log = SessionLog(Path(a), max_open=max_open), SessionLog(Path(b))
        n = 0
        for k, batch in enumerate(batches):
            evs = []
            for agent, session in batch:
                evs.append(_ev(agent, session, n))
                n += 1
            if k in full:  # the disk is full for this batch: every write fails
                for log_ in (raw_log, line_log):
                    log_._append = _failing(log_)  # type: ignore[method-assign]
            got = raw_log.write_raw_batch([(e, dumps(e)) for e in evs])
            want = line_log.write_batch([(e, encode_line(e)) for e in evs])
            assert got == want == [k not in full] * len(evs)
            for log_ in (raw_log, line_log):
                log_.__dict__.pop("_append", None)
        raw_log.close()
        line_log.close()
        for rel in {str(p.relative_to(b)) for p in Path(b).rglob("*.jsonl")} | \
                {str(p.relative_to(a)) for p in Path(a).rglob("*.jsonl")}:
            assert (Path(a) / rel).read_bytes() == (Path(b) / rel).read_bytes()
        assert raw_log.lines == line_log.lines


def _failing(log_: SessionLog):
    """``log_``'s ``_append`` on a full disk: nothing written (each write
    still whole lines)."""
    def append(target, data, lines, writer=None):
        assert data.endswith(b"\n") and data.count(b"\n") == lines
        log_.errors += lines
        return False
    return append
