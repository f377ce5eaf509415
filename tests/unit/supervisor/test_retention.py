"""Session log retention (:mod:`supervisor.sessionlog.retention`): rotation by size
and age, compression of closed files, the oldest removed first under the
total cap, never the file being written; the settings refused clearly."""
from __future__ import annotations

import gzip
import json
import os
import secrets
from functools import partial
from pathlib import Path

import pytest
import trio

from supervisor.sessionlog import retention
from supervisor.sessionlog.retention import (
    RetainingSessionLog,
    RetentionPolicy,
    parse_age,
    parse_size,
    segment_name,
)


class Clock:
    def __init__(self, t: float = 1_796_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ev(session: str, seq: int, pad: int = 200) -> dict:
    # random hex: compresses about as well as real events do (~2x here, not 100x)
    return {"aep": "0.1", "id": f"id-{session}-{seq}", "type": "tool.completed",
            "agent": "codex", "session": session, "seq": seq,
            "data": {"pad": secrets.token_hex(pad // 2)}}


def write(log: RetainingSessionLog, e: dict) -> None:
    """A write followed by the maintenance task's per-second look (as if
    each write took a second)."""
    log.write(e)
    log.check()


def du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


async def test_rotation_by_size_compresses_the_closed_file(tmp_path):
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=2000, max_age=None,
                                                        max_total_bytes=None), clock=Clock())
    line = len(json.dumps(ev("s1", 10), separators=(",", ":"))) + 1
    for i in range(20):
        write(log, ev("s1", i))
    per_file = -(-2000 // line)  # the write that reaches the limit is the file's last
    rotations = log.retained["rotations"]
    assert rotations == 20 // per_file >= 2
    live = tmp_path / "codex" / "s1.jsonl"
    assert live.stat().st_size < 2000
    await log.compress_pending()
    assert log.retained["compressed"] == rotations
    names = files(tmp_path)
    assert names.count("s1.jsonl") == 1 and sum(n.endswith(".jsonl.gz") for n in names) == rotations
    # nothing lost, in order, across the segments and the live file
    segs = sorted((tmp_path / "codex").glob("s1.*.jsonl.gz"))
    chunks = [gzip.decompress(s.read_bytes()).splitlines() for s in segs]
    assert [len(c) for c in chunks] == [per_file] * rotations
    lines = [json.loads(x) for c in chunks for x in c]
    lines += [json.loads(x) for x in live.read_bytes().splitlines()]
    assert [e["seq"] for e in lines] == list(range(20))
    log.close()


async def test_rotation_is_off_the_write_path(tmp_path):
    """A burst between two looks grows the live file past the limit; the
    next look rotates it (the documented overshoot: one interval's writes)."""
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=1000, max_age=None,
                                                        max_total_bytes=None), clock=Clock())
    for i in range(20):
        log.write(ev("s", i))
    assert log.retained["rotations"] == 0 and (tmp_path / "codex" / "s.jsonl").stat().st_size > 4000
    assert log.check() == 1
    assert not (tmp_path / "codex" / "s.jsonl").exists()
    log.write(ev("s", 20))
    assert (tmp_path / "codex" / "s.jsonl").read_bytes().count(b"\n") == 1
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
        write(log, e)
        if i % 100 == 99:  # what the maintenance task does when woken
            await log.compress_pending()
            log.sweep()
    await log.compress_pending()
    log.sweep()
    assert written > 10 * cap
    assert du(tmp_path) <= cap, (du(tmp_path), files(tmp_path))
    assert log.retained["removed_files"] > 0 and log.retained["removed_bytes"] > 0
    assert abs(log.total_bytes - du(tmp_path)) < 1024  # the running figure tracks the disk
    # the newest events of every session are all still there (oldest went first)
    for s in range(5):
        kept = []
        for f in (tmp_path / "codex").glob(f"s{s}.*"):
            data = gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes()
            kept += [json.loads(x)["seq"] for x in data.splitlines()]
        assert max(kept) == 2995 + s
        assert sorted(kept) == list(range(min(kept), 2996 + s, 5))  # a contiguous newest run
    log.close()


async def test_the_oldest_go_first_and_never_the_file_being_written(tmp_path):
    clock = Clock()
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=1000, max_age=None,
                                                        max_total_bytes=None), clock=clock)
    for i in range(13):  # 4 lines a file: three closed, one line live
        clock.t += 60
        write(log, ev("old", i))
    await log.compress_pending()
    old_segments = sorted((tmp_path / "codex").glob("old.*.gz"))
    assert len(old_segments) >= 2
    mtimes = {p: p.stat().st_mtime for p in old_segments}
    for i in range(13):
        write(log, ev("new", i))
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
    assert log.writing() == set() and log.retained["rotations"] >= 2
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
    write(log, ev("s", 0))
    clock.t += 2 * day + 1
    assert log.check() == 1  # open for longer than max_age: rotated
    write(log, ev("s", 1))
    assert log.retained["rotations"] == 1
    await log.compress_pending()
    (seg,) = (tmp_path / "codex").glob("s.*.jsonl.gz")
    import os
    os.utime(seg, (clock.t - 3 * day, clock.t - 3 * day))  # last written 3 days ago
    log.sweep()
    assert not seg.exists() and (tmp_path / "codex" / "s.jsonl").exists()
    assert log.retained["removed_files"] == 1
    log.close()


