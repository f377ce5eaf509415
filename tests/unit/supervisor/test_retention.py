"""Session log retention (:mod:`supervisor.retention`): rotation by size
and age, compression of closed files, the oldest removed first under the
total cap, never the file being written; the settings refused clearly."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import trio

from supervisor.retention import RetainingSessionLog, RetentionPolicy, parse_age, parse_size, segment_name


class Clock:
    def __init__(self, t: float = 1_796_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ev(session: str, seq: int, pad: int = 200) -> dict:
    return {"aep": "0.1", "id": f"id-{session}-{seq}", "type": "tool.completed",
            "agent": "codex", "session": session, "seq": seq, "data": {"pad": "x" * pad}}


def du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


async def test_rotation_by_size_compresses_the_closed_file(tmp_path):
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=2000, max_age=None,
                                                        max_total_bytes=None), clock=Clock())
    line = len(json.dumps(ev("s1", 10), separators=(",", ":"))) + 1
    for i in range(20):
        log.write(ev("s1", i))
    per_file = 2000 // line
    assert log.counters["rotations"] == (20 - 1) // per_file
    live = tmp_path / "codex" / "s1.jsonl"
    assert live.stat().st_size <= 2000
    rotations = log.counters["rotations"]
    await log.compress_pending()
    assert log.counters["compressed"] == rotations >= 2
    names = files(tmp_path)
    assert names.count("s1.jsonl") == 1 and sum(n.endswith(".jsonl.gz") for n in names) == rotations
    # nothing lost, in order, across the segments and the live file
    segs = sorted((tmp_path / "codex").glob("s1.*.jsonl.gz"))
    lines = [json.loads(x) for s in segs for x in gzip.decompress(s.read_bytes()).splitlines()]
    lines += [json.loads(x) for x in live.read_bytes().splitlines()]
    assert [e["seq"] for e in lines] == list(range(20))
    log.close()


async def test_writing_past_the_total_cap_keeps_the_directory_under_it(tmp_path):
    cap = 64 * 1024
    clock = Clock()
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=8 * 1024, max_age=None,
                                                        max_total_bytes=cap), clock=clock)
    written = 0
    for i in range(3000):  # ~12x the cap, across 5 sessions
        e = ev(f"s{i % 5}", i, pad=300)
        written += len(json.dumps(e))
        clock.t += 0.01
        log.write(e)
        if i % 100 == 99:  # what the maintenance task does when woken
            await log.compress_pending()
            log.sweep()
    await log.compress_pending()
    log.sweep()
    assert written > 10 * cap
    assert du(tmp_path) <= cap, (du(tmp_path), files(tmp_path))
    assert log.counters["removed_files"] > 0 and log.counters["removed_bytes"] > 0
    assert abs(log.total_bytes - du(tmp_path)) < 1024  # the running figure tracks the disk
    # every session's live file survived, and the newest events are all there
    for s in range(5):
        live = tmp_path / "codex" / f"s{s}.jsonl"
        assert live.exists()
        assert json.loads(live.read_bytes().splitlines()[-1])["seq"] == 2995 + s
    log.close()


async def test_the_oldest_go_first_and_never_the_file_being_written(tmp_path):
    clock = Clock()
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=1000, max_age=None,
                                                        max_total_bytes=None), clock=clock)
    for i in range(12):
        clock.t += 60
        log.write(ev("old", i))
    await log.compress_pending()
    old_segments = sorted((tmp_path / "codex").glob("old.*.gz"))
    assert len(old_segments) >= 2
    mtimes = {p: p.stat().st_mtime for p in old_segments}
    for i in range(12):
        log.write(ev("new", i))
    await log.compress_pending()
    # now cap the directory just under what it holds: the oldest closed segment goes
    log.policy = RetentionPolicy(max_bytes=1000, max_age=None, max_total_bytes=du(tmp_path) - 1)
    log.sweep()
    gone = [p for p in old_segments if not p.exists()]
    assert gone == [min(mtimes, key=mtimes.get)]
    # a cap below the live files alone: every closed file goes; the live
    # ones are rotated (closed) first, never unlinked while open
    log.policy = RetentionPolicy(max_bytes=1000, max_age=None, max_total_bytes=1)
    writing = log.writing()
    assert writing == {tmp_path / "codex" / "old.jsonl", tmp_path / "codex" / "new.jsonl"}
    log.sweep()
    assert log.writing() == set() and log.counters["rotations"] >= 2
    await log.compress_pending()
    log.sweep()
    assert files(tmp_path) == []
    log.write(ev("new", 99))  # and the session log carries on
    assert files(tmp_path) == ["new.jsonl"] and log.errors == 0
    log.close()


async def test_age_rotates_the_live_file_and_removes_old_closed_files(tmp_path):
    clock = Clock()
    day = 86400.0
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=2 * day,
                                                        max_total_bytes=None), clock=clock)
    log.write(ev("s", 0))
    clock.t += 2 * day + 1
    log.write(ev("s", 1))  # open for longer than max_age: rotated first
    assert log.counters["rotations"] == 1
    await log.compress_pending()
    (seg,) = (tmp_path / "codex").glob("s.*.jsonl.gz")
    import os
    os.utime(seg, (clock.t - 3 * day, clock.t - 3 * day))  # last written 3 days ago
    log.sweep()
    assert not seg.exists() and (tmp_path / "codex" / "s.jsonl").exists()
    assert log.counters["removed_files"] == 1
    log.close()


async def test_maintain_runs_on_rotation(tmp_path):
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=600, max_age=None,
                                                        max_total_bytes=None))
    async with trio.open_nursery() as n:
        await n.start(log.maintain)
        for i in range(6):
            log.write(ev("s", i))
        with trio.fail_after(10):
            while log.counters["compressed"] < log.counters["rotations"] or not log.counters["compressed"]:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    assert list((tmp_path / "codex").glob("*.jsonl.gz"))
    log.close()


async def test_a_restart_compresses_what_a_crash_left_plain(tmp_path):
    d = tmp_path / "codex"
    d.mkdir()
    seg = segment_name(d / "s.jsonl", 1_796_000_000.5)
    seg.write_bytes(b'{"a":1}\n')
    log = RetainingSessionLog(tmp_path, RetentionPolicy())
    await log.compress_pending()
    gz = Path(str(seg) + ".gz")
    assert not seg.exists() and gzip.decompress(await trio.Path(gz).read_bytes()) == b'{"a":1}\n'


def test_settings():
    assert parse_size("64M") == 64 << 20 and parse_size("1g") == 1 << 30
    assert parse_size("1048576") == 1 << 20 and parse_size("10KiB") == 10 << 10
    assert parse_age("30d") == 30 * 86400 and parse_age("12h") == 43200 and parse_age("90") == 90
    for bad in ("", "x", "1.5M", "-1"):
        with pytest.raises(ValueError):
            parse_size(bad)
    policy, problems = RetentionPolicy.from_env({})
    assert policy == RetentionPolicy(64 << 20, 30 * 86400.0, 1 << 30) and problems == []
    policy, problems = RetentionPolicy.from_env({"AEP_LOG_MAX_BYTES": "0", "AEP_LOG_MAX_AGE": "0",
                                                 "AEP_LOG_MAX_TOTAL_BYTES": "0"})
    assert policy == RetentionPolicy(None, None, None) and problems == []
    _, problems = RetentionPolicy.from_env({"AEP_LOG_MAX_BYTES": "lots", "AEP_LOG_MAX_AGE": "soon"})
    assert problems == ["AEP_LOG_MAX_BYTES='lots': expected bytes (64M, 1G, 1048576); 0 turns it off",
                        "AEP_LOG_MAX_AGE='soon': expected a duration (30d, 12h, 3600); 0 turns it off"]
    _, problems = RetentionPolicy.from_env({"AEP_LOG_MAX_BYTES": "2G", "AEP_LOG_MAX_TOTAL_BYTES": "1G"})
    assert len(problems) == 1 and "exceeds AEP_LOG_MAX_TOTAL_BYTES" in problems[0]


def test_the_readme_documents_the_knobs_as_declared():
    from bridges.core.settings import render_table
    from supervisor.retention import SETTINGS
    from tests.support.shared import ROOT
    readme = (ROOT / "README.md").read_text()
    for row in render_table(SETTINGS).splitlines()[2:]:
        assert row in readme, row
