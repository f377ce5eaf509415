"""Spare session log files (``supervisor.sessionlog.spares``, issue 11): a new
session's file is an empty spare renamed into place. Held to the log
without spares (same files, same lines, existing files never replaced),
the pool's refill task, the spares of a previous run, and failures
falling back to creating the file."""
from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import time
from pathlib import Path

import trio
import trio.lowlevel
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.sessionlog.jsonlog import SessionLog, encode_line
from supervisor.sessionlog.spares import SPARE_DIR, SpareFiles, give_back

_SESSIONS = st.sampled_from(["s1", "s2", "ses 3", "../x", None, "s5", "s6", "s7"])


def _ev(agent, session, n):
    ev = {"aep": "0.1", "id": f"e{n}", "type": "x.t.e", "seq": n, "agent": agent}
    if session is not None:
        ev["session"] = session
    return ev


def _files(root: Path) -> dict[str, list[int]]:
    return {str(p.relative_to(root)): [json.loads(x)["seq"] for x in p.read_text().splitlines()]
            for p in sorted(root.rglob("*.jsonl"))}


def _pool(root: Path, n: int, target: int = 64) -> SpareFiles:
    sp = SpareFiles(root / SPARE_DIR, target=target)
    made, sp._next, err = sp._make(0, n)  # what keep() does in its worker thread
    assert err is None
    sp._ready.extend(made)
    return sp


async def _filled(pool: SpareFiles, nursery: trio.Nursery) -> None:
    """Start ``pool``'s keeper in ``nursery`` and wait until it is full
    (60 s of real time at most: the keeper creates the files in a worker
    thread, and under trio's MockClock a virtual-time wait let the clock
    jump past its deadline while that thread was still creating them on a
    loaded machine: TooSlowError, seen in a parallel run). The loop never
    sleeps in virtual time, so the clock does not move while it waits."""
    await nursery.start(pool.keep)
    deadline = time.monotonic() + 60
    while pool.ready() < pool.target:
        assert time.monotonic() < deadline, f"pool not full: {pool.ready()} of {pool.target}"
        time.sleep(0.001)  # noqa: ASYNC251 -- hands the GIL to the keeper's thread, no virtual time
        await trio.lowlevel.checkpoint()


@settings(max_examples=120, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.sampled_from(["codex", "kimi"]), _SESSIONS),
                                 min_size=1, max_size=6), max_size=10),
       spares=st.integers(0, 6), max_open=st.integers(1, 3),
       existing=st.lists(_SESSIONS, max_size=3))
def test_a_log_with_spares_writes_exactly_what_a_log_without_them_writes(
        batches, spares, max_open, existing):
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with_spares, plain = SessionLog(Path(a), max_open=max_open), SessionLog(Path(b))
        with_spares.spares = pool = _pool(Path(a), spares)
        for root in (a, b):  # files a previous run left: appended to, never replaced
            for session in existing:
                SessionLog(Path(root)).write(_ev("codex", session, -1))
        n = 0
        for batch in batches:
            evs = [_ev(agent, session, n + i) for i, (agent, session) in enumerate(batch)]
            n += len(evs)
            assert with_spares.write_batch([(e, encode_line(e)) for e in evs]) == [True] * len(evs)
            for e in evs:
                assert plain.write(e) is True
        with_spares.close()
        plain.close()
        assert _files(Path(a)) == _files(Path(b))
        new_files = len(_files(Path(b))) - len(set(existing))
        assert pool.counters["taken"] == min(spares, new_files)
        assert pool.ready() == spares - pool.counters["taken"]
        # a taken spare's name stays until the keeper's worker removes it:
        # a second link of the session's file, never a spare again
        pending = sorted(set(os.listdir(Path(a) / SPARE_DIR)) - {os.path.basename(r) for r in pool._ready})
        assert len(pending) == pool.counters["taken"]
        assert all(os.stat(Path(a) / SPARE_DIR / n).st_nlink == 2 for n in pending)
        pool.retire()
        left = os.listdir(Path(a) / SPARE_DIR)
        assert len(left) == pool.ready()
        for p in Path(a).rglob("*.jsonl"):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_spare_is_never_renamed_over_an_existing_file(tmp_path):
    log = SessionLog(tmp_path)
    assert log.write(_ev("codex", "s1", 0))
    log.close()
    again = SessionLog(tmp_path)
    again.spares = pool = _pool(tmp_path, 2)
    assert again.write(_ev("codex", "s1", 1)) and again.write(_ev("codex", "s2", 2))
    again.close()
    assert _files(tmp_path) == {"codex/s1.jsonl": [0, 1], "codex/s2.jsonl": [2]}
    assert pool.counters["taken"] == 1 and pool.ready() == 1


