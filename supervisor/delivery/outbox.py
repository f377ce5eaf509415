"""The uplink's outbox: a bounded, ordered, severity-aware queue with a
confirmation window (AEP-0003 §8.4 emitter-side buffering; DESIGN.md
"Delivery"). Pure: no I/O, no clock, no trio; :mod:`supervisor.delivery.uplink`
drives it.

Life of an entry::

    offer() -> pending --(written to the socket)--> unconfirmed --(pong)--> gone
                  ^                                      |
                  +------------- rewind() (connection lost) --+

- **Ordered.** Entries leave in the order offered; after a reconnect the
  unconfirmed ones go first, still in order (:meth:`rewind`).
- **Removed only once delivered.** An entry stays in the outbox after it was
  written to the socket until a ``pong`` answers a ``ping`` sent after it
  (AEP-0003 §3.5): the relay read every frame before that ping, so a relay
  killed mid-stream loses nothing the outbox has not still got. The
  resend after a reconnect can duplicate; duplicates are legal and collapse
  on ``(source, id)`` (AEP-0001 §7.4, AEP-0003 §7).
- **Bounded, shedding debug/info first.** ``maxsize`` live entries
  (pending + unconfirmed). When full, an offer evicts the oldest *pending*
  ``debug`` entry, else the oldest pending ``info`` entry (never one of
  higher severity than the offered event: a ``debug`` offer facing only
  queued ``info`` is itself dropped); every drop is counted per severity.
  An entry rewound after a connection loss is pending again and can be
  shed (counted: its delivery was never confirmed).
  ``notice`` and above are never dropped: when nothing can be shed the
  offer answers ``"full"`` and the caller waits (backpressure).
- **Windowed.** At most ``window`` entries are written but unconfirmed; the
  sender waits for a pong beyond that, so at least ``maxsize - window``
  slots always remain for shedding to work on.

A ``severity`` outside the AEP-0001 enum is treated as ``notice`` (never
silently droppable); an absent one is ``info`` (the envelope default)."""
from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from bridges.core.aep import NOTICE_RANK as _NOTICE
from bridges.core.aep import SEVERITIES
from bridges.core.aep import SEVERITY_RANK as _RANK

PENDING, INFLIGHT, SENT, DROPPED = range(4)


def severity_rank(severity: object) -> int:
    """0 (debug) .. 5 (critical); ``None`` -> info; unknown -> notice."""
    if severity is None:
        return _RANK["info"]
    return _RANK.get(severity, _NOTICE) if isinstance(severity, str) else _NOTICE


class Entry:
    """One queued frame: ``wire`` (the text frame), ``rank`` (severity),
    ``state`` and ``mark`` (the ping number that will confirm it)."""

    __slots__ = ("wire", "rank", "state", "mark", "item")

    def __init__(self, wire: str, rank: int, item: Any = None) -> None:
        self.wire = wire
        self.rank = rank
        self.state = PENDING
        self.mark = 0
        self.item = item

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Entry({self.item!r}, rank={self.rank}, state={self.state}, mark={self.mark})"


