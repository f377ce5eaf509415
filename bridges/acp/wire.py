"""The tee -> daemon wire: one WebSocket per tee on the daemon's own listener.

Endpoint: ``GET /bridges/acp/{name}`` upgraded to a WebSocket on
``AEP_LISTEN`` (the embedded relay's listener, or the health listener in
uplink mode), ``{name}`` the AEP agent id the tee observes as (one of the
daemon's ``AEP_ACP_AGENTS``; another name is refused 404). With
``AEP_TOKEN`` set on the daemon, the upgrade carries
``Authorization: Bearer <token>`` (401 otherwise). The Host guard of the
relay applies; an upgrade carrying a browser ``Origin`` is refused 403.

Messages, tee -> daemon (the daemon sends one TEXT message, the welcome
``{"aep_acp_daemon": 1, "resume": "<key>"}`` right after a hello it
accepts, then nothing but close frames):

1. one TEXT message first, the hello::

       {"aep_acp_tee": 1, "tee": "<ULID>", "agent": "<name>",
        "command": "<basename of argv[0]>", "pid": 1234,
        "stats": {"drops": 0, "oversize": 0}}

   ``tee`` is minted once per tee process: it qualifies run ids and names
   the tee's connection session, so a reconnect continues the same story
   and a restarted tee never re-mints a run id. The id is bound to the
   connection that first used it: a reconnect carries ``"resume"``, the
   key of the welcome; a hello for an id that another connection holds,
   or without its key, is closed with code 4409 and the tee mints a new id.
2. then BINARY messages, each a batch of records, each record
   ``TAG + uint32 big-endian length + payload``: ``>`` bytes the client
   sent to the agent, ``<`` bytes the agent sent to the client (the raw
   bytes as they went through, in order, in whatever pieces the pipes
   gave: the DAEMON splits lines, :class:`LineSplitter`), ``#`` a control
   record (compact JSON): ``{"gap": "client"|"agent"}`` (the tee's bounded
   queue dropped bytes of that direction just before: the daemon drops the
   partial line and resumes at the next ``\n``), ``{"stats": {"drops": N,
   "skipped_bytes": N}}``, and ``{"exit": STATUS, "stats": {...}}`` when
   the agent exited.

   The tee ships every byte of a line up to its parse cap (``max_line`` in
   the hello) and one more, then nothing of that line until its ``\n``
   (``skipped_bytes``): the daemon's splitter sees the line over the cap
   and counts it, and no line costs more than the cap in transit or in
   memory. A line shorter than one pipe read is shipped whole.

The hello also carries ``"max_line"`` (the tee's parse cap) and
``"mid_line"``: the directions whose next bytes continue a line that a
previous connection carried the start of (a reconnect); a daemon that does
not know the tee resumes those at their next ``\n``.

Pure helpers; the tee (:mod:`bridges.acp.tee`) and the daemon side
(:mod:`bridges.acp.bridge`) both use them.
"""
from __future__ import annotations

import json
import os
import re
import struct
import urllib.parse
from typing import Any, Iterator

from bridges.core.aep import loads as _loads

CLIENT = "client"
AGENT = "agent"
DIRECTIONS = (CLIENT, AGENT)
TAGS = {CLIENT: b">", AGENT: b"<"}
_DIRS = {ord(">"): CLIENT, ord("<"): AGENT}
CONTROL = ord("#")
VERSION = 1
_LEN = struct.Struct(">I")
DEFAULT_MAX_LINE = 4 << 20
"""Parse cap in bytes: a longer line passes through but is not observed."""
MAX_CONTROL = 64 << 10
"""The largest hello or ``#`` control record parsed (bytes); a larger one is refused."""
CLAIMED = 4409
"""The close code for a hello whose tee id another connection holds (or
that lacks the id's resume key): the tee mints a new id and reconnects."""
PATH_PREFIX = "/bridges/acp/"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def new_tee_id() -> str:
    # the SDK (its generated pydantic types) only in the tee that mints an id:
    # the daemon imports this module for the bridge's settings at every start
    from aep_sdk import ulid
    return ulid()


def valid_name(name: str) -> bool:
    """An agent id the tee may ask for: letters, digits, ``_``, ``-``."""
    return bool(_NAME.match(name or ""))


