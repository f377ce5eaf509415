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
  ``max_sessions`` buffers are held (``AEP_MAX_SESSIONS``), evicting the
  least recently *written* one; all buffers together hold at most
  ``total_bytes`` (``AEP_BUFFER_TOTAL_BYTES``), trimming the least recently
  written buffer oldest first (dropping it once empty). An event bigger
  than ``buffer_bytes`` is fanned out live but never held.
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

Pure data structure: no I/O, no clocks. Memory is bounded by
``total_bytes`` (accounted per entry as its compact JSON plus
:data:`ENTRY_OVERHEAD` for the envelope attributes and bookkeeping; an
approximation measured on typical events) and by ``depth * max_sessions``
entries."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from operator import itemgetter
from typing import Any, Iterator, Sequence

from bridges.core.aep import ACK_TYPES, CAPTURE_RANK, SEVERITY_RANK, is_command_type

__all__ = ["SessionBuffers", "Entry", "Held", "Position", "BufKey", "ENTRY_OVERHEAD", "MiB",
           "same_event", "same_json", "AppendFault"]

MiB = 1 << 20

#: Accounted bytes per held entry beyond its JSON: the envelope attribute
#: dict and its strings, the entry object, list slots and the dedupe key
#: (tracemalloc on typical 300-byte events: ~850 bytes).
ENTRY_OVERHEAD = 1024

Position = tuple[int, int]
"""``(epoch, seq)``; tuples order lexicographically (AEP-0001 §7 rule 3)."""

BufKey = tuple[str, str]
"""``(source, session)``: one emitter's session (AEP-0001 §5.2)."""


Held = tuple  # (names, raw, sev, cap, n, size, epoch, seq, source, id, *values): Entry.held
"""One buffered event: ``(names, raw, sev, cap, n, size, epoch, seq,
source, id, *values)``, the :class:`Entry` fields with ``attrs`` as
``dict(zip(names, values))``: atomic values only, flat (module docstring)."""

#: attribute-name tuples shared by every held event of the same layout (an
#: emitter's events repeat a handful); bounded, past it each keeps its own
_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}
_MAX_NAMES = 4096

#: an envelope's key tuple (``tuple(ev)``) -> its :class:`_Layout`
#: (:meth:`SessionBuffers.append_stamped`); bounded
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}

#: what an append reads from every envelope (a layout without one of them: the one-event path)
_NEEDED = ("type", "source", "session", "seq", "id")

_Layout = tuple  # (names, values, at type, source, session, agent, seq, epoch, id, severity, capture)
"""One envelope key layout: its attribute names (the keys but ``data``,
shared through :data:`_NAMES`), the getter of their values in that order
(``operator.itemgetter``) and the index of each attribute an append reads
in those values (``-1``: absent)."""


def _layout(keys: tuple[str, ...]) -> _Layout | None:
    """``keys``' :data:`_Layout` (remembered in :data:`_LAYOUTS`); ``None``
    when an attribute of :data:`_NEEDED` is missing."""
    names = tuple(k for k in keys if k != "data")
    if any(k not in names for k in _NEEDED):
        return None
    if len(_NAMES) < _MAX_NAMES:
        names = _NAMES.setdefault(names, names)
    at = [names.index(k) if k in names else -1
          for k in ("type", "source", "session", "agent", "seq", "epoch", "id", "severity", "capture")]
    got = (names, itemgetter(*names), *at)
    if len(_LAYOUTS) >= _MAX_NAMES:
        _LAYOUTS.clear()
    _LAYOUTS[keys] = got
    return got


class AppendFault(Exception):
    """:meth:`SessionBuffers.append_stamped` failed part way through the
    append of a pair (the cause is chained): ``taken`` is the index after
    that pair (it and every pair before it from ``start`` were admitted:
    buffered, the failing one perhaps not whole), ``n`` the admission
    counter after them, ``held`` the held tuples of those before it (the
    failing one is not among them: the one-event path fans nothing out of
    an admission that raised)."""

    def __init__(self, taken: int, n: int, held: list[Held]) -> None:
        super().__init__(f"append failed at pair {taken - 1}")
        self.taken, self.n, self.held = taken, n, held


