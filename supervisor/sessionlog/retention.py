"""Session log retention: rotation by size and age, closed files compressed,
the oldest removed first under a total cap, never the file being written.

Layout under ``{state}/logs/{agent}/`` (see :mod:`supervisor.sessionlog.jsonlog`):

- ``{session}.jsonl``: the live file of a session (appended to);
- ``{session}.{UTC}.jsonl``: a closed segment, just rotated (``UTC`` is
  ``YYYYmmddTHHMMSS.ffffffZ``, so names sort in rotation order);
- ``{session}.{UTC}.jsonl.gz``: the same, compressed (gzip, in a worker
  thread so the relay channel never waits on it); the plain one is removed
  once the ``.gz`` is complete.

Rules (:class:`RetentionPolicy`, from ``AEP_LOG_MAX_BYTES``,
``AEP_LOG_MAX_AGE``, ``AEP_LOG_MAX_TOTAL_BYTES``; ``0`` turns one off):

- a live file is rotated once past ``max_bytes`` or open for ``max_age``
  (checked every second, off the write path: :meth:`RetainingSessionLog.check`);
- a file not open for writing whose last write is older than ``max_age`` is
  removed;
- while the directory holds more than ``max_total_bytes``, the cap is
  shared between writers (issue 25: one unauthenticated OTLP sender
  filling it evicted every other agent's files; attack 5: grouped by
  agent, an OTLP flood as agent ``codex`` evicted the Codex hook bridge's
  sessions, the same agent): the writer holding the most bytes, its live
  files counted, loses its oldest closed file (by last write), again and
  again. A file's writer is the fleet bridge that wrote it (its name), or
  ``relay:{principal}`` for a remote emitter's posts, as recorded in
  :mod:`.writers` (a file it has no entry for: its agent's directory). So
  a writer holding no more than its share (the cap over the number of
  writers with files) is never evicted by another's flood: it could only
  be the largest with the directory under the cap. When the largest holds
  only live files, they are rotated (its largest first), so they become
  removable. The live
  files being written are never removed, so the directory can exceed the
  cap by at most what is written to fresh live files before the next
  sweep.

Counts (``retained``) go to ``/healthz`` and ``/metrics``."""
from __future__ import annotations

import gzip
import heapq
import logging
import os
import re
import shutil
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import trio

from bridges.core.settings import EnvReader, Setting, check_fields

from .jsonlog import SessionLog
from .spares import SPARE_DIR
from .writers import WriterIndex, stem_of

__all__ = ["SETTINGS", "REMOVALS_PER_STEP", "RetentionPolicy", "RetainingSessionLog", "parse_size", "parse_age",
           "segment_name"]

log = logging.getLogger("aep.retention")

REMOVALS_PER_STEP = 128
"""Files the maintenance task's sweep removes between two turns of the
event loop (an unlink is ~10-30 us here)."""

SETTINGS = (
    Setting("AEP_LOG_MAX_BYTES", "`64M`",
            "a session log file is rotated (closed, compressed) once it grows past this "
            "(checked every second; bytes, `K`/`M`/`G` suffixes; `0`: never by size); "
            "unset, a quarter of `AEP_LOG_MAX_TOTAL_BYTES` when that is smaller"),
    Setting("AEP_LOG_MAX_AGE", "`30d`",
            "a session log file is rotated once open this long, and files last written longer "
            "ago are removed (`s`/`m`/`h`/`d` suffixes; `0`: keep forever)"),
    Setting("AEP_LOG_MAX_TOTAL_BYTES", "`1G`",
            "all session logs together; above it the writer (bridge, or remote principal) "
            "holding the most bytes loses its oldest closed files first (one source cannot evict "
            "everyone else's), never a file being written (`0`: no cap)"),
)

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.I)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.I)
_SEGMENT = re.compile(r"\.\d{8}T\d{6}\.\d{6}Z\.jsonl(\.gz)?$")


def parse_size(value: str) -> int:
    """``"64M"`` -> 67108864 (``K``/``M``/``G``/``T`` are powers of 1024).
    Raises ``ValueError``."""
    m = _SIZE.match(value)
    if not m:
        raise ValueError(value)
    return int(m.group(1)) << (10 * " kmgt".index((m.group(2) or " ").lower()))


def parse_age(value: str) -> float:
    """``"30d"`` -> seconds (``s``/``m``/``h``/``d``/``w``; bare: seconds).
    Raises ``ValueError``."""
    m = _AGE.match(value)
    if not m:
        raise ValueError(value)
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2).lower()]
    return float(m.group(1)) * unit


