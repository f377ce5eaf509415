"""The durable session log: ``{state}/logs/{agent}/{session}.jsonl``, one
event per line, each line written with a single ``write`` on an
``O_APPEND`` descriptor so a concurrent ``tail -f`` never sees a torn event
(AEP-0003 §3.1). Written before any other sink (DESIGN.md "Delivery").

Session ids are producer-controlled (AEP-0001 §12): they are encoded before
they become file names."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import time
import urllib.parse
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

from bridges.core.aep import dumps
from bridges.core.paths import ROTATION_STAMP, make_private_dirs

from .spares import SpareFiles
from .writers import WriterIndex

log = logging.getLogger("aep.jsonl")

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
_EXISTING = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,150}\Z")
#: what a long id's percent-encoding is shortened to (:func:`safe_name`)
_DIGEST_SHAPE = re.compile(r".{100}~[0-9a-f]{24}\Z", re.DOTALL)


def safe_name(value: str) -> str:
    """A file-system-safe, collision-free name for an untrusted id: the id
    itself when it fits ``[A-Za-z0-9][A-Za-z0-9._-]*`` (and is short), else
    ``~`` + its percent-encoding (shortened with a digest suffix when long).
    The two forms cannot collide: one starts alphanumeric, the other ``~``.

    No name ends in a rotated segment's stamp
    (:data:`~bridges.core.paths.ROTATION_STAMP`, ``.YYYYmmddTHHMMSS.ffffffZ``;
    issue 25, attack 6: a session named ``{S}.{UTC}`` had the file name of a
    segment of ``S``, so retention charged it to ``S``'s writer and the
    relay's restore read it as ``S``'s history): such an id takes the
    ``~`` form with the stamp's last dot written ``%2E`` (``quote`` never
    writes it, and it decodes back, so the form stays collision-free).
    Nor does an id whose percent-encoding has the digest form's shape
    (``_DIGEST_SHAPE``: 100 characters, ``~``, 24 lowercase hex digits;
    round 8 outside attack, findings 2 and 3: ``'a'*100 + '~' +
    sha256('a'*200)[:24]`` was named as ``'a'*200`` is, so a second
    credential appended to the first's log and retention charged its bytes
    to the first's writer): its ``~`` there is written ``%7E`` (``quote``
    never writes that either, and it decodes back), so a digest-form name
    is a long id's alone. Every other id keeps the name it always had."""
    if _SAFE.match(value) and ROTATION_STAMP.search(value) is None:
        return value
    enc = urllib.parse.quote(value, safe="")
    if len(enc) > 150:  # ends in hex digits: never a stamp
        enc = enc[:100] + "~" + hashlib.sha256(value.encode()).hexdigest()[:24]
    elif ROTATION_STAMP.search(enc) is not None:  # "....ffffffZ": the dot 8 from the end
        enc = enc[:-8] + "%2E" + enc[-7:]
    elif _DIGEST_SHAPE.match(enc) is not None:  # a long id's name, if left so
        enc = enc[:100] + "%7E" + enc[101:]
    return "~" + enc


def encode_line(event: dict[str, Any]) -> bytes:
    """One JSONL line: the event's wire form (:func:`bridges.core.aep.dumps`)
    and a newline. Raises ``UnicodeEncodeError`` for text with a lone UTF-16
    surrogate (no UTF-8 form; see :func:`bridges.core.aep.scrub_surrogates`)
    and ``TypeError``/``ValueError`` for anything that is not JSON."""
    return dumps(event) + b"\n"


