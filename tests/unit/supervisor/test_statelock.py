"""The state directory's lock (``supervisor.sessionlog.statelock``): one holder at a
time, the holder's pid readable by the refused one, the file private, and
the lock free again once released."""
from __future__ import annotations

import os
import stat

import pytest

from supervisor.sessionlog.statelock import LOCK_FILE, StateDirBusy, hold


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    first = hold(tmp_path)
    try:
        # flock belongs to the open file description: a second open, even in
        # this process, meets the first one's lock as another daemon would
        with pytest.raises(StateDirBusy) as e:
            hold(tmp_path)
        assert e.value.pid == os.getpid()
        assert e.value.path == tmp_path / LOCK_FILE
    finally:
        first.release()


def test_the_lock_is_free_again_after_release_and_release_is_idempotent(tmp_path):
    hold(tmp_path).release()
    again = hold(tmp_path)
    again.release()
    again.release()


def test_a_released_lock_leaves_no_pid_behind(tmp_path):
    # a start refused after the lock (its ports busy) must not leave its pid
    # in the file, where a reader would take it for the state dir's holder
    hold(tmp_path).release()
    assert (tmp_path / LOCK_FILE).read_text() == ""
    lock = hold(tmp_path)
    try:  # the next holder's pid is there again
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()


def test_the_lock_file_holds_only_our_pid(tmp_path):
    (tmp_path / LOCK_FILE).write_text("123456789012\n")  # a longer stale pid
    lock = hold(tmp_path)
    try:
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()


def test_a_fresh_lock_file_is_made_0600(tmp_path):
    lock = hold(tmp_path)
    try:
        assert stat.S_IMODE((tmp_path / LOCK_FILE).stat().st_mode) == 0o600
    finally:
        lock.release()


def test_a_missing_state_directory_is_an_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        hold(tmp_path / "nowhere")


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (tmp_path / LOCK_FILE).symlink_to(target)
    with pytest.raises(OSError) as e:
        hold(tmp_path)
    assert e.value.filename == str(tmp_path / LOCK_FILE)
    assert target.read_text() == "keep me\n"


def test_a_lock_file_that_is_not_a_regular_file_is_refused_by_name(tmp_path):
    os.mkfifo(tmp_path / LOCK_FILE)
    with pytest.raises(OSError) as e:
        hold(tmp_path)  # a FIFO: neither waited on nor locked
    assert e.value.filename == str(tmp_path / LOCK_FILE)
    assert not isinstance(e.value, StateDirBusy)


def test_a_hard_linked_lock_file_is_refused_and_its_other_name_untouched(tmp_path):
    other = tmp_path / "precious"
    other.write_text("keep me\n")
    os.link(other, tmp_path / LOCK_FILE)
    with pytest.raises(OSError) as e:
        hold(tmp_path)
    assert e.value.filename == str(tmp_path / LOCK_FILE)
    assert other.read_text() == "keep me\n"