async def test_maintain_runs_on_rotation(tmp_path):
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=600, max_age=None,
                                                        max_total_bytes=None))
    async with trio.open_nursery() as n:
        await n.start(partial(log.maintain, check_interval=0.01))
        for i in range(6):
            log.write(ev("s", i))
            await trio.sleep(0.02)
        with trio.fail_after(10):
            while log.retained["compressed"] < log.retained["rotations"] or not log.retained["compressed"]:
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


def test_the_configuration_page_documents_the_knobs_as_declared():
    from bridges.core.settings import render_table
    from supervisor.sessionlog.retention import SETTINGS
    from tests.support.shared import ROOT
    page = (ROOT / "docs" / "configuration.md").read_text()
    for row in render_table(SETTINGS).splitlines()[2:]:
        assert row in page, row


def test_current_bytes_is_fresh_between_looks(tmp_path):
    log = RetainingSessionLog(tmp_path, RetentionPolicy())
    for i in range(5):
        log.write(ev("s", i))
    assert log.total_bytes == 0 and log.current_bytes() == du(tmp_path) > 0
    log.check()
    assert log.total_bytes == log.current_bytes() == du(tmp_path)
    log.close()


def test_a_live_file_removed_under_the_daemon_is_started_again(tmp_path, caplog):
    """An agent directory removed by hand while its files are open: the
    cached descriptors pointed into deleted files, so every later
    (acknowledged) event of those sessions went where nobody could read it
    (break-it review). The per-second check sees the file gone (no link
    left), closes it, and the next write makes directory and file again."""
    import shutil
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=None,
                                                        max_total_bytes=None), clock=Clock())
    write(log, ev("s1", 0))
    write(log, ev("s2", 0))
    shutil.rmtree(tmp_path / "codex")
    with caplog.at_level("WARNING", logger="aep.retention"):
        log.check()
    assert len([r for r in caplog.records if "removed while open" in r.getMessage()]) == 2
    write(log, ev("s1", 1))
    log.close()
    lines = (tmp_path / "codex" / "s1.jsonl").read_text().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == [1]
    assert log.total_bytes == (tmp_path / "codex" / "s1.jsonl").stat().st_size


def test_a_file_written_after_the_scan_is_not_removed_by_its_sweep(tmp_path):
    # maintain() walks the directory in a worker thread, then decides on the
    # loop: a file the writer appended to in between is not the old file the
    # scan saw, and is left for the next sweep to see as it is
    import os

    from supervisor.sessionlog import retention

    d = tmp_path / "codex"
    d.mkdir()
    old, other = d / "old.jsonl", d / "other.jsonl"
    for p in (old, other):
        p.write_bytes(b'{"a":1}\n')
        os.utime(p, (1_000.0, 1_000.0))  # long past max_age
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=86400.0,
                                                        max_total_bytes=None))
    scan = retention._scan(tmp_path)
    with old.open("ab") as f:  # the writer, between the scan and the decisions
        f.write(b'{"a":2}\n')
    log._sweep(scan)
    assert old.exists() and not other.exists()
    assert log.retained["removed_files"] == 1
    log.sweep()  # the next sweep sees it as it is now: old again only by its new mtime
    assert old.exists()


