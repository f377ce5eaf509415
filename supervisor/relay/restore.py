"""A restart forgets nothing that was written (issue 25 row 9): at start,
the embedded relay re-admits the recent tail of the session logs into its
replay buffers, so ``from=all``, ``from=`` and ``Last-Event-ID`` work across
a restart with every position as it was (the same ``id``, the same
``epoch:seq``: the lines are the events' own wire bytes).

The layout is the session log's (``supervisor/jsonlog.py``,
``supervisor/retention.py``; read here, never imported: the relay layer
uses ``bridges.core`` alone): ``{root}/{agent}/{session}.jsonl`` is a
session's live file, ``{session}.{UTC}.jsonl[.gz]`` its closed segments
(names sort in rotation order; no session's own file name ends in the
stamp: ``bridges.core.paths.ROTATION_STAMP``, issue 25 attack 6); the spare files' directory (a name
starting with ``.``) and ``*.torn`` fragments are not read.

Bounded by the buffer settings, and cheap: only tails are read.

- at most ``max_sessions`` files' sessions, the most recently written first
  (by the newest file's mtime);
- per session at most ``depth`` (``AEP_BUFFER``) lines and ``buffer_bytes``
  (``AEP_BUFFER_BYTES``) bytes, read backwards from the end of the live
  file in blocks; an older segment is read only when the newer files hold
  fewer (a ``.gz`` one is streamed through, keeping the last lines);
- all together at most ``total_bytes`` (``AEP_BUFFER_TOTAL_BYTES``), shared
  evenly (what a short session leaves goes to the next): the newest sessions
  first, then admitted oldest first so the buffers' recency (what the
  session cap evicts by) is the logs' own.

Each line is this daemon's own log line (see :func:`_entries`); a line
that is not a sequenced event (a torn line, a command, ``agent.*``) is
skipped and counted. Restored events claim nothing and are not fanned out
(no one is subscribed yet): they are replay history only."""
from __future__ import annotations

import gc
import gzip
import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import trio

from bridges.core.aep import is_command_type, loads
from bridges.core.paths import ROTATION_STAMP

from .buffer import ENTRY_OVERHEAD, Entry
from .envelope import trusted_entry

if TYPE_CHECKING:
    from .core import Relay

__all__ = ["read_tails", "restore_from_logs", "BLOCK"]

BLOCK = 64 * 1024
"""Bytes read per step when reading a file backwards."""


def _session_files(root: Path) -> dict[tuple[str, str], list[tuple[float, str]]]:
    """``(agent dir, session base name) -> [(mtime, path)]``, the files in
    rotation order (segments by name, the live file last)."""
    groups: dict[tuple[str, str], list[tuple[bool, str, float]]] = {}
    try:
        agents = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)
                  and not e.name.startswith(".")]
    except OSError:
        return {}
    for a in agents:
        try:
            files = list(os.scandir(a.path))
        except OSError:
            continue
        for f in files:
            name = f.name
            if name.endswith(".jsonl"):
                base = name[:-6]
            elif name.endswith(".jsonl.gz"):
                base = name[:-9]
            else:
                continue
            m = ROTATION_STAMP.search(base)
            live = m is None
            if m is not None:
                base = base[:m.start()]
            elif name.endswith(".gz"):
                continue  # not a name the session log makes
            try:
                if not f.is_file():
                    continue
                mtime = f.stat().st_mtime
            except OSError:
                continue
            groups.setdefault((a.name, base), []).append((live, f.path, mtime))
    out: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for key, found in groups.items():
        found.sort()  # segments (False) by name, i.e. by their stamp; the live file last
        out[key] = [(mtime, path) for _live, path, mtime in found]
    return out


def _tail_plain(path: str, want: int, budget: int, counts: dict[str, int] | None = None
                ) -> list[bytes]:
    """The last ``want`` complete lines of ``path`` within ``budget`` bytes
    (read backwards in :data:`BLOCK` steps; a last line without its newline,
    a torn tail, is left out). A line bigger than the whole ``budget`` can
    never be restored: it is passed over (counted ``oversize`` in
    ``counts``) and the lines before it are read on, so one big event (a
    poster's, in any session) does not hide a session's history."""
    lines: list[bytes] = []
    used = 0
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        rest = b""  # the start of the earliest line seen so far (it may begin further back)
        ended = False  # whether ``rest`` is followed by a newline (a whole line once it starts)
        first = True
        skip = False  # inside a line too big to keep: read back to its start, keeping nothing
        while pos > 0 and len(lines) < want:
            step = min(BLOCK, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step)
            if skip:
                nl = data.rfind(b"\n")
                if nl < 0:
                    continue
                data, skip = data[:nl + 1], False  # what follows it: the skipped line's start
            parts = (data + rest).split(b"\n")
            rest = parts[0]
            body = parts[1:]
            if body:
                ended = True
            if first:
                first = False
                if body:
                    body.pop()  # what follows the last newline: empty, or a torn tail
            for ln in reversed(body):
                if not ln:
                    continue
                size = len(ln) + ENTRY_OVERHEAD
                if size > budget:
                    _count(counts, "oversize")
                    continue
                if len(lines) >= want or used + size > budget:
                    return lines[::-1]
                lines.append(ln)
                used += size
            if len(rest) + ENTRY_OVERHEAD > budget:
                _count(counts, "oversize")
                rest, skip = b"", True
        if pos == 0 and ended and rest and len(lines) < want \
                and used + len(rest) + ENTRY_OVERHEAD <= budget:
            lines.append(rest)  # the file's first line
    return lines[::-1]


def _count(counts: dict[str, int] | None, key: str) -> None:
    if counts is not None:
        counts[key] = counts.get(key, 0) + 1


