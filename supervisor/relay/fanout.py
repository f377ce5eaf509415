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
from collections import OrderedDict
from typing import Any, Callable, Sequence

import trio

from bridges.core import capture as _capture
from bridges.core.aep import CAPTURE_LEVELS, CAPTURE_RANK, dumps

from .attrmatch import Filter
from .buffer import Entry, Held, Position
from .outlet import EventItem, Outlet, RunItem, Subscriber, exhausted_marker

__all__ = ["RENDER_CACHE_BYTES", "Fanout", "View", "downlevel_raw", "sse_safe", "sse_message"]

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
#: the longest key memoized (4,096 keys of 4 KiB sessions were 32 MiB kept
#: outside the buffer budget: an eighth outside attack's finding 4)
_MAX_MEMO_KEY = 256
#: a rank above every capture level (no ceiling: everything as ingested)
_ABOVE_ALL = len(CAPTURE_LEVELS)


def _memo(table: dict[str, bytes], key: str, value: bytes) -> bytes:
    if len(key) > _MAX_MEMO_KEY:  # bounded in bytes too: a 4 KiB session is not kept
        return value
    if len(table) >= _MAX_MEMO:
        table.clear()
    table[key] = value
    return value


def sse_message(e: Entry, raw: bytes) -> bytes:
    """The SSE message (AEP-0003 §3.3.2) carrying ``raw`` as ``e``:
    ``event: {type}``, ``data: {raw}`` and, for a sequenced event whose
    session SSE can carry, ``id: {session}:{epoch}:{seq}``."""
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
            return b"%s%s%s%d:%d\n\n" % (head, raw, ident, pos[0], pos[1])
    return head + raw + b"\n\n"


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
            self._sse = sse_message(self.entry, self.raw)
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


def _plain_item(e: Entry) -> EventItem:
    """``e``'s SSE message as ingested, as one queue item (:meth:`View.sse_item`)."""
    payload = sse_message(e, e.raw)
    return EventItem(payload, len(payload), e.sev)


def _same_across(entries: Sequence[Entry], key: str, default: Any) -> bool:
    """Whether ``attrs.get(key, default)`` is one value of one type (or
    absent) in every entry."""
    first = entries[0].attrs.get(key, default)
    kind = type(first)
    for e in entries:
        v = e.attrs.get(key, default)
        if v is not first and (type(v) is not kind or v != first):
            return False
    return True


def _held_payloads(held: Sequence[Held]) -> list[bytes]:
    """:func:`sse_message` of each held event (:data:`.buffer.Held`, of one
    layout: ``held[0]``'s attribute names), as :meth:`Entry.from_held` of
    it would give it, without the entry."""
    names = held[0][0]
    at_type = 10 + names.index("type")
    at_session = 10 + names.index("session") if "session" in names else -1
    heads, ids = _HEADS, _IDS
    out: list[bytes] = []
    append = out.append
    session: Any = None
    ident = b""
    for h in held:
        t = h[at_type]
        head = heads.get(t)
        if head is None:
            head = _memo(heads, t, b"event: " + t.encode() + b"\ndata: ")
        if at_session >= 0:
            ses = h[at_session]
            if ses is not session:
                session = ses
                ident = b""
                if type(ses) is str:
                    ident = ids.get(ses)  # type: ignore[assignment]
                    if ident is None:
                        ident = _memo(ids, ses, b"\nid: " + ses.encode() + b":"
                                      if sse_safe(ses) else b"")
        if ident:
            append(b"%s%s%s%d:%d\n\n" % (head, h[1], ident, h[6], h[7]))
        else:
            append(head + h[1] + b"\n\n")
    return out