def test_a_spare_that_went_away_is_skipped_and_none_left_means_the_slow_create(tmp_path):
    pool = _pool(tmp_path, 2)
    os.unlink(pool._ready[0])
    log = SessionLog(tmp_path)
    log.spares = pool
    for i in range(3):
        assert log.write(_ev("codex", f"s{i}", i))
    log.close()
    assert _files(tmp_path) == {f"codex/s{i}.jsonl": [i] for i in range(3)}
    assert pool.counters["taken"] == 1 and pool.counters["missed"] == 2 and pool.ready() == 0


def test_a_session_directory_removed_under_the_log_keeps_the_spares(tmp_path):
    import shutil
    log = SessionLog(tmp_path)
    log.spares = pool = _pool(tmp_path, 3)
    assert log.write(_ev("codex", "s1", 0))
    shutil.rmtree(tmp_path / "codex")
    assert log.write(_ev("codex", "s2", 1)) and not log.failing
    log.close()
    assert _files(tmp_path) == {"codex/s2.jsonl": [1]}
    assert pool.counters["taken"] == 2 and pool.ready() == 1 and pool.counters["missed"] == 0


def test_keep_fills_the_pool_refills_when_quiet_and_adopts_a_previous_runs_spares(tmp_path):
    d = tmp_path / SPARE_DIR
    d.mkdir()
    (d / "3.spare").touch()
    (d / "5.spare").write_text("a removed session's lines: not a spare")
    (d / "x.spare").touch()
    (d / "7.spare").touch()
    for p in d.iterdir():
        os.chmod(p, 0o600)  # as a previous run made them
    os.link(d / "7.spare", tmp_path / "linked")  # two links: a session's file, not a spare

    async def main():
        pool = SpareFiles(d, target=8)
        async with trio.open_nursery() as nursery:
            await _filled(pool, nursery)
            assert str(d / "3.spare") in pool._ready  # adopted
            assert not any(os.stat(p).st_size for p in pool._ready)  # 5's lines are gone
            linked = os.stat(tmp_path / "linked").st_ino  # never a spare again
            assert all(os.stat(p).st_ino != linked for p in pool._ready)
            assert pool.counters["made"] == 7  # 4, 5 (its leftover removed), 6, 7 (freed), 8-10
            for i in range(5):  # above the low-water mark: refilled once no spare is taken
                assert pool.take(str(tmp_path / f"t{i}"))
            with trio.fail_after(10):
                while pool.ready() < 8:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        return pool

    pool = trio.run(main)
    assert pool.counters["taken"] == 5 and pool.counters["made"] == 12
    assert all((d / n).stat().st_size == 0 for n in os.listdir(d))
    names = sorted(os.listdir(d))
    assert len(names) == 8 + 1 and "x.spare" in names  # ready, and the stray left alone
    # two links: a crash between a take's link and unlink; the spare name
    # goes, the session's file stays
    assert "7.spare" not in names and os.stat(tmp_path / "linked").st_nlink == 1


def test_a_failing_refill_is_logged_once_and_the_log_creates_files_meanwhile(tmp_path, caplog):
    blocker = tmp_path / "logs"
    blocker.mkdir()
    (blocker / SPARE_DIR).write_text("a file where the spare directory should be")

    async def main():
        pool = SpareFiles(blocker / SPARE_DIR, target=4)
        log = SessionLog(blocker)
        log.spares = pool
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.keep)
            with trio.fail_after(10):
                while pool.counters["errors"] < 2:  # retried after a second
                    await trio.sleep(0.05)
            assert log.write(_ev("codex", "s", 0)) and not log.failing
            nursery.cancel_scope.cancel()
        log.close()
        return pool

    with caplog.at_level(logging.WARNING, logger="aep.jsonl"):
        pool = trio.run(main)
    assert pool.ready() == 0 and pool.counters["made"] == 0
    assert len([r for r in caplog.records if "spare" in r.getMessage()]) == 1
    assert _files(blocker) == {"codex/s.jsonl": [0]}


