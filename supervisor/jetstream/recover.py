"""What earlier runs logged but never got stored in the stream, published
from the JSONL session logs at every start (issues 14 and 25: the outbox
is memory; the session log, written before an OTLP export is answered, is
the durable truth). No marker decides *whether* to look: a kill can leave
any marker stale (issue 25 rows 7 and 8), so every start reads the logs.

**The invariant.** The publisher keeps one publish in flight per session,
so what the stream holds of a session is a *prefix* of the session's log
(less ``debug``/``info`` events the outbox shed, counted as drops then).
So every event of a live session log that comes after the stream's last
stored event of that session (``S.ev.<agent>.<session>``, asked with one
``last_by_subj`` get) is missing, and nothing before it is; each start
publishes those before anything new (:meth:`~.publish.Publisher.run`'s
``first``), so each session's stream stays in emission order. Events of
the current run (its ``epoch``) are left out: they are in the outbox; so
are events that are not this daemon's own (``source`` not under
``aep://<host>/``: what the embedded relay took from another emitter, if
it logs such, was never this daemon's to publish).

**Finding the last stored event** in the log: by its ``Nats-Msg-Id``
(``<id> <source>``), reading the file backwards from its end (most files
end with it: one small read). When it is not in what was read (another
emitter publishes on the subject, the file was rotated since, or more
than :data:`MAX_FILE_BYTES` are unpublished), the events stamped no
earlier than it are taken (an event id is a ULID whose time part is the
stamping millisecond, and stamping order is log order); an id with no
ULID time: nothing, logged. Re-sending is safe anyway: the server drops
a ``Nats-Msg-Id`` it holds within ``AEP_NATS_DUPLICATE_WINDOW``.

**A session the stream holds nothing of**: every event of the file
stamped at or after the *horizon* (:func:`horizon_of`): the later of the
first start with ``AEP_NATS_URL`` (``AEP_STATE_DIR/nats-outbox``, written
once, before any event of that run: logs from before NATS was configured
are not back-filled), ``AEP_NATS_MAX_AGE`` before now, and the time of the
stream's oldest stored message once the stream has removed any (an event
stamped before it may have been stored and aged out: not sent twice).
The vendor's timestamps (the event's ``time``) play no part.

**What bounds the work.** Live session files (``logs/<agent>/<session>.jsonl``;
rotated segments are not read) modified since the first start with
``AEP_NATS_URL``, most recently written first, at most
``AEP_MAX_SESSIONS``; one get per file (no read more when the stream holds
nothing of the session and the file was last written before the horizon);
at most the last :data:`MAX_FILE_BYTES` of each.

The pure part (:func:`missing_lines`) takes the file's lines; the I/O part
(:func:`recover`) reads the files and asks the stream.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .subjects import MSG_ID, event_subject_of, msg_id

if TYPE_CHECKING:
    from .config import NatsConfig
    from .link import Link
    from .publish import Message

log = logging.getLogger("aep.nats.recover")

MARK_FILE = "nats-outbox"
_SEGMENT = re.compile(r"\.\d{8}T\d{6}\.\d{6}Z\.jsonl$")  # a rotated segment (supervisor.sessionlog.retention)
MAX_FILE_BYTES = 64 << 20
"""Largest tail of one session file read back (a session with more than
this unpublished is recovered from its last 64 MiB)."""
CHUNK = 256 << 10
"""Bytes read per step when reading a file backwards."""
_CROCKFORD = {c: i for i, c in enumerate("0123456789ABCDEFGHJKMNPQRSTVWXYZ")}
_MTIME_SLACK_S = 5.0  # file mtime granularity, clocks


def ulid_ms(eid: object) -> int | None:
    """The time part (ms since the Unix epoch) of a ULID event id (the
    stamping millisecond, :class:`bridges.core.envelope.Ulids`); ``None``
    for anything else. Pure."""
    if not isinstance(eid, str) or len(eid) != 26:
        return None
    ms = 0
    for c in eid[:10]:
        v = _CROCKFORD.get(c)
        if v is None:
            return None
        ms = ms * 32 + v
    return ms


def _parse(lines: Sequence[bytes], epoch: int | None,
           own: str | None) -> list[tuple[dict[str, Any], bytes]]:
    out = []
    for line in lines:
        raw = line.rstrip(b"\n")
        if not raw:
            continue
        try:
            ev = json.loads(raw)
        except ValueError:
            continue  # a torn tail
        if not isinstance(ev, dict) or (epoch is not None and ev.get("epoch") == epoch):
            continue
        src = ev.get("source")
        if own is None or (isinstance(src, str) and src.startswith(own)):
            out.append((ev, raw))
    return out


def missing_lines(lines: Sequence[bytes], last_id: str | None, *, horizon_ms: int,
                  epoch: int | None = None, own: str | None = None
                  ) -> list[tuple[dict[str, Any], bytes]] | None:
    """The events of one session log (``lines``: JSONL lines in file order,
    a tail of the file) that the stream lacks, as ``(event, raw)`` in file
    order (``raw`` without the newline). ``last_id``: the ``Nats-Msg-Id``
    of the stream's last message on the session's subject (``None``: it
    holds none; then the events stamped at or after ``horizon_ms``, ms,
    and those with no ULID id). When ``last_id`` is not in the lines: the
    events stamped no earlier than it (but it), or ``None`` (recover
    nothing) when its id has no ULID time. Lines of the run ``epoch`` (the
    current one: in its outbox), lines whose ``source`` does not start with
    ``own`` (``aep://<host>/``: not this daemon's events, e.g. what the
    embedded relay took from another emitter) and lines that are not JSON
    objects are skipped. Pure; never raises."""
    parsed = _parse(lines, epoch, own)
    if last_id is None:
        out = []
        for ev, raw in parsed:
            ms = ulid_ms(ev.get("id"))
            if ms is None or ms >= horizon_ms:
                out.append((ev, raw))
        return out
    for i in range(len(parsed) - 1, -1, -1):
        if msg_id(parsed[i][0]) == last_id:
            return parsed[i + 1:]
    last_ms = ulid_ms(last_id.partition(" ")[0])
    if last_ms is None:
        return None
    return [(ev, raw) for ev, raw in parsed
            if msg_id(ev) != last_id and (ulid_ms(ev.get("id")) or 0) >= last_ms]


def marker(state_dir: Path) -> Path:
    """The file holding the first start with ``AEP_NATS_URL`` (``{"since": T}``)."""
    return Path(state_dir) / MARK_FILE


def nats_since(state_dir: Path, now: float) -> float:
    """The first start with ``AEP_NATS_URL`` of this state directory
    (epoch s): read from :func:`marker`, or ``now`` written there when it
    is absent or unreadable (a first run: nothing logged before is
    back-filled). Call it before this run logs anything. A marker of the
    earlier format (``{"state": "running", "since": T}`` or ``{"state":
    "clean"}``) gives its ``since`` or its modification time, and is
    rewritten. Never raises (a failed write is logged at debug)."""
    from bridges.core.paths import write_atomic
    path = marker(state_dir)
    since: float | None = None
    try:
        v = json.loads(path.read_text())
        if isinstance(v, dict):
            s = v.get("since")
            since = float(s) if isinstance(s, (int, float)) and not isinstance(s, bool) \
                else path.stat().st_mtime if v.get("state") == "clean" else None
            if since is not None and v.get("state") is None:
                return since
    except (OSError, ValueError):
        since = None
    since = now if since is None else min(since, now)
    try:
        write_atomic(path, json.dumps({"since": since}) + "\n", fsync=True)
    except OSError as e:
        log.debug("nats: %s not written: %s", MARK_FILE, type(e).__name__)
    return since


def candidate_files(logs: Path, *, after: float, limit: int) -> list[Path]:
    """Live session files (``logs/<agent>/<session>.jsonl``) modified at or
    after ``after`` (epoch s), most recently written first, at most
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
                    if m >= after:
                        found.append((m, Path(f.path)))
        except OSError:
            continue
    found.sort(reverse=True)
    return [p for _, p in found[:limit]]


