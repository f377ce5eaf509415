"""One emitter session's replay buffer (:class:`SessionRing`): its held
tuples in ``(epoch, seq)`` order with their positions beside them (for
bisection), the lazily compacted trimmed head, the ``id`` index, its
accounted bytes, the highest position it ever dropped, and what the
eviction order reads (:mod:`.pins`: its kind, its open asks, the order it
is in). The byte budgets, the eviction and the lookups over all buffers
are :class:`.buffer.SessionBuffers`'."""
from __future__ import annotations

from collections import OrderedDict

from .entry import BufKey, Held, Position

__all__ = ["SessionRing"]


class SessionRing:
    """One buffer's state (``len``: the entries held; ``earliest()``:
    the first held position or ``None``)."""

    __slots__ = ("entries", "keys", "start", "ids", "bytes", "dropped", "key", "fleet",
                 "asks", "order")

    def __init__(self, dropped: Position | None = None, key: BufKey = ("", "")) -> None:
        self.entries: list[Held] = []
        self.keys: list[Position] = []
        self.start = 0  # entries[:start] are trimmed (compacted lazily)
        #: id -> the held entry (every entry of a buffer has its source: the
        #: ids are the (source, id) keys without a tuple to build and hash each)
        self.ids: dict[str, Held] = {}
        self.bytes = 0  # accounted bytes of the held entries
        self.dropped = dropped  # highest position ever trimmed from this buffer
        self.key = key  # (source, session)
        #: an authenticated fleet bridge wrote it (:mod:`.pins`: evicted after the open kind)
        self.fleet = False
        #: ids of the held attention.requested events still open (None: none yet)
        self.asks: dict[str, None] | None = None
        #: the eviction order it is in (:mod:`.pins`), least recently written first
        self.order: OrderedDict[BufKey, None] | None = None

    def __len__(self) -> int:
        return len(self.entries) - self.start

    def earliest(self) -> Position | None:
        return self.keys[self.start] if self.start < len(self.keys) else None
