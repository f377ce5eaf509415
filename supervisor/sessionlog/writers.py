"""Who wrote each session log: the fairness group retention shares the
total cap by (issue 25, attack 5).

The directory layout (``{agent}/{session}.jsonl``) names the agent, not
the writer, and one agent id can come from several writers: the
unauthenticated OTLP receiver and the authenticated Codex hook bridge both
write agent ``codex``, so grouping by the agent's directory let an OTLP
flood evict a hook session's log. The writer (a fleet bridge's name, or
``relay:{principal}`` for a remote emitter's posts) is not in the file, and
the files stay as consumers read them, so it is kept beside them in
``{logs}/.writers``: one JSON line ``[stem, writer]`` per session file
stem (``{agent}/{session}``, what the live file and its rotated segments
share), appended when a writer first opens a stem this index does not know
(kept in memory at once, on disk at the next :meth:`WriterIndex.flush`:
retention's look every second, and at close; a write per new session was
~12 us on the pump's path, a spare file's link ~25).
The first writer of a stem keeps it (another writer appending to the same
session later cannot move someone's file into the flooding group), except
that an authenticated writer outranks an open one (attack 6: a Codex
session's first line from the unauthenticated OTLP receiver, Codex's own
export or anyone naming the id, put the hook bridge's session in the
OTLP flood's group): a writer is *open* when anyone who reaches it names
its sessions (:attr:`WriterIndex.open_writers`/``open_prefixes``: the
OTLP and AG-UI bridges, the relay's posters; the fleet and the daemon say
which), and a stem an open writer has is taken by the first authenticated
writer that writes it, recorded as ``[stem, writer, 1]``; an open writer
never takes a stem from another writer. Read back at start, so a restart keeps the grouping; pruned to the stems still
on disk at each sweep (:meth:`WriterIndex.prune`, rewritten atomically
when mostly stale). A stem with no entry (logs from before this index, or
a line lost to a crash) is grouped by its agent's directory, as before.
The name has no ``.jsonl``, and it is a file at the root: every reader of
the logs (retention's scan, the relay's restore, JetStream recovery, the
``logs`` tool) walks only directories there."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from bridges.core.paths import ROTATION_STAMP, write_atomic

__all__ = ["INDEX_NAME", "WriterIndex", "stem_of"]

log = logging.getLogger("aep.retention")

INDEX_NAME = ".writers"
"""The index file, under the logs' root."""

_TAILS = (".tmp", ".gz", ".torn")


def stem_of(agent: str, name: str) -> str:
    """``{agent}/{session}`` of a session log file named ``name`` in
    ``agent``'s directory: its live file (``{session}.jsonl``), a rotated
    segment (``{session}.{UTC}.jsonl``, ``.gz``), a torn tail kept aside
    (``.torn``) or a compression's temporary (``.gz.tmp``) all give the
    same stem. Pure string work (a sweep asks it once per file). No
    session's own file name ends in the stamp this strips
    (:func:`~.jsonlog.safe_name`), so a stem is one session's alone."""
    for tail in _TAILS:
        if name.endswith(tail):
            name = name[:-len(tail)]
    if name.endswith(".jsonl"):
        name = name[:-6]
    m = ROTATION_STAMP.search(name)
    if m is not None:
        name = name[:m.start()]
    return f"{agent}/{name}"


