"""Which logged events the stream lacks
(supervisor.jetstream.recover.missing_lines): everything after the stream's
last stored event of the session, found by its Nats-Msg-Id, or else by its
ULID stamping time; the file stamped from the horizon on when the stream
holds none of it (the vendor's ``time`` plays no part); the current run's
epoch left out. The backwards reader, the since-marker, the file choice."""
from __future__ import annotations

import json
import os
import time

from hypothesis import given
from hypothesis import strategies as st

from bridges.core.envelope import Ulids
from supervisor.jetstream import recover as R

T0 = 1_800_000_000_000  # ms
ulid = Ulids()


def _ev(i: int, *, ms: int = T0, epoch: int = 1, seq: bool = True,
        t: str = "2027-01-15T08:00:00.000Z") -> dict:
    ev = {"aep": "0.1", "id": ulid.at(ms + i), "source": "aep://h/codex/s1", "agent": "codex",
          "session": "s1", "type": "tool.completed", "time": t}
    if seq:
        ev.update(epoch=epoch, seq=i)
    return ev


def _line(ev: dict) -> bytes:
    return json.dumps(ev).encode() + b"\n"


def _mid(ev: dict) -> str:
    return f"{ev['id']} {ev['source']}"


def test_ulid_ms_reads_the_stamping_millisecond() -> None:
    assert R.ulid_ms(ulid.at(T0)) == T0
    assert R.ulid_ms("id0001") is None and R.ulid_ms(None) is None
    assert R.ulid_ms("!" * 26) is None


@given(st.integers(min_value=0, max_value=30), st.data())
def test_the_tail_after_the_last_stored_event_is_what_is_missing(n, data) -> None:
    evs = [_ev(i, seq=data.draw(st.booleans())) for i in range(n)]
    lines = [_line(e) for e in evs]
    if n == 0:
        assert R.missing_lines(lines, None, horizon_ms=0) == []
        return
    k = data.draw(st.integers(min_value=0, max_value=n - 1))  # the stream holds 0..k
    got = R.missing_lines(lines, _mid(evs[k]), horizon_ms=0)
    assert got is not None
    assert [ev["id"] for ev, _ in got] == [e["id"] for e in evs[k + 1:]]
    assert [raw + b"\n" for _, raw in got] == lines[k + 1:]  # the logged bytes, as they are


def test_none_stored_is_everything_stamped_from_the_horizon_whatever_its_time() -> None:
    old_ts = _ev(5, ms=T0, t="2020-01-01T00:00:00Z")  # vendor time years old: still sent
    before = _ev(0, ms=T0 - 60_000)  # stamped before the horizon: maybe aged out
    torn = b'{"aep": "0.1", "id": "x'
    got = R.missing_lines([_line(before), _line(old_ts), torn], None, horizon_ms=T0 - 1000)
    assert [ev["id"] for ev, _ in got] == [old_ts["id"]]  # the torn tail skipped


def test_the_current_runs_epoch_is_left_to_the_outbox() -> None:
    evs = [_ev(0, epoch=1), _ev(1, epoch=1), _ev(2, epoch=2), _ev(3, epoch=2)]
    got = R.missing_lines([_line(e) for e in evs], _mid(evs[0]), horizon_ms=0, epoch=2)
    assert [ev["id"] for ev, _ in got] == [evs[1]["id"]]


def test_a_last_stored_event_not_in_the_lines_is_compared_by_stamping_time() -> None:
    gone = _ev(3)  # stored, then rotated away (or more than the tail unpublished)
    evs = [_ev(1), _ev(3), _ev(4)]
    got = R.missing_lines([_line(e) for e in evs], _mid(gone), horizon_ms=0)
    assert [ev["id"] for ev, _ in got] == [evs[1]["id"], evs[2]["id"]]
    assert R.missing_lines([_line(e) for e in evs], "other aep://x/y", horizon_ms=0) is None