class Entry:
    """One ingested event as the relay holds it.

    ``attrs``: the envelope attributes without ``data`` (what filters see);
    ``size``: the bytes it is accounted for (``len(raw)`` + :data:`ENTRY_OVERHEAD`);
    ``raw``: the event's compact JSON, UTF-8 (serialized once at ingest);
    ``pos``: ``(epoch, seq)`` for sequenced session events, else ``None``;
    ``sev``/``cap``: severity and capture ranks (defaults applied);
    ``key``: the ``(source, id)`` dedupe key; ``n``: the relay-wide admission
    counter (replay snapshots cut on it)."""

    __slots__ = ("attrs", "raw", "pos", "sev", "cap", "key", "n", "size", "bkey")

    def __init__(self, attrs: dict[str, Any], raw: bytes, pos: Position | None,
                 sev: int, cap: int, n: int = 0) -> None:
        self.attrs = attrs
        self.raw = raw
        self.pos = pos
        self.sev = sev
        self.cap = cap
        self.key = (attrs["source"], attrs["id"])
        self.n = n
        self.size = len(raw) + ENTRY_OVERHEAD  # accounted bytes (the byte budgets)
        #: the buffer this entry belongs to, ``(source, session)`` (sequenced entries)
        self.bkey: BufKey = (attrs["source"], attrs["session"]) if pos is not None else None  # type: ignore[assignment]

    def held(self, like: Held | None = None) -> Held:
        """What a buffer keeps of this sequenced entry (:data:`Held`).
        ``like``: a held tuple made just before (a run's previous entry),
        whose shared names this entry's layout reuses when it is the same
        (no table lookup)."""
        attrs = self.attrs
        names = tuple(attrs)
        if like is not None and like[0] == names:
            names = like[0]
        elif len(_NAMES) < _MAX_NAMES:
            names = _NAMES.setdefault(names, names)
        pos, key = self.pos, self.key
        return (names, self.raw, self.sev, self.cap, self.n, self.size,
                pos[0], pos[1], key[0], key[1], *attrs.values())  # type: ignore[index]

    @classmethod
    def from_held(cls, h: Held) -> Entry:
        """The entry a :data:`Held` tuple was made from (equal fields, new
        ``attrs``, ``pos`` and ``key`` objects)."""
        e = cls.__new__(cls)
        e.raw, e.sev, e.cap, e.n, e.size = h[1:6]
        e.pos = (h[6], h[7])
        e.key = (h[8], h[9])
        e.attrs = attrs = dict(zip(h[0], h[10:], strict=True))
        e.bkey = (h[8], attrs["session"])
        return e

    @property
    def type(self) -> str:
        return self.attrs["type"]

    @property
    def session(self) -> str | None:
        return self.attrs.get("session")


def same_event(a: bytes, b: bytes) -> bool:
    """Whether two serialized events carry the same content (JSON equality:
    attribute order does not matter, ``true`` is not ``1``; see
    :func:`same_json`)."""
    if a == b:
        return True
    import json
    try:
        return same_json(json.loads(a), json.loads(b))
    except (ValueError, RecursionError):
        return False


def _kind(v: Any) -> type:
    # JSON has one number type (1 and 1.0 are one value), and booleans apart
    return float if type(v) is int else type(v)


