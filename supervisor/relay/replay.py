"""Replay out of the session buffers (:mod:`.buffer`) for one subscription
(AEP-0003 §3.3, §5): which buffers to read from where (:func:`plan_replay`),
and the lazy, chunked reader a connection's writer pulls from
(:class:`ReplayJob`).

Replay is never materialized whole: a subscription registers for live
delivery and records the admission counter at that instant (``cutoff``);
replay serves buffered entries admitted up to it, live serves the rest; no
gap, no duplicate. Pure: no I/O, no clocks."""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

import trio

from bridges.core.pacing import YIELD_BYTES

from .attrmatch import Filter
from .buffer import BufKey, Entry, Held, Position, SessionBuffers
from .fanout import View
from .outlet import Subscriber, exhausted_marker

__all__ = ["ReplayJob", "Plan", "exhausted_marker", "plan_replay", "unheld_positions"]

Plan = list[tuple[BufKey, "Position | None", bool]]
"""``[(buffer key, after, mark)]``: resume strictly after ``after``
(``None``: from the earliest held); ``mark``: an exhausted buffer gets a
``replay-exhausted`` marker (never for replay-all)."""


def plan_replay(buffers: SessionBuffers, flt: Filter, *, plan_all: bool,
                positions: list[tuple[str, Position | None]] | None, live: bool) -> Plan:
    """The buffers a new subscription replays: every buffer for
    ``plan_all``; for each ``(session, position)`` every emitter's buffer of
    that name from that position (AEP-0001 §5.2, the residual ambiguity of
    resume tokens; each gets its own exhausted verdict); and, for a
    replay-only request, the buffers of the sessions the filter pins."""
    plan: Plan = []
    if plan_all:
        plan = [(k, None, False) for k in buffers.sessions()]
    elif positions:
        plan = [(k, pos, True) for s, pos in positions for k in buffers.keys_for(s, gone=True)]
    if not live and not plan_all:
        named = {s for s, _ in positions or ()}
        plan += [(k, None, False) for s in flt.sessions if s not in named
                 for k in buffers.keys_for(s)]
    return plan


def unheld_positions(buffers: SessionBuffers, *, plan_all: bool,
                     positions: list[tuple[str, Position | None]] | None,
                     live: bool) -> dict[str, Position] | None:
    """The resume positions (session -> asked position) of sessions the
    relay holds nothing of, not even a remembered eviction: replay cannot
    say whether they predate what it holds, so a live subscription waits
    for each one's first later event (:meth:`.fanout.Fanout.add`; AEP-0003
    §3.3 item 3, §5). A session named twice keeps its earliest position.
    ``None`` when there are none, for replay-all (which names no position)
    and for replay-only requests (nothing live follows)."""
    if plan_all or not positions or not live:
        return None
    out: dict[str, Position] = {}
    for s, pos in positions:
        if pos is not None and not buffers.keys_for(s, gone=True):
            old = out.get(s)
            out[s] = pos if old is None or pos < old else old
    return out or None


class ReplayJob:
    """Buffered replay for one subscription, rendered lazily in chunks.

    ``plan``: see :data:`Plan`. Only entries admitted at or before ``cutoff``
    are served; later ones reach the subscriber live. ``render(entry,
    ceiling)`` gives the entry's :class:`~.outlet.View` at the
    subscription's ceiling (the relay's down-leveling). ``tail`` is
    rendered after the last chunk (SSE ``: replay-complete`` for ``live=0``)."""

    CHUNK = 256  # rendered events per chunk
    SCAN = 4096  # entries examined per chunk (a narrow filter over a big buffer)
    #: event bytes rendered per chunk (past it the chunk ends after its event):
    #: a render below the event's capture parses and re-encodes it, and 8
    #: subscribers replaying 8 events of 4 MB at ``capture=metadata`` held
    #: the loop 3.6 s in one chunk each (a twelfth outside attack, issue 25)
    CHUNK_BYTES = YIELD_BYTES

    def __init__(self, buffers: SessionBuffers, render: Callable[[Entry, str | None], View],
                 sub: Subscriber, plan: Plan, cutoff: int, tail: list[Any] | None = None,
                 gate: Any = None) -> None:
        self.buffers = buffers
        self.render = render
        #: held while a chunk renders (:attr:`.fanout.Fanout.render_gate`, relay-wide)
        self.gate = gate if gate is not None else trio.Lock()
        self.sub = sub
        self.plan = deque(plan)
        self.cutoff = cutoff
        self.tail = tail
        self._cur: deque[Held] = deque()

    def next_chunk(self) -> list[Any] | None:
        """The next payloads (at most :attr:`CHUNK`, after scanning at most
        :attr:`SCAN` entries): ``[]`` when a slice matched nothing but more
        remains, ``None`` when the replay is done."""
        if not self.sub.active:  # replaced or ended: nothing more to replay
            return None
        out: list[Any] = []
        outlet = self.sub.outlet
        scanned = work = 0
        while len(out) < self.CHUNK and scanned < self.SCAN and work < self.CHUNK_BYTES:
            if not self._cur:
                if not self.plan:
                    break
                key, after, mark = self.plan.popleft()
                entries, exhausted, earliest = self.buffers.held_after(key, after)
                if exhausted and mark and earliest is not None:
                    out.append(exhausted_marker(self.sub, key[1], earliest))
                self._cur = deque(entries)
                continue
            h = self._cur.popleft()
            scanned += 1
            if h[4] > self.cutoff:  # admitted after the cut (n): live delivers it
                continue
            e = Entry.from_held(h)
            if not self.sub.filter.matches(e.attrs):
                continue
            view = self.render(e, self.sub.ceiling)
            work += len(e.raw)
            if outlet.kind == "sse":
                out.append(view.sse())
            else:
                out.append(view.text())
                outlet.mark_delivered(self.sub.sid, e.attrs["session"], e.pos)  # type: ignore[arg-type]
        if not out:
            if self._cur or self.plan:
                return out  # budget spent on non-matching entries; more to scan
            if self.tail is not None:
                tail, self.tail = self.tail, None
                return tail
            return None
        return out