def _tail_gz(path: str, want: int, budget: int, counts: dict[str, int] | None = None
             ) -> list[bytes]:
    """The last ``want`` complete lines of a compressed segment within
    ``budget`` bytes (streamed through: gzip cannot be read backwards); a
    line bigger than ``budget`` is passed over, as :func:`_tail_plain` does."""
    keep: deque[bytes] = deque(maxlen=want)
    with gzip.open(path, "rb") as f:
        for ln in f:
            if ln.endswith(b"\n"):
                keep.append(ln[:-1])
    out: list[bytes] = []
    used = 0
    for ln in reversed(keep):
        if len(ln) + ENTRY_OVERHEAD > budget:
            _count(counts, "oversize")
            continue
        if used + len(ln) + ENTRY_OVERHEAD > budget:
            break
        out.append(ln)
        used += len(ln) + ENTRY_OVERHEAD
    return out[::-1]


def read_tails(root: Path, *, depth: int, buffer_bytes: int, total_bytes: int,
               max_sessions: int) -> tuple[list[list[bytes]], dict[str, int]]:
    """Pure file reading (a worker thread): the lines to re-admit, one list
    per session file group in the order to admit them (oldest session
    first), and counts ``{files, sessions, lines, bytes, errors, oversize}``
    (``oversize``: lines bigger than their session's share, passed over)."""
    groups = _session_files(root)
    newest = sorted(groups.items(), key=lambda kv: max(t for t, _ in kv[1]), reverse=True)
    counts = {"files": 0, "sessions": 0, "lines": 0, "bytes": 0, "errors": 0, "oversize": 0}
    chosen: list[list[bytes]] = []
    newest = newest[:max_sessions]
    # every session gets its share of the total (the most recent first, and
    # what one leaves unused goes to the next): a short tail of each, not
    # the whole depth of a few, so every consumer's resume finds its session
    left = total_bytes
    for n, (_key, files) in enumerate(newest):
        if left <= 0:
            break
        want, budget = depth, min(buffer_bytes, left // (len(newest) - n))
        got: list[bytes] = []
        for _mtime, path in reversed(files):
            try:
                part = _tail_gz(path, want, budget, counts) if path.endswith(".gz") \
                    else _tail_plain(path, want, budget, counts)
            except (OSError, EOFError, gzip.BadGzipFile):
                counts["errors"] += 1
                continue
            counts["files"] += 1
            got[:0] = part
            want -= len(part)
            budget -= sum(len(ln) + ENTRY_OVERHEAD for ln in part)
            if want <= 0 or budget <= 0:
                break
        if got:
            size = sum(len(ln) + ENTRY_OVERHEAD for ln in got)
            left -= size
            counts["sessions"] += 1
            counts["lines"] += len(got)
            counts["bytes"] += size
            chosen.append(got)
    chosen.reverse()
    return chosen, counts


def _entries(lines: Iterable[bytes]) -> tuple[list[Entry], int]:
    """The sequenced entries of ``lines`` and how many lines were skipped.
    The lines are this daemon's own session log (the fleet's stamped events,
    remote events validated before they were written), so each is taken as
    :func:`.envelope.trusted_entry` takes a stamped one, after a shape check
    of what the buffers key on (a line that fails it, or is not JSON, is
    skipped): full validation was ~6x the cost (issue 25, measured)."""
    out: list[Entry] = []
    skipped = 0
    for ln in lines:
        try:
            ev = loads(ln)
            if ev.__class__ is not dict or not _SHAPED(ev) or is_command_type(ev["type"]):
                skipped += 1
                continue
            out.append(trusted_entry(ev, ln))
        except (ValueError, KeyError, TypeError):
            skipped += 1
    return out, skipped


def _SHAPED(ev: dict[str, Any]) -> bool:
    """What a buffered entry needs: ``str`` ``id``/``type``/``source``/
    ``session``/``agent``, an ``int`` ``seq`` (and ``epoch`` when present)."""
    g = ev.get
    return g("id").__class__ is str and g("type").__class__ is str \
        and g("source").__class__ is str and g("session").__class__ is str \
        and g("agent").__class__ is str and g("seq").__class__ is int \
        and g("epoch", 0).__class__ is int


async def restore_from_logs(relay: Relay, root: Path) -> dict[str, Any]:
    """Re-admit the session logs' tails under ``root`` into ``relay``'s
    buffers (see the module docstring): the reading in a worker thread,
    the admission on the loop a session at a time with a checkpoint between.
    Returns the counts (``files``, ``sessions``, ``lines``, ``bytes``,
    ``errors``, ``restored``, ``skipped``, ``seconds``), also kept in
    ``relay.counters`` as ``restored_events`` / ``restore_skipped``."""
    t0 = time.monotonic()
    chosen, counts = await trio.to_thread.run_sync(
        lambda: read_tails(root, depth=relay.buffer_depth, buffer_bytes=relay.buffers.buffer_bytes,
                           total_bytes=relay.buffers.total_bytes, max_sessions=relay.max_sessions))
    restored = skipped = 0
    for lines in chosen:
        # no collection while one session's entries are made: they all live
        # on, and collections over the growing heap were half the time
        was = gc.isenabled()
        gc.disable()
        try:
            entries, bad = _entries(lines)
            skipped += bad
            restored += relay.restore(entries)
        finally:
            if was:
                gc.enable()
        await trio.lowlevel.checkpoint()
    relay.counters["restored_events"] = relay.counters.get("restored_events", 0) + restored
    skipped += counts["oversize"]
    relay.counters["restore_skipped"] = relay.counters.get("restore_skipped", 0) + skipped
    return {**counts, "restored": restored, "skipped": skipped,
            "seconds": round(time.monotonic() - t0, 3)}
