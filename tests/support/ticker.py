"""A clock-free measure of how long work holds the trio loop: a second task
that counts the scheduling rounds it gets (:class:`Ticker`). Work that
notes ``ticker.ticks`` as it goes shows how much of it ran between two
rounds, with no wall-clock time involved (the tests of the loop-holding
findings of issue 25's outside attacks)."""
from __future__ import annotations

from typing import Awaitable, Callable, TypeVar

import trio

T = TypeVar("T")


class Ticker:
    """``ticks``: the rounds the ticking task got so far."""

    def __init__(self) -> None:
        self.ticks = 0
        self._done = False

    async def _tick(self) -> None:
        while not self._done:
            self.ticks += 1
            await trio.lowlevel.checkpoint()

    async def beside(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work()`` with the ticking task beside it (started and
        ticked once before the work begins); its result."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tick)
            while not self.ticks:
                await trio.lowlevel.checkpoint()
            try:
                return await work()
            finally:
                self._done = True
