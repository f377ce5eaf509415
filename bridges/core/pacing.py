"""Yield the event loop by work done, not by count of items: a loop over
untrusted input (a ``POST /events`` batch's lines, an ACP tee's lines)
tells a :class:`Pacer` what each item cost (its bytes, its JSON arrays and
objects) and the pacer checkpoints once a budget is spent.

Why not every N items: one item's cost varies a thousandfold. 80 lines of
65,000 empty arrays each (each line under
:data:`~bridges.core.aep.MAX_CONTAINERS`, 15.6 MB in all) were one
``POST /events`` parsed between two yields of "every 128 lines": the loop
was held 2.3 s and a gated hook failed open (an eleventh outside attack on
issue 25, finding 2). Parsing and checking an event costs here some 0.3 us
an array or object, up to ~1 us a float, ~4 ms a MiB of string: the
budgets below hold a step to some 30-70 ms. Between two checkpoints runs
at most one budget's work, or one item alone when it is bigger; each item
is capped on its own (a line: :data:`~bridges.core.aep.MAX_CONTAINERS`,
:data:`~bridges.core.aep.MAX_VALUES`)."""
from __future__ import annotations

import trio

from .aep import MAX_CONTAINERS

__all__ = ["YIELD_BYTES", "YIELD_CONTAINERS", "YIELD_ITEMS", "Pacer"]

YIELD_BYTES = 256 << 10
"""Bytes of input handled between two checkpoints (or one bigger item):
256 KiB of ``[0.5,0.5,...]`` is 65,536 floats, some 50 ms."""
YIELD_CONTAINERS = MAX_CONTAINERS
"""JSON arrays and objects parsed between two checkpoints (or one bigger item's)."""
YIELD_ITEMS = 128
"""Items (lines, frames) between two checkpoints, however small."""


class Pacer:
    """Counts work since the last checkpoint. Tell it each item's cost
    before handling the item (:meth:`take`): when that item would pass a
    budget (``max_bytes`` bytes, ``max_containers`` JSON arrays and
    objects, ``max_items`` items since the last checkpoint), it checkpoints
    first (``trio.lowlevel.checkpoint``: other tasks run, a cancellation
    is delivered). So between two checkpoints runs at most one budget's
    work, or one item alone when that item is bigger."""

    __slots__ = ("bytes", "containers", "items", "max_bytes", "max_containers", "max_items")

    def __init__(self, max_bytes: int = YIELD_BYTES, max_containers: int = YIELD_CONTAINERS,
                 max_items: int = YIELD_ITEMS) -> None:
        self.max_bytes = max_bytes
        self.max_containers = max_containers
        self.max_items = max_items
        self.bytes = self.containers = self.items = 0

    def due(self, nbytes: int, containers: int = 0) -> bool:
        """Whether to checkpoint before an item of ``nbytes`` bytes opening
        ``containers`` JSON arrays and objects (the caller then does, and
        the counts start over), and count that item."""
        due = self.items > 0 and (self.bytes + nbytes > self.max_bytes
                                  or self.containers + containers > self.max_containers
                                  or self.items >= self.max_items)
        if due:
            self.bytes = self.containers = self.items = 0
        self.bytes += nbytes
        self.containers += containers
        self.items += 1
        return due

    async def take(self, nbytes: int, containers: int = 0) -> None:
        """:meth:`due`, and the checkpoint when it is (before the item)."""
        if self.due(nbytes, containers):
            await trio.lowlevel.checkpoint()
