"""Spare session log files: empty files made ahead of time, so that the
first event of a new session is appended to a file that is linked into
place rather than created on the event loop.

Why (issue 11): creating a file is the one part of a new session's first
event that the daemon cannot make cheap. Measured on ext4 here, a create
costs 30-800 us of kernel time (the inode allocator steps over every inode
freed in the last minutes), linking an existing empty file ~25 us. Every
new OpenCode/Kilo session, OpenHands conversation and Codex conversation
pays it before its first event reaches the relay (the log is written
first: DESIGN.md "Delivery"). The spares are made in a worker thread, off
the event loop, and made ahead of a burst rather than beside it: a create
is kernel CPU the burst would otherwise share (no-journal ext4 scans past
every inode freed in the last minute or more), so the pool is topped up
when no spare has been taken for a while, and at once only when nearly
empty (:meth:`SpareFiles.keep`); the loop only links them into place.

Layout: ``{logs}/.spare/{n}.spare``, ``0600`` in a ``0700`` directory. No
session or agent name can be ``.spare`` (:func:`supervisor.sessionlog.jsonlog.safe_name`
starts every name with a letter, digit or ``~``), and nothing that reads
the logs looks at files without ``.jsonl`` in their name. Spares left by a
previous run are used again when they are this user's, ``0600`` and empty.
A spare is linked (``link(2)``, which refuses an existing path) as the new
session's file, then its spare name removed: no session file is ever
replaced, even by a second writer of the same logs.

The spare name is removed by the worker thread, not on the loop (issue 11
latency): an ``unlink`` in ``.spare`` waits for the directory's lock, which
a refill's create holds for its whole inode allocation (0.2-1.3 ms a create
on this machine's ext4; the loop's unlink took up to 5-11 ms while a refill
ran, 15-140 us otherwise). A taken spare's name is retired within
:data:`RETIRE_AFTER` seconds (with the next refill, or alone); until then
the session's file has a second link in ``.spare``, which the next start
removes too if the daemon stops first (the same case as a crash between
the link and the unlink).

Pure bookkeeping plus two kinds of I/O: :meth:`SpareFiles.take` (a
``link``, ~25 us, on the loop) and :meth:`SpareFiles.keep` (the refills
and the spare names' removal, in a worker thread owned by the task that
awaits it)."""
from __future__ import annotations

import errno
import logging
import os
import stat
from collections import deque
from pathlib import Path

import trio

from bridges.core.paths import make_private_dirs

__all__ = ["SpareFiles", "SPARE_DIR", "DEFAULT_TARGET", "QUIET", "CHUNK", "RETIRE_AFTER",
           "INODE_RESERVE", "give_back"]

log = logging.getLogger("aep.jsonl")

SPARE_DIR = ".spare"
DEFAULT_TARGET = 2048
"""Spares kept ready (each an empty file: an inode, no data block). A
burst of up to ``DEFAULT_TARGET - DEFAULT_TARGET // 8`` (1,792) new
sessions (an OpenHands server's conversations attached at start) is served
with no file created while it lasts; the pool is topped up once the burst
is over (:meth:`SpareFiles.keep`)."""
QUIET = 0.25
"""Seconds without a spare taken before the pool is topped up above its
low-water mark: creates are kernel time (30-800 us each here), and made
beside a burst they take the CPU the burst runs on (issue 11: the
OpenHands bench's 2,000 fresh sessions ran ~30% slower than with the files
there, the takes themselves ~22 us a session)."""
CHUNK = 128
"""Spares made per worker-thread call: a top-up yields to a burst that
starts meanwhile within one chunk."""

RETIRE_AFTER = 1.0
"""Most seconds a taken spare's name stays (a second link of the session's
file): the takes of a burst share one thread hop, at most one per
:data:`QUIET` while it lasts."""

INODE_RESERVE = 0.05
"""Spares never take the file system's last free inodes: a refill stops
short of ``INODE_RESERVE`` of its inodes (at least 1,024) being free, so
the pool cannot leave the daemon's own session logs (or a restart's
probe) without an inode. File systems that report no inode count (0)
are not limited."""

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
# a link that failed with one of these never works into that directory:
# another file system, or one without hard links; anything else (read-only
# for a while, permissions, an immutable directory's EPERM, no space) is
# tried again at the next take
_FOREIGN_ERRNOS = frozenset({errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})


