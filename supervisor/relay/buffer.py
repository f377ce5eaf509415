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
- Each buffer holds at most ``depth`` entries (``AEP_BUFFER``), trimming
  oldest first; at most ``max_sessions`` buffers are held
  (``AEP_MAX_SESSIONS``), evicting the least recently *written* one.

Pure data structure: no I/O, no clocks. Memory is bounded by
``depth * max_sessions`` entries (each the event's compact JSON plus its
envelope attributes)."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Any, Iterator

Position = tuple[int, int]
"""``(epoch, seq)``; tuples order lexicographically (AEP-0001 §7 rule 3)."""

BufKey = tuple[str, str]
"""``(source, session)``: one emitter's session (AEP-0001 §5.2)."""


class Entry:
    """One ingested event as the relay holds it.

    ``attrs``: the envelope attributes without ``data`` (what filters see);
    ``raw``: the event's compact JSON, UTF-8 (serialized once at ingest);
    ``pos``: ``(epoch, seq)`` for sequenced session events, else ``None``;
    ``sev``/``cap``: severity and capture ranks (defaults applied);
    ``key``: the ``(source, id)`` dedupe key; ``n``: the relay-wide admission
    counter (replay snapshots cut on it)."""

    __slots__ = ("attrs", "raw", "pos", "sev", "cap", "key", "n")

    def __init__(self, attrs: dict[str, Any], raw: bytes, pos: Position | None,
                 sev: int, cap: int, n: int = 0) -> None:
        self.attrs = attrs
        self.raw = raw
        self.pos = pos
        self.sev = sev
        self.cap = cap
        self.key = (attrs["source"], attrs["id"])
        self.n = n

    @property
    def type(self) -> str:
        return self.attrs["type"]

    @property
    def session(self) -> str | None:
        return self.attrs.get("session")

    @property
    def bkey(self) -> BufKey:
        """The buffer this entry belongs to: ``(source, session)``."""
        return (self.attrs["source"], self.attrs["session"])


class _Session:
    __slots__ = ("entries", "keys", "start", "ids")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.keys: list[Position] = []
        self.start = 0  # entries[:start] are trimmed (compacted lazily)
        self.ids: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        return len(self.entries) - self.start

    def earliest(self) -> Position | None:
        return self.keys[self.start] if self.start < len(self.keys) else None


class SessionBuffers:
    """All replay buffers of one relay, keyed ``(source, session)``.

    ``counters``: ``duplicates`` (admissions refused on ``(source, id)``),
    ``trimmed`` (entries dropped by the per-buffer depth),
    ``sessions_evicted`` (whole buffers dropped by the buffer cap)."""

    def __init__(self, depth: int = 10_000, max_sessions: int = 500) -> None:
        if depth < 1 or max_sessions < 1:
            raise ValueError("depth and max_sessions must be >= 1")
        self.depth = depth
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[BufKey, _Session] = OrderedDict()
        self._names: dict[str, dict[BufKey, None]] = {}  # session name -> its buffers
        self.counters = {"duplicates": 0, "trimmed": 0, "sessions_evicted": 0}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session: object) -> bool:
        """A buffer key, or a bare session name held by any emitter."""
        return session in self._sessions if isinstance(session, tuple) else session in self._names

    def sessions(self) -> list[BufKey]:
        """Held buffer keys, least recently written first."""
        return list(self._sessions)

    def keys_for(self, session: str) -> list[BufKey]:
        """Every held buffer of the bare session name ``session`` (one per
        emitter that used it)."""
        keys = self._names.get(session)
        return list(keys) if keys else []

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
        if s is None or pos is None or not s.keys or pos > s.keys[-1] or entry.key in s.ids:
            return False
        i = bisect_left(s.keys, pos, lo=s.start)
        return i < len(s.keys) and s.keys[i] == pos

    def _drop(self, key: BufKey) -> None:
        del self._sessions[key]
        names = self._names.get(key[1])
        if names is not None:
            names.pop(key, None)
            if not names:
                del self._names[key[1]]

    def admit(self, entry: Entry) -> bool:
        """Buffer a sequenced session event. Returns ``False`` (nothing
        stored) for a ``(source, id)`` already held in that buffer. The
        caller refuses :meth:`conflict` entries first (not re-checked)."""
        key = entry.bkey
        assert entry.pos is not None, "only sequenced session events are buffered"
        s = self._sessions.get(key)
        if s is None:
            if len(self._sessions) >= self.max_sessions:
                self._drop(next(iter(self._sessions)))
                self.counters["sessions_evicted"] += 1
            s = self._sessions[key] = _Session()
            self._names.setdefault(key[1], {})[key] = None
        elif entry.key in s.ids:
            self.counters["duplicates"] += 1
            return False
        else:
            self._sessions.move_to_end(key)  # recency = last buffered write
        s.ids.add(entry.key)
        pos = entry.pos
        if not s.keys or pos >= s.keys[-1]:
            s.entries.append(entry)
            s.keys.append(pos)
        else:  # backfill: insert-sort (rare)
            i = bisect_right(s.keys, pos, lo=s.start)
            s.entries.insert(i, entry)
            s.keys.insert(i, pos)
        while len(s) > self.depth:
            s.ids.discard(s.entries[s.start].key)
            s.entries[s.start] = None  # type: ignore[call-overload]  # release now
            s.start += 1
            self.counters["trimmed"] += 1
        if s.start > 1024 and s.start * 2 > len(s.entries):
            del s.entries[:s.start]
            del s.keys[:s.start]
            s.start = 0
        return True

    def replay_after(self, key: BufKey, after: Position | None
                     ) -> tuple[list[Entry], bool, Position | None]:
        """Entries of the buffer ``key`` strictly after ``after`` (all held
        entries when ``after`` is ``None``), in ``(epoch, seq)`` order.

        Returns ``(entries, exhausted, earliest)``: ``exhausted`` is true when
        the requested position predates what the buffer holds, i.e. the
        earliest held position is later than the position right after
        ``after`` (events in between may have been evicted or never reached
        this relay): the caller emits ``replay-exhausted`` (§3.3.3, §5).
        Never exhausted for ``after=None`` (replay-all asks for earliest)."""
        s = self._sessions.get(key)
        if s is None or len(s) == 0:
            return [], False, None
        earliest = s.earliest()
        if after is None:
            return s.entries[s.start:], False, earliest
        i = bisect_right(s.keys, after, lo=s.start)
        exhausted = earliest is not None and earliest > (after[0], after[1] + 1)
        return s.entries[i:], exhausted, earliest

    def iter_entries(self, session: str | BufKey) -> Iterator[Entry]:
        """Held entries of a buffer key, or of every buffer of a bare name."""
        keys = [session] if isinstance(session, tuple) else self.keys_for(session)
        for k in keys:
            s = self._sessions.get(k)
            if s is not None:
                yield from s.entries[s.start:]
