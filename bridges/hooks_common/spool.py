"""Spool ingestion (``/work/hooks-contract.md`` §3): moments a shim could
not hand the daemon, appended to ``<spool dir>/<agent>.jsonl``, are taken
at run start and every :data:`INTERVAL_S` while running.

Taking: open, ``flock(LOCK_EX)``, rename to
``<agent>.jsonl.ingesting-<ulid>``, unlock (a writer that locked the old
inode sees its ``st_ino`` differ from the path's and reopens), read every
line, feed each through the live path as spooled (never held, its events
stamped with the line's ``spooled_at_ms``: when it happened), delete.
Leftover ``.ingesting-*`` files (a crash mid-ingest) are ingested first;
dedupe by hook id covers a repeat. A malformed line is counted
(``hooks_spool_malformed``) and skipped, a line over :data:`LINE_MAX` too
(read line by line: a huge file costs one line of memory); a file another
user owns, a symlink, or anything but a regular file (a FIFO would block
``open(2)`` on the event loop: every file is opened ``O_NONBLOCK``) is
never read (``hooks_spool_foreign``). A line whose mapping fails is
counted by the hub (``hooks_map_failed``) and skipped.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any, NamedTuple

import trio

from bridges.core.aep import check_json
from bridges.core.envelope import Ulids

from .hub import HookHub, MappingFailed, now_ms
from .mapping import moment_ms

__all__ = ["INTERVAL_S", "LINE_MAX", "Foreign", "Spooled", "claim", "ingest", "parse_line",
           "pending", "serve", "sweep"]

INTERVAL_S = 3.0
LINE_MAX = 32 << 20
"""Longest spool line read (bytes): a 4 MiB hook body, escaped to ASCII, fits."""


class Foreign(Exception):
    """A spool file this user does not own, or not a regular file: never
    read (anyone who can write it could feed the daemon moments; a FIFO
    would block the reader)."""


def _open_own(path: Path) -> int:
    """``path`` opened for reading without following a symlink or blocking
    on a FIFO; raises :class:`Foreign` unless it is a regular file this
    user owns, ``FileNotFoundError`` / ``OSError`` as ``os.open``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symlink: whoever made it chose what we would read
            raise Foreign(str(path)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise Foreign(str(path))
    return fd


def claim(spool: Path, agent: str, ids: Ulids | None = None) -> Path | None:
    """Rename ``<agent>.jsonl`` aside under the writers' lock; the new path,
    or ``None`` when there is nothing to take. Raises :class:`Foreign` for a
    file another user owns (left in place), ``OSError`` for an unreadable
    spool directory."""
    path = spool / f"{agent}.jsonl"
    try:
        fd = _open_own(path)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size == 0:
            return None
        target = spool / f"{agent}.jsonl.ingesting-{(ids or Ulids())()}"
        try:
            os.rename(path, target)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            raise
        return target
    finally:
        os.close(fd)  # closing releases the lock


def pending(spool: Path, agent: str) -> list[Path]:
    """Leftover ``.ingesting-*`` names, oldest first (their names sort by
    time); :func:`ingest` reads only the regular files this user owns."""
    try:
        return sorted(spool.glob(f"{agent}.jsonl.ingesting-*"))
    except OSError:
        return []


class Spooled(NamedTuple):
    """One spool line: the shim's hook ``id`` (``None`` when it had none),
    the vendor ``moment``, and ``at_ms``, the line's ``spooled_at_ms`` as
    written (``None`` when absent or not an integer: :func:`~.mapping.moment_ms`
    decides what time the moment takes)."""

    id: str | None
    moment: dict[str, Any]
    at_ms: int | None


def parse_line(line: bytes, agent: str) -> Spooled | None:
    """One spool line -> :class:`Spooled`, or ``None`` when malformed
    (not JSON, not the contract's shape, another agent's, a payload that is
    not a JSON object: raw text the vendor sent cannot be mapped; nesting
    too deep to decode; more JSON arrays, objects, values or floats than
    the endpoint takes in a body, :func:`bridges.core.aep.check_json`: a
    spooled body the daemon never saw is held to the same bounds)."""
    try:
        check_json(line)
        rec = json.loads(line)
    except (ValueError, RecursionError):  # nesting: one bad line, never a bridge crash
        return None
    if not isinstance(rec, dict) or rec.get("agent") not in (None, agent):
        return None
    payload = rec.get("payload")
    if isinstance(payload, str):
        try:
            check_json(payload)
            payload = json.loads(payload)
        except (ValueError, RecursionError):
            return None
    if not isinstance(payload, dict):
        return None
    hid = rec.get("id")
    at = rec.get("spooled_at_ms")
    return Spooled(hid if isinstance(hid, str) and hid else None, payload,
                   at if isinstance(at, int) and not isinstance(at, bool) else None)


async def ingest(hub: HookHub, path: Path) -> int:
    """Feed every line of the claimed file ``path`` through the hub as
    spooled, then delete it. Returns the moments fed."""
    health = hub.ctx.health
    try:
        fd = _open_own(path)  # re-checked: a name can be replaced after pending() or claim()
    except Foreign:
        health.count("hooks_spool_foreign")
        hub.ctx.log.warning("%s: not reading %s: not a regular file of this user",
                            hub.profile.key, path)
        return 0
    except OSError as e:
        hub.ctx.log.warning("%s: cannot read spool %s: %s", hub.profile.key, path, e)
        return 0
    fed = 0
    with os.fdopen(fd, "rb") as f:
        while line := f.readline(LINE_MAX + 1):  # a small local file; a thread hop costs more
            if len(line) > LINE_MAX and not line.endswith(b"\n"):
                health.count("hooks_spool_malformed")
                while (rest := f.readline(LINE_MAX)) and not rest.endswith(b"\n"):
                    pass  # skip the rest of the overlong line
                continue
            if not line.strip():
                continue
            rec = parse_line(line, hub.profile.agent)
            if rec is None:
                health.count("hooks_spool_malformed")
                continue
            try:
                await hub.handle(rec.moment, hook_id=rec.id, spooled=True,
                                 at_ms=moment_ms(now_ms(), rec.at_ms))
            except MappingFailed:  # counted hooks_map_failed by the hub; the next line goes on
                continue
            health.count("hooks_spooled_ingested")  # once its events are out and logged
            fed += 1
    try:
        path.unlink()  # noqa: ASYNC240 -- one local unlink
    except OSError:
        pass
    return fed


async def sweep(hub: HookHub, spool: Path) -> int:
    """Ingest what is left over, then what is spooled now."""
    agent = hub.profile.agent
    fed = 0
    for p in pending(spool, agent):
        fed += await ingest(hub, p)
    try:
        taken = claim(spool, agent)
    except Foreign as e:
        hub.ctx.health.count("hooks_spool_foreign")
        hub.ctx.log.warning("%s: not reading %s: owned by another user", hub.profile.key, e)
        return fed
    except OSError as e:
        hub.ctx.log.warning("%s: cannot take the spool %s: %s", hub.profile.key, spool, e)
        return fed
    if taken is not None:
        fed += await ingest(hub, taken)
    return fed


async def serve(hub: HookHub, spool: Path, interval_s: float = INTERVAL_S) -> None:
    """Sweep at start and every ``interval_s`` seconds until cancelled."""
    while True:
        await sweep(hub, spool)
        await trio.sleep(interval_s)
