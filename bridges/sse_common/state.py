"""The bridge's small persistent state (``{AEP_STATE_DIR}/{bridge}/{host}_{port}.json``):
what a daemon restart must not lose so that no run and no attention request
is left dangling and nothing is emitted twice (open runs, pending asks with
their ``attention.requested`` ids, settling marks, cancel notes); see
:meth:`bridges.sse_common.tracker.Tracker.snapshot`.

Written incrementally (issue 11): a change appends the changed sessions'
entries to a journal beside the document (``{...}.json.journal``, one JSON
line ``[session, entry-or-null]`` each, one ``write`` per save on an
``O_APPEND`` descriptor), so a frame costs what it changed, not what is open.
Once the journal outgrows :data:`COMPACT_MIN` bytes and the document itself,
it is compacted: the whole document is replaced atomically
(:func:`bridges.core.paths.write_atomic`), then the journal is removed.

Crash safety: the document is always whole (atomic replace); the journal's
lines are whole but for a torn last one (a crash mid-``write``), which
:meth:`StateFile.load` ignores, and the next save compacts instead of
appending after it. The document names its journal generation
(``"journal": N``) and a journal opens with its own (``{"journal": N}``):
a crash between a compaction's replace and the old journal's removal leaves
a journal of an older generation, which is never replayed (it would set
sessions back to what they were before the compaction)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from bridges.core.paths import write_atomic

log = logging.getLogger("aep.sse.state")

COMPACT_MIN = 256 * 1024
"""Journal bytes below which it is never compacted (above it: once it is
also larger than the document, so compaction is amortized O(1) a byte)."""


def state_path(state_dir: Path | None, bridge: str, url: str) -> Path | None:
    """The state file for one bridge and server (``None``: no persistence)."""
    if state_dir is None:
        return None
    p = urllib.parse.urlsplit(url)
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{p.hostname or 'server'}_{p.port or ''}").strip("_")
    return Path(state_dir) / bridge / f"{key}.json"


def _dumps(doc: object) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _digest(text: str) -> bytes:
    """What is remembered of an entry as written (16 bytes, not its text)."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class StateFile:
    """Load/save one JSON document ``{"version": 1, "sessions": {id: entry}}``
    and its journal; failures are logged once and counted (``errors``) by
    the caller, never raised (the bridge keeps running without persistence).
    ``counters``: ``appends`` (journal writes), ``compactions``,
    ``torn_tail`` (loads that found a torn last journal line)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.journal = path.with_name(path.name + ".journal") if path is not None else None
        self.errors = 0
        self._warned = False
        self._hashes: dict[str, bytes] = {}  # session -> digest of its entry as last written
        self._doc_bytes = 0  # the document's size as last written or read
        self._journal_bytes = 0
        self._compact_due = False  # a torn or stale journal: never append after it
        self._gen = 0  # the journal generation the document names
        self.counters = {"appends": 0, "compactions": 0, "torn_tail": 0}

    def load(self) -> object:
        """The saved document with its journal replayed, as parsed JSON
        (untrusted: the tracker checks its shape; sessions in id order, as
        the document stores them), or ``None`` when there is none or it is
        unreadable."""
        if self.path is None:
            return None
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

    def _read_journal(self) -> list[tuple[str, Any]]:
        """The journal's whole lines, in order; a torn or unparsable line
        ends it (counted ``torn_tail``, the next save compacts)."""
        assert self.journal is not None
        try:
            raw = self.journal.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            self._warn(f"journal unreadable ({type(e).__name__}); starting without it")
            self._compact_due = True
            return []
        self._journal_bytes = len(raw)
        if not raw:
            return []
        out: list[tuple[str, Any]] = []
        head, _, rest = raw.partition(b"\n")
        try:
            header = json.loads(head)
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("journal") != self._gen:
            # older than the document (a crash after a compaction), or garbage
            self._compact_due = True
            return []
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
                    "replayed up to it, compacting at the next save", self.journal)
        return out

    def _remember(self, doc: object) -> None:
        sessions = doc.get("sessions") if isinstance(doc, dict) else None
        self._hashes = {sid: _digest(_dumps(e)) for sid, e in sessions.items()
                        if isinstance(sid, str) and isinstance(e, dict)} \
            if isinstance(sessions, dict) else {}

    def save(self, doc: object) -> None:
        """Replace the document with ``doc`` (atomic) and drop the journal."""
        if self.path is None:
            return
        gen = self._gen + 1
        text = _dumps(dict(doc, journal=gen) if isinstance(doc, dict) else doc)
        try:
            write_atomic(self.path, text)
        except OSError as e:
            self.errors += 1
            self._compact_due = True  # the next save writes the whole document again
            self._warn(f"cannot be written ({e.strerror or type(e).__name__})")
            return
        self._gen = gen
        self._doc_bytes = len(text)
        self._remember(doc)
        self.counters["compactions"] += 1
        assert self.journal is not None
        try:
            self.journal.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:  # an older generation: never replayed (module doc)
            self.errors += 1
            self._compact_due = True  # and never appended to
            self._warn(f"journal cannot be removed ({e.strerror or type(e).__name__})")
            return
        self._journal_bytes = 0
        self._compact_due = False

    def save_changes(self, changes: dict[str, Any], full: Callable[[], object]) -> None:
        """Persist ``changes`` (``{session: entry, or None for gone}``, e.g.
        :meth:`bridges.sse_common.tracker.Tracker.changes`): the entries
        that differ from what was last written are appended to the journal
        in one ``write``; when the journal is due for compaction (or its tail
        is torn) ``full()`` (the whole document) replaces the file instead."""
        if self.path is None:
            return
        lines: list[str] = []
        written: dict[str, bytes | None] = {}
        for sid in sorted(changes):
            entry = changes[sid]
            if entry is None:
                if sid not in self._hashes:
                    continue
                lines.append(_dumps([sid, None]))
                written[sid] = None
                continue
            text = _dumps(entry)
            h = _digest(text)
            if self._hashes.get(sid) == h:
                continue
            lines.append(f"[{json.dumps(sid)},{text}]")
            written[sid] = h
        if not lines and not self._compact_due:
            return
        data = ("\n".join(lines) + "\n").encode()
        if self._compact_due or (self._journal_bytes + len(data) > COMPACT_MIN
                                 and self._journal_bytes + len(data) > self._doc_bytes):
            self.save(full())
            return
        if not self._append(data):
            return
        for sid, digest in written.items():
            if digest is None:
                self._hashes.pop(sid, None)
            else:
                self._hashes[sid] = digest

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
                self.journal.parent.mkdir(parents=True, exist_ok=True)
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