class SpareFiles:
    """A pool of empty ``0600`` files in ``directory`` (see the module
    docstring). ``target``: how many to keep ready. ``counters``:
    ``made`` (files created by refills), ``taken`` (linked into place),
    ``missed`` (a session file created on the event loop instead: none
    ready, or the link failed; counted by the log), ``errors`` (refills
    or links that failed)."""

    def __init__(self, directory: Path, *, target: int = DEFAULT_TARGET) -> None:
        self.directory = Path(directory)
        self.target = max(1, target)
        self._ready: deque[str] = deque()
        self._next = 0  # the next spare's number
        #: at most this many ready: refilled at once, not only when quiet
        self.low = self.target // 8
        self._used = trio.Event()  # set: a spare was taken (the keeper waits on it when full)
        self._urgent = trio.Event()  # set: at most ``low`` ready
        #: spare names linked into place, to be removed by the keeper's worker
        self._taken: list[str] = []
        self._failing = False  # the last refill failed: logged once per spell
        #: directories a link into failed for good (another file system...):
        #: their new files are created, no spare is spent on them again
        self._foreign: set[str] = set()
        self.counters = {"made": 0, "taken": 0, "missed": 0, "errors": 0}

    def ready(self) -> int:
        """Spares ready to be taken now."""
        return len(self._ready)

    def take(self, dest: str) -> bool:
        """Link a spare as ``dest`` (``dest`` in a directory on the same
        file system; the spare name is left for :meth:`keep`'s worker to
        remove, see the module docstring); ``True`` when ``dest`` now
        exists as an empty ``0600`` file, ``False`` when no spare is ready,
        ``dest`` exists already or the link failed (the caller creates or
        opens ``dest`` itself; a missing directory of ``dest`` keeps the
        spare for the retry). Raises nothing."""
        ready = self._ready
        if not ready:
            return False
        where = os.path.dirname(dest)
        if where in self._foreign:
            return False
        taken = False
        while ready:
            spare = ready.popleft()
            try:
                # link(2), not rename(2): it refuses a dest that exists, so a
                # session log is never replaced, whoever made it meanwhile
                os.link(spare, dest)
            except FileExistsError:
                ready.appendleft(spare)
                break
            except FileNotFoundError:
                if os.path.lexists(spare):  # dest's directory is gone, not the spare
                    ready.appendleft(spare)
                    break
                continue  # the spare went away (a cleanup): the next one
            except OSError as e:  # another file system (EXDEV), read-only, no space...
                ready.appendleft(spare)  # kept: never one left behind per session
                self.counters["errors"] += 1
                if e.errno in _FOREIGN_ERRNOS:  # for good: stop spending spares there
                    self._foreign.add(where)
                    log.warning("spare session log files cannot be linked into %s (%s); its "
                                "new files are created in place", where,
                                e.strerror or type(e).__name__)
                break
            # the spare name goes in the keeper's worker: an unlink here would
            # wait for .spare's lock while a refill creates there
            self._taken.append(spare)
            self.counters["taken"] += 1
            taken = True
            break
        self._used.set()
        if len(ready) <= self.low:
            self._urgent.set()
        return taken

    def retire(self) -> None:
        """Remove the spare names of the spares taken so far, now (what
        :meth:`keep`'s worker does; :meth:`keep` calls it when it ends).
        Raises nothing: a name that cannot be removed is left for the next
        start (:meth:`_adopt` removes a spare name with a second link)."""
        names, self._taken = self._taken, []
        _unlink_all(names)

    async def keep(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                   ) -> None:
        """Forever: keep :attr:`target` spares ready (the spares of a
        previous run are adopted first). Spares are made in a worker thread,
        :data:`CHUNK` at a time: at once while at most :attr:`low` are
        ready, otherwise only once no spare was taken for :data:`QUIET`
        seconds (then chunk after chunk until one is taken), so a burst of
        new sessions is served from the pool without files being created
        beside it. Taken spares' names are removed in the same worker hops
        (during a burst, one hop per :data:`QUIET` removes only names; what
        is left when it ends, on the loop). A failing refill is logged once
        per failing spell and retried at most once a second."""
        task_status.started()
        try:
            adopted, after = await trio.to_thread.run_sync(self._adopt)
            self._ready.extend(adopted)
            self._next = max(self._next, after)
            seen = -1  # spares taken as of the last quiet look
            while True:
                want = 0
                if len(self._ready) >= self.target:
                    if not self._taken:
                        self._used = trio.Event()
                        await self._used.wait()  # set by take()
                        continue
                elif len(self._ready) > self.low and self.counters["taken"] != seen:
                    seen = self.counters["taken"]
                    self._urgent = trio.Event()
                    with trio.move_on_after(QUIET):
                        await self._urgent.wait()  # set by take() at the low-water mark
                    if self.counters["taken"] == seen or len(self._ready) <= self.low:
                        want = min(CHUNK, self.target - len(self._ready))
                    # else sessions are being started: no create beside them, names only
                else:
                    want = min(CHUNK, self.target - len(self._ready))
                names, self._taken = self._taken, []
                if want <= 0 and not names:
                    continue
                made, self._next, err = await trio.to_thread.run_sync(
                    self._refill, names, self._next, want)
                self._ready.extend(made)
                self.counters["made"] += len(made)
                if err is not None:
                    if not isinstance(err, _AtReserve):  # the reserve is no error
                        self.counters["errors"] += 1
                    if not self._failing:
                        log.warning("cannot make spare session log files in %s: %s "
                                    "(new session files are created on the event loop "
                                    "meanwhile)", self.directory, err)
                    self._failing = True
                    await trio.sleep(5.0 if isinstance(err, _AtReserve) else 1.0)
                elif self._failing and want > 0:
                    self._failing = False
                    log.info("spare session log files are made again")
        finally:
            self.retire()  # what is left: a few unlinks, at shutdown

    # -- in the worker thread: no shared state touched, results returned
    def _refill(self, names: list[str], first: int, n: int
                ) -> tuple[list[str], int, OSError | None]:
        """Remove the taken spares' ``names``, then :meth:`_make` ``n``
        spares (none when ``n <= 0``)."""
        _unlink_all(names)
        if n <= 0:
            return [], first, None
        return self._make(first, n)

    def _adopt(self) -> tuple[list[str], int]:
        """The spares a previous run left (empty regular files named
        ``{n}.spare``, one link) and the number after the highest of them.
        Names with a second link (a taken spare) and our non-empty ones (a
        taken spare whose session file was removed) are removed."""
        found: list[str] = []
        after = 0
        for e, st in _spare_entries(self.directory):
            name = e.name
            if st.st_nlink > 1 and stat.S_ISREG(st.st_mode):
                # a crash between a take's link and unlink: the file is a
                # session's log now; only this name of it goes
                try:
                    os.unlink(e.path)
                except OSError:
                    pass
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size > 0 and st.st_uid == os.getuid():
                # a taken spare whose session file was removed before its
                # name was retired (and the daemon stopped meanwhile): what
                # is left is a removed session's lines, never to be kept
                try:
                    os.unlink(e.path)
                except OSError:
                    pass
                continue
            # a spare becomes a session log as it is: only ours, 0600, empty
            if (stat.S_ISREG(st.st_mode) and st.st_size == 0
                    and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()):
                found.append(e.path)
                after = max(after, int(name[:-6]) + 1)
        return found, after

    def _make(self, first: int, n: int) -> tuple[list[str], int, OSError | None]:
        """Create ``n`` spares numbered from ``first`` on (skipping numbers
        taken by strays); returns their paths, the next free number and the
        error that stopped the refill early, if any."""
        made: list[str] = []
        i = first
        try:
            make_private_dirs(self.directory)  # the logs' root too, when this makes it
            if stat.S_IMODE(os.stat(self.directory).st_mode) != 0o700:
                os.chmod(self.directory, 0o700)  # one made otherwise (a restore, umask)
            room = _inode_room(self.directory)
            short = room < n
            n = min(n, room)
            while len(made) < n:
                path = os.path.join(self.directory, f"{i}.spare")
                i += 1
                try:
                    os.close(os.open(path, _FLAGS, 0o600))
                except FileExistsError:  # a stray of an earlier run: skip its number
                    continue
                made.append(path)
            if short:  # logged once a spell, looked at again every few seconds
                raise _AtReserve(errno.ENOSPC, "free inodes down to the reserve "
                                               f"({INODE_RESERVE:.0%} of the file system's)")
        except OSError as e:
            return made, i, e
        return made, i, None


