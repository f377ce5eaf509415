"""What the relay holds of one event (AEP-0001 §7, docs/relay.md "Ingest,
buffer, fan-out"): the :class:`Entry` built at ingest, the flat
:data:`Held` tuple a buffer keeps of it (see :mod:`.buffer` for why it is
a flat tuple of atomic values), the position and buffer-key types, the
accounted size of an entry (:data:`ENTRY_OVERHEAD`), and JSON content
equality (:func:`same_event`: a redelivery versus other content under a
held ``(source, id)``).

Pure data: no I/O, no clocks."""
from __future__ import annotations

from typing import Any

__all__ = ["Entry", "Held", "Position", "BufKey", "ENTRY_OVERHEAD", "MiB", "same_event",
           "same_json"]

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
