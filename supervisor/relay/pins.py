"""Which replay buffer goes first when the session cap (``AEP_MAX_SESSIONS``)
or the total byte budget (``AEP_BUFFER_TOTAL_BYTES``) needs room (issue 25,
fifth outside attack: 600 new OTLP sessions from an unauthenticated sender
evicted a Claude Code session holding a permission ask; ``from=all`` then
served none of it and ``aep-bridges respond`` found no ask to answer while
the agent still waited). docs/security.md "Limits", docs/stream.md.

- **Kinds.** A buffer is *fleet* once an authenticated bridge of the
  daemon wrote it (an in-process emitter whose session ids no
  unauthenticated sender chooses: the hook bridges, OpenCode, ACP...);
  every other buffer is *open*: the OTLP receiver's and the AG-UI proxy's
  (``open_sessions`` bridges: anyone who reaches them names the session),
  remote ``POST /events`` and ``/socket`` emitters', and history restored
  from the session logs until a fleet bridge writes to it again.
- **Pins.** A buffer that holds an *open ask* (an ``attention.requested``
  it holds whose ``attention.resolved`` or ``attention.timeout``, by
  ``subject``, it has not admitted, nor a ``session.ended``) is pinned. A
  trimmed ask is no longer held, so it no longer pins. At most
  ``max_sessions // 4`` buffers are pinned: past it the least recently
  written open pin loses its pin (else the least recently written fleet
  one), counted ``pins_released``, and goes back to the front of its kind's
  order (the next of its kind to go).
- **Order.** The buffer dropped is the least recently written unpinned
  open one; else the least recently written pinned open one; else the
  least recently written unpinned fleet one; else pinned fleet (the kind
  first: asks an open party posts in its own sessions never outlive the
  fleet's buffers). Counted
  ``sessions_evicted`` (all) and by kind: ``sessions_evicted_open``,
  ``sessions_evicted_fleet``, ``sessions_evicted_pinned``.

So an open sender can displace only open buffers while any remain, and
never a pinned one while fewer than the cap's quarter are pinned.

:class:`Evictions` is a mixin of :class:`.buffer.SessionBuffers`. Pure
data: no I/O, no clocks."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

from .entry import BufKey
from .ring import SessionRing

__all__ = ["Evictions", "PIN_TYPES"]

#: the event types that open or close a pin (never taken by a fast path's
#: stretch of appends: they go through :meth:`.buffer.SessionBuffers.admit`)
PIN_TYPES = frozenset({"attention.requested", "attention.resolved", "attention.timeout",
                       "session.ended"})

_Order = OrderedDict[BufKey, None]


class Evictions:
    """The eviction order of :class:`.buffer.SessionBuffers` (a mixin)."""

    counters: dict[str, int]
    _bury: Callable[[BufKey], None]

    def _init_orders(self, max_sessions: int) -> None:
        #: at most this many buffers pinned (``max_sessions // 4``)
        self.max_pins = max_sessions // 4
        self._open: _Order = OrderedDict()
        self._fleet: _Order = OrderedDict()
        self._pinned_open: _Order = OrderedDict()
        self._pinned_fleet: _Order = OrderedDict()
        self.counters.update(sessions_evicted_open=0, sessions_evicted_fleet=0,
                             sessions_evicted_pinned=0, pins_released=0)

    @property
    def pinned(self) -> int:
        """How many buffers are pinned now."""
        return len(self._pinned_open) + len(self._pinned_fleet)

    def is_pinned(self, key: BufKey) -> bool:
        return key in self._pinned_open or key in self._pinned_fleet

    def _place(self, s: SessionRing, pinned: bool, *, front: bool = False) -> None:
        """Move ``s`` into its kind's order (pinned or not), at the recent
        end (``front``: at the least recent end)."""
        key = s.key
        if s.order is not None:
            s.order.pop(key, None)
        if pinned:
            order = self._pinned_fleet if s.fleet else self._pinned_open
        else:
            order = self._fleet if s.fleet else self._open
        order[key] = None
        if front:
            order.move_to_end(key, last=False)
        s.order = order

    def _enlist(self, s: SessionRing, fleet: bool) -> None:
        """A new buffer: the most recent of its kind."""
        s.fleet = fleet
        self._place(s, False)

    def _promote(self, s: SessionRing) -> None:
        """A fleet bridge wrote the open buffer ``s``: fleet from now on."""
        pinned = s.order is self._pinned_open
        s.fleet = True
        self._place(s, pinned)

    def _delist(self, s: SessionRing) -> None:
        """``s`` is dropped whole: out of its order."""
        if s.order is not None:
            s.order.pop(s.key, None)
            s.order = None

    def _victim(self) -> BufKey:
        """The buffer to drop next (module docstring); ``KeyError`` when none is held."""
        # the kind first, then the pin: an open party's own asks never outlive the fleet's
        # buffers (a sixth outside attack pinned its own sessions with forged asks and got
        # every Claude Code hook session's buffer evicted under the total bytes)
        for order in (self._open, self._pinned_open, self._fleet, self._pinned_fleet):
            if order:
                return next(iter(order))
        raise KeyError("no buffer held")

    def _evict(self, key: BufKey, s: SessionRing) -> None:
        """Drop the buffer ``key`` whole for the cap or the total budget, counted by kind."""
        c = self.counters
        c["sessions_evicted"] += 1
        if s.order is self._pinned_open or s.order is self._pinned_fleet:
            c["sessions_evicted_pinned"] += 1
        c["sessions_evicted_fleet" if s.fleet else "sessions_evicted_open"] += 1
        self._bury(key)

    def _mark(self, s: SessionRing, attrs: dict[str, Any]) -> None:
        """An admitted event of a :data:`PIN_TYPES` type in ``s``: an ask
        opens (the buffer pinned) or closes (unpinned once none is open)."""
        t = attrs["type"]
        if t == "attention.requested":
            if s.asks is None:
                s.asks = {}
            s.asks[attrs["id"]] = None
            if s.order is self._open or s.order is self._fleet:
                self._pin(s)
            return
        asks = s.asks
        if not asks:
            return
        if t == "session.ended":
            asks.clear()
        else:
            asks.pop(attrs.get("subject"), None)  # type: ignore[arg-type]
        if not asks:
            self._unpin(s)

    def _settled(self, s: SessionRing, ident: str) -> None:
        """The held ask ``ident`` of ``s`` was trimmed: it pins no more."""
        asks = s.asks
        if asks is not None:
            asks.pop(ident, None)
            if not asks:
                self._unpin(s)

    def _pin(self, s: SessionRing) -> None:
        self._place(s, True)
        if self.pinned > self.max_pins:  # the least recently written open pin goes first
            order = self._pinned_open or self._pinned_fleet
            released = self._sessions_ring(next(iter(order)))
            self.counters["pins_released"] += 1
            self._place(released, False, front=True)

    def _unpin(self, s: SessionRing) -> None:
        if s.order is self._pinned_open or s.order is self._pinned_fleet:
            self._place(s, False)

    def _sessions_ring(self, key: BufKey) -> SessionRing:
        raise NotImplementedError  # SessionBuffers: the held buffer of key