def test_the_scan_skips_the_spare_files_and_links_to_directories(tmp_path):
    import os

    from supervisor.sessionlog import retention
    from supervisor.sessionlog.spares import SPARE_DIR

    (tmp_path / "codex").mkdir()
    (tmp_path / "codex" / "s.jsonl").write_bytes(b"x\n")
    seg = segment_name(tmp_path / "codex" / "s.jsonl", 1_796_000_000.5)
    seg.write_bytes(b"yy\n")
    (tmp_path / "codex" / "notes.txt").write_bytes(b"zzzz")
    (tmp_path / SPARE_DIR).mkdir()
    (tmp_path / SPARE_DIR / "0.spare.jsonl").write_bytes(b"spare")  # never a session log
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "t.jsonl").write_bytes(b"outside\n")
    os.symlink(outside, tmp_path / "linked")
    os.utime(seg, (2_000.0, 2_000.0))  # the segment older than the live file
    os.utime(tmp_path / "codex" / "s.jsonl", (3_000.0, 3_000.0))
    scan = retention._scan(tmp_path)
    assert set(scan.sizes) == {tmp_path / "codex" / "s.jsonl", seg}
    assert scan.total == 2 + 3 and scan.segments == [seg]
    assert scan.aged == [(2_000.0, 3, seg), (3_000.0, 2, tmp_path / "codex" / "s.jsonl")]


# the scan runs in a worker thread: the directory may change between it and
# the decisions on the loop (found by review 6a); these replay that window
NOW = 1_796_000_000.0


def _put(root: Path, name: str, size: int, age: float) -> Path:
    p = root / "codex" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x" * (size - 1) + b"\n")
    os.utime(p, (NOW - age, NOW - age))
    return p


def test_a_file_appended_or_truncated_during_the_scan_is_kept(tmp_path):
    a = _put(tmp_path, "a.jsonl", 100, 10 * 86400)
    b = _put(tmp_path, "b.jsonl", 100, 10 * 86400)
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=86400,
                                                        max_total_bytes=None), clock=lambda: NOW)
    scan = retention._scan(tmp_path)
    with open(a, "ab") as f:
        f.write(b"{}\n")
    os.truncate(b, 10)
    log._sweep(scan)
    assert a.exists() and b.exists()


def test_a_file_gone_during_the_scan_does_not_make_the_sweep_remove_another(tmp_path):
    """Over the cap only because of a file that went away during the scan
    (an operator's cleanup, a logrotate): the sweep must not remove a file
    the rules do not ask for (found by a review: the vanished file's bytes
    stayed in ``total_bytes`` and ``b.jsonl`` went too)."""
    a = _put(tmp_path, "a.jsonl", 600, 300)   # oldest
    b = _put(tmp_path, "b.jsonl", 300, 200)
    c = _put(tmp_path, "c.jsonl", 300, 100)
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=None,
                                                        max_total_bytes=1000), clock=lambda: NOW)
    scan = retention._scan(tmp_path)
    a.unlink()  # while the worker thread's scan was running
    log._sweep(scan)
    assert b.exists() and c.exists(), "a file under the cap was removed"
    assert log.total_bytes == 600


def test_the_same_through_maintain_with_the_scan_in_its_thread(tmp_path):
    """The same window through :meth:`maintain` itself: the file goes away
    while ``_scan`` runs in its worker thread."""
    a = _put(tmp_path, "a.jsonl", 600, 300)
    b = _put(tmp_path, "b.jsonl", 300, 200)
    c = _put(tmp_path, "c.jsonl", 300, 100)
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=None,
                                                        max_total_bytes=1000), clock=lambda: NOW)
    real = retention._scan

    def scan_then_cleanup(root):
        out = real(root)
        a.unlink()  # an operator's rm, just after the walk passed a.jsonl
        return out

    async def main():
        retention._scan = scan_then_cleanup
        try:
            with trio.move_on_after(0.5):
                await log.maintain(check_interval=10, sweep_interval=60)
        finally:
            retention._scan = real

    trio.run(main)
    assert b.exists() and c.exists(), "a file under the cap was removed"


def test_maintain_lets_the_loop_run_between_steps_of_a_long_sweep(tmp_path):
    # removing thousands of files at once held the event loop ~0.45 s: the
    # maintenance task's sweep yields every REMOVALS_PER_STEP removals, and a
    # file the writer opened meanwhile is not removed
    n = 3 * retention.REMOVALS_PER_STEP + 5
    for i in range(n):
        _put(tmp_path, f"s{i:04d}.2026.jsonl", 10, 10 * 86400)
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=86400,
                                                        max_total_bytes=None), clock=lambda: NOW)
    ticks = [0]
    seen: list[int] = []
    real_remove = log._remove

    def remove(p, size):
        seen.append(ticks[0])
        real_remove(p, size)

    log._remove = remove  # type: ignore[method-assign]

    async def main():
        async def ticker():
            while True:
                ticks[0] += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            nursery.start_soon(partial(log.maintain, check_interval=10, sweep_interval=60))
            # until the first sweep is done, however slow the machine (a fixed
            # 1 s window saw 128 of 389 removals at load 7 on 2 cores)
            with trio.fail_after(120):
                while len(seen) < n:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(seen) == n and not list((tmp_path / "codex").iterdir())
    # trio runs a turn's tasks in random order, so two steps may see one tick
    assert len(set(seen)) >= 2, "the sweep removed everything in one turn of the loop"


