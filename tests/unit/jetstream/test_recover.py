"""Which logged events a killed daemon left unpublished
(supervisor.jetstream.recover.missing_lines): everything after the stream's
last stored event of the session, found by its Nats-Msg-Id; the whole file
(within the max age) when the stream holds none of it; nothing when the
stored event is not in the file. And the run marker."""
from __future__ import annotations

import json
import time

from hypothesis import given
from hypothesis import strategies as st

from supervisor.jetstream import recover as R

NOW = 1_800_000_000.0


def _line(i: int, *, seq: bool = True, t: str = "2027-01-15T08:00:00.000Z") -> bytes:
    ev = {"aep": "0.1", "id": f"id{i:04d}", "source": "aep://h/codex", "agent": "codex",
          "session": "s1", "type": "tool.completed", "time": t}
    if seq:
        ev.update(epoch=1, seq=i)
    return json.dumps(ev).encode() + b"\n"


@given(st.integers(min_value=0, max_value=30), st.data())
def test_the_tail_after_the_last_stored_event_is_what_is_missing(n, data) -> None:
    lines = [_line(i, seq=data.draw(st.booleans())) for i in range(n)]
    if n == 0:
        assert R.missing_lines(lines, None, now=NOW, max_age=1e9) == []
        return
    k = data.draw(st.integers(min_value=0, max_value=n - 1))  # the stream holds 0..k
    got = R.missing_lines(lines, f"id{k:04d} aep://h/codex", now=NOW, max_age=1e9)
    assert got is not None
    assert [ev["id"] for ev, _ in got] == [f"id{i:04d}" for i in range(k + 1, n)]
    assert [raw + b"\n" for _, raw in got] == lines[k + 1:]  # the logged bytes, as they are


def test_none_stored_is_the_file_within_the_max_age_and_unknown_is_nothing() -> None:
    old = _line(0, t="2020-01-01T00:00:00Z")
    fresh = _line(1, t="2027-01-15T08:00:00Z")
    torn = b'{"aep": "0.1", "id": "x'
    got = R.missing_lines([old, fresh, torn], None, now=NOW, max_age=86400 * 365)
    assert [ev["id"] for ev, _ in got] == ["id0001"]  # the torn tail skipped
    assert R.missing_lines([old, fresh], "other aep://x/y", now=NOW, max_age=1e9) is None


@given(st.lists(st.binary(max_size=40), max_size=8), st.one_of(st.none(), st.text(max_size=8)))
def test_never_raises_on_garbage(lines, last) -> None:
    got = R.missing_lines(lines, last, now=NOW, max_age=1e9)
    assert got is None or isinstance(got, list)


def test_the_run_marker_says_what_to_read_back(tmp_path) -> None:
    assert R.read_mark(tmp_path) is None  # no file: a first run, nothing to read back
    R.write_mark(tmp_path, 1234.5)
    assert R.read_mark(tmp_path) == 1234.5  # found running: it did not stop clean
    R.write_mark(tmp_path, None)
    assert R.read_mark(tmp_path) is None
    R.marker(tmp_path).write_text("{torn")
    assert R.read_mark(tmp_path) is None


def test_candidate_files_are_live_recent_files_newest_first(tmp_path) -> None:
    logs = tmp_path / "logs"
    (logs / "codex").mkdir(parents=True)
    paths = [logs / "codex" / f"s.{i}.jsonl" for i in range(3)]  # dots in a session name
    for i, p in enumerate(paths):
        p.write_bytes(_line(i))
        t = time.time() - 100 * (3 - i)
        import os
        os.utime(p, (t, t))
    (logs / "codex" / "s.0.20270101T000000.000000Z.jsonl").write_bytes(_line(9))  # a segment
    got = R.candidate_files(logs, now=time.time(), max_age=250, limit=10)
    assert got == [paths[2], paths[1]]
    assert R.candidate_files(logs, now=time.time(), max_age=1e6, limit=1) == [paths[2]]