@dataclass(frozen=True)
class RetentionPolicy:
    """The three limits; ``None`` is off. Sizes in bytes, age in seconds."""

    max_bytes: int | None = 64 << 20
    max_age: float | None = 30 * 86400.0
    max_total_bytes: int | None = 1 << 30

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> tuple["RetentionPolicy", list[str]]:
        """``(policy, problems)``: one problem line per bad value (the default
        is kept for it), as :class:`bridges.core.settings.EnvReader` does."""
        r = EnvReader(environ)
        values: dict[str, Any] = {}
        for name, field, parse, default in (
                ("AEP_LOG_MAX_BYTES", "max_bytes", parse_size, cls.max_bytes),
                ("AEP_LOG_MAX_AGE", "max_age", parse_age, cls.max_age),
                ("AEP_LOG_MAX_TOTAL_BYTES", "max_total_bytes", parse_size, cls.max_total_bytes)):
            raw = r.raw(name)
            if raw is None:
                values[field] = default
                continue
            try:
                v = parse(raw)
            except ValueError:
                unit = "a duration (30d, 12h, 3600)" if field == "max_age" else "bytes (64M, 1G, 1048576)"
                r.problems.append(f"{name}={raw!r}: expected {unit}; 0 turns it off")
                values[field] = default
                continue
            values[field] = v or None
        total = values["max_total_bytes"]
        if r.raw("AEP_LOG_MAX_BYTES") is None and total and values["max_bytes"]:
            # the per-file default follows a smaller total the operator set: a
            # default they never chose must not refuse their one setting
            values["max_bytes"] = min(values["max_bytes"], max(1, total // 4))
        policy = cls(**values)
        if policy.max_bytes and policy.max_total_bytes and policy.max_bytes > policy.max_total_bytes:
            r.problems.append(f"AEP_LOG_MAX_BYTES={policy.max_bytes} exceeds "
                              f"AEP_LOG_MAX_TOTAL_BYTES={policy.max_total_bytes}: one file could "
                              "not fit the cap")
        return policy, r.problems


def segment_name(live: Path, when: float) -> Path:
    """The closed-segment path for ``live`` rotated at ``when`` (epoch s)."""
    micros = round(when * 1e6)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(micros // 1_000_000)) + f".{micros % 1_000_000:06d}Z"
    return live.with_name(f"{live.name[:-len('.jsonl')]}.{stamp}.jsonl")


class RetainingSessionLog(SessionLog):
    """A :class:`SessionLog` that keeps its directory within a
    :class:`RetentionPolicy`, without touching the write path: the
    maintenance task (:meth:`maintain`, in the fleet's nursery) looks at the
    open live files every ``check_interval`` seconds (:meth:`check`: one
    ``fstat`` each), rotates those past ``max_bytes`` or open for
    ``max_age`` (a rename; the next write opens a fresh file), compresses
    rotated files in a worker thread and sweeps (:meth:`sweep`). So a live
    file can pass ``max_bytes`` by what is written within one interval.
    ``clock`` is the wall clock (file ages are wall-clock facts).
    ``scan=False``: the directory is not looked at (its files belong to
    another process: the bytes of an earlier daemon's logs are not ours)."""

    def __init__(self, root: Path, policy: RetentionPolicy, *, max_open: int = 128,
                 clock: Callable[[], float] = time.time, scan: bool = True) -> None:
        super().__init__(root, max_open=max_open)
        self.policy = policy
        self.clock = clock
        #: retention's counts (``jsonl_*`` in /healthz, ``session_log_*`` in /metrics)
        self.retained = {"rotations": 0, "compressed": 0, "compress_errors": 0,
                         "removed_files": 0, "removed_bytes": 0, "remove_errors": 0}
        self._scanned: dict[Path, int] = {}  # size of each file at the last rescan
        self._sizes: dict[Path, int] = {}    # size of each open file at the last check
        self._opened: dict[Path, float] = {}
        self._todo: deque[Path] = deque()
        self._wake = trio.Event()
        self.total_bytes = 0
        if scan:  # ``scan=False``: a fleet that writes no log (``aep-bridges relay``)
            self.writers = WriterIndex(self.root)
            self._rescan()

    # -- accounting ------------------------------------------------------------
    def _rescan(self) -> None:
        """Total bytes under the root (the baseline :meth:`check` adds growth
        to), and any plain segment left uncompressed (a crash between
        rotation and compression) queued. Scans on the caller's thread (at
        start; the maintenance task scans in a worker thread)."""
        self._apply(_scan(self.root))

    def _apply(self, scan: _Scan) -> None:
        """Take ``scan`` (made by :func:`_scan`, in a worker thread or not)
        as the baseline; nothing that changes files ran since it began (the
        maintenance task does rotation, compression and sweeping in turn),
        and what the writer appended since is growth the next
        :meth:`check` counts (it reads each open file's size against the
        size scanned)."""
        todo = set(self._todo)
        for seg in scan.segments:
            if seg not in todo:
                self._todo.append(seg)
        self._scanned, self._sizes = scan.sizes, {}
        self.total_bytes = scan.total

    def writing(self) -> set[Path]:
        """The live files with an open descriptor: never removed."""
        return set(self._fds)

    def current_bytes(self) -> int:
        """Bytes on disk now: ``total_bytes`` plus what the open files grew
        since the last :meth:`check` (one ``fstat`` each; changes nothing)."""
        total = self.total_bytes
        for path, fd in list(self._fds.items()):
            try:
                size = os.fstat(fd).st_size
            except OSError:
                continue
            total += size - self._sizes.get(path, self._scanned.get(path, 0))
        return total

    # -- the live files ----------------------------------------------------------
    def check(self) -> int:
        """Look at every open live file once: count its growth into
        ``total_bytes``, rotate it when past ``max_bytes`` or open for
        ``max_age``; wake the sweep when over the total cap. Returns the
        number of files rotated."""
        now = self.clock()
        limit, age = self.policy.max_bytes, self.policy.max_age
        rotated = 0
        for path, fd in list(self._fds.items()):
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            size = st.st_size
            prev = self._sizes.get(path, self._scanned.get(path, 0))
            if st.st_nlink == 0:
                # removed under the daemon (its directory, by hand): writes
                # would go on into the deleted file; the next one makes it
                # again (the directory too), so at most one interval's lines
                # went where nobody can read them
                del self._fds[path]
                os.close(fd)
                self._sizes.pop(path, None)
                self._opened.pop(path, None)
                self.total_bytes -= prev
                log.warning("session log %s was removed while open; the next event of its "
                            "session starts it again", path)
                continue
            self.total_bytes += size - prev
            self._sizes[path] = size
            opened = self._opened.setdefault(path, now)
            if size and ((limit is not None and size >= limit)
                         or (age is not None and now - opened >= age)):
                if self.rotate(path) is not None:
                    rotated += 1
        if self.writers is not None:  # who wrote the files opened since the last look
            self.writers.flush()
        cap = self.policy.max_total_bytes
        if cap is not None and self.total_bytes > cap:
            self._wake.set()
        return rotated

    def rotate(self, path: Path) -> Path | None:
        """Close ``path``'s descriptor and rename it to a closed segment
        (queued for compression); the next write starts a new live file.
        Returns the segment, or ``None`` when there was nothing to rotate."""
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)
        self._sizes.pop(path, None)
        self._scanned.pop(path, None)  # the next live file of this name starts at 0
        self._opened.pop(path, None)
        when = self.clock()
        seg = segment_name(path, when)
        while seg.exists() or seg.with_name(seg.name + ".gz").exists():
            when += 1e-6  # never rename onto an earlier segment
            seg = segment_name(path, when)
        try:
            os.rename(path, seg)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.error("cannot rotate session log %s: %s", path, e)
            return None
        self.retained["rotations"] += 1
        self._todo.append(seg)
        self._wake.set()
        return seg

    # -- maintenance -----------------------------------------------------------
    async def maintain(self, *, check_interval: float = 1.0, sweep_interval: float = 60.0,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Forever: :meth:`check` the live files every ``check_interval``
        seconds; after a rotation, over the cap, or every ``sweep_interval``
        seconds, compress rotated segments (worker thread) and
        :meth:`sweep`."""
        task_status.started()
        last_sweep = -sweep_interval
        while True:
            self.check()
            if self._wake.is_set() or self._todo or trio.current_time() - last_sweep >= sweep_interval:
                self._wake = trio.Event()
                await self.compress_pending()
                # the directory walk off the loop (~40 us a file on the loop
                # made 20,000 files a 0.8 s stall every minute); the decisions
                # and removals on it, checked against the files as they are
                scan = await trio.to_thread.run_sync(_scan, self.root)
                for _ in self._sweep_steps(scan):
                    await trio.lowlevel.checkpoint()
                last_sweep = trio.current_time()
            await trio.sleep(check_interval)

    async def compress_pending(self) -> None:
        """gzip every queued segment in a worker thread; the plain file is
        removed only after its ``.gz`` is complete and renamed into place."""
        while self._todo:
            seg = self._todo.popleft()
            try:
                before = seg.stat().st_size
                gz = await trio.to_thread.run_sync(_gzip, seg)
                after = gz.stat().st_size
            except OSError as e:
                self.retained["compress_errors"] += 1
                log.error("cannot compress session log %s: %s", seg, e)
                continue
            self.retained["compressed"] += 1
            self.total_bytes += after - before

    def sweep(self) -> None:
        """Remove what the age and total-size rules say, oldest first, never
        a file open for writing (see the module docstring). Scans the
        directory on the caller's thread (:meth:`maintain` scans in a
        worker thread)."""
        self._sweep(_scan(self.root))

    def _sweep(self, scan: _Scan) -> None:
        """:meth:`sweep` from ``scan`` at once (:meth:`_sweep_steps`)."""
        for _ in self._sweep_steps(scan):
            pass

    def _sweep_steps(self, scan: _Scan) -> Iterator[None]:
        """:meth:`sweep` from ``scan``, taken as the new baseline
        (:meth:`_apply`), yielding after every :data:`REMOVALS_PER_STEP`
        removals (:meth:`maintain` lets the loop run there: removing 20,000
        files at once held it ~0.45 s). A file is removed only if it is not
        open for writing as it is removed (the writer may open one between
        steps) and still as scanned (its size and mtime, looked at again
        now): one written since the scan is not the old file the rules saw."""
        self._apply(scan)
        if self.writers is not None:  # the index follows the files on disk
            self.writers.prune(self._stems(scan))
        todo = set(self._todo)
        now = self.clock()
        age, cap = self.policy.max_age, self.policy.max_total_bytes
        removed = 0
        rest: list[tuple[float, int, Path]] = []  # not too old: what the cap may take
        for i, item in enumerate(scan.aged):  # oldest first
            if age is None or now - item[0] <= age:
                rest = scan.aged[i:]
                break
            if self._try_remove(*item, todo):
                removed += 1
                if removed % REMOVALS_PER_STEP == 0:
                    yield
        if cap is not None and self.total_bytes > cap:
            yield from self._cap_steps(scan, rest, todo, cap, removed)

    def _cap_steps(self, scan: _Scan, rest: list[tuple[float, int, Path]], todo: set[Path],
                   cap: int, removed: int) -> Iterator[None]:
        """The total cap's part of :meth:`_sweep_steps` (``rest``: the
        files the age rule left, oldest first; ``removed``: removals so
        far, for the steps)."""
        # the cap, shared fairly: the writer holding the most bytes (its live
        # files counted) loses its oldest closed file first, so one flooding
        # source eats its own files before anyone else's
        group = self._grouper()
        held: dict[str, int] = {}
        for p, size in scan.sizes.items():
            a = group(p)
            held[a] = held.get(a, 0) + size
        closed: dict[str, deque[tuple[float, int, Path]]] = {}
        for item in rest:
            if item[2] in scan.sizes:
                closed.setdefault(group(item[2]), deque()).append(item)
        heap = [(-n, a) for a, n in held.items()]
        heapq.heapify(heap)
        stuck: str | None = None
        while heap and self.total_bytes > cap:
            n, a = heapq.heappop(heap)
            if -n != held[a]:  # changed since pushed
                heapq.heappush(heap, (-held[a], a))
                continue
            q = closed.get(a)
            if not q:
                stuck = a  # the largest holds only files being written: rotate them below
                break
            mtime, size, p = q.popleft()
            if self._try_remove(mtime, size, p, todo):
                held[a] -= size
                removed += 1
                if removed % REMOVALS_PER_STEP == 0:
                    yield
            heapq.heappush(heap, (-held[a], a))
        if self.total_bytes > cap:
            # only live files left where it counts: rotate the largest (the
            # stuck agent's first), so the next sweep (woken by the
            # rotation) may remove them
            excess = self.total_bytes - cap
            def live_size(q: Path) -> int:  # as of the rescan above (or a later check)
                return self._sizes.get(q) or self._scanned.get(q, 0)

            for p in sorted(self.writing(),
                            key=lambda q: (group(q) != stuck, -live_size(q))):
                if excess <= 0:
                    break
                size = live_size(p)
                if size and self.rotate(p) is not None:
                    excess -= size

    def _grouper(self) -> Callable[[Path], str]:
        """``group(path)``: the fairness group of a session log file: its
        writer (``w:{writer}``, from :attr:`writers`), else its agent's
        directory (``a:{agent}``; ``a:``: the root itself)."""
        index = self.writers
        root = str(self.root)
        cut = len(root) + 1

        def group(p: Path) -> str:
            s = str(p)
            if not s.startswith(root + os.sep):
                return "a:"
            rel = s[cut:]
            agent, sep, name = rel.partition(os.sep)
            if not sep or os.sep in name:
                return "a:" if not sep else f"a:{agent}"
            writer = index.get(stem_of(agent, name)) if index is not None else None
            return f"w:{writer}" if writer is not None else f"a:{agent}"
        return group

    def close(self) -> None:
        super().close()
        if self.writers is not None:
            self.writers.close()

    def _stems(self, scan: _Scan) -> set[str]:
        """The writer index's keys of the files in ``scan`` and of the open ones."""
        root = str(self.root)
        cut = len(root) + 1
        stems = set()
        for p in [*scan.sizes, *self._fds]:
            agent, sep, name = str(p)[cut:].partition(os.sep)
            if sep and os.sep not in name:
                stems.add(stem_of(agent, name))
        return stems

    def _try_remove(self, mtime: float, size: int, p: Path, todo: set[Path]) -> bool:
        """Remove ``p`` as scanned (``mtime``, ``size``) unless it is open
        for writing now or queued for compression (``todo``), or changed
        since the scan (then counted at its size now). ``True`` once removed."""
        if p in self._fds or p in todo:
            return False
        try:
            st = p.stat()
        except FileNotFoundError:  # removed since the scan (by hand, logrotate)
            self.total_bytes -= size
            self._scanned.pop(p, None)
            return False
        except OSError:
            return False
        if st.st_mtime != mtime or st.st_size != size:
            # written since the scan (not open here: another writer): kept,
            # and counted at its size now; the next sweep sees it as it is
            self.total_bytes += st.st_size - size
            self._scanned[p] = st.st_size
            return False
        before = self.retained["removed_files"]
        self._remove(p, size)
        return self.retained["removed_files"] > before

    def _remove(self, p: Path, size: int) -> None:
        try:
            p.unlink()
        except FileNotFoundError:
            return
        except OSError as e:
            self.retained["remove_errors"] += 1
            log.error("cannot remove session log %s: %s", p, e)
            return
        self.retained["removed_files"] += 1
        self.retained["removed_bytes"] += size
        self.total_bytes -= size
        self._sizes.pop(p, None)
        self._opened.pop(p, None)


@dataclass(frozen=True)
class _Scan:
    """What :func:`_scan` found: each session log file's size (``sizes``)
    and their ``total``, the plain segments left uncompressed
    (``segments``), and ``(mtime, size, path)`` of each, oldest first
    (``aged``)."""

    sizes: dict[Path, int]
    total: int
    segments: list[Path]
    aged: list[tuple[float, int, Path]]


def _scan(root: Path) -> _Scan:
    """Walk ``root`` (the agents' directories under it; the spare files'
    directory is not walked) for session log files (a name with
    ``.jsonl``, a regular file, links followed as ``stat`` does): pure, for a
    worker thread; touches no state. Files that vanish meanwhile are left
    out; an unreadable directory is skipped."""
    sizes: dict[Path, int] = {}
    segments: list[Path] = []
    aged: list[tuple[float, int, Path]] = []
    stack = [str(root)]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):  # as rglob: no walk through a link
                    if e.name != SPARE_DIR:
                        stack.append(e.path)
                    continue
                if ".jsonl" not in e.name or not e.is_file():
                    continue
                st = e.stat()
            except OSError:
                continue
            p = Path(e.path)
            sizes[p] = st.st_size
            aged.append((st.st_mtime, st.st_size, p))
            if _SEGMENT.search(e.name) and not e.name.endswith(".gz"):
                segments.append(p)
    aged.sort()
    return _Scan(sizes, sum(sizes.values()), segments, aged)


def _gzip(seg: Path) -> Path:
    """``seg`` -> ``seg.gz`` (written beside as ``.gz.tmp``, then renamed);
    removes ``seg``; keeps its mtime (the age rules read it)."""
    gz = seg.with_name(seg.name + ".gz")
    tmp = seg.with_name(seg.name + ".gz.tmp")
    st = seg.stat()
    with open(seg, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(tmp, 0o600)
    os.utime(tmp, (st.st_atime, st.st_mtime))
    os.replace(tmp, gz)
    os.unlink(seg)
    return gz
