"""Per-session bounded replay buffers (AEP-0003 §5, docs/relay.md
"Ingest, buffer, fan-out").

- One buffer per emitter session, keyed ``(source, session)``
  (:data:`BufKey`): session identity is emitter-scoped (AEP-0001 §5.2), so
  another emitter posting under the same ``session`` string has a buffer
  of its own and can neither evict nor reorder a bridge's history. Bare
  session names (``from``, ``Last-Event-ID``, filters) address every
  buffer holding that name (:meth:`SessionBuffers.keys_for`).
- Admission dedupes on ``(source, id)`` (AEP-0001 §7.4); live fan-out is the
  caller's business and forwards duplicates as received.
- One ``(epoch, seq)`` position holds one event (AEP-0001 §7 rule 2): a
  different event claiming a held position is an emitter fault the caller
  refuses (:meth:`SessionBuffers.conflict`).
- Entries are kept in ``(epoch, seq)`` order: appended when in order (the
  common case), insert-sorted otherwise (backfill).
- Each buffer holds at most ``depth`` entries (``AEP_BUFFER``) and at most
  ``buffer_bytes`` (``AEP_BUFFER_BYTES``), trimming oldest first; at most
  ``max_sessions`` buffers are held (``AEP_MAX_SESSIONS``), evicting one
  in the order of :mod:`.pins` (the least recently *written* of the open
  kind first, fleet buffers after them, buffers holding an open ask last);
  all buffers together hold at most ``total_bytes``
  (``AEP_BUFFER_TOTAL_BYTES``), trimming the buffer that order names oldest
  first (dropping it once empty). An event bigger than ``buffer_bytes`` is
  fanned out live but never held.
- What was dropped is remembered (the highest dropped position per buffer,
  and per wholly evicted buffer, at most ``max_sessions`` of those), so a
  resume from before it gets ``replay-exhausted`` instead of silence.

What a buffer holds per event is one flat :data:`Held` tuple of atomic
values (the wire bytes, ranks, position, the envelope attribute values,
and a shared tuple of their names), not the :class:`Entry` object, a dict
or nested tuples: CPython's collector stops tracking a tuple of atomic
values at the first young collection that sees it (a tuple holding a dict
stays tracked for good; one holding fresh tuples needs a second pass),
so tens of thousands of held events cost a collection nothing (an
``Entry`` per held event was one tracked object each, walked by every
collection that reached it: on the fleet's OTLP path the young and full
collections walking the buffers cost ~1-4 us per record, issue 11).
Readers get :class:`Entry` objects rebuilt from them (:meth:`Entry.from_held`).

The parts: :mod:`.entry` (the :class:`Entry`, :data:`Held`, the accounted
size, content equality), :mod:`.ring` (one buffer's state) and
:mod:`.stamped` (the stamped-append fast path, a mixin); this module is
the :class:`SessionBuffers` over them: the lookups, admission, the
byte accounting and eviction, and the replay reads. Every name above is
importable from here.

Pure data structure: no I/O, no clocks. Memory is bounded by
``total_bytes`` (accounted per entry as its compact JSON plus
:data:`ENTRY_OVERHEAD` for the envelope attributes and bookkeeping; an
approximation measured on typical events) and by ``depth * max_sessions``
entries."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Iterator, Sequence

from .entry import ENTRY_OVERHEAD, BufKey, Entry, Held, MiB, Position, same_event, same_json
from .pins import PIN_TYPES, Evictions
from .ring import SessionRing
from .stamped import AppendFault, StampedAppends

__all__ = ["SessionBuffers", "Entry", "Held", "Position", "BufKey", "ENTRY_OVERHEAD", "MiB",
           "same_event", "same_json", "AppendFault"]


class SessionBuffers(StampedAppends, Evictions):
    """All replay buffers of one relay, keyed ``(source, session)``.

    ``bytes``: accounted bytes held in all buffers. ``counters``:
    ``duplicates`` (admissions refused on ``(source, id)``), ``trimmed``
    (entries dropped by the per-buffer depth), ``trimmed_bytes`` (entries
    dropped by a byte budget), ``sessions_evicted`` (whole buffers dropped
    by the buffer cap or the total byte budget; by kind
    ``sessions_evicted_open``, ``sessions_evicted_fleet``,
    ``sessions_evicted_pinned``) and ``pins_released`` (:mod:`.pins`). Raises ``ValueError`` for
    a size below 1 or ``total_bytes < buffer_bytes``."""

    def __init__(self, depth: int = 10_000, max_sessions: int = 500, *,
                 buffer_bytes: int = 8 * MiB, total_bytes: int = 256 * MiB) -> None:
        if depth < 1 or max_sessions < 1 or buffer_bytes < 1:
            raise ValueError("depth, max_sessions and buffer_bytes must be >= 1")
        if total_bytes < buffer_bytes:
            raise ValueError("total_bytes must be >= buffer_bytes")
        self.depth = depth
        self.max_sessions = max_sessions
        self.buffer_bytes = buffer_bytes
        self.total_bytes = total_bytes
        self.bytes = 0
        self._sessions: OrderedDict[BufKey, SessionRing] = OrderedDict()
        self._names: dict[str, dict[BufKey, None]] = {}  # session name -> its buffers
        # source -> its buffers: a source need not name one session (AEP-0001
        # §5.1 #6 only recommends .../session/{session}), and (source, id) is
        # the identity whatever the session (§7)
        self._sources: dict[str, dict[BufKey, None]] = {}
        # wholly dropped buffers: key -> highest position dropped (bounded)
        self._gone: OrderedDict[BufKey, Position] = OrderedDict()
        self._gone_names: dict[str, dict[BufKey, None]] = {}
        self.counters = {"duplicates": 0, "trimmed": 0, "trimmed_bytes": 0, "sessions_evicted": 0}
        self._init_orders(max_sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def _sessions_ring(self, key: BufKey) -> SessionRing:
        return self._sessions[key]

    def __contains__(self, session: object) -> bool:
        """A buffer key, or a bare session name held by any emitter."""
        return session in self._sessions if isinstance(session, tuple) else session in self._names

    def sessions(self) -> list[BufKey]:
        """Held buffer keys, least recently written first."""
        return list(self._sessions)

    def keys_for(self, session: str, *, gone: bool = False) -> list[BufKey]:
        """Every held buffer of the bare session name ``session`` (one per
        emitter that used it); with ``gone``, also the remembered wholly
        dropped ones (a resume position must hear that they are gone)."""
        keys = list(self._names.get(session) or ())
        if gone:
            keys += [k for k in self._gone_names.get(session) or () if k not in self._sessions]
        return keys

    def held(self, session: str | BufKey) -> int:
        """Entries held for a buffer key, or summed over a bare name's buffers."""
        keys = [session] if isinstance(session, tuple) else self.keys_for(session)
        return sum(len(self._sessions[k]) for k in keys if k in self._sessions)

    def conflict(self, entry: Entry) -> bool:
        """Whether a *different* event (another ``(source, id)``) already holds
        ``entry``'s ``(epoch, seq)`` in its buffer (AEP-0001 §7 rule 2: an
        emitter fault). A redelivery of the same event is no conflict."""
        s = self._sessions.get(entry.bkey)
        pos = entry.pos
        if s is None or pos is None or not s.keys or pos > s.keys[-1] or entry.key[1] in s.ids:
            return False
        i = bisect_left(s.keys, pos, lo=s.start)
        return i < len(s.keys) and s.keys[i] == pos

    def fresh(self, entry: Entry) -> bool:
        """Whether the sequenced ``entry`` is past everything its buffer holds
        and its ``(source, id)`` is not held: then it is neither a
        :meth:`conflict` nor a :meth:`conflicting_duplicate` (one lookup for
        the common case of an emitter appending)."""
        s = self._sessions.get(entry.bkey)
        if s is None:
            return entry.bkey[0] not in self._sources  # no other session holds the source
        if len(self._sources[entry.bkey[0]]) > 1:
            return False  # a source over several sessions: the full checks
        keys = s.keys
        return (not keys or entry.pos > keys[-1]) and entry.key[1] not in s.ids  # type: ignore[operator]

    def held_ids(self, key: BufKey) -> dict[str, Held] | None:
        """The ``id`` values the buffer ``key`` holds (its source is
        ``key[0]``: a read-only view for lookups), ``None`` when it holds no
        buffer."""
        s = self._sessions.get(key)
        return s.ids if s is not None else None

    def held_duplicate(self, entry: Entry) -> Entry | None:
        """The held entry with ``entry``'s ``(source, id)``, if any (admission
        keeps the first, AEP-0001 §7 rule 4)."""
        s = self._sessions.get(entry.bkey) if entry.pos is not None else None
        h = s.ids.get(entry.key[1]) if s is not None else None
        return Entry.from_held(h) if h is not None else None

    def conflicting_duplicate(self, entry: Entry) -> bool:
        """Whether a held event has ``entry``'s ``(source, id)`` but other
        content (issue 10 #14): refused ``invalid-event``, never delivered.
        A byte-identical (or key-order-only different) redelivery is not."""
        if entry.pos is None:
            return False
        s = self._sessions.get(entry.bkey)
        h = s.ids.get(entry.key[1]) if s is not None else None
        if h is None:
            # the same (source, id) held under another session of the source:
            # other content by construction (its session differs)
            for key in self._sources.get(entry.bkey[0], ()):
                if key != entry.bkey and entry.key[1] in self._sessions[key].ids:
                    return True
            return False
        return not same_event(h[1], entry.raw)

    # -- dropping ------------------------------------------------------------
    def _trim(self, s: SessionRing) -> None:
        """Drop the oldest entry of ``s``."""
        start = s.start
        entries = s.entries
        h = entries[start]
        s.ids.pop(h[9], None)
        if s.asks:
            self._settled(s, h[9])
        entries[start] = None  # type: ignore[call-overload]  # release now
        size = h[5]
        s.bytes -= size
        self.bytes -= size
        pos = s.keys[start]
        dropped = s.dropped
        if dropped is None or pos > dropped:
            s.dropped = pos
        start += 1
        s.start = start
        if start > 1024 and start * 2 > len(entries):
            del entries[:start]
            del s.keys[:start]
            s.start = 0

    def _bury(self, key: BufKey) -> None:
        """Drop the buffer ``key`` whole, remembering the highest position it
        held or dropped (for ``replay-exhausted``)."""
        s = self._sessions.pop(key)
        self._delist(s)
        self.bytes -= s.bytes
        names = self._names.get(key[1])
        if names is not None:
            names.pop(key, None)
            if not names:
                del self._names[key[1]]
        shared = self._sources.get(key[0])
        if shared is not None:
            shared.pop(key, None)
            if not shared:
                del self._sources[key[0]]
        marks = [p for p in (s.keys[-1] if len(s) else None, s.dropped) if p is not None]
        if not marks:
            return
        self._gone[key] = max(marks)
        self._gone.move_to_end(key)
        self._gone_names.setdefault(key[1], {})[key] = None
        if len(self._gone) > self.max_sessions:
            old, _ = self._gone.popitem(last=False)
            self._forget(old)

    def _forget(self, key: BufKey) -> None:
        names = self._gone_names.get(key[1])
        if names is not None:
            names.pop(key, None)
            if not names:
                del self._gone_names[key[1]]

    # -- admission -----------------------------------------------------------
    def admit(self, entry: Entry, fleet: bool = False) -> bool:
        """Buffer a sequenced session event (``fleet``: an authenticated
        fleet bridge's, :mod:`.pins`). Returns ``False`` (nothing
        stored) for a ``(source, id)`` already held in that buffer. The
        caller refuses :meth:`conflict` entries first (not re-checked).
        ``True`` means admitted, even when a byte budget trimmed it away at
        once (too big to hold: it was fanned out live, replay announces it
        as dropped)."""
        key = entry.bkey
        pos = entry.pos
        assert pos is not None, "only sequenced session events are buffered"
        s = self._sessions.get(key)
        if s is None:
            if len(self._sessions) >= self.max_sessions:
                old = self._victim()
                self._evict(old, self._sessions[old])
            dropped = self._gone.pop(key, None)
            if dropped is not None:
                self._forget(key)
            s = self._sessions[key] = SessionRing(dropped, key)
            self._enlist(s, fleet)
            self._names.setdefault(key[1], {})[key] = None
            self._sources.setdefault(key[0], {})[key] = None
        elif entry.key[1] in s.ids:
            self.counters["duplicates"] += 1
            return False
        else:
            self._sessions.move_to_end(key)  # recency = last buffered write
            s.order.move_to_end(key)  # type: ignore[union-attr]  # (a held buffer has one)
            if fleet and not s.fleet:
                self._promote(s)
        h = s.ids[entry.key[1]] = entry.held()
        entries, keys = s.entries, s.keys
        if not keys or pos >= keys[-1]:
            entries.append(h)
            keys.append(pos)
        else:  # backfill: insert-sort (rare)
            i = bisect_right(keys, pos, lo=s.start)
            entries.insert(i, h)
            keys.insert(i, pos)
        if entry.attrs["type"] in PIN_TYPES:
            self._mark(s, entry.attrs)
        size = entry.size
        s.bytes += size
        self.bytes += size
        # len(s) spelled out below: the hot path (one call per admission)
        # pays no method call for it; _trim stays the one way to drop
        depth = self.depth
        if len(entries) - s.start > depth:
            counters = self.counters
            while len(s.entries) - s.start > depth:
                self._trim(s)
                counters["trimmed"] += 1
        if s.bytes > self.buffer_bytes:
            while s.bytes > self.buffer_bytes:
                self._trim(s)
                self.counters["trimmed_bytes"] += 1
            if len(s) == 0:
                self._bury(key)
        while self.bytes > self.total_bytes:  # in the eviction order (.pins), oldest first
            victim_key = self._victim()
            victim = self._sessions[victim_key]
            self._trim(victim)
            self.counters["trimmed_bytes"] += 1
            if len(victim) == 0:
                self._evict(victim_key, victim)
        return True

    def admit_run(self, run: Sequence[Entry]) -> None:
        """:meth:`admit` for each of the sequenced entries ``run``, in order,
        in one call (a POSTed chunk, an emitter appending). A stretch of
        entries :meth:`admit` would simply append to one existing buffer
        (its position at or past the buffer's last, its ``(source, id)``
        not held, the stretch within both byte budgets before any trim, so
        no byte budget can trim during it) is appended in one step: the
        buffer moved to the recent end once, then the depth trimmed once
        for the whole stretch (the same oldest entries :meth:`admit` trims
        one by one). Every other entry takes :meth:`admit`. Equal to one
        :meth:`admit` per entry (property test
        ``tests/unit/relay/test_relay_runs.py``); the verdicts are not
        returned (the relay's runs do not read them)."""
        i, n = 0, len(run)
        sessions = self._sessions
        while i < n:
            e = run[i]
            key = e.bkey
            s = sessions.get(key)
            if s is None:
                self.admit(e)  # a new buffer (and maybe an eviction): the general path
                i += 1
                continue
            ids, entries, keys = s.ids, s.entries, s.keys
            room = min(self.buffer_bytes - s.bytes, self.total_bytes - self.bytes)
            last = keys[-1] if keys else None
            added = 0
            j = i
            h = None
            while j < n:
                e = run[j]
                pos: Position = e.pos  # type: ignore[assignment]  # sequenced
                k = e.key[1]
                size = e.size
                if e.bkey != key or (last is not None and pos < last) \
                        or k in ids or added + size > room or e.attrs["type"] in PIN_TYPES:
                    break
                h = ids[k] = e.held(h)
                entries.append(h)
                keys.append(pos)
                last = pos
                added += size
                j += 1
            if j == i:
                self.admit(e)  # a duplicate, a backfill, a byte trim, a pin: the general path
                i += 1
                continue
            sessions.move_to_end(key)  # recency = last buffered write
            s.order.move_to_end(key)  # type: ignore[union-attr]
            s.bytes += added
            self.bytes += added
            over = len(entries) - s.start - self.depth
            if over > 0:
                self._trim_many(s, over)
                self.counters["trimmed"] += over
            i = j

    def _trim_many(self, s: SessionRing, count: int) -> None:
        """:meth:`_trim` ``count`` times (the oldest ``count`` entries of ``s``)."""
        start = s.start
        stop = start + count
        entries, ids = s.entries, s.ids
        freed = 0
        for x in range(start, stop):
            h = entries[x]
            ids.pop(h[9], None)
            if s.asks:
                self._settled(s, h[9])
            freed += h[5]
            entries[x] = None  # type: ignore[call-overload]  # release now
        s.bytes -= freed
        self.bytes -= freed
        pos = s.keys[stop - 1]  # the highest trimmed: keys are in order
        dropped = s.dropped
        if dropped is None or pos > dropped:
            s.dropped = pos
        s.start = stop
        if stop > 1024 and stop * 2 > len(entries):
            del entries[:stop]
            del s.keys[:stop]
            s.start = 0

    def replay_after(self, key: BufKey, after: Position | None
                     ) -> tuple[list[Entry], bool, Position | None]:
        """:meth:`held_after` with the entries rebuilt (:meth:`Entry.from_held`)."""
        held, exhausted, earliest = self.held_after(key, after)
        return [Entry.from_held(h) for h in held], exhausted, earliest

    def held_after(self, key: BufKey, after: Position | None
                   ) -> tuple[list[Held], bool, Position | None]:
        """Entries of the buffer ``key`` strictly after ``after`` (all held
        entries when ``after`` is ``None``), in ``(epoch, seq)`` order.

        Returns ``(held, exhausted, earliest)`` (:data:`Held` tuples): ``exhausted`` is true when
        the requested position predates what the buffer holds, i.e. the
        earliest held position is later than the position right after
        ``after`` (events in between may have been evicted or never reached
        this relay): the caller emits ``replay-exhausted`` (§3.3.3, §5).
        Also exhausted when this relay dropped a position after ``after``
        (trimmed, or the whole buffer evicted: then ``entries`` is empty and
        ``earliest`` is the position after the last one dropped). Never
        exhausted for ``after=None`` (replay-all asks for earliest)."""
        s = self._sessions.get(key)
        if s is None:
            hw = self._gone.get(key)
            if hw is None or after is None or not after < hw:
                return [], False, None
            # wholly dropped: "earliest" is the first position after what is gone
            return [], True, (hw[0], hw[1] + 1)
        earliest = s.earliest()
        if after is None:
            return s.entries[s.start:], False, earliest
        i = bisect_right(s.keys, after, lo=s.start)
        exhausted = earliest is not None and (earliest > (after[0], after[1] + 1) or (
            s.dropped is not None and after < s.dropped))
        return s.entries[i:], exhausted, earliest

    def iter_entries(self, session: str | BufKey) -> Iterator[Entry]:
        """Held entries of a buffer key, or of every buffer of a bare name."""
        keys = [session] if isinstance(session, tuple) else self.keys_for(session)
        for k in keys:
            s = self._sessions.get(k)
            if s is not None:
                for h in s.entries[s.start:]:
                    yield Entry.from_held(h)