@given(st.lists(st.binary(max_size=40), max_size=8), st.one_of(st.none(), st.text(max_size=30)))
def test_never_raises_on_garbage(lines, last) -> None:
    got = R.missing_lines(lines, last, horizon_ms=0, epoch=3)
    assert got is None or isinstance(got, list)


@given(st.lists(st.binary(min_size=1, max_size=300).filter(lambda b: b"\n" not in b),
                min_size=1, max_size=40), st.data())
def test_read_back_returns_whole_lines_through_the_needles_line(lines, data) -> None:
    import tempfile
    k = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    needle = b"NEEDLE%dX" % k
    lines = [*lines[:k], lines[k] + needle, *lines[k + 1:]]
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "f.jsonl")
        with open(p, "wb") as f:
            f.write(b"\n".join(lines) + b"\n")
        old = R.CHUNK
        R.CHUNK = 7  # many steps, needles across step boundaries
        try:
            got = R.read_back(p, needle)
            assert got[-(len(lines) - k):] == lines[k:]  # the needle's line whole, and after it
            assert R.read_back(p, None) == lines
            small = R.read_back(p, None, max_bytes=50)
            assert small == lines[len(lines) - len(small):]  # a suffix of whole lines
        finally:
            R.CHUNK = old


def test_nats_since_is_written_once_and_old_markers_are_read(tmp_path) -> None:
    assert R.nats_since(tmp_path, 100.0) == 100.0  # a first run: now
    assert R.nats_since(tmp_path, 200.0) == 100.0  # kept across starts, whatever a kill did
    R.marker(tmp_path).write_text(json.dumps({"state": "running", "since": 50.0}))
    assert R.nats_since(tmp_path, 300.0) == 50.0
    assert json.loads(R.marker(tmp_path).read_text()) == {"since": 50.0}
    R.marker(tmp_path).write_text(json.dumps({"state": "clean"}))
    m = R.marker(tmp_path).stat().st_mtime
    assert R.nats_since(tmp_path, time.time() + 10) == m
    R.marker(tmp_path).write_text("{torn")
    assert R.nats_since(tmp_path, 400.0) == 400.0


def test_candidate_files_are_live_recent_files_newest_first(tmp_path) -> None:
    logs = tmp_path / "logs"
    (logs / "codex").mkdir(parents=True)
    paths = [logs / "codex" / f"s.{i}.jsonl" for i in range(3)]  # dots in a session name
    now = time.time()
    for i, p in enumerate(paths):
        p.write_bytes(_line(_ev(i)))
        t = now - 100 * (3 - i)
        os.utime(p, (t, t))
    (logs / "codex" / "s.0.20270101T000000.000000Z.jsonl").write_bytes(_line(_ev(9)))  # a segment
    assert R.candidate_files(logs, after=now - 250, limit=10) == [paths[2], paths[1]]
    assert R.candidate_files(logs, after=0, limit=1) == [paths[2]]


def test_only_this_daemons_own_events_are_sent() -> None:
    mine = [_ev(0), _ev(1)]
    other = {**_ev(2), "source": "aep://elsewhere/agent/codex/session/s1"}
    lines = [_line(mine[0]), _line(other), _line(mine[1])]
    got = R.missing_lines(lines, None, horizon_ms=0, own="aep://h/")
    assert [ev["id"] for ev, _ in got] == [mine[0]["id"], mine[1]["id"]]
    got = R.missing_lines(lines, _mid(mine[0]), horizon_ms=0, own="aep://h/")
    assert [ev["id"] for ev, _ in got] == [mine[1]["id"]]


def test_read_back_of_one_line_longer_than_a_step(tmp_path) -> None:
    p = tmp_path / "s.jsonl"
    big = b"x" * (3 * R.CHUNK)
    p.write_bytes(b"a\n" + big + b"\n")
    assert R.read_back(p, None, R.CHUNK) == []  # no whole line within one step
    assert R.read_back(p, None) == [b"a", big]