class _AtReserve(OSError):
    """A refill stopped at :data:`INODE_RESERVE`: not an error, a limit."""


def _inode_room(directory: Path) -> int:
    """How many files may be made in ``directory`` without eating into
    :data:`INODE_RESERVE`; a large number when the file system reports no
    inode count. Raises ``OSError`` (``statvfs``)."""
    st = os.statvfs(directory)
    if st.f_files <= 0:
        return 1 << 30
    reserve = max(1024, int(st.f_files * INODE_RESERVE))
    return max(0, st.f_favail - reserve)


def give_back(directory: Path, n: int = 64) -> int:
    """Remove up to ``n`` of the spares (empty ``{n}.spare`` files) in
    ``directory``, at once, for a start that finds no free inode left
    (:func:`supervisor.config.state_dir_problem`); how many went. Raises
    nothing."""
    gone = 0
    for e, st in _spare_entries(directory):
        if gone >= n:
            break
        if st.st_size == 0:
            try:
                os.unlink(e.path)
                gone += 1
            except OSError:
                pass
    return gone


def _spare_entries(directory: Path | str) -> list[tuple[os.DirEntry[str], os.stat_result]]:
    """The entries of ``directory`` named like a spare (``{n}.spare``) with
    their ``lstat``; none when it cannot be listed, an entry gone
    meanwhile left out."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    out = []
    for e in entries:
        name = e.name
        stem = name[:-6]
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses
        if name.endswith(".spare") and stem.isascii() and stem.isdigit():
            try:
                out.append((e, e.stat(follow_symlinks=False)))
            except OSError:
                continue
    return out


def _unlink_all(names: list[str]) -> None:
    """``unlink`` each of ``names``; one that fails is left (a taken
    spare's second name: the next start removes it)."""
    for name in names:
        try:
            os.unlink(name)
        except OSError:
            pass