def test_a_file_the_writer_opens_between_sweep_steps_is_not_removed(tmp_path):
    n = 2 * retention.REMOVALS_PER_STEP + 5
    for i in range(n):
        _put(tmp_path, f"s{i:04d}.jsonl", 10, 10 * 86400)  # old live files, closed
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=None, max_age=86400,
                                                        max_total_bytes=None), clock=lambda: NOW)
    steps = log._sweep_steps(retention._scan(tmp_path))
    next(steps)  # the first step's removals; the loop runs the writer here
    last = f"s{n - 1:04d}"
    log.write(ev(last, 0))  # its session comes back: the file is open for writing
    for _ in steps:
        pass
    left = sorted(p.name for p in (tmp_path / "codex").iterdir())
    assert left == [f"{last}.jsonl"]
    assert (tmp_path / "codex" / f"{last}.jsonl").read_bytes().startswith(b"x")  # appended to
    log.close()


def _agent_ev(agent: str, session: str, seq: int, pad: int = 200) -> dict:
    return {**ev(session, seq, pad), "agent": agent}


async def test_the_cap_is_shared_the_largest_agent_loses_its_oldest_first(tmp_path):
    # issue 25: one source that fills the cap evicted every other agent's
    # files (they were the oldest); now the agent holding the most bytes
    # loses its oldest closed files first
    clock = Clock()
    cap = 24 * 1024
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_bytes=2 * 1024, max_age=None,
                                                        max_total_bytes=cap),
                              clock=clock, max_open=4)
    for i in range(3):  # the quiet agent: three sessions, its files the oldest on disk
        clock.t += 1
        log.write(_agent_ev("quiet", f"q{i}", i))
    quiet = {p: p.read_bytes() for p in (tmp_path / "quiet").iterdir()}
    for i in range(600):  # the flood: many sessions, ~10x the cap
        clock.t += 0.01
        write(log, _agent_ev("flood", f"f{i % 50}", i, pad=300))
        if i % 50 == 49:
            await log.compress_pending()
            log.sweep()
    await log.compress_pending()
    log.sweep()
    assert log.retained["removed_files"] > 20
    assert du(tmp_path) <= cap + 4 * 2 * 1024  # at most the open live files over
    assert {p: p.read_bytes() for p in (tmp_path / "quiet").iterdir()} == quiet
    # when the quiet agent is the largest (the flood gone quiet, a smaller
    # cap), its oldest closed file is the one that goes
    log.close()  # nothing open: every file closed
    for p in (tmp_path / "flood").iterdir():
        p.unlink()
    log.policy = RetentionPolicy(max_bytes=4 * 1024, max_age=None,
                                 max_total_bytes=du(tmp_path) - 1)
    log.sweep()
    oldest = min(quiet, key=lambda p: p.name)
    assert not oldest.exists() and all(p.exists() for p in quiet if p != oldest)


async def test_the_cap_is_shared_by_writer_not_by_agent_and_a_restart_keeps_it(tmp_path):
    # issue 25, attack 5: the unauthenticated OTLP receiver and the Codex
    # hook bridge both write agent ``codex``; grouped by agent, an OTLP
    # flood evicted the hook bridge's (closed, oldest) session files. The
    # group is the writer: the flood eats its own files first
    clock = Clock()
    cap = 24 * 1024
    policy = RetentionPolicy(max_bytes=2 * 1024, max_age=None, max_total_bytes=cap)
    log = RetainingSessionLog(tmp_path, policy, clock=clock, max_open=4)
    for i in range(3):  # the hook bridge's sessions: the oldest files on disk
        clock.t += 1
        log.write(ev(f"hook{i}", i), writer="codex_hooks")
    hooks = {p: p.read_bytes() for p in (tmp_path / "codex").iterdir()}
    assert len(hooks) == 3

    async def flood(log: RetainingSessionLog, n: int, first: int = 0) -> None:
        for i in range(first, first + n):  # many sessions, ~10x the cap, agent codex too
            clock.t += 0.01
            log.write(ev(f"otlp{i % 50}", i, pad=300), writer="otlp_in.codex")
            log.check()
            if i % 50 == 49:
                await log.compress_pending()
                log.sweep()
        await log.compress_pending()
        log.sweep()

    await flood(log, 600)
    assert log.retained["removed_files"] > 20
    assert du(tmp_path) <= cap + 4 * 2 * 1024 + 4096  # open live files and the index aside
    assert {p: p.read_bytes() for p in hooks if p.exists()} == hooks
    log.close()
    # a restart reads who wrote what back from the index: the same again
    log = RetainingSessionLog(tmp_path, policy, clock=clock, max_open=4)
    await flood(log, 300, first=600)
    assert {p: p.read_bytes() for p in hooks if p.exists()} == hooks
    log.close()


