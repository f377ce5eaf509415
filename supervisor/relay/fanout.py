"""Live fan-out (AEP-0003 §5, §6.4; ``docs/relay.md`` "Ingest, buffer,
fan-out"): the set of live subscriptions, and one event offered to every
subscription whose filter matches it, rendered once per capture ceiling
(:class:`View`: the SSE message, AEP-0003 §3.3.2, and the WS frame) and
shared by reference among the subscribers that get it.

A subscriber that fails is shed (its outlet terminated) and the fan-out
goes on: an ingest is never aborted half-way (a batch is accepted whole).
Down-leveling fails closed (:func:`downlevel_raw`). No I/O."""
from __future__ import annotations

import json
import logging
from typing import Callable

from bridges.core import capture as _capture
from bridges.core.aep import CAPTURE_LEVELS, CAPTURE_RANK, dumps

from .buffer import Entry, Position
from .outlet import EventItem, Outlet, Subscriber, exhausted_marker

__all__ = ["Fanout", "View", "downlevel_raw", "sse_safe"]

log = logging.getLogger("aep.relay")


def sse_safe(s: str) -> bool:
    """Whether ``s`` can be written into an SSE field (no line breaks, no NUL)."""
    return "\n" not in s and "\r" not in s and "\0" not in s


# -- rendered views -------------------------------------------------------------

#: memoized SSE framing: ``type -> b"event: {type}\ndata: "`` and ``session ->
#: b"\nid: {session}:"`` (``b""`` for a name SSE cannot carry); bounded
_HEADS: dict[str, bytes] = {}
_IDS: dict[str, bytes] = {}
_MAX_MEMO = 4096


def _memo(table: dict[str, bytes], key: str, value: bytes) -> bytes:
    if len(table) >= _MAX_MEMO:
        table.clear()
    table[key] = value
    return value


class View:
    """One event rendered at one capture ceiling: ``raw`` (compact JSON bytes),
    ``sse()`` (the whole SSE message, AEP-0003 §3.3.2) and ``text()`` (the WS
    frame); each computed once and shared by every subscriber."""

    __slots__ = ("entry", "raw", "_sse", "_text", "_sse_item")

    def __init__(self, entry: Entry, raw: bytes) -> None:
        self.entry = entry
        self.raw = raw
        self._sse: bytes | None = None
        self._text: str | None = None
        self._sse_item: EventItem | None = None

    def sse_item(self) -> EventItem:
        """The SSE message as one queue item, shared by every stream."""
        if self._sse_item is None:
            payload = self.sse()
            self._sse_item = EventItem(payload, len(payload), self.entry.sev)
        return self._sse_item

    def sse(self) -> bytes:
        if self._sse is None:
            e = self.entry
            attrs = e.attrs
            t = attrs["type"]
            head = _HEADS.get(t)
            if head is None:
                head = _memo(_HEADS, t, b"event: " + t.encode() + b"\ndata: ")
            session = attrs.get("session")
            pos = e.pos
            # agent-scoped and seq-less events carry no id: they are not
            # resumable positions; a session name that would break SSE
            # framing is never written into a field
            if pos is not None and type(session) is str:
                ident = _IDS.get(session)
                if ident is None:
                    ident = _memo(_IDS, session, b"\nid: " + session.encode() + b":"
                                  if sse_safe(session) else b"")
                if ident:
                    self._sse = b"%s%s%s%d:%d\n\n" % (head, self.raw, ident, pos[0], pos[1])
                    return self._sse
            self._sse = head + self.raw + b"\n\n"
        return self._sse

    def text(self) -> str:
        if self._text is None:
            self._text = self.raw.decode("utf-8")
        return self._text


def downlevel_raw(e: Entry, ceiling: str, on_error: Callable[[Exception], None]) -> bytes:
    """``e``'s wire form mechanically down-leveled to ``ceiling`` (AEP-0003
    §6.4, :func:`bridges.core.capture.downlevel`). A command carrying more
    than it declares is down-leveled from what it carries. Fails closed:
    when down-leveling raises, ``on_error(exc)`` is told and the envelope
    goes without ``data``, never above the ceiling."""
    ev = json.loads(e.raw)
    if CAPTURE_RANK[ev.get("capture", "metadata")] < e.cap:
        ev["capture"] = CAPTURE_LEVELS[e.cap]
    try:
        return dumps(_capture.downlevel(ev, ceiling))
    except Exception as exc:  # noqa: BLE001 -- fail closed: never above the ceiling
        on_error(exc)
        ev.pop("data", None)
        ev["capture"] = "metadata" if ceiling == "redacted" else ceiling
        return dumps(ev)