class _Run:
    """What :meth:`Fanout.offer_run` shares between the subscriptions of
    one run: the as-ingested SSE item of each entry (made once), each
    entry's down-leveled views, the whole run's item list, the highest
    capture rank in it, and which attributes hold one value across it.
    Made from the entries, or from the held tuples of sequenced events
    (:meth:`Fanout.offer_held`): then the entries are made only if
    something asks for them (a stream that takes the whole run as ingested
    and the filters constant across it never do)."""

    __slots__ = ("_entries", "held", "plain", "caches", "top", "_whole", "_same", "_shared",
                 "_uniform")

    def __init__(self, entries: Sequence[Entry] | None, held: Sequence[Held] | None = None) -> None:
        self._entries = entries
        self.held = held
        count = len(entries) if entries is not None else len(held)  # type: ignore[arg-type]
        self.plain: list[EventItem | None] = [None] * count
        self.caches: list[dict[str | None, View] | None] = [None] * count
        self.top = max(e.cap for e in entries) if entries is not None \
            else max(h[3] for h in held)  # type: ignore[union-attr]
        self._whole: tuple[list[EventItem], int] | None = None
        self._same: dict[tuple[str, Any], bool] = {}
        self._shared: RunItem | None = None
        self._uniform: bool | None = None  # held: all of one layout (one names tuple)

    @property
    def entries(self) -> Sequence[Entry]:
        """The run's entries (made once from the held tuples if need be)."""
        if self._entries is None:
            self._entries = [Entry.from_held(h) for h in self.held]  # type: ignore[union-attr]
        return self._entries

    def first_attrs(self) -> dict[str, Any]:
        """The first entry's attributes."""
        if self._entries is not None:
            return self._entries[0].attrs
        h = self.held[0]  # type: ignore[index]
        return dict(zip(h[0], h[10:], strict=True))

    def uniform(self) -> bool:
        """Held: whether every held tuple has the first one's names (then
        an attribute is at one index in all of them)."""
        if self._uniform is None:
            held = self.held
            names = held[0][0]  # type: ignore[index]
            self._uniform = all(h[0] is names for h in held)  # type: ignore[union-attr]
        return self._uniform

    def whole(self) -> tuple[list[EventItem], int]:
        """Every entry's as-ingested SSE item, in order, and their total size."""
        if self._whole is None:
            items = []
            size = 0
            plain = self.plain
            for i, e in enumerate(self.entries):
                item = plain[i]
                if item is None:
                    item = plain[i] = _plain_item(e)
                items.append(item)
                size += item.size
            self._whole = items, size
        return self._whole

    def shared(self) -> RunItem:
        """Every entry as ingested, as one queue item (:meth:`whole`'s
        items, made only if something asks for them), the same for every
        stream that queues all of it (its payloads joined once for all)."""
        if self._shared is None:
            if self._whole is not None:
                self._shared = RunItem(*self._whole)
            elif self._entries is None and self.uniform():
                held = self.held
                payloads = _held_payloads(held)  # type: ignore[arg-type]
                self._shared = RunItem(None, sum(map(len, payloads)), payloads=payloads,
                                       sevs=[h[2] for h in held])  # type: ignore[union-attr]
            else:
                entries = self.entries
                payloads = [sse_message(e, e.raw) for e in entries]
                self._shared = RunItem(None, sum(map(len, payloads)), payloads=payloads,
                                       sevs=[e.sev for e in entries])
        return self._shared

    def constant(self, flt: Filter) -> bool:
        """Whether ``flt`` gives every entry the verdict it gives the first:
        each attribute it reads (:attr:`Filter.keys`, defaults applied) is
        one value of one type, or absent, across the run (``True == 1`` in
        Python, not in attr-match)."""
        same = self._same
        for key, default in flt.keys:
            verdict = same.get((key, default))
            if verdict is None:
                if self._entries is None and self.uniform():
                    verdict = _same_held(self.held, key)  # type: ignore[arg-type]
                else:
                    verdict = _same_across(self.entries, key, default)
                same[key, default] = verdict
            if not verdict:
                return False
        return True


def _same_held(held: Sequence[Held], key: str) -> bool:
    """:func:`_same_across` for held tuples of one layout: ``key`` is at one
    index in each (absent from all: the default in each, one value)."""
    names = held[0][0]
    if key not in names:
        return True
    at = 10 + names.index(key)
    first = held[0][at]
    kind = type(first)
    for h in held:
        v = h[at]
        if v is not first and (type(v) is not kind or v != first):
            return False
    return True


