"""What a killed daemon's outbox held, published from its JSONL logs at the
next start (issue 14's leftover: the outbox is memory; the session log,
written first, has every event).

**Which events.** The publisher keeps one publish in flight per session, so
what the stream holds of a session is a *prefix* of the session's log
(less the ``debug``/``info`` events the outbox shed, which were counted as
drops then): everything after the stream's last message on the session's
subject (``S.ev.<agent>.<session>``, asked with one ``last_by_subj`` get)
is missing, and nothing before it is. The last stored message is found in
the log by its ``Nats-Msg-Id`` (``<id> <source>``), so seq-less events
count too. A session the stream holds nothing of gets its whole live log
file, less the events older than ``AEP_NATS_MAX_AGE`` (retention would
drop them anyway). A session whose last stored message is not in the
file (another emitter publishes on that subject, or the file was rotated
since) is left alone and logged: guessing could store events twice.
Re-sending is safe anyway: the server drops a ``Nats-Msg-Id`` it holds
within ``AEP_NATS_DUPLICATE_WINDOW``.

**Which files.** ``AEP_STATE_DIR/nats-outbox`` says how the last run with
``AEP_NATS_URL`` ended: ``{"state": "running", "since": T}`` while one
runs (so after a crash, SIGKILL or a drain deadline passed) and
``{"state": "clean"}`` once it stopped with its outbox empty. A start that
finds ``running`` reads back the live session files modified since ``T``
(most recent first, at most ``limit``; the last :data:`MAX_FILE_BYTES` of
each), and keeps ``T`` in the file until its own recovery is all
acknowledged (a crash during the recovery loses nothing), then writes its
own start. A start that finds ``clean`` or no file (the first run with
``AEP_NATS_URL``: events logged before it are not back-filled) reads
nothing. Rotated segments are not read.

**Order.** The recovered events are published before anything the new run
queued (:meth:`~.publish.Publisher.run`'s ``first``), so each session's
stream stays in emission order.

The pure part (:func:`missing_lines`) takes the file's lines; the I/O part
(:func:`recover`) reads the files and asks the stream.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .subjects import MSG_ID, event_subject_of, msg_id

if TYPE_CHECKING:
    from .config import NatsConfig
    from .link import Link
    from .publish import Message

log = logging.getLogger("aep.nats.recover")

MARK_FILE = "nats-outbox"
_SEGMENT = re.compile(r"\.\d{8}T\d{6}\.\d{6}Z\.jsonl$")  # a rotated segment (supervisor.retention)
MAX_FILE_BYTES = 64 << 20
"""Largest tail of one session file read back (a session with more than
this unpublished is recovered from its last 64 MiB)."""


def _event_time(ev: dict[str, Any]) -> float | None:
    t = ev.get("time")
    if not isinstance(t, str):
        return None
    try:
        return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def missing_lines(lines: Sequence[bytes], last_id: str | None, *, now: float,
                  max_age: float) -> list[tuple[dict[str, Any], bytes]] | None:
    """The events of one session log (``lines``: its JSONL lines, in file
    order) that the stream lacks, as ``(event, raw)`` in file order
    (``raw`` without the newline). ``last_id``: the ``Nats-Msg-Id`` of the
    stream's last message on the session's subject (``None``: it holds
    none). ``None`` when ``last_id`` is not in the lines (unknown: recover
    nothing). Lines that are not JSON objects (a torn tail) are skipped;
    with ``last_id`` ``None``, events whose ``time`` is older than
    ``max_age`` seconds before ``now`` too. Pure; never raises."""
    parsed: list[tuple[dict[str, Any], bytes]] = []
    for line in lines:
        raw = line.rstrip(b"\n")
        if not raw:
            continue
        try:
            ev = json.loads(raw)
        except ValueError:
            continue
        if isinstance(ev, dict):
            parsed.append((ev, raw))
    if last_id is None:
        out = []
        for ev, raw in parsed:
            t = _event_time(ev)
            if t is None or t >= now - max_age:
                out.append((ev, raw))
        return out
    for i in range(len(parsed) - 1, -1, -1):
        if msg_id(parsed[i][0]) == last_id:
            return parsed[i + 1:]
    return None


def marker(state_dir: Path) -> Path:
    """The file saying how the last run with ``AEP_NATS_URL`` ended."""
    return Path(state_dir) / MARK_FILE


def read_mark(state_dir: Path) -> float | None:
    """``since`` of a run that did not stop clean (recover the files
    modified after it); ``None`` after a clean stop or with no file (a
    first run). Never raises: an unreadable file counts as a crash since
    the epoch would (too many files), so as no file."""
    try:
        v = json.loads(marker(state_dir).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(v, dict) and v.get("state") == "running" \
            and isinstance(v.get("since"), (int, float)):
        return float(v["since"])
    return None


def write_mark(state_dir: Path, since: float | None) -> None:
    """``running`` since ``since`` (epoch s), or ``clean`` (``None``).
    Atomic; never raises (logged at debug)."""
    from bridges.core.paths import write_atomic
    body = {"state": "clean"} if since is None else {"state": "running", "since": since}
    try:
        write_atomic(marker(state_dir), json.dumps(body) + "\n", fsync=True)
    except OSError as e:
        log.debug("nats: %s not written: %s", MARK_FILE, type(e).__name__)


def candidate_files(logs: Path, *, now: float, max_age: float, limit: int) -> list[Path]:
    """Live session files (``logs/<agent>/<session>.jsonl``) modified in the
    last ``max_age`` seconds before ``now``, most recent first, at most
    ``limit``."""
    found = []
    try:
        agents = list(os.scandir(logs))
    except OSError:
        return []
    for a in agents:
        if not a.is_dir():
            continue
        try:
            for f in os.scandir(a.path):
                if f.name.endswith(".jsonl") and not _SEGMENT.search(f.name):
                    m = f.stat().st_mtime
                    if m >= now - max_age:
                        found.append((m, Path(f.path)))
        except OSError:
            continue
    found.sort(reverse=True)
    return [p for _, p in found[:limit]]


def _tail(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - MAX_FILE_BYTES)
        f.seek(start)
        data = f.read()
    lines = data.split(b"\n")
    if start:
        lines = lines[1:]  # a partial first line
    return [x for x in lines if x]


async def recover(link: Link, cfg: NatsConfig, state_dir: Path, daemon: str, *,
                  since: float, limit: int) -> list[Message]:
    """The messages a run that did not stop clean left unpublished (module
    docstring), read from the session files modified since ``since``
    (epoch s, :func:`read_mark`), in file order per session. Raises the
    nats-py error when the stream cannot be asked (the caller retries)."""
    import nats.js.errors

    from .link import aio
    from .publish import message_for
    now = time.time()
    out: list[Message] = []
    window = min(cfg.max_age, max(0.0, now - since) + 5.0)  # 5 s: mtime granularity, clocks
    files = candidate_files(Path(state_dir) / "logs", now=now, max_age=window, limit=limit)
    for path in files:
        try:
            lines = _tail(path)
        except OSError as e:
            log.warning("nats: cannot read %s to recover it (%s)", path, type(e).__name__)
            continue
        if not lines:
            continue
        try:
            probe = json.loads(lines[-1])
        except ValueError:
            probe = None
        if not isinstance(probe, dict):
            continue
        subject = event_subject_of(cfg.stream, probe)
        try:
            m = await aio(link.js.get_msg)(cfg.stream, subject=subject)
            last_id: str | None = (m.headers or {}).get(MSG_ID)
        except nats.js.errors.NotFoundError:
            last_id = None
        got = missing_lines(lines, last_id, now=now, max_age=cfg.max_age)
        if got is None:
            log.warning("nats: %s: the stream's last event of this session is not in the file "
                        "(another emitter, or rotated): not recovered", path)
            continue
        out += [message_for(cfg.stream, ev, raw, daemon) for ev, raw in got
                if event_subject_of(cfg.stream, ev) == subject]
    log.log(logging.WARNING if out else logging.INFO,
            "nats: the last run did not stop clean: %d events from %d session logs it wrote "
            "are not in the stream; publishing them first", len(out), len(files))
    return out


__all__: Sequence[str] = ("MARK_FILE", "MAX_FILE_BYTES", "candidate_files", "marker",
                          "missing_lines", "read_mark", "recover", "write_mark")
