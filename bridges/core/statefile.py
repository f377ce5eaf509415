"""A bridge's small persistent state: one JSON document per bridge and
vendor server (``{AEP_STATE_DIR}/{bridge}/{host}_{port}.json``, see
:func:`state_path`) holding one entry per session, keyed by the session id,
and an append-only journal beside it. What a daemon restart must not lose
so that no run and no attention request is left dangling and nothing is
emitted twice: for the SSE bridges open runs, pending asks with their
``attention.requested`` ids, settling marks, cancel notes
(:meth:`bridges.sse_common.tracker.Tracker.snapshot`); for OpenHands each
conversation's :meth:`bridges.openhands.receiver.Conversation.persisted`.
(Moved here from ``bridges/sse_common/state.py``, which re-exports it, so
that bridges outside the SSE family share it; issue 11.)

Written incrementally (issue 11): a change appends the changed sessions'
entries to a journal beside the document (``{...}.json.journal``, one JSON
line ``[session, entry-or-null]`` each, one ``write`` per save on an
``O_APPEND`` descriptor), so a frame costs what it changed, not what is open.
Once the journal outgrows :data:`COMPACT_MIN` bytes and the document itself,
it is compacted into a new document. The document is joined from the
entries' texts the state file keeps (what it wrote of each session), never
rebuilt from the tracker, and, with :meth:`StateFile.compactor` running (the
bridge runs it), written :data:`COMPACT_CHUNK` sessions per step with a
checkpoint between steps while saves go on appending to the old journal: a
compaction no longer pauses the event loop (it was one 60-370 ms pause at
5,000 open runs). Without the task (tests, tools) it runs to the end at once.

A compaction's steps: the new document (generation N+1) into a temporary
file, chunk by chunk; the changes saved meanwhile into
``{...}.json.journal.next`` (header ``{"journal": N+1}``); the document
replaced atomically; ``.journal.next`` renamed over the journal (none
changed meanwhile: the old journal is removed instead).

Crash safety: the document is always whole (atomic replace); the journal's
lines are whole but for a torn last one (a crash mid-``write``), which
:meth:`StateFile.load` ignores, and the next save compacts instead of
appending after it. The document names its journal generation
(``"journal": N``) and a journal opens with its own (``{"journal": N}``):
a journal of another generation is never replayed (after a crash between a
compaction's replace and its journal's move it is the old one, and would
set sessions back to what they were before); ``.journal.next`` is replayed
instead when it is of the document's generation (the crash came between
the replace and the move), else ignored (the crash came before the
replace: the old journal holds everything)."""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Generator, Iterator

import trio

from .paths import make_private_dirs

log = logging.getLogger("aep.state")

__all__ = ["COMPACT_CHUNK", "COMPACT_MIN", "StateFile", "state_path"]

COMPACT_MIN = 256 * 1024
"""Journal bytes below which it is never compacted (above it: once it is
also larger than the document, so compaction is amortized O(1) a byte)."""

COMPACT_CHUNK = 256
"""Sessions a compaction writes per step (one checkpoint between steps when
:meth:`StateFile.compactor` drives it: ~0.1 ms of work a step)."""


def state_path(state_dir: Path | None, bridge: str, url: str) -> Path | None:
    """The state file for one bridge and server (``None``: no persistence)."""
    if state_dir is None:
        return None
    p = urllib.parse.urlsplit(url)
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{p.hostname or 'server'}_{p.port or ''}").strip("_")
    return Path(state_dir) / bridge / f"{key}.json"