def same_json(a: Any, b: Any) -> bool:
    """JSON value equality of two decoded values: objects by their members
    (any order), arrays element-wise, numbers by value, and no value equal to
    one of another JSON type. Python's ``==`` is not that: ``True == 1 ==
    1.0``, so a changed ``true`` -> ``1`` passed as a redelivery (fresh-user
    review; the README's integrity row: other content under a held
    ``(source, id)`` is refused)."""
    if _kind(a) is not _kind(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(map(same_json, a, b))
    return bool(a == b)


class _Session:
    __slots__ = ("entries", "keys", "start", "ids", "bytes", "dropped")

    def __init__(self, dropped: Position | None = None) -> None:
        self.entries: list[Held] = []
        self.keys: list[Position] = []
        self.start = 0  # entries[:start] are trimmed (compacted lazily)
        #: id -> the held entry (every entry of a buffer has its source: the
        #: ids are the (source, id) keys without a tuple to build and hash each)
        self.ids: dict[str, Held] = {}
        self.bytes = 0  # accounted bytes of the held entries
        self.dropped = dropped  # highest position ever trimmed from this buffer

    def __len__(self) -> int:
        return len(self.entries) - self.start

    def earliest(self) -> Position | None:
        return self.keys[self.start] if self.start < len(self.keys) else None


class SessionBuffers:
    """All replay buffers of one relay, keyed ``(source, session)``.

    ``bytes``: accounted bytes held in all buffers. ``counters``:
    ``duplicates`` (admissions refused on ``(source, id)``), ``trimmed``
    (entries dropped by the per-buffer depth), ``trimmed_bytes`` (entries
    dropped by a byte budget), ``sessions_evicted`` (whole buffers dropped
    by the buffer cap or the total byte budget). Raises ``ValueError`` for
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
        self._sessions: OrderedDict[BufKey, _Session] = OrderedDict()
        self._names: dict[str, dict[BufKey, None]] = {}  # session name -> its buffers
        # source -> its buffers: a source need not name one session (AEP-0001
        # §5.1 #6 only recommends .../session/{session}), and (source, id) is
        # the identity whatever the session (§7)
        self._sources: dict[str, dict[BufKey, None]] = {}
        # wholly dropped buffers: key -> highest position dropped (bounded)
        self._gone: OrderedDict[BufKey, Position] = OrderedDict()
        self._gone_names: dict[str, dict[BufKey, None]] = {}
        self.counters = {"duplicates": 0, "trimmed": 0, "trimmed_bytes": 0, "sessions_evicted": 0}

    def __len__(self) -> int:
        return len(self._sessions)

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
    def _trim(self, s: _Session) -> None:
        """Drop the oldest entry of ``s``."""
        start = s.start
        entries = s.entries
        h = entries[start]
        s.ids.pop(h[9], None)
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
    def admit(self, entry: Entry) -> bool:
        """Buffer a sequenced session event. Returns ``False`` (nothing
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
                self._bury(next(iter(self._sessions)))
                self.counters["sessions_evicted"] += 1
            dropped = self._gone.pop(key, None)
            if dropped is not None:
                self._forget(key)
            s = self._sessions[key] = _Session(dropped)
            self._names.setdefault(key[1], {})[key] = None
            self._sources.setdefault(key[0], {})[key] = None
        elif entry.key[1] in s.ids:
            self.counters["duplicates"] += 1
            return False
        else:
            self._sessions.move_to_end(key)  # recency = last buffered write
        h = s.ids[entry.key[1]] = entry.held()
        entries, keys = s.entries, s.keys
        if not keys or pos >= keys[-1]:
            entries.append(h)
            keys.append(pos)
        else:  # backfill: insert-sort (rare)
            i = bisect_right(keys, pos, lo=s.start)
            entries.insert(i, h)
            keys.insert(i, pos)
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
        while self.bytes > self.total_bytes:  # least recently written first, oldest first
            victim_key, victim = next(iter(self._sessions.items()))
            self._trim(victim)
            self.counters["trimmed_bytes"] += 1
            if len(victim) == 0:
                self._bury(victim_key)
                self.counters["sessions_evicted"] += 1
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
                        or k in ids or added + size > room:
                    break
                h = ids[k] = e.held(h)
                entries.append(h)
                keys.append(pos)
                last = pos
                added += size
                j += 1
            if j == i:
                self.admit(e)  # a duplicate, a backfill or a byte trim: the general path
                i += 1
                continue
            sessions.move_to_end(key)  # recency = last buffered write
            s.bytes += added
            self.bytes += added
            over = len(entries) - s.start - self.depth
            if over > 0:
                self._trim_many(s, over)
                self.counters["trimmed"] += over
            i = j

    def append_stamped(self, key: BufKey, pairs: Sequence[tuple[dict[str, Any], bytes]],
                       start: int, n: int, agent: str | None, plain: set[str]
                       ) -> tuple[int, int, list[Held]]:
        """Admit into the held buffer ``key`` the stamped envelopes of
        ``pairs[start:]`` (``(event dict, its wire bytes)``: what
        :func:`.envelope.trusted_entry` takes) that the relay's trusted run
        (:meth:`Relay.admit_stamped_run <supervisor.relay.core.Relay.admit_stamped_run>`)
        would simply append to it, in one loop, with no :class:`Entry`:
        each pair's held tuple made from the dict itself, its admission
        number ``n + 1``, ``n + 2``... It stops at the first pair that is
        not such an append: another ``source`` or ``session`` than
        ``key``'s, a ``type`` that is not a ``str`` in ``plain`` nor a
        non-command ``str`` (added to ``plain`` then), an ``agent`` other
        than ``agent`` (``None``: any), a ``seq`` or ``epoch`` that is not
        an ``int``, a position not past the buffer's last, an ``id`` it
        holds, an unknown ``severity`` or ``capture``, an entry that does
        not fit both byte budgets as they stood before the first (so no
        byte budget trims), anything that raises while it is looked at;
        or at once when ``key``'s source has other buffers too. Those are
        exactly the pairs for which the run's checks
        (:meth:`fresh`, the owner check made already for ``key``'s source,
        the agent check) pass and :meth:`admit` appends; the depth is
        trimmed as :meth:`admit` trims it, after each append. Equal to
        :func:`.envelope.trusted_entry` + :meth:`admit` per pair (property
        test ``tests/unit/relay/test_append_stamped.py``).

        Returns ``(stop, n, held)``: the index of the first pair not taken,
        the admission counter after the taken ones and their held tuples in
        order (what the caller fans out). The caller counts them, and
        claims nothing: it admitted an event of ``key`` just before (the
        claims of ``key``'s session and source are already the most recent).
        Raises :class:`AppendFault` when an append raises part way."""
        s = self._sessions.get(key)
        source, session = key
        if s is None or len(self._sources[source]) > 1:
            return start, n, []
        ids, entries, marks = s.ids, s.entries, s.keys
        last = marks[-1] if marks else None
        room = min(self.buffer_bytes - s.bytes, self.total_bytes - self.bytes)
        limit = self.depth + s.start  # len(entries) past it: over the depth
        sev_rank, cap_rank, layouts = SEVERITY_RANK, CAPTURE_RANK, _LAYOUTS
        sev_info, cap_metadata = sev_rank["info"], cap_rank["metadata"]
        held: list[Held] = []
        keep, hold, mark = held.append, entries.append, marks.append
        added = 0
        lkeys: tuple[str, ...] | None = None
        k, n0 = start, n
        try:
            for k in range(start, len(pairs)):  # noqa: B007 -- k: where it stopped
                try:
                    ev, raw = pairs[k]
                    keys = tuple(ev)
                    if keys != lkeys:
                        got = layouts.get(keys) or _layout(keys)
                        if got is None:
                            break
                        names, values, at_t, at_src, at_ses, at_ag, at_seq, at_ep, at_id, \
                            at_sev, at_cap = got
                        if agent is not None and at_ag < 0:
                            break
                        lkeys = keys
                    vals = values(ev)
                    t = vals[at_t]
                    if t not in plain:
                        if t.__class__ is not str or is_command_type(t) or t in ACK_TYPES:
                            break
                        plain.add(t)
                    # the buffer's own source and session: the same object (a
                    # stamper's run), else an equal exact str (as the key lookup)
                    src, ses = vals[at_src], vals[at_ses]
                    if (src is not source and (src.__class__ is not str or src != source)) or \
                            (ses is not session and (ses.__class__ is not str or ses != session)) \
                            or (agent is not None and vals[at_ag] != agent):
                        break
                    seq = vals[at_seq]
                    epoch = vals[at_ep] if at_ep >= 0 else 0
                    if seq.__class__ is not int or epoch.__class__ is not int:
                        break
                    pos = (epoch, seq)
                    ident = vals[at_id]
                    if (last is not None and pos <= last) or ident in ids:
                        break
                    sev = sev_rank[vals[at_sev]] if at_sev >= 0 else sev_info
                    cap = cap_rank[vals[at_cap]] if at_cap >= 0 else cap_metadata
                    size = len(raw) + ENTRY_OVERHEAD
                    if added + size > room:
                        break
                    h = (names, raw, sev, cap, n + 1, size, epoch, seq, src, ident) + vals
                except Exception:  # noqa: BLE001 -- not an append: the one-event path answers it
                    break
                n += 1
                ids[ident] = h
                hold(h)
                mark(pos)
                last = pos
                added += size
                if len(entries) > limit:  # as admit(): the oldest out, now
                    s.bytes += added  # (accounted first, as admit() does)
                    self.bytes += added
                    added = 0
                    limit = self._trim_appended(s)
                keep(h)
            else:
                k = len(pairs)
        except Exception as exc:
            raise AppendFault(k + 1, n, held) from exc
        finally:
            self._appended(key, s, added, n != n0)
        return k, n, held

    def _trim_appended(self, s: _Session) -> int:
        """:meth:`append_stamped` past the depth: the oldest entries trimmed
        and counted until it is not (as :meth:`admit` does: one, unless a
        trim that raised left it over); returns the length of ``s.entries``
        past which it is over again (a trim may compact the list)."""
        depth, counters = self.depth, self.counters
        while len(s.entries) - s.start > depth:
            self._trim(s)
            counters["trimmed"] += 1
        return depth + s.start

    def _appended(self, key: BufKey, s: _Session, added: int, any_: bool) -> None:
        """:meth:`append_stamped`'s accounting: ``added`` bytes and (``any_``
        appended) ``key`` the most recently written."""
        s.bytes += added
        self.bytes += added
        if any_:
            self._sessions.move_to_end(key)  # recency = last buffered write

    def _trim_many(self, s: _Session, count: int) -> None:
        """:meth:`_trim` ``count`` times (the oldest ``count`` entries of ``s``)."""
        start = s.start
        stop = start + count
        entries, ids = s.entries, s.ids
        freed = 0
        for x in range(start, stop):
            h = entries[x]
            ids.pop(h[9], None)
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