def test_the_group_falls_back_to_the_agent_and_the_first_writer_keeps_a_file(tmp_path):
    log = RetainingSessionLog(tmp_path, RetentionPolicy(max_total_bytes=None), max_open=2)
    log.write(ev("a", 0), writer="codex_hooks")
    log.write(ev("a", 1), writer="otlp_in")  # another writer appending: the file stays the first's
    log.write(_agent_ev("kimi", "b", 0))  # no writer said: its agent's directory
    rotated = log.rotate(tmp_path / "codex" / "a.jsonl")
    assert rotated is not None
    group = log._grouper()
    assert group(tmp_path / "codex" / "a.jsonl") == "w:codex_hooks"
    assert group(rotated) == group(rotated.with_name(rotated.name + ".gz")) == "w:codex_hooks"
    assert group(tmp_path / "kimi" / "b.jsonl") == "a:kimi"
    log.close()


def test_stems_name_a_session_across_its_files():
    from supervisor.sessionlog.writers import stem_of
    live = "s.jsonl"
    seg = segment_name(Path(live), 1_796_000_000.5).name
    for name in (live, seg, seg + ".gz", seg + ".gz.tmp", live + ".torn"):
        assert stem_of("codex", name) == "codex/s", name
    # a session id that looks like a file name is its own stem
    assert stem_of("codex", "s.jsonl.jsonl") == "codex/s.jsonl"


def test_the_writer_index_survives_torn_lines_and_is_pruned_to_the_files(tmp_path):
    from supervisor.sessionlog.writers import INDEX_NAME, WriterIndex
    idx = WriterIndex(tmp_path)
    for i in range(400):
        idx.note(f"codex/s{i}", "otlp_in")
    idx.note("codex/s0", "codex_hooks")  # taken: the first writer keeps it
    idx.close()
    with open(tmp_path / INDEX_NAME, "ab") as f:
        f.write(b'["codex/torn", "ot')  # a crash mid-line
    idx = WriterIndex(tmp_path)
    assert idx.get("codex/s0") == "otlp_in" and idx.get("codex/torn") is None and len(idx) == 400
    idx.prune({"codex/s1", "codex/s2"})  # the rest are gone from disk: the file is rewritten
    assert len(idx) == 2
    idx.note("codex/new", "relay:token")
    idx.close()
    again = WriterIndex(tmp_path)
    assert {s: again.get(s) for s in ("codex/s1", "codex/s2", "codex/new", "codex/s3")} == {
        "codex/s1": "otlp_in", "codex/s2": "otlp_in", "codex/new": "relay:token", "codex/s3": None}
    assert len((tmp_path / INDEX_NAME).read_text().splitlines()) == 3
    assert (tmp_path / INDEX_NAME).stat().st_mode & 0o777 == 0o600


def test_a_line_noted_after_a_torn_one_is_not_glued_onto_it(tmp_path):
    from supervisor.sessionlog.writers import INDEX_NAME, WriterIndex
    idx = WriterIndex(tmp_path)
    idx.note("codex/a", "codex_hooks")
    assert not (tmp_path / INDEX_NAME).exists()  # on disk at the next flush, not per note
    idx.flush()
    idx.close()
    with open(tmp_path / INDEX_NAME, "ab") as f:
        f.write(b'["codex/b", "ot')  # a crash mid-line
    idx = WriterIndex(tmp_path)
    idx.note("codex/c", "otlp_in.codex")
    idx.close()
    again = WriterIndex(tmp_path)
    assert (again.get("codex/a"), again.get("codex/b"), again.get("codex/c")) == \
        ("codex_hooks", None, "otlp_in.codex")
