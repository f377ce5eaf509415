"""One daemon per state directory: an advisory ``flock(2)`` on
``<AEP_STATE_DIR>/daemon.lock``, held by ``aep-bridges run`` for its
whole life.

Why: two daemons on one state directory share the session logs, the
epoch and the bridges' state files (OpenHands, the SSE trackers). Each
of those assumes one writer: two writers lose lines and state (seen in a
review: 1 line of 600 lost, state entries overwritten). Different ports
do not protect the state directory, so the second daemon is refused
before it touches anything.

The lock dies with its process (``kill -9`` included, so a crash never
leaves a stale lock behind). The file holds the holder's pid, only so the
refusal can name it; a daemon that ends (or a start refused later, e.g.
for its ports) leaves it empty. ``aep-bridges relay`` takes no lock: it keeps no
session logs and may share a host's default state directory with a
daemon."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

LOCK_FILE = "daemon.lock"


class StateDirBusy(Exception):
    """Another live process holds the state directory's lock. ``pid``:
    the holder's pid as it wrote it (``None`` when unreadable)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"{path} is held by {who}")

    def refusal(self) -> tuple[str, str]:
        """``(what, fix)``: the words of ``run``'s refusal (``what; fix``),
        which ``doctor`` and ``check`` print too."""
        who = f"aep-bridges pid {self.pid}" if self.pid else "another aep-bridges"
        return (f"AEP_STATE_DIR={str(self.path.parent)!r}: in use by {who}",
                "stop it first, or give this daemon a state directory of its own")


class StateLock:
    """The held lock: an open descriptor on ``daemon.lock``. Keep the object
    alive for as long as the daemon runs; :meth:`release` (or process exit)
    frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Empty the file (still holding the lock: no pid is left naming a
        process that is gone, e.g. a start refused for its ports), then
        unlock and close; idempotent."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:  # a read-only remount meanwhile: the pid stays, harmless
                pass
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def hold(state_dir: Path) -> StateLock:
    """Take ``state_dir``'s lock without waiting (the directory must exist)
    and write our pid into it. Raises :class:`StateDirBusy` when a live
    process holds it, ``OSError`` (its ``filename`` the lock file) when
    the file cannot be opened or locked: a symlink (``ELOOP``), not a
    regular file (``EINVAL``), no permission."""
    path = Path(state_dir) / LOCK_FILE
    # never through a symlink (it would truncate whatever it names), never
    # waiting on a FIFO
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_nlink > 1:  # a hard link: the pid would overwrite another file's lines
            raise OSError(errno.EMLINK, "has other links (a hard link to another file)", str(path))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateDirBusy(path, _read_pid(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        os.close(fd)
        if e.filename is None and not isinstance(e, StateDirBusy):
            e.filename = str(path)
        raise
    except BaseException:
        os.close(fd)
        raise
    return StateLock(path, fd)


def probe(state_dir: Path) -> None:
    """Is ``state_dir``'s lock free? Returns when it is (or when there is no
    lock file: nothing ever held it); raises :class:`StateDirBusy` when a
    live process holds it. Never takes the lock from anyone and writes
    nothing (``doctor``, ``check``, a ``run`` refused for its ports): a
    shared, non-blocking ``flock`` on a read-only descriptor, dropped at
    once. A daemon starting in that instant is refused as if busy (it says
    so; a start again succeeds). ``OSError`` when the file cannot be opened
    (``run`` says the same when it tries)."""
    path = Path(state_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateDirBusy(path, _read_pid(fd)) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


__all__ = ("LOCK_FILE", "StateDirBusy", "StateLock", "hold", "probe")