def _dumps(doc: object) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class StateFile:
    """Load/save one JSON document ``{"version": 1, "sessions": {id: entry}}``
    and its journal; failures are logged once and counted (``errors``) by
    the caller, never raised (the bridge keeps running without persistence).
    ``counters``: ``appends`` (journal writes), ``compactions``,
    ``torn_tail`` (loads that found a torn last journal line)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.journal = path.with_name(path.name + ".journal") if path is not None else None
        self.journal_next = path.with_name(path.name + ".journal.next") \
            if path is not None else None
        self.errors = 0
        self._warned = False
        #: session -> its entry's text (:func:`_dumps`) as the file holds it
        #: (document + journal), or as it must once a due compaction runs: a
        #: compaction joins these (no snapshot of the tracker, no entry
        #: serialized again; issue 11) and a save compares against them
        self._texts: dict[str, str] = {}
        self._doc_bytes = 0  # the document's size as last written or read
        self._journal_bytes = 0
        self._compact_due = False  # a torn or stale journal: never append after it
        self._gen = 0  # the journal generation the document names
        #: while a compaction runs: what was saved since it started
        #: (session -> entry text, ``None``: gone), its next journal
        self._since: dict[str, str | None] | None = None
        self._wake: trio.Event | None = None  # set: a compactor task waits for work
        self.counters = {"appends": 0, "compactions": 0, "torn_tail": 0}

    def _remove_temporaries(self) -> None:
        """Remove the compaction documents a crash left half written
        (``.{name}.XXXXXXXX`` beside the document; never read, they would
        pile up one per crash)."""
        assert self.path is not None
        prefix = f".{self.path.name}."
        try:
            entries = list(os.scandir(self.path.parent))
        except OSError:
            return
        for e in entries:
            if e.name.startswith(prefix) and len(e.name) > len(prefix):
                try:
                    os.unlink(e.path)
                except OSError:  # gone already, or not ours to remove: left
                    pass

    def load(self) -> object:
        """The saved document with its journal replayed, as parsed JSON
        (untrusted: the tracker checks its shape; sessions in id order, as
        the document stores them), or ``None`` when there is none or it is
        unreadable."""
        if self.path is None:
            return None
        self._remove_temporaries()
        doc: object = None
        try:
            text = self.path.read_text()
            self._doc_bytes = len(text)
            doc = json.loads(text)
            gen = doc.get("journal") if isinstance(doc, dict) else None
            self._gen = gen if isinstance(gen, int) and not isinstance(gen, bool) else 0
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            self._warn(f"unreadable ({type(e).__name__}); starting without it")
        lines = self._read_journal()
        if not lines:
            self._remember(doc)
            return doc
        base: dict[str, Any] = doc if isinstance(doc, dict) and isinstance(doc.get("sessions"), dict) \
            else {"version": 1, "sessions": {}}
        sessions: dict[str, Any] = base["sessions"]
        for sid, entry in lines:
            if entry is None:
                sessions.pop(sid, None)
            else:
                sessions[sid] = entry
        base["sessions"] = dict(sorted(sessions.items()))
        self._remember(base)
        return base

    def entry(self, session: str) -> object:
        """The entry the file holds for ``session`` now (what :meth:`load`
        read or the last save wrote), parsed afresh from its text (untrusted
        JSON: the caller checks its shape), or ``None``. Lets a bridge read
        one session's state at attach without keeping the loaded document."""
        text = self._texts.get(session)
        return None if text is None else json.loads(text)

    def _read_journal(self) -> list[tuple[str, Any]]:
        """The journal's whole lines, in order; a torn or unparsable line
        ends it (counted ``torn_tail``, the next save compacts). A journal
        missing or of another generation than the document's: the
        compaction's ``.journal.next`` when it is of the document's (module
        doc), else nothing."""
        assert self.journal is not None and self.journal_next is not None
        raw = self._read(self.journal)
        if raw is not None:
            self._journal_bytes = len(raw)
            if not raw:
                return []
            if _generation(raw) == self._gen:
                return self._lines(raw, self.journal)
            # older than the document (a crash after a compaction), or garbage
            self._compact_due = True
        nxt = self._read(self.journal_next)
        if nxt is None or _generation(nxt) != self._gen:
            return []
        self._compact_due = True  # the journal is not in place: never append to it
        return self._lines(nxt, self.journal_next)

    def _read(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._warn(f"journal unreadable ({type(e).__name__}); starting without it")
            self._compact_due = True
            return None

    def _lines(self, raw: bytes, path: Path) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        rest = raw.partition(b"\n")[2]
        for line in rest.split(b"\n")[:-1]:  # the part after the last newline is torn (or empty)
            try:
                item = json.loads(line)
            except ValueError:
                break
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                    and (item[1] is None or isinstance(item[1], dict))):
                break
            out.append((item[0], item[1]))
        else:
            if raw.endswith(b"\n"):
                return out
        self.counters["torn_tail"] += 1
        self._compact_due = True
        log.warning("bridge state journal %s ends in a torn line (a crash mid-write): "
                    "replayed up to it, compacting at the next save", path)
        return out

    def _remember(self, doc: object) -> None:
        sessions = doc.get("sessions") if isinstance(doc, dict) else None
        self._texts = {sid: _dumps(e) for sid, e in sessions.items()
                       if isinstance(sid, str) and isinstance(e, dict)} \
            if isinstance(sessions, dict) else {}

    def save(self, doc: object) -> None:
        """Replace the document with ``doc`` (a :meth:`Tracker.snapshot`
        shape: ``{"version": 1, "sessions": {...}}``) and drop the journal,
        at once (a compaction running meanwhile is abandoned)."""
        if self.path is None:
            return
        self._remember(doc)  # what the file must hold (a failed write: the next save compacts)
        for _ in self.compaction():
            pass

    def compacted(self, gen: int) -> str:
        """The document a compaction writes, whole: every remembered entry
        (what the document and its journal hold, with what a due compaction
        must add), generation ``gen``; the very text ``_dumps`` makes of the
        whole snapshot (``{"journal", "sessions" in id order, "version"}``,
        keys sorted, compact), assembled from the entries' texts. (The
        compaction writes these same pieces a chunk at a time.)"""
        return "".join(_document(sorted(self._texts.items()), gen, len(self._texts) + 1))

    def save_changes(self, changes: dict[str, Any]) -> None:
        """Persist ``changes`` (``{session: entry, or None for gone}``, e.g.
        :meth:`bridges.sse_common.tracker.Tracker.changes`): the entries
        that differ from what was last written are appended to the journal
        in one ``write``. A journal due for compaction is compacted by the
        :meth:`compactor` task when one runs (the appends go on meanwhile),
        else at once; a journal that must not be appended to (a torn tail,
        an earlier write failed) is compacted at once, these changes with it."""
        if self.path is None:
            return
        texts, since = self._texts, self._since
        lines: list[str] = []
        for sid in sorted(changes):
            entry = changes[sid]
            if entry is None:
                if texts.pop(sid, None) is None:
                    continue
                lines.append(_dumps([sid, None]))
                text = None
            else:
                text = _dumps(entry)
                if texts.get(sid) == text:
                    continue
                texts[sid] = text
                lines.append(f"[{json.dumps(sid)},{text}]")
            if since is not None:
                since[sid] = text
        if self._compact_due:
            if since is None:  # (a running compaction takes these along)
                for _ in self.compaction():
                    pass
            return
        if lines and not self._append(("\n".join(lines) + "\n").encode()):
            return  # compacts at the next save
        if since is None and self._journal_bytes > COMPACT_MIN \
                and self._journal_bytes > self._doc_bytes:
            if self._wake is not None:
                self._wake.set()
            else:
                for _ in self.compaction():
                    pass

    async def compactor(self) -> None:
        """Run the compactions :meth:`save_changes` finds due, one
        :data:`COMPACT_CHUNK` of sessions per checkpoint, until cancelled
        (a compaction cut short leaves the previous document and journal,
        both whole)."""
        try:
            while True:
                self._wake = trio.Event()
                await self._wake.wait()
                self._wake = None
                steps = self.compaction()
                try:
                    for _ in steps:
                        await trio.lowlevel.checkpoint()
                finally:
                    steps.close()
        finally:  # no task left to wake: a save after it compacts at once again
            self._wake = None

    def compaction(self) -> Generator[None, None, None]:
        """One compaction as steps (a ``yield`` between chunks; module doc):
        the remembered entries as of its start into a new document, what is
        saved meanwhile into the new generation's journal. Raises nothing:
        a failure is logged once and counted, and the next save compacts
        again."""
        assert self.path is not None and self.journal is not None
        assert self.journal_next is not None
        gen = self._gen + 1
        items = sorted(self._texts.items())
        since: dict[str, str | None] = {}
        self._since = since  # (a newer compaction replaces it: this one then stops)
        fd, tmp = -1, ""
        size = 0
        try:
            make_private_dirs(self.path.parent)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            for piece in _document(items, gen, COMPACT_CHUNK):
                size += _write_all(fd, piece.encode())
                yield
                if self._since is not since:  # :meth:`save` compacted meanwhile
                    return
            os.close(fd)
            fd = -1
            # synchronous from here on: nothing is saved in between
            lines = [_dumps([sid, None]) if text is None else f"[{json.dumps(sid)},{text}]"
                     for sid, text in sorted(since.items())]
            journal = ("\n".join([_dumps({"journal": gen})] + lines) + "\n").encode()
            if lines:  # first: a crash after the replace finds them there (no
                # temporary file needed: it is trusted only once the document
                # naming its generation is in place, i.e. after it was whole)
                nfd = os.open(self.journal_next, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                              | os.O_CLOEXEC, 0o600)
                try:
                    _write_all(nfd, journal)
                finally:
                    os.close(nfd)
            else:  # one left by an earlier crash must not name the new generation
                _unlink(self.journal_next)
            os.replace(tmp, self.path)
            tmp = ""
        except OSError as e:
            self.errors += 1
            self._compact_due = True  # the next save writes the whole document again
            self._warn(f"cannot be written ({e.strerror or type(e).__name__})")
            return
        finally:
            if self._since is since:
                self._since = None
            if fd >= 0:
                os.close(fd)
            if tmp:
                _unlink(Path(tmp))
        self._gen = gen
        self._doc_bytes = size
        self.counters["compactions"] += 1
        try:
            if lines:
                os.replace(self.journal_next, self.journal)
            else:
                _unlink(self.journal)
        except OSError as e:  # an older generation: never replayed (module doc)
            self.errors += 1
            self._compact_due = True  # and never appended to
            self._warn(f"journal cannot be replaced ({e.strerror or type(e).__name__})")
            return
        self._journal_bytes = len(journal) if lines else 0
        self._compact_due = False

    def _append(self, data: bytes) -> bool:
        """One ``write`` of whole lines to the journal (a new journal opens
        with its generation); a short write is cut back off (never a
        fragment for the next line to be glued onto)."""
        assert self.journal is not None
        if not self._journal_bytes:
            data = _dumps({"journal": self._gen}).encode() + b"\n" + data
        fd = -1
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            try:
                fd = os.open(self.journal, flags, 0o600)
            except FileNotFoundError:
                make_private_dirs(self.journal.parent)
                fd = os.open(self.journal, flags, 0o600)
            n = os.write(fd, data)
            if n != len(data):
                os.ftruncate(fd, os.fstat(fd).st_size - n)
                raise OSError(f"short write ({n}/{len(data)} bytes)")
        except OSError as e:
            self.errors += 1
            self._compact_due = True  # whatever is on disk now, the next save rewrites it whole
            self._warn(f"journal cannot be written ({e.strerror or type(e).__name__})")
            return False
        finally:
            if fd >= 0:
                os.close(fd)
        self._journal_bytes += n
        self.counters["appends"] += 1
        return True

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("bridge state file %s %s", self.path, what)


def _generation(raw: bytes) -> object:
    """The generation a journal's header line names (``None``: no header)."""
    try:
        header = json.loads(raw.partition(b"\n")[0])
    except ValueError:
        return None
    return header.get("journal") if isinstance(header, dict) else None


def _document(items: list[tuple[str, str]], gen: int, chunk: int) -> Iterator[str]:
    """The document's text in pieces of ``chunk`` sessions (``items``:
    ``(session, entry text)`` in id order); joined, ``_dumps`` of
    ``{"journal": gen, "sessions": {...}, "version": 1}``."""
    yield f'{{"journal":{gen},"sessions":{{'
    for i in range(0, len(items), chunk):
        part = ",".join([f"{json.dumps(sid)}:{text}" for sid, text in items[i:i + chunk]])
        yield part if i == 0 else "," + part
    yield '},"version":1}'


def _write_all(fd: int, data: bytes) -> int:
    """``os.write`` until all of ``data`` is written (raises ``OSError``)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError("short write")
        view = view[n:]
    return len(data)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