class Outbox:
    """See the module docstring. ``maxsize`` >= 1; ``window`` (default
    ``max(1, maxsize // 4)``) <= ``maxsize``.

    ``counters``: ``dropped_debug``, ``dropped_info`` (the shed),
    ``dropped`` (their sum), ``confirmed``, ``rewound``."""

    def __init__(self, maxsize: int = 10000, window: int | None = None) -> None:
        if maxsize < 1:
            raise ValueError("outbox maxsize must be >= 1")
        self.maxsize = maxsize
        self.window = max(1, min(window if window is not None else maxsize // 4, maxsize))
        self._pending: deque[Entry] = deque()  # may hold DROPPED tombstones
        self._tombstones = 0
        self._unconfirmed: deque[Entry] = deque()
        # the pending debug (0) and info (1) entries, in pending order, so a
        # victim is found at a deque end instead of by a scan
        self._low: tuple[deque[Entry], deque[Entry]] = (deque(), deque())
        self._next_ping = 1
        self.counters: dict[str, int] = {"dropped_debug": 0, "dropped_info": 0, "dropped": 0,
                                         "confirmed": 0, "rewound": 0}

    # -- sizes -----------------------------------------------------------
    def __len__(self) -> int:
        """Live entries: pending (incl. one in flight) + unconfirmed."""
        return len(self._pending) - self._tombstones + len(self._unconfirmed)

    @property
    def pending(self) -> int:
        return len(self._pending) - self._tombstones

    @property
    def unconfirmed(self) -> int:
        return len(self._unconfirmed)

    # -- producer side -----------------------------------------------------
    def offer(self, wire: str, severity: Any = None, item: Any = None) -> str:
        """Queue one frame. Returns ``"queued"`` (possibly after shedding an
        older debug/info entry), ``"dropped"`` (the offered debug/info frame
        itself was shed) or ``"full"`` (nothing sheddable; nothing changed;
        wait for room and offer again)."""
        rank = severity_rank(severity)
        if len(self) >= self.maxsize:
            victim = self._victim(min(rank, _NOTICE - 1))
            if victim is not None:
                self._drop(victim)
            elif rank < _NOTICE:
                self._count_drop(rank)
                return "dropped"
            else:
                return "full"
        e = Entry(wire, rank, item)
        self._pending.append(e)
        if rank < _NOTICE:
            self._low[rank].append(e)
        return "queued"

    def _victim(self, max_rank: int) -> Entry | None:
        for r in range(0, max_rank + 1):
            low = self._low[r]
            while low and low[0].state == SENT:  # stale (sent since indexed)
                low.popleft()
            for i, e in enumerate(low):
                if e.state == PENDING:
                    del low[i]
                    return e
                if i >= 1:  # only the head can be in flight
                    break
        return None

    def _drop(self, e: Entry) -> None:
        e.state = DROPPED
        self._tombstones += 1
        self._count_drop(e.rank)
        if self._tombstones > 64 and self._tombstones * 2 > len(self._pending):
            self._pending = deque(x for x in self._pending if x.state != DROPPED)
            self._tombstones = 0

    def _count_drop(self, rank: int) -> None:
        self.counters["dropped_" + SEVERITIES[rank]] += 1
        self.counters["dropped"] += 1

    # -- sender side -------------------------------------------------------
    def peek(self) -> Entry | None:
        """The next entry to write, or ``None`` (nothing pending, or the
        confirmation window is full). Marks it in flight: the shedding
        never picks it; :meth:`sent` or :meth:`rewind` ends that."""
        if len(self._unconfirmed) >= self.window:
            return None
        while self._pending and self._pending[0].state == DROPPED:
            self._pending.popleft()
            self._tombstones -= 1
        if not self._pending:
            return None
        e = self._pending[0]
        e.state = INFLIGHT
        return e

    def sent(self, e: Entry) -> None:
        """``e`` (the entry :meth:`peek` returned) was written to the socket."""
        assert self._pending and self._pending[0] is e and e.state == INFLIGHT
        self._pending.popleft()
        e.state = SENT
        e.mark = self._next_ping
        self._unconfirmed.append(e)
        if e.rank < _NOTICE:
            low = self._low[e.rank]
            while low and low[0].state == SENT:
                low.popleft()

    def unpinged(self) -> bool:
        """Some written entry is not yet covered by a ping."""
        return bool(self._unconfirmed) and self._unconfirmed[-1].mark == self._next_ping

    def ping(self) -> int:
        """Register a ping about to be written; returns its number (the
        ``t`` to send). A pong for it confirms every entry written before."""
        n = self._next_ping
        self._next_ping += 1
        return n

    def confirm(self, n: int) -> int:
        """A pong answered ping ``n``: forget the entries it covers. Returns
        how many were confirmed."""
        k = 0
        while self._unconfirmed and self._unconfirmed[0].mark <= n:
            self._unconfirmed.popleft()
            k += 1
        self.counters["confirmed"] += k
        return k

    def rewind(self) -> int:
        """The connection is gone: unconfirmed entries go back to the front
        of the pending queue, in order (and the one in flight, if any, is
        pending again). Returns how many were rewound."""
        if self._pending and self._pending[0].state == INFLIGHT:
            self._pending[0].state = PENDING
        back = list(self._unconfirmed)
        self._unconfirmed.clear()
        for e in back:
            e.state = PENDING
            e.mark = 0
        self._pending.extendleft(reversed(back))
        for r in (0, 1):
            mine = [e for e in back if e.rank == r]
            if mine:
                self._low[r].extendleft(reversed(mine))
        self.counters["rewound"] += len(back)
        return len(back)

    # -- introspection (tests, /healthz) ------------------------------------
    def items(self) -> Iterable[Any]:
        """The live entries' ``item`` values in delivery order."""
        for e in self._unconfirmed:
            yield e.item
        for e in self._pending:
            if e.state != DROPPED:
                yield e.item