class Fanout:
    """The relay's live subscriptions. ``counters`` is the relay's counter
    dict (``fanout_errors``, ``downlevel_errors`` and ``replay_exhausted_late``
    are counted into it).

    Resume positions of sessions the relay held nothing of at subscribe
    time (:func:`.replay.unheld_positions`) wait here, per session, for that
    session's first event past them: the exact next one (same epoch, seq
    + 1) resolves it silently; any later one (a gap, a later epoch) first
    queues ``replay-exhausted`` with ``earliest`` = that event's position
    (AEP-0003 §3.3 item 3, §5: the request predates what the relay holds).
    Events at or before the asked position are forwarded as received (live
    fan-out never dedupes, §5) and leave it waiting. Checked once per
    sequenced event whatever its filters say (the verdict is about what the
    relay holds, as replay's is), before any delivery, so the marker
    precedes the event on every outlet; nothing per delivery, nothing at
    all while none waits. Bounded by the subscriptions' ``from`` lists
    (``AEP_MAX_FROM``); dropped with the subscription."""

    def __init__(self, counters: dict[str, int]) -> None:
        self.counters = counters
        counters.setdefault("replay_exhausted_late", 0)
        self._subs: set[Subscriber] = set()
        self._snapshot: tuple[Subscriber, ...] = ()  # iterated by offer(): safe to mutate the set
        #: session -> subscriber -> the position it resumes after
        self._pending: dict[str, dict[Subscriber, Position]] = {}

    def __len__(self) -> int:
        return len(self._subs)

    def add(self, sub: Subscriber, pending: dict[str, Position] | None = None) -> None:
        """Deliver live events to ``sub`` from now on; ``pending``: its
        resume positions of sessions the relay holds nothing of (class
        docstring)."""
        self._subs.add(sub)
        self._snapshot = tuple(self._subs)
        sub.outlet.subs.append(sub)
        if pending:
            sub.pending = dict(pending)
            for session, pos in pending.items():
                self._pending.setdefault(session, {})[sub] = pos

    def _unpend(self, sub: Subscriber) -> None:
        if sub.pending:
            for session in sub.pending:
                waiting = self._pending.get(session)
                if waiting is not None:
                    waiting.pop(sub, None)
                    if not waiting:
                        del self._pending[session]
        sub.pending = None

    def remove(self, sub: Subscriber) -> None:
        """Stop delivering to ``sub`` (what its outlet holds stays queued;
        its replay, if still running, stops: issue 10 #3)."""
        sub.active = False
        self._unpend(sub)
        if sub in self._subs:
            self._subs.discard(sub)
            self._snapshot = tuple(self._subs)
        try:
            sub.outlet.subs.remove(sub)
        except ValueError:
            pass

    def detach(self, outlet: Outlet) -> None:
        """Stop delivering to every subscription feeding ``outlet``."""
        if outlet.subs:
            for sub in outlet.subs:
                sub.active = False
                self._unpend(sub)
                self._subs.discard(sub)
            outlet.subs = []
            self._snapshot = tuple(self._subs)

    @property
    def pending(self) -> int:
        """How many (subscription, session) resume positions wait."""
        return sum(len(w) for w in self._pending.values())

    def _resolve(self, e: Entry, pos: Position) -> None:
        """``e`` (sequenced) against the positions waiting on its session."""
        session = e.attrs["session"]
        waiting = self._pending.get(session)
        if waiting is None:
            return
        for sub, asked in list(waiting.items()):
            if pos <= asked:
                continue  # not past the position yet: forwarded as received, still waiting
            if waiting.pop(sub, None) is None:
                continue  # shed meanwhile: a marker passed its outlet's hard bound
            if sub.pending is not None:
                sub.pending.pop(session, None)
                if not sub.pending:
                    sub.pending = None
            if pos[0] != asked[0] or pos[1] != asked[1] + 1:
                self.counters["replay_exhausted_late"] += 1
                sub.outlet.push_frame(exhausted_marker(sub, session, pos))
        if not waiting and self._pending.get(session) is waiting:
            del self._pending[session]

    def view(self, e: Entry, ceiling: str | None, cache: dict[str | None, View]) -> View:
        """``e`` rendered at ``ceiling`` (mechanical down-level, AEP-0003
        §6.4; ``None`` or a ceiling at or above what ``e`` carries: as
        ingested); ``cache`` holds this event's views for one fan-out."""
        if ceiling is None or CAPTURE_RANK[ceiling] >= e.cap:
            ceiling = None
        v = cache.get(ceiling)
        if v is None:
            v = cache[ceiling] = View(e, e.raw if ceiling is None
                                      else downlevel_raw(e, ceiling, self._downlevel_failed))
        return v

    def render(self, e: Entry, ceiling: str | None) -> View:
        """``e`` rendered at ``ceiling`` on its own (replay: no shared cache)."""
        return self.view(e, ceiling, {})

    def _downlevel_failed(self, exc: Exception) -> None:
        self.counters["downlevel_errors"] += 1
        log.error("relay: downlevel failed (%s); delivering the envelope without data",
                  type(exc).__name__)

    def offer(self, e: Entry) -> None:
        """Offer ``e`` to every matching live subscription (never blocks)."""
        if self._pending and e.pos is not None:
            self._resolve(e, e.pos)
        # the view as ingested (what every subscriber at or above the
        # event's capture gets: the common case) without view()'s cache;
        # a lower ceiling's down-leveled views go through view() as before
        plain: View | None = None
        cache: dict[str | None, View] | None = None
        attrs, cap = e.attrs, e.cap
        for sub in self._snapshot:
            if sub.filter.matches(attrs):
                try:
                    ceiling = sub.ceiling
                    if ceiling is None or CAPTURE_RANK[ceiling] >= cap:
                        if plain is None:
                            plain = View(e, e.raw)
                        sub.offer(plain)
                    else:
                        if cache is None:
                            cache = {}
                        sub.offer(self.view(e, ceiling, cache))
                except Exception as exc:  # noqa: BLE001 -- never abort an ingest half-way
                    # (a batch is accepted whole): that subscriber is shed instead
                    self.counters["fanout_errors"] += 1
                    log.error("relay: fan-out to a %s subscriber failed (%s); shedding it",
                              sub.outlet.kind, type(exc).__name__)
                    sub.outlet.terminate("internal-error")
