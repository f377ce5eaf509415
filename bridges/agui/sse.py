"""An incremental, size-capped ``text/event-stream`` parser for the tee's
copy of the bytes (WHATWG HTML "Server-sent events", §9.2.6 "Interpreting
an event stream").

Why not ``httpx_sse``: its decoder works on already split lines and
accumulates an event's ``data`` without bound; the tee is fed raw chunks
exactly as they are forwarded and must stay bounded whatever the agent
sends (a 20 MB event, a line that never ends). So: bytes in, whole events
out, at most ``max_event`` bytes held for one event plus one pending line
piece; an event over the cap is reported as :class:`SseEvent` with
``oversize=True`` (its size and the first :data:`PEEK` bytes of its data,
never more), and parsing resumes at the next event boundary.

Across streams (issue 25: 20 streams each holding one event just under
the cap cost +206 MiB, with no total bound) every parser of a proxy draws
the bytes it holds from one :class:`Budget`; an event whose next bytes do
not fit is reported like an oversized one, flagged ``over_budget``, and its
bytes are given back at once. Only the observation degrades: the proxy
forwards every byte before the parser sees it.

Pure: no I/O, no clocks. :meth:`SseParser.feed` never raises.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_EVENT = 8 * 1024 * 1024
"""Bytes of one event parsed (data lines and field names together)."""

DEFAULT_MAX_BUFFERED = 64 * 1024 * 1024
"""Bytes of unfinished events held across all of a proxy's streams."""

PEEK = 512
"""Bytes of an oversized event's data kept to name its type."""


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event: ``data`` (lines joined by ``\\n``), ``event``
    (the ``event:`` field, ``None`` when absent), ``id`` (``None`` when
    absent); ``oversize``: over the cap, ``data`` then holds only the first
    :data:`PEEK` bytes; ``size``: bytes of the event's lines, each
    line break counted as one byte; ``over_budget``: ``oversize`` because
    the shared :class:`Budget` had no room, not the event's own size."""

    data: str
    event: str | None = None
    id: str | None = None
    oversize: bool = False
    size: int = 0
    over_budget: bool = False


class Budget:
    """The bytes all parsers sharing it may hold together (``limit``).
    ``held``: held now; ``refused``: draws refused so far."""

    def __init__(self, limit: int = DEFAULT_MAX_BUFFERED) -> None:
        self.limit = max(1, limit)
        self.held = 0
        self.refused = 0

    def take(self, n: int) -> bool:
        """Draw ``n`` bytes; ``False`` (nothing drawn) when they do not fit."""
        if self.held + n > self.limit:
            self.refused += 1
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held = max(0, self.held - n)