def path_for(name: str) -> str:
    return f"{PATH_PREFIX}{name}"


def daemon_problem(url: str) -> str | None:
    """``None`` for a usable ``http(s)://host:port`` daemon URL."""
    p = urllib.parse.urlsplit(url)
    if p.scheme not in ("http", "https", "ws", "wss") or not p.hostname:
        return f"--daemon {url!r}: expected http(s)://host:port"
    try:
        _ = p.port
    except ValueError:
        return f"--daemon {url!r}: the port is not a number"
    return None


def tee_url(daemon: str, name: str) -> str:
    """``http://h:p`` -> ``ws://h:p/bridges/acp/{name}`` (``https`` -> ``wss``)."""
    p = urllib.parse.urlsplit(daemon)
    scheme = {"http": "ws", "https": "wss"}.get(p.scheme, p.scheme)
    return urllib.parse.urlunsplit((scheme, p.netloc, p.path.rstrip("/") + path_for(name), "", ""))


def hello(tee: str, name: str, command: list[str], pid: int, stats: dict[str, int], *,
          max_line: int = DEFAULT_MAX_LINE, mid_line: list[str] | None = None,
          resume: str | None = None) -> dict[str, Any]:
    h = {"aep_acp_tee": VERSION, "tee": tee, "agent": name,
         "command": os.path.basename(command[0]) if command else "", "pid": pid,
         "stats": stats, "max_line": max_line, "mid_line": list(mid_line or [])}
    if resume is not None:
        h["resume"] = resume
    return h


def parse_welcome(text: Any) -> str | None:
    """The resume key of the daemon's answer to a hello (``{"aep_acp_daemon":
    1, "resume": KEY}``), or ``None`` for any other message. Never raises."""
    if not isinstance(text, str) or len(text) > MAX_CONTROL:
        return None
    try:
        w = _loads(text)
    except ValueError:
        return None
    key = w.get("resume") if isinstance(w, dict) and w.get("aep_acp_daemon") == VERSION else None
    return key if isinstance(key, str) and _NAME.match(key) else None


def record(direction: str, data: bytes) -> bytes:
    """One record of raw bytes observed in ``direction``."""
    return TAGS[direction] + _LEN.pack(len(data)) + data


def piece(direction: str, data: bytes) -> tuple[bytes, bytes]:
    """:func:`record` as ``(header, data)``, without copying ``data``."""
    return TAGS[direction] + _LEN.pack(len(data)), data