class WriterIndex:
    """The ``{logs}/.writers`` index (module docstring): ``stem -> writer``
    in memory, appended to on disk as stems are first seen. Raises nothing:
    a file it cannot read or write is logged once and counted in
    ``errors``, and the stems it misses fall back to their agent's group.
    ``open_writers`` (names) and ``open_prefixes``: the open writers (the
    module docstring), set by their owners before anything is written;
    every other writer is authenticated."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / INDEX_NAME
        self._of: dict[str, str] = {}
        self._auth: set[str] = set()  # stems whose writer is authenticated (recorded so)
        self.open_writers: set[str] = set()
        self.open_prefixes: tuple[str, ...] = ()
        self._fd = -1
        self._lines = 0  # lines in the file (what a rewrite would shrink)
        self._since: set[str] = set()  # stems noted since the last prune
        self._pending: dict[str, None] = {}  # stems noted, not yet on disk (in order)
        self._torn = False  # the file ends without a newline (a crash mid-line)
        self.errors = 0
        self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            self._failed("read", e)
            return
        self._torn = bool(data) and not data.endswith(b"\n")
        lines = data.splitlines()
        self._lines = len(lines)
        try:  # one parse for the whole file (~3x faster than a line at a time)
            rows = json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:  # a line torn by a crash: its stem falls back, the rest are read
            rows = []
            for line in lines:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
        of, auth = self._of, self._auth
        for row in rows:
            if isinstance(row, list) and 2 <= len(row) <= 3 and isinstance(row[0], str) \
                    and isinstance(row[1], str):
                stem = row[0]
                if len(row) == 3 and row[2] == 1:  # an authenticated writer's: outranks an open one
                    if stem not in auth:
                        of[stem] = row[1]
                        auth.add(stem)
                else:
                    of.setdefault(stem, row[1])  # the first writer keeps it

    def get(self, stem: str) -> str | None:
        """The writer of ``stem``, or ``None`` when unknown."""
        return self._of.get(stem)

    def __len__(self) -> int:
        return len(self._of)

    def is_open(self, writer: str) -> bool:
        """Whether ``writer`` is open (anyone who reaches it names its sessions)."""
        return writer in self.open_writers or writer.startswith(self.open_prefixes)

    def note(self, stem: str, writer: str) -> bool:
        """``writer`` wrote to ``stem``'s file: recorded (in memory at once,
        on disk at the next :meth:`flush`) when the stem has no writer yet,
        or has an open one and ``writer`` is authenticated. Returns whether
        the stem's writer is settled (authenticated: no later writer
        changes it; the caller need not ask again)."""
        cur = self._of.get(stem)
        if cur is not None:
            if stem in self._auth:
                return True
            if cur == writer or self.is_open(writer):  # an open writer takes no one's file
                return False
            if not self.is_open(cur):
                # a line from before ranks were recorded, by an authenticated writer
                self._auth.add(stem)
                return True
        self._of[stem] = writer
        settled = not self.is_open(writer)
        if settled:
            self._auth.add(stem)
        self._since.add(stem)
        self._pending[stem] = None  # encoded at the flush, off the pump's path
        return settled

    def _row(self, stem: str, writer: str) -> str:
        row = [stem, writer, 1] if stem in self._auth else [stem, writer]
        return json.dumps(row, ensure_ascii=True) + "\n"

    def flush(self) -> None:
        """Append the lines noted since the last flush, in one ``write``."""
        if not self._pending:
            return
        of = self._of
        data = "".join(self._row(s, of[s]) for s in self._pending if s in of).encode()
        if self._torn:  # a crash's fragment at the end: never glue a line onto it
            data = b"\n" + data
        lines = len(self._pending)
        self._pending = {}
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                   0o600)
            n = os.write(self._fd, data)
            if n != len(data):  # disk full: cut the fragment (this is the only writer)
                os.ftruncate(self._fd, max(0, os.fstat(self._fd).st_size - n))
                raise OSError(f"short write ({n}/{len(data)} bytes; disk full?)")
            self._lines += lines
            self._torn = False
        except OSError as e:
            self._failed("write", e)

    def _failed(self, what: str, e: OSError) -> None:
        if not self.errors:
            log.error("cannot %s the session logs' writer index %s: %s (files it misses are "
                      "shared out by their agent's directory)", what, self.path, e)
        self.errors += 1

    def prune(self, stems: set[str]) -> None:
        """Forget the stems not in ``stems`` (those with a file on disk, as
        a sweep scanned them); the file is rewritten (atomically) once
        most of its lines are stale. A stem noted since the last prune is
        kept whatever ``stems`` says (its file may be newer than the scan)."""
        since, self._since = self._since, set()
        stale = [s for s in self._of if s not in stems and s not in since]
        for s in stale:
            del self._of[s]
            self._auth.discard(s)
        if self._lines <= 2 * len(self._of) + 256:
            return
        text = "".join(self._row(s, w) for s, w in self._of.items())
        try:
            write_atomic(self.path, text)
        except OSError as e:
            self._failed("rewrite", e)
            return
        self._pending = {}  # in the new file already
        self._torn = False
        self.close()  # the next flush appends to the new file
        self._lines = len(self._of)

    def close(self) -> None:
        """:meth:`flush`, then close the file (the next flush opens it again)."""
        self.flush()
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