class SseParser:
    """Feed bytes, get events. ``max_event``: see :data:`DEFAULT_MAX_EVENT`;
    ``budget``: the :class:`Budget` shared with other parsers (``None``:
    only ``max_event`` bounds it). Call :meth:`release` when the stream is
    over: what it still holds goes back to the budget."""

    def __init__(self, max_event: int = DEFAULT_MAX_EVENT, budget: Budget | None = None) -> None:
        self.max_event = max(1, max_event)
        self.budget = budget
        self._taken = 0              # bytes drawn from the budget
        self._data_len = 0           # bytes in self._data
        self._starved = False        # the current event went over the budget
        self._line = bytearray()     # the pending (unterminated) line
        self._skip_line = False      # the pending line is over the cap: drop to its end
        self._cr = False             # the last byte was CR (a following LF is the same break)
        self._data: list[bytes] = []
        self._size = 0               # bytes of the current event so far
        self._oversize = False
        self._peek = bytearray()
        self._event: str | None = None
        self._id: str | None = None
        self._bom = True             # a leading U+FEFF is ignored once

    @property
    def buffered(self) -> int:
        """Bytes held right now (bounded by about ``2 * max_event``)."""
        return len(self._line) + self._data_len

    def release(self) -> None:
        """Give back everything held (the stream is over); idempotent."""
        self._line, self._data, self._data_len = bytearray(), [], 0
        self._sync()

    def _sync(self) -> None:
        """Give back what was drawn and is no longer held."""
        excess = self._taken - self.buffered
        if excess > 0 and self.budget is not None:
            self.budget.give(excess)
            self._taken -= excess

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Parse ``chunk`` (any split of the stream); returns the events it
        completed, in order."""
        out: list[SseEvent] = []
        if not chunk:
            return out
        if self._bom:
            if len(chunk) < 3 and b"\xef\xbb\xbf".startswith(chunk) and not self._line:
                self._line += chunk  # could still be a BOM: decide with the next bytes
                return out
            self._bom = False
            if self._line:
                chunk, self._line = bytes(self._line) + chunk, bytearray()
            if chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
        i, n = 0, len(chunk)
        if self._cr and i < n and chunk[0:1] == b"\n":
            i = 1
        self._cr = False
        while i < n:
            lf, cr = chunk.find(b"\n", i), chunk.find(b"\r", i)
            ends = [p for p in (lf, cr) if p >= 0]
            if not ends:
                self._append(chunk[i:])
                break
            j = min(ends)
            self._append(chunk[i:j])
            ev = self._line_done()
            if ev is not None:
                out.append(ev)
            if chunk[j:j + 1] == b"\r":
                if j + 1 < n:
                    i = j + 2 if chunk[j + 1:j + 2] == b"\n" else j + 1
                else:
                    self._cr = True
                    i = n
            else:
                i = j + 1
        self._sync()
        return out

    def pending(self) -> bool:
        """An event is partly read (the stream ending now would drop it:
        the spec does not dispatch an unterminated event)."""
        return bool(self._line or self._data or self._oversize or self._event or self._id)

    # ------------------------------------------------------------------ internals
    def _append(self, piece: bytes) -> None:
        if not piece or self._skip_line:
            self._size += len(piece)
            return
        if len(self._line) + len(piece) + self._size > self.max_event:
            self._overflow(piece)
            return
        if self.budget is not None:
            self._sync()
            if not self.budget.take(len(piece)):
                self._starved = True
                self._overflow(piece)
                return
            self._taken += len(piece)
        self._line += piece

    def _overflow(self, piece: bytes) -> None:
        line = bytes(self._line) + piece
        if line.startswith(b"data:") or line.startswith(b"data") and len(line) == 4:
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            self._keep_peek(value)
        self._size += len(line)
        self._line = bytearray()
        self._skip_line = True
        self._mark_oversize()
        self._sync()

    def _mark_oversize(self) -> None:
        if not self._oversize:
            self._oversize = True
            for d in self._data:
                self._keep_peek(d + b"\n")
            self._data, self._data_len = [], 0

    def _keep_peek(self, b: bytes) -> None:
        room = PEEK - len(self._peek)
        if room > 0:
            self._peek += b[:room]

    def _line_done(self) -> SseEvent | None:
        if self._skip_line:
            self._skip_line = False
            self._size += 1
            return None
        line = bytes(self._line)
        self._line = bytearray()
        if not line:
            return self._dispatch()
        self._size += len(line) + 1
        if line.startswith(b":"):
            return None  # a comment (keep-alive)
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            if self._oversize:
                self._keep_peek(value)
            else:
                self._data.append(value)
                self._data_len += len(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\x00" not in value:
            self._id = value.decode("utf-8", "replace")
        # retry: and unknown fields are ignored (the spec); nothing to do
        if self._size > self.max_event:
            self._mark_oversize()
        return None

    def _dispatch(self) -> SseEvent | None:
        size = self._size + 1
        if self._oversize:
            ev = SseEvent(bytes(self._peek).decode("utf-8", "replace"), self._event, self._id,
                          oversize=True, size=size, over_budget=self._starved)
        elif self._data:
            ev = SseEvent(b"\n".join(self._data).decode("utf-8", "replace"), self._event,
                          self._id, size=size)
        else:
            ev = None  # no data: nothing dispatched (the spec)
        self._data, self._size, self._oversize = [], 0, False
        self._data_len, self._starved = 0, False
        self._peek = bytearray()
        self._event = None
        # the last event id persists across events per the spec, but each
        # SseEvent reports only the id its own block set
        self._id = None
        return ev