def tighten_dir(path: Path) -> bool:
    """Make ``path`` ``0700`` when it is a directory (not a link) owned by
    this user that others (or its group) may read, write or enter (issue 25,
    attack 5: logs made before the daemon made its directories private).
    Another user's directory is left alone (not ours to change). ``True``
    when it changed it; raises nothing."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or not st.st_mode & 0o077:
            return False
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    except OSError:
        return False
    return True


class _Target:
    """One session's file: its ``path`` (the descriptors' key), the same as
    ``file`` (a ``str``, what ``os.open`` takes), its ``directory``, its
    ``stem`` (``{agent}/{session}``: the writer index's key), and
    whether this log has not opened it yet (``new``: a new session's file
    usually does not exist yet, so a spare is linked before any open);
    ``by``, the writer last noted in the writer index since the file was
    opened, and ``settled``, whether the index's writer for it is final
    (authenticated), so a write asks the index nothing again."""

    __slots__ = ("path", "file", "directory", "stem", "new", "by", "settled")

    def __init__(self, path: Path, file: str, directory: str, stem: str) -> None:
        self.path = path
        self.file = file
        self.directory = directory
        self.stem = stem
        self.new = True
        self.by: str | None = None
        self.settled = False


class SessionLog:
    """Appends events to per-session files, keeping at most ``max_open``
    descriptors open (least recently written closed first; ``AEP_LOG_MAX_OPEN``).

    Whole lines or nothing (issue 10 #9): a line the disk takes only part of
    (``ENOSPC`` mid-line) is cut back off the file at once, so a fragment is
    never left for the next line to be glued onto; :meth:`repair` does the
    same at start for a tail torn by a crash, keeping the fragment aside in
    ``{file}.torn`` (never read as a session log).

    ``write`` raises nothing: it returns whether the line is on disk; a
    failing disk is logged once per failing spell and counted in
    ``errors``, ``failing`` stays true until a write succeeds again (the
    fleet refuses new OTLP exports retryably meanwhile; relay delivery
    continues). ``counters``: ``files_opened``, ``descriptors_evicted``,
    ``torn_repaired``, ``unwritten``.

    Who wrote a file (``writer``/``writers`` of the write calls: a fleet
    bridge's name, a remote principal's) is recorded in :attr:`writers`
    when set (:class:`~.writers.WriterIndex`; retention shares its cap by
    it) when this log opens the file, and again when another writer writes
    it, until an authenticated writer has it (then never per line).
    Directories it makes are ``0700``; :meth:`repair` tightens looser ones
    it finds under ``root`` (issue 25, attack 5)."""

    def __init__(self, root: Path, *, max_open: int = 128) -> None:
        self.root = Path(root)
        self.max_open = max(1, max_open)
        self._fds: OrderedDict[Path, int] = OrderedDict()
        # (agent, session) -> its file
        self._paths: dict[tuple[Any, Any], _Target] = {}
        # safe agent name -> its directory (path, str path)
        self._agent_dirs: dict[str, tuple[Path, str]] = {}
        self._dirs: set[str] = set()  # agent directories made (or found) by this log
        #: spare files linked into place for new sessions (the fleet sets
        #: and refills it; :mod:`supervisor.sessionlog.spares`), or ``None``: created here
        self.spares: SpareFiles | None = None
        #: who wrote each file (the retaining log sets it), or ``None``: not recorded
        self.writers: WriterIndex | None = None
        self.errors = 0
        self.lines = 0
        self.failing = False  # the last write failed (health)
        self.failed_at = 0.0  # time.monotonic() of the last failed write
        self.counters = {"files_opened": 0, "descriptors_evicted": 0, "torn_repaired": 0,
                         "unwritten": 0}

    def path_for(self, event: dict[str, Any]) -> Path:
        """The file ``event`` is appended to (``{root}/{agent}/{session}.jsonl``,
        both names through :func:`safe_name`; ``_agent.jsonl`` without a session)."""
        return self._target((event.get("agent"), event.get("session"))).path

    def _target(self, key: tuple[Any, Any]) -> _Target:
        """``key``'s file, worked out once per ``(agent, session)``: the
        strings are joined as strings and the :class:`~pathlib.Path` (the
        descriptors' key) made from its agent directory's, cached too
        (pathlib per new session was ~5% of the one-frame path, issue 11)."""
        target = self._paths.get(key)
        if target is None:
            if len(self._paths) >= 4096:  # bounded: a fleet writes to few sessions at a time
                self._paths.clear()
            agent = safe_name(str(key[0] or "unknown"))
            session = key[1]
            name = safe_name(str(session)) if session else "_agent"  # cannot collide: see safe_name
            where = self._agent_dirs.get(agent)
            if where is None:
                if len(self._agent_dirs) >= 256:  # agents are few; a bound all the same
                    self._agent_dirs.clear()
                path = self.root / agent
                where = self._agent_dirs[agent] = (path, str(path))
            file = f"{name}.jsonl"
            directory = where[1]
            target = self._paths[key] = _Target(where[0] / file, f"{directory}/{file}", directory,
                                                f"{agent}/{name}")
        return target

    def _fd(self, target: _Target) -> int:
        path = target.path
        fds = self._fds
        fd = fds.get(path)
        if fd is not None:
            fds.move_to_end(path)
            return fd
        while len(fds) >= self.max_open:
            _, old = fds.popitem(last=False)
            os.close(old)
            self.counters["descriptors_evicted"] += 1
        fd = fds[path] = self._open(target.file, target.directory, target.new)
        target.new = False
        target.by = None  # noted again (the index may have pruned the stem meanwhile)
        target.settled = False
        self.counters["files_opened"] += 1
        return fd

    def _note(self, target: _Target, writer: str) -> None:
        """``writer`` wrote to ``target``: tell the writer index (an
        authenticated writer takes the file from an open one)."""
        if self.writers is not None:
            target.settled = self.writers.note(target.stem, writer)
        target.by = writer

    def _open(self, file: str, directory: str, new: bool = False) -> int:
        """``file`` opened for appending (a spare linked into place or
        created ``0600`` when missing); its directory is made the first time
        this log writes there (and again when it went away since). ``new``:
        the file is probably not there yet (a spare is linked before an open
        is tried). Raises ``OSError``."""
        if directory not in self._dirs:
            make_private_dirs(directory)
            self._dirs.add(directory)
        try:
            return self._open_in(file, new)
        except FileNotFoundError:  # the directory was removed under us
            self._dirs.discard(directory)
            make_private_dirs(directory)
            self._dirs.add(directory)
            return self._open_in(file, new)

    def _open_in(self, file: str, new: bool = False) -> int:
        spares = self.spares
        if spares is None:
            return os.open(file, _FLAGS, 0o600)
        if spares.ready():
            if new:
                # a new session: the link first (link(2) refuses a file that
                # exists, which is then opened as it is), no failing open
                if spares.take(file):
                    return os.open(file, _EXISTING)
            else:
                try:
                    return os.open(file, _EXISTING)
                except FileNotFoundError:  # a spare linked is ~25 us, a create 30-800
                    if spares.take(file):
                        return os.open(file, _EXISTING)
        try:
            fd = os.open(file, _FLAGS | os.O_EXCL, 0o600)
        except FileExistsError:
            return os.open(file, _EXISTING)
        spares.counters["missed"] += 1
        return fd

    def write(self, event: dict[str, Any], line: bytes | None = None, *,
              writer: str | None = None) -> bool:
        """Append one event's line; ``True`` when the whole line is on disk,
        ``False`` (nothing of it left in the file) otherwise. ``writer``:
        who wrote it (see the class docstring)."""
        return self._append(self._target((event.get("agent"), event.get("session"))),
                            line if line is not None else encode_line(event), 1, writer)

    def write_batch(self, events: list[tuple[dict[str, Any], bytes]],
                    writers: Sequence[str] | None = None) -> list[bool]:
        """Append ``(event, line)`` pairs with one ``write`` per session file
        (its lines joined, in order): a batch costs a syscall per file, not
        per event. Returns, per pair, whether its line is on disk; a file's
        lines are on disk all or none (a short write is cut back off, as in
        :meth:`write`). ``writers``: who wrote each pair (parallel to
        ``events``; a file's first pair in the batch names it). Raises nothing."""
        return self._write_groups(events, b"", writers)

    def write_raw_batch(self, events: Sequence[tuple[dict[str, Any], bytes]],
                        writers: Sequence[str] | None = None) -> list[bool]:
        """:meth:`write_batch` of ``(event, raw)`` pairs whose ``raw`` is the
        event's wire form without the newline (:func:`bridges.core.aep.dumps`:
        what the relay and the uplink take): the newlines are put in by the
        one join per file, so no line is copied to add one (the fleet's
        pump). Equal to :meth:`write_batch` of ``(event, raw + b"\\n")``."""
        return self._write_groups(events, b"\n", writers)

    def _write_groups(self, events: Sequence[tuple[dict[str, Any], bytes]], sep: bytes,
                      writers: Sequence[str] | None = None) -> list[bool]:
        """Each session file's lines of ``events`` in one ``write``; ``sep``:
        what follows each line (``b""``: it ends in its newline already)."""
        if len(events) == 1:
            ev, line = events[0]
            return [self._append(self._target((ev.get("agent"), ev.get("session"))),
                                 line + sep if sep else line, 1,
                                 writers[0] if writers is not None else None)]
        groups: dict[tuple[Any, Any], list[int]] = {}
        last_key: tuple[Any, Any] | None = None
        last: list[int] = []
        for i, (ev, _) in enumerate(events):
            key = (ev.get("agent"), ev.get("session"))
            if key == last_key:  # a drain is mostly runs of one session: no lookup
                last.append(i)
                continue
            idx = groups.get(key)
            if idx is None:
                idx = groups[key] = [i]
            else:
                idx.append(i)
            last_key, last = key, idx
        done = [False] * len(events)
        for key, idx in groups.items():
            writer = writers[idx[0]] if writers is not None else None
            if len(idx) == 1:
                line = events[idx[0]][1]
                ok = self._append(self._target(key), line + sep if sep else line, 1, writer)
            else:
                lines = [events[i][1] for i in idx]
                if sep:
                    lines.append(b"")  # the last line's newline too
                target = self._target(key)
                ok = self._append(target, sep.join(lines), len(idx), writer)
                if ok and writers is not None:
                    for i in idx:  # another writer in the same file's lines (an open one first)
                        if target.settled:
                            break
                        if writers[i] != target.by:
                            self._note(target, writers[i])
            for i in idx:
                done[i] = ok
        return done

    def _append(self, target: _Target, data: bytes, lines: int, writer: str | None = None
                ) -> bool:
        """One ``write`` of ``lines`` whole lines to ``target``'s file: all
        on disk (``True``) or none of them left in the file."""
        fd = -1
        try:
            fd = self._fd(target)
            if writer is not None and not target.settled and writer != target.by:
                self._note(target, writer)
            n = os.write(fd, data)
            if n != len(data):  # regular files short-write only when the disk is full
                self._cut(fd, n)
                raise OSError(f"short write ({n}/{len(data)} bytes; disk full?)")
        except OSError as e:
            self.errors += lines
            self.counters["unwritten"] += lines
            if not self.failing:  # once per failing spell, not per line
                log.error("cannot write session log %s: %s (events still go to the relay; "
                          "OTLP exports are refused retryably until the log writes again)",
                          target.file, e)
            self.failing = True
            self.failed_at = time.monotonic()
            return False
        if self.failing:
            log.warning("session log writes again (%d lines were not written)",
                        self.counters["unwritten"])
        self.lines += lines
        self.failing = False
        return True

    @staticmethod
    def _cut(fd: int, n: int) -> None:
        """Remove the ``n`` bytes a short write appended (O_APPEND: they
        are the file's tail; this process is the file's only writer)."""
        if n <= 0:
            return
        try:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - n))
        except OSError as e:  # cannot even cut: repair() at the next start will
            log.error("cannot cut a partial line off a session log: %s", e)

    def repair(self) -> list[Path]:
        """Start-up repair: every ``*.jsonl`` under ``root`` whose last byte
        is not a newline is truncated to its last newline; the fragment is
        appended to ``{file}.torn`` and the repair logged. Returns the
        repaired paths. Reads one byte per file (more only when torn).
        Also tightens ``root`` and the agents' directories to ``0700``
        (:func:`tighten_dir`)."""
        repaired: list[Path] = []
        try:
            agents = [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            return repaired
        loose = sum(tighten_dir(d) for d in [self.root, *agents])
        if loose:
            log.warning("session log directories readable by other users made private (0700): "
                        "%d under %s", loose, self.root)
        for agent in agents:
            try:
                files = [p for p in agent.iterdir() if p.suffix == ".jsonl"]
            except OSError:
                continue
            for path in files:
                try:
                    if self._repair_one(path):
                        repaired.append(path)
                except OSError as e:
                    log.error("cannot repair session log %s: %s", path, e)
        return repaired

    def _repair_one(self, path: Path) -> bool:
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return False
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return False
            keep = size
            step = 64 * 1024
            while keep > 0:  # find the last newline, scanning back in blocks
                start = max(0, keep - step)
                f.seek(start)
                block = f.read(keep - start)
                i = block.rfind(b"\n")
                if i >= 0:
                    keep = start + i + 1
                    break
                keep = start
            f.seek(keep)
            fragment = f.read()
            with open(path.with_name(path.name + ".torn"), "ab") as aside:
                aside.write(fragment + b"\n")
            f.truncate(keep)
        self.counters["torn_repaired"] += 1
        log.warning("session log %s ended in a torn line (%d bytes, from a crash or a full "
                    "disk): truncated to the last whole line, the fragment kept in %s.torn",
                    path, len(fragment), path.name)
        return True

    def writable(self, probe_after: float = 1.0) -> bool:
        """Whether to accept new work for the log: it writes, or the disk
        shows room again (``statvfs``), or its last failure is ``probe_after``
        s old (the next write probes the disk)."""
        if not self.failing or time.monotonic() - self.failed_at >= probe_after:
            return True
        try:
            st = os.statvfs(self.root)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= 1 << 20

    def flush(self) -> None:
        """fsync every open file (shutdown)."""
        for fd in self._fds.values():
            try:
                os.fsync(fd)
            except OSError:
                pass

    def close(self) -> None:
        self.flush()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
