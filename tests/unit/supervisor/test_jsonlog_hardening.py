"""Issue 10 #9/#10: the durable session log never tears and never claims a
write it did not make (a fault-injecting writer stands in for a full disk;
the tmpfs version is ``tests/integration/hardening/test_integrity.py``)."""
from __future__ import annotations

import errno
import json
import os

import pytest

from supervisor.sessionlog import jsonlog
from supervisor.sessionlog.jsonlog import SessionLog


def _ev(session: str, n: int) -> dict:
    return {"aep": "0.1", "id": f"{session}-{n}", "type": "x.t.e", "agent": "codex",
            "session": session, "seq": n, "data": {"pad": "p" * 50}}


def _lines(path) -> list[dict]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), data[-60:]
    return [json.loads(ln) for ln in data.splitlines()]


def test_a_short_write_leaves_no_fragment_and_reports_not_written(tmp_path, monkeypatch):
    sl = SessionLog(tmp_path)
    assert sl.write(_ev("s", 0)) is True
    real = os.write

    def short(fd, data):  # the disk fills mid-line
        return real(fd, bytes(data)[: len(data) // 2])

    monkeypatch.setattr(jsonlog.os, "write", short)
    assert sl.write(_ev("s", 1)) is False
    assert sl.failing and sl.errors == 1
    monkeypatch.setattr(jsonlog.os, "write", real)
    assert sl.write(_ev("s", 2)) is True
    assert not sl.failing
    assert [e["seq"] for e in _lines(sl.path_for(_ev("s", 0)))] == [0, 2]
    sl.close()


def test_enospc_reports_not_written_and_recovers(tmp_path, monkeypatch):
    sl = SessionLog(tmp_path)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonlog.os, "write", full)
    assert sl.write(_ev("s", 0)) is False and sl.failing
    monkeypatch.undo()
    assert sl.write(_ev("s", 1)) is True and not sl.failing
    assert [e["seq"] for e in _lines(sl.path_for(_ev("s", 1)))] == [1]
    sl.close()


def test_repair_truncates_a_torn_tail_and_keeps_the_fragment(tmp_path):
    p = tmp_path / "codex" / "s.jsonl"
    p.parent.mkdir()
    whole = json.dumps(_ev("s", 0)) + "\n"
    p.write_text(whole + '{"aep":"0.1","id":"tor')
    (tmp_path / "codex" / "ok.jsonl").write_text(whole)
    sl = SessionLog(tmp_path)
    repaired = sl.repair()
    assert repaired == [p]
    assert p.read_text() == whole
    kept = [q for q in tmp_path.rglob("*") if q.is_file() and b'"id":"tor' in q.read_bytes()]
    assert kept and all(not q.name.endswith(".jsonl") for q in kept)
    assert sl.write(_ev("s", 1)) is True
    assert [e["seq"] for e in _lines(p)] == [0, 1]
    assert sl.repair() == []  # idempotent
    sl.close()


def test_a_file_that_is_all_fragment_is_emptied(tmp_path):
    p = tmp_path / "codex" / "s.jsonl"
    p.parent.mkdir()
    p.write_text('{"half')
    sl = SessionLog(tmp_path)
    assert sl.repair() == [p]
    assert p.read_bytes() == b""
    sl.close()


def test_descriptors_stay_within_the_lru_and_are_counted(tmp_path):
    sl = SessionLog(tmp_path, max_open=4)
    before = len(os.listdir("/proc/self/fd"))
    for i in range(50):
        assert sl.write(_ev(f"s{i}", 0))
    assert len(os.listdir("/proc/self/fd")) <= before + 4
    assert sl.counters["files_opened"] == 50 and sl.counters["descriptors_evicted"] == 46
    sl.close()


@pytest.mark.parametrize("n", [1, 3])
def test_whole_lines_survive_an_interleaved_failure(tmp_path, monkeypatch, n):
    sl = SessionLog(tmp_path)
    real = os.write
    calls = {"k": 0}

    def flaky(fd, data):
        calls["k"] += 1
        if calls["k"] % 2 == 0:
            return real(fd, bytes(data)[:n])
        return real(fd, data)

    monkeypatch.setattr(jsonlog.os, "write", flaky)
    results = [sl.write(_ev("s", i)) for i in range(10)]
    monkeypatch.undo()
    written = [e["seq"] for e in _lines(sl.path_for(_ev("s", 0)))]
    assert written == [i for i, ok in enumerate(results) if ok]
    sl.close()


def _mode(p) -> int:
    return p.stat().st_mode & 0o777


def test_every_directory_the_log_makes_is_private_whatever_the_umask(tmp_path):
    # issue 25, attack 5: logs/<agent>/ was 0755 (files 0600): other local
    # users could list the session ids
    root = tmp_path / "state" / "logs"
    old = os.umask(0o022)
    try:
        sl = SessionLog(root)
        assert sl.write(_ev("s1", 0))
        sl.close()
    finally:
        os.umask(old)
    agent = root / "codex"
    assert (agent / "s1.jsonl").exists()
    assert _mode(agent) == _mode(root) == _mode(tmp_path / "state") == 0o700


def test_write_atomic_and_state_files_make_private_directories(tmp_path):
    from bridges.core.paths import write_atomic
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a" / "b" / "doc.json", "{}")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == _mode(tmp_path / "a" / "b") == 0o700


def test_repair_at_start_tightens_looser_log_directories(tmp_path):
    # logs written by an older daemon: 0755 directories are made 0700 at start
    root = tmp_path / "logs"
    (root / "codex").mkdir(parents=True)
    (root / "kimi").mkdir()
    (root / "codex" / "s.jsonl").write_text("{}\n")
    for d in (root, root / "codex", root / "kimi"):
        os.chmod(d, 0o755)
    os.chmod(root / "kimi", 0o750)
    SessionLog(root).repair()
    assert [_mode(d) for d in (root, root / "codex", root / "kimi")] == [0o700] * 3
    assert _mode(root / "codex" / "s.jsonl") != 0  # files untouched