def test_only_our_own_0600_spares_are_adopted_and_the_directory_is_made_0700(tmp_path):
    """A spare becomes a session log as it is: one a restore left 0644 (or
    another user's) is never adopted, and a ``.spare`` directory found
    looser than 0700 is tightened (break-it review: a new session's log
    came out world-readable)."""
    d = tmp_path / SPARE_DIR
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    (d / "0.spare").touch(mode=0o644)
    os.chmod(d / "0.spare", 0o644)
    (d / "1.spare").touch(mode=0o600)
    os.chmod(d / "1.spare", 0o600)

    async def main():
        pool = SpareFiles(d, target=4)
        async with trio.open_nursery() as nursery:
            await _filled(pool, nursery)
            nursery.cancel_scope.cancel()
        return pool

    pool = trio.run(main)
    assert str(d / "0.spare") not in pool._ready and str(d / "1.spare") in pool._ready
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    log = SessionLog(tmp_path)
    log.spares = pool
    for i in range(4):
        assert log.write(_ev("codex", f"n{i}", i))
    log.close()
    for p in (tmp_path / "codex").glob("*.jsonl"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_directory_spares_cannot_be_moved_into_keeps_the_spares(tmp_path, monkeypatch):
    """A rename that fails for good (an agent directory on another file
    system: EXDEV) puts the spare back and stops trying that directory:
    no spare file is left behind per new session (break-it review: 768
    leftovers after 600 sessions), and other directories still take them."""
    import errno

    from supervisor.sessionlog import spares as spares_mod
    real = os.link
    renames = []

    def link(src, dst):
        renames.append(dst)
        if os.path.dirname(dst).endswith("elsewhere"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst)
    monkeypatch.setattr(spares_mod.os, "link", link)
    log = SessionLog(tmp_path)
    log.spares = pool = _pool(tmp_path, 3)
    for i in range(5):
        assert log.write(_ev("elsewhere", f"s{i}", i))
    assert log.write(_ev("codex", "s", 9))
    log.close()
    assert len([r for r in renames if "elsewhere" in r]) == 1  # tried once, not per session
    assert pool.counters["errors"] == 1 and pool.counters["taken"] == 1
    assert pool.counters["missed"] == 5 and pool.ready() == 2
    pool.retire()
    assert len(os.listdir(tmp_path / SPARE_DIR)) == 2
    assert _files(tmp_path) == {**{f"elsewhere/s{i}.jsonl": [i] for i in range(5)},
                                "codex/s.jsonl": [9]}



def test_a_file_another_writer_made_meanwhile_is_opened_never_replaced(tmp_path, monkeypatch):
    """Between the log's ENOENT and the spare's link another writer of the
    same logs (a second daemon on one state directory) makes the file and
    writes a line: link(2) refuses, the spare stays, and both lines are
    kept (break-it review: with rename, 1 line of 600 was lost). The open
    comes first for a file this log has opened before (here: rotated away
    since, so it is missing again)."""
    from supervisor.sessionlog import jsonlog as jsonlog_mod
    log = SessionLog(tmp_path, max_open=1)
    log.spares = pool = _pool(tmp_path, 3)
    assert log.write(_ev("codex", "s1", -2)) and log.write(_ev("codex", "s2", 0))  # s1 closed
    os.rename(tmp_path / "codex" / "s1.jsonl", tmp_path / "s1.old")  # a rotation
    assert pool.ready() == 1 and pool.counters["taken"] == 2
    real_open = os.open
    raced = []

    def racing_open(path, flags, *mode):
        if path.endswith("s1.jsonl") and not raced and not flags & os.O_CREAT:
            raced.append(path)
            try:
                return real_open(path, flags, *mode)
            finally:  # the other writer, right after our ENOENT
                with open(path, "ab") as f:
                    f.write(json.dumps(_ev("codex", "s1", -1)).encode() + b"\n")
        return real_open(path, flags, *mode)
    monkeypatch.setattr(jsonlog_mod.os, "open", racing_open)
    assert log.write(_ev("codex", "s1", 0))
    log.close()
    assert raced and _files(tmp_path) == {"codex/s1.jsonl": [-1, 0], "codex/s2.jsonl": [0]}
    assert pool.ready() == 1 and pool.counters["taken"] == 2


def test_a_new_sessions_file_another_writer_made_is_opened_never_replaced(tmp_path):
    """A session this log has not written yet is linked from a spare before
    any open (no failing open per new session, issue 11); when another
    writer of the same logs made its file already, link(2) refuses, the
    spare stays, and the file is appended to as it is."""
    (tmp_path / "codex").mkdir()
    (tmp_path / "codex" / "s1.jsonl").write_bytes(json.dumps(_ev("codex", "s1", -1)).encode()
                                                 + b"\n")
    log = SessionLog(tmp_path)
    log.spares = pool = _pool(tmp_path, 2)
    assert log.write(_ev("codex", "s1", 0)) and log.write(_ev("codex", "s2", 0))
    log.close()
    assert _files(tmp_path) == {"codex/s1.jsonl": [-1, 0], "codex/s2.jsonl": [0]}
    assert pool.ready() == 1 and pool.counters["taken"] == 1 and pool.counters["missed"] == 0


def test_the_loop_never_unlinks_in_the_spare_directory(tmp_path, monkeypatch):
    """A take only links (issue 11 latency: an unlink in ``.spare`` waits
    for the lock a refill's create holds); the taken spare's name is
    removed by the keeper's worker thread, alone within RETIRE_AFTER when
    no refill is due, and what is left when the keeper ends goes then. The
    session's file keeps its one name and its lines throughout."""
    import threading

    from supervisor.sessionlog import spares as spares_mod
    real = os.unlink
    on_loop = []

    def unlink(path, *a, **kw):
        if threading.current_thread() is threading.main_thread():
            on_loop.append(path)
        return real(path, *a, **kw)
    monkeypatch.setattr(spares_mod.os, "unlink", unlink)
    d = tmp_path / SPARE_DIR

    async def main():
        pool = SpareFiles(d, target=8)
        log = SessionLog(tmp_path)
        log.spares = pool
        async with trio.open_nursery() as nursery:
            await _filled(pool, nursery)
            assert log.write(_ev("codex", "s0", 0))  # 7 ready: a top-up once QUIET
            (name,) = set(os.listdir(d)) - {os.path.basename(r) for r in pool._ready}
            assert os.stat(d / name).st_nlink == 2  # not removed on the loop
            with trio.fail_after(10):
                while (d / name).exists():
                    await trio.sleep(0.01)
            assert os.stat(tmp_path / "codex" / "s0.jsonl").st_nlink == 1
            for i in range(1, 3):  # pending when the keeper ends
                assert log.write(_ev("codex", f"s{i}", i))
            assert on_loop == []
            nursery.cancel_scope.cancel()
        log.close()
        return pool

    pool = trio.run(main)
    assert sorted(os.listdir(d)) == sorted(os.path.basename(r) for r in pool._ready)
    assert pool.ready() == 6 and pool.counters["taken"] == 3  # 8 after the quiet top-up
    assert _files(tmp_path) == {f"codex/s{i}.jsonl": [i] for i in range(3)}
    for i in range(3):
        assert os.stat(tmp_path / "codex" / f"s{i}.jsonl").st_nlink == 1


def test_a_burst_is_served_from_the_pool_with_no_spare_made_beside_it(tmp_path):
    """While spares are taken less than QUIET apart and more than ``low``
    are ready, none is made (their creates would run beside the burst)."""
    from trio.testing import MockClock

    from supervisor.sessionlog.spares import QUIET

    async def main():
        pool = SpareFiles(tmp_path / SPARE_DIR, target=16)
        assert pool.low == 2
        made = []
        async with trio.open_nursery() as nursery:
            await _filled(pool, nursery)
            for i in range(13):  # 16 -> 3 ready: above the low-water mark throughout
                assert pool.take(str(tmp_path / f"t{i}"))
                await trio.sleep(QUIET / 3)
                made.append(pool.counters["made"])
            nursery.cancel_scope.cancel()
        return made, pool

    made, pool = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert made == [16] * 13 and pool.ready() == 3


def test_at_the_low_water_mark_spares_are_made_at_once(tmp_path, monkeypatch):
    """A burst that takes the pool down to ``low`` gets spares made beside
    it: with QUIET never reached, only that path can make them."""
    from supervisor.sessionlog import spares

    async def main():
        pool = SpareFiles(tmp_path / SPARE_DIR, target=16)
        async with trio.open_nursery() as nursery:
            await _filled(pool, nursery)
            monkeypatch.setattr(spares, "QUIET", 1e9)
            for i in range(13):
                assert pool.take(str(tmp_path / f"t{i}"))
            await trio.sleep(0.2)
            assert pool.counters["made"] == 16  # 3 ready: waiting for a quiet pool
            assert pool.take(str(tmp_path / "t13"))  # 2: the low-water mark
            with trio.fail_after(10):
                while pool.counters["made"] == 16:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_spares_never_take_the_last_free_inodes(tmp_path, monkeypatch):
    """A refill stops short of the inode reserve (review: 2,048 spares took
    every free inode of a small file system and the daemon could not start
    again) and says so as an error, so the keeper backs off."""
    import errno as errno_mod

    from supervisor.sessionlog import spares as spares_mod

    class Vfs:
        f_files = 10_000
        f_favail = 1_030  # reserve max(1024, 5%) = 1,024: room for 6
    monkeypatch.setattr(spares_mod.os, "statvfs", lambda _p: Vfs())
    pool = SpareFiles(tmp_path / SPARE_DIR, target=128)
    made, after, err = pool._make(0, 128)
    assert len(made) == 6 and after == 6
    assert isinstance(err, OSError) and err.errno == errno_mod.ENOSPC
    Vfs.f_files = 0  # a file system without an inode count: no limit
    made, _, err = pool._make(after, 10)
    assert len(made) == 10 and err is None


def test_a_removed_sessions_lines_left_in_a_spare_are_removed_at_the_next_start(tmp_path):
    """A taken spare's name outlives its session file when the file is
    removed and the daemon stops before the name is retired (review): the
    removed session's lines must not stay in ``.spare`` for good."""
    d = tmp_path / SPARE_DIR
    d.mkdir(mode=0o700)
    leftover = d / "3.spare"
    leftover.write_bytes(b'{"aep":"0.1"}\n')
    os.chmod(leftover, 0o600)
    (d / "5.spare").touch(mode=0o600)
    os.chmod(d / "5.spare", 0o600)
    found, after = SpareFiles(d)._adopt()
    assert found == [str(d / "5.spare")] and after == 6
    assert not leftover.exists()


def test_a_link_failure_of_the_moment_does_not_give_up_on_the_directory(tmp_path, monkeypatch):
    """EROFS/EACCES/ENOSPC/EPERM are tried again at the next take (review:
    a directory read-only, or immutable, for one export lost its spares for
    the daemon's life); another file system (EXDEV) is given up for good."""
    import errno as errno_mod

    from supervisor.sessionlog import spares as spares_mod
    pool = _pool(tmp_path, 4)
    (tmp_path / "a").mkdir()
    real = os.link
    fail = [errno_mod.EROFS, errno_mod.EPERM]

    def link(src, dst, *a, **kw):
        if fail:
            raise OSError(fail.pop(), "no")
        return real(src, dst, *a, **kw)
    monkeypatch.setattr(spares_mod.os, "link", link)
    assert not pool.take(str(tmp_path / "a" / "s0.jsonl"))  # EPERM (an immutable directory)
    assert not pool.take(str(tmp_path / "a" / "s0.jsonl"))  # EROFS
    assert pool.ready() == 4 and pool.counters["errors"] == 2
    assert pool.take(str(tmp_path / "a" / "s1.jsonl"))  # writable again: a spare again
    fail.append(errno_mod.EXDEV)
    assert not pool.take(str(tmp_path / "a" / "s2.jsonl"))
    assert not pool.take(str(tmp_path / "a" / "s3.jsonl"))  # given up: no link tried
    assert pool.ready() == 3 and pool.counters["errors"] == 3 and pool.counters["taken"] == 1


def test_the_inode_reserve_is_a_limit_not_an_error(tmp_path, monkeypatch):
    """At the reserve the keeper makes what fits, counts no error (an alert
    on the error rate would fire for good on a small file system) and looks
    again only every few seconds."""
    from trio.testing import MockClock

    from supervisor.sessionlog import spares as spares_mod

    class Vfs:
        f_files = 10_000
        f_favail = 1_030
    monkeypatch.setattr(spares_mod.os, "statvfs", lambda _p: Vfs())
    hops = []
    real = SpareFiles._refill

    def refill(self, *a):
        hops.append(a)
        return real(self, *a)
    monkeypatch.setattr(SpareFiles, "_refill", refill)

    async def main():
        pool = SpareFiles(tmp_path / SPARE_DIR, target=64)
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.keep)
            with trio.fail_after(5):
                while pool.ready() < 6:
                    await trio.sleep(0.01)
            n = len(hops)
            await trio.sleep(4.0)
            assert len(hops) == n  # backed off: no hop a second
            nursery.cancel_scope.cancel()
        return pool
    pool = trio.run(main, clock=MockClock(autojump_threshold=0.05))
    assert pool.ready() == 6 and pool.counters["errors"] == 0


# a stray name whose stem str.isdigit() takes but int() refuses ("²") stopped
# the daemon at start (review 6a; older than the shared listing)
def test_a_stray_superscript_digit_spare_name_is_ignored(tmp_path):
    p = tmp_path / "\u00b2.spare"
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(p, 0o600)
    (tmp_path / "3.spare").touch(mode=0o600)
    os.chmod(tmp_path / "3.spare", 0o600)
    found, after = SpareFiles(tmp_path)._adopt()
    assert found == [str(tmp_path / "3.spare")] and after == 4
    assert give_back(tmp_path, 10) >= 1