def read_back(path: Path, needle: bytes | None, max_bytes: int = MAX_FILE_BYTES) -> list[bytes]:
    """The whole lines of ``path``'s tail, in file order: read backwards in
    :data:`CHUNK` steps until the line holding ``needle`` is complete (so a
    file that ends with the stream's last stored event costs one small
    read), the file's start, or ``max_bytes``. Raises ``OSError``."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        pos, buf, found = size, b"", -1
        while pos > 0 and size - pos < max_bytes:
            step = min(CHUNK, pos, max_bytes - (size - pos))
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
            if needle is not None:
                if found < 0:
                    found = buf.find(needle, 0, step + len(needle))
                else:
                    found += step
                if found >= 0 and (pos == 0 or buf.rfind(b"\n", 0, found) >= 0):
                    break
    lines = buf.split(b"\n")
    if pos > 0:
        lines = lines[1:]  # a partial first line
    return [x for x in lines if x]


async def horizon_of(link: Link, cfg: NatsConfig, *, since: float, now: float) -> float:
    """The time (epoch s) before which an event missing from the stream
    may have been stored and removed: the latest of ``since`` (the first
    start with ``AEP_NATS_URL``), ``AEP_NATS_MAX_AGE`` before ``now``, and,
    once the stream has removed messages, the time of its oldest stored
    one. Raises the nats-py error when the stream cannot be asked."""
    from .link import aio
    h = max(since, now - cfg.max_age)
    info = await aio(link.js.stream_info)(cfg.stream)
    st = info.state
    if (st.first_seq or 0) > 1 and (st.messages or 0) > 0:
        first = await aio(link.js.get_msg)(cfg.stream, seq=st.first_seq)
        if first.time is not None:
            h = max(h, first.time.timestamp())
    return h


async def recover(link: Link, cfg: NatsConfig, state_dir: Path, daemon: str, *,
                  since: float, epoch: int | None, limit: int,
                  host: str | None = None) -> list[Message]:
    """The messages earlier runs logged and the stream lacks (module
    docstring), in file order per session, read from the live session
    files under ``state_dir/logs``; ``since``: :func:`nats_since`;
    ``epoch``: the current run's (its events are left out); ``host``: this
    daemon's (only events whose ``source`` is under ``aep://<host>/`` are
    its own to publish; ``None``: any). Raises the nats-py error when the
    stream cannot be asked (the caller retries)."""
    import nats.js.errors

    from .link import aio
    from .publish import message_for
    now = time.time()
    horizon = await horizon_of(link, cfg, since=since, now=now)
    out: list[Message] = []
    # not ``horizon``: a session the stream holds a stored event of may have
    # events after it stamped before the horizon (an outage, then a kill)
    files = candidate_files(Path(state_dir) / "logs", after=since - _MTIME_SLACK_S, limit=limit)
    sessions = 0
    for path in files:
        try:
            mtime = path.stat().st_mtime
            # the last line names the subject (a line over CHUNK: read on)
            probe_lines = read_back(path, None, CHUNK) or read_back(path, None)
        except OSError as e:
            log.warning("nats: cannot read %s to recover it (%s)", path, type(e).__name__)
            continue
        probe = None
        for line in reversed(probe_lines):
            try:
                probe = json.loads(line)
                break
            except ValueError:
                continue
        if not isinstance(probe, dict):
            continue
        subject = event_subject_of(cfg.stream, probe)
        try:
            m = await aio(link.js.get_msg)(cfg.stream, subject=subject)
            last_id: str | None = (m.headers or {}).get(MSG_ID)
        except nats.js.errors.NotFoundError:
            last_id = None
            if mtime < horizon - _MTIME_SLACK_S:
                continue  # every line stamped before the horizon: nothing to send, nothing read
        try:
            lines = read_back(path, last_id.partition(" ")[0].encode() if last_id else None)
        except OSError as e:
            log.warning("nats: cannot read %s to recover it (%s)", path, type(e).__name__)
            continue
        got = missing_lines(lines, last_id, horizon_ms=int(horizon * 1000), epoch=epoch,
                            own=None if host is None else f"aep://{host}/")
        if got is None:
            log.warning("nats: %s: the stream's last event of this session is not in the file "
                        "and has no time to compare with (another emitter?): not recovered", path)
            continue
        got = [(ev, raw) for ev, raw in got if event_subject_of(cfg.stream, ev) == subject]
        if got:
            sessions += 1
            out += [message_for(cfg.stream, ev, raw, daemon) for ev, raw in got]
    log.log(logging.WARNING if out else logging.INFO,
            "nats: %d logged events of %d sessions (of %d session logs read back) are not "
            "in the stream; publishing them first", len(out), sessions, len(files))
    return out


__all__: Sequence[str] = ("CHUNK", "MARK_FILE", "MAX_FILE_BYTES", "candidate_files",
                          "horizon_of", "marker", "missing_lines", "nats_since", "read_back",
                          "recover", "ulid_ms")