def control(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return b"#" + _LEN.pack(len(data)) + data


def parse_hello(text: str) -> dict[str, Any] | None:
    """The hello, normalized (every field of the shape above, of its type:
    ``command`` ``str``, ``pid`` ``int | None``, ``stats`` ``dict``,
    ``max_line`` ``int | None``, ``mid_line`` a list of directions,
    ``resume`` ``str | None``), or ``None`` when the message is not one this
    daemon speaks: not JSON, over :data:`MAX_CONTROL`, nested past what
    :func:`bridges.core.aep.loads` reads, or a field of the wrong type.
    Never raises."""
    if len(text) > MAX_CONTROL:
        return None
    try:
        h = _loads(text)
    except ValueError:  # aep.loads turns absurd nesting into ValueError too
        return None
    if not isinstance(h, dict) or h.get("aep_acp_tee") != VERSION:
        return None
    tee, agent, resume = h.get("tee"), h.get("agent"), h.get("resume")
    if not isinstance(tee, str) or not _NAME.match(tee) or not isinstance(agent, str):
        return None
    if resume is not None and (not isinstance(resume, str) or not _NAME.match(resume)):
        return None
    pid, max_line, stats, mid = h.get("pid"), h.get("max_line"), h.get("stats"), h.get("mid_line")
    return {"aep_acp_tee": VERSION, "tee": tee, "agent": agent, "resume": resume,
            "command": h["command"][:200] if isinstance(h.get("command"), str) else "",
            "pid": pid if type(pid) is int else None,
            "max_line": max_line if type(max_line) is int else None,
            "stats": {k: v for k, v in stats.items() if type(v) is int}
            if isinstance(stats, dict) else {},
            "mid_line": [d for d in DIRECTIONS if isinstance(mid, list) and d in mid]}


def records(message: bytes) -> Iterator[tuple[str, bytes] | tuple[None, dict[str, Any] | None]]:
    """The records of one batch: ``(direction, bytes)`` or ``(None, control)``.
    A control record that is not a JSON object of at most
    :data:`MAX_CONTROL` bytes (nesting included: it is read by
    :func:`bridges.core.aep.loads`, which refuses absurd depth with
    ``ValueError``) is ``(None, None)``: refused, for the caller to count.
    Unknown tags are skipped; a truncated record ends the batch. Never raises."""
    view = memoryview(message)
    pos, end = 0, len(message)
    while pos + 5 <= end:
        tag = message[pos]
        (n,) = _LEN.unpack_from(message, pos + 1)
        start, pos = pos + 5, pos + 5 + n
        if pos > end:
            return
        if tag in _DIRS:
            yield _DIRS[tag], bytes(view[start:pos])
        elif tag == CONTROL:
            obj: Any = None
            if n <= MAX_CONTROL:
                try:
                    obj = _loads(view[start:pos].tobytes())
                except ValueError:
                    obj = None
            yield None, obj if isinstance(obj, dict) else None


class LineSplitter:
    """Split one direction's byte stream into lines (``\n`` only: U+2028 /
    U+2029 inside JSON strings are not line ends).

    :meth:`feed` takes the next piece and returns the records it completed:
    ``bytes`` (one line, without its ``\n``) or an ``int`` (the length of a
    line over ``max_line``, whose bytes were not kept); :meth:`finish`
    returns the trailing partial line at EOF; :meth:`resync` forgets the
    partial line and drops bytes up to the next ``\n`` (after a gap). At
    most ``max_line`` bytes are ever held."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.max_line = max_line
        self._buf: list[bytes] = []
        self._held = 0
        self._over = 0  # >0: length so far of a line past the cap (bytes dropped)
        self._resync = False
        self.oversize = 0

    @property
    def held(self) -> int:
        """Bytes of the unfinished line held now (at most ``max_line``)."""
        return self._held

    def resync(self) -> None:
        self._buf, self._held, self._over = [], 0, 0
        self._resync = True

    def feed(self, chunk: bytes) -> list[bytes | int]:
        out: list[bytes | int] = []
        start = 0
        if self._resync:
            nl = chunk.find(b"\n")
            if nl < 0:
                return out
            self._resync = False
            start = nl + 1
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                self._add(chunk[start:] if start else chunk)
                return out
            self._add(chunk[start:nl])
            out.append(self._take())
            start = nl + 1

    def finish(self) -> list[bytes | int]:
        if (self._buf or self._over) and not self._resync:
            return [self._take()]
        return []

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        if self._over:
            self._over += len(piece)
        elif self._held + len(piece) > self.max_line:
            self._over = self._held + len(piece)
            self._buf, self._held = [], 0
        else:
            self._buf.append(piece)
            self._held += len(piece)

    def _take(self) -> bytes | int:
        if self._over:
            n, self._over = self._over, 0
            self.oversize += 1
            return n
        line = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf, self._held = [], 0
        return line


class Shipper:
    """The tee's side of the parse cap for one direction (see the module
    docstring): :meth:`cut` returns the part of a piece to ship (possibly
    empty), O(1) Python work per piece (the scans run in C). ``skipped``
    counts the bytes of over-cap lines that were not shipped."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.max_line = max_line
        self.line = 0  # bytes of the current line shipped so far
        self.skipping = False
        self.skipped = 0

    def cut(self, piece: bytes) -> bytes:
        if self.skipping:
            nl = piece.find(b"\n")
            if nl < 0:
                self.skipped += len(piece)
                return b""
            self.skipped += nl
            self.skipping = False
            self.line = 0
            piece = piece[nl:]
        last = piece.rfind(b"\n")
        if last < 0:
            if self.line + len(piece) > self.max_line:
                keep = max(0, self.max_line + 1 - self.line)
                self.skipping = True
                self.skipped += len(piece) - keep
                self.line += keep
                return piece[:keep]
            self.line += len(piece)
            return piece
        self.line = len(piece) - last - 1
        if self.line > self.max_line:  # the tail is already over the cap: skip the rest of it
            self.skipping = True
        return piece