RENDER_CACHE_BYTES = 64 << 20
"""Bytes of replay renders :meth:`Fanout.render` keeps for other replays
(each view counted at three times its JSON: raw, SSE and WebSocket forms)."""


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
        #: replays render one chunk at a time, relay-wide (:class:`.replay.ReplayJob`):
        #: 32 subscribers each re-rendering an event of 7.7 MB in one scheduling round
        #: held the loop 3-9 s and gated hooks failed open (a thirteenth outside attack)
        self.render_gate = trio.Lock()
        #: replay renders shared by every subscription (:meth:`render`), least
        #: recently used first, at most :data:`RENDER_CACHE_BYTES`
        self._renders: OrderedDict[tuple[Any, ...], tuple[View, int]] = OrderedDict()
        self._render_bytes = 0
        #: in subscription order (a dict: fan-out order is the same run to run)
        self._subs: dict[Subscriber, None] = {}
        self._snapshot: tuple[Subscriber, ...] = ()  # iterated by offer(): safe to mutate the set
        #: session -> subscriber -> the position it resumes after
        self._pending: dict[str, dict[Subscriber, Position]] = {}

    def __len__(self) -> int:
        return len(self._subs)

    def add(self, sub: Subscriber, pending: dict[str, Position] | None = None) -> None:
        """Deliver live events to ``sub`` from now on; ``pending``: its
        resume positions of sessions the relay holds nothing of (class
        docstring)."""
        self._subs[sub] = None
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
            del self._subs[sub]
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
                self._subs.pop(sub, None)
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
        """``e`` rendered at ``ceiling`` for a replay: a sequenced event's
        view is shared by the replays that render it meanwhile (the last
        :data:`RENDER_CACHE_BYTES` of views), so N subscribers replaying the
        same events below their capture parse and re-encode each once."""
        if e.pos is None:
            return self.view(e, ceiling, {})
        eff = None if ceiling is None or CAPTURE_RANK[ceiling] >= e.cap else ceiling
        key = (e.attrs["session"], e.pos, e.attrs.get("id"), eff)
        hit = self._renders.get(key)
        if hit is not None:
            self._renders.move_to_end(key)
            return hit[0]
        v = self.view(e, ceiling, {})
        cost = 3 * len(v.raw)  # the raw form, the SSE message and the WS text at most
        if cost <= RENDER_CACHE_BYTES:
            self._renders[key] = (v, cost)
            self._render_bytes += cost
            while self._render_bytes > RENDER_CACHE_BYTES:
                _, (_, gone) = self._renders.popitem(last=False)
                self._render_bytes -= gone
        return v

    def _downlevel_failed(self, exc: Exception) -> None:
        self.counters["downlevel_errors"] += 1
        log.error("relay: downlevel failed (%s); delivering the envelope without data",
                  type(exc).__name__)

    def offer_run(self, entries: Sequence[Entry]) -> None:
        """:meth:`offer` for each of ``entries`` in order, in one call (a
        POSTed chunk): what every outlet queues, drops and counts is what
        one :meth:`offer` per entry gives (property test
        ``tests/unit/relay/test_relay_runs.py``). An SSE stream has one
        subscription, so its events are collected per subscription (the
        as-ingested SSE item made once per entry and shared, as
        :meth:`offer` shares it) and queued with one
        :meth:`Outlet.offer_many`. A filter whose attributes hold one value
        (type and value) across the run gives one verdict for all of it,
        so it is asked once (a run comes from one emitter; the streams
        filtering on another session or agent cost one check a run, not
        one an event). A WebSocket's subscriptions share its outlet, so
        they take the entries one by one as :meth:`offer` does. While a
        resume position waits (``replay-exhausted`` must precede the event
        on every outlet) each entry takes :meth:`offer`."""
        if self._pending or len(entries) < 2:
            for e in entries:
                self.offer(e)
            return
        if self._snapshot:
            self._offer_run(_Run(entries))

    def offer_held(self, held: Sequence[Held]) -> None:
        """:meth:`offer_run` for the entries the held tuples ``held``
        (:data:`.buffer.Held`: sequenced events, e.g. appended to one buffer
        by :meth:`.buffer.SessionBuffers.append_stamped`) were made from
        (:meth:`Entry.from_held`), made only if something asks for them: an
        SSE stream whose filter is constant across the run and which takes
        all of it as ingested gets the SSE messages made from the held
        tuples (property test ``tests/unit/relay/test_append_stamped.py``)."""
        if self._pending or len(held) < 2:
            for h in held:
                self.offer(Entry.from_held(h))
            return
        if self._snapshot:
            self._offer_run(_Run(None, held))

    def _offer_run(self, run: _Run) -> None:
        """:meth:`offer_run`'s fan-out of ``run`` to the live subscriptions."""
        subs = self._snapshot
        shared: list[Subscriber] = []
        for sub in subs:
            if sub.outlet.kind == "sse":
                self._offer_run_sse(sub, run)
            else:
                shared.append(sub)  # several subscriptions, one outlet: entry by entry
        if shared:
            for i, e in enumerate(run.entries):
                cache = run.caches[i]
                self._offer_to(shared, e, cache if cache is not None else {})

    def _offer_run_sse(self, sub: Subscriber, run: _Run) -> None:
        """The run to one SSE stream (:meth:`offer_run`)."""
        outlet = sub.outlet
        out: list[EventItem] = []
        size = 0
        try:
            flt, ceiling = sub.filter, sub.ceiling
            rank = _ABOVE_ALL if ceiling is None else CAPTURE_RANK[ceiling]
            every = run.constant(flt)  # one verdict for the whole run
            if every:
                if not flt.matches(run.first_attrs()):
                    return
                if rank >= run.top:  # all of it as ingested: one list for every such stream
                    try:
                        shared = run.shared()
                    except Exception:  # noqa: BLE001 -- one that cannot be rendered: event by
                        shared = None  # event below, what precedes it queued, then the shed
                    if shared is not None:
                        outlet.offer_many(None, shared.size, shared)
                        return
            entries = run.entries
            matches, plain, caches = flt.matches, run.plain, run.caches
            for i, e in enumerate(entries):
                if every or matches(e.attrs):
                    if rank >= e.cap:
                        item = plain[i]
                        if item is None:
                            item = plain[i] = _plain_item(e)
                    else:
                        cache = caches[i]
                        if cache is None:
                            cache = caches[i] = {}
                        item = self.view(e, ceiling, cache).sse_item()
                    out.append(item)
                    size += item.size
        except Exception as exc:  # noqa: BLE001 -- as offer(): shed after what came before
            if out:
                outlet.offer_many(out, size)
            self._shed(sub, exc)
            return
        if out:
            outlet.offer_many(out, size)

    def _offer_to(self, subs: Sequence[Subscriber], e: Entry, cache: dict[str | None, View]) -> None:
        """``e`` to each of ``subs`` whose filter matches (views from ``cache``)."""
        attrs = e.attrs
        for sub in subs:
            try:
                if sub.filter.matches(attrs):
                    sub.offer(self.view(e, sub.ceiling, cache))
            except Exception as exc:  # noqa: BLE001 -- never abort an ingest half-way
                self._shed(sub, exc)

    def _shed(self, sub: Subscriber, exc: Exception) -> None:
        """A fan-out to ``sub`` failed: counted, logged, its outlet terminated."""
        self.counters["fanout_errors"] += 1
        log.error("relay: fan-out to a %s subscriber failed (%s); shedding it",
                  sub.outlet.kind, type(exc).__name__)
        sub.outlet.terminate("internal-error")

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
            try:
                if not sub.filter.matches(attrs):
                    continue
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
                self._shed(sub, exc)
