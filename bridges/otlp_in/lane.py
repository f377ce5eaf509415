"""One decoding lane per process: OTLP bodies decode one at a time,
small before large, whichever transport brought them.

Decoding (the protobuf parse in C, the flatten in Python, a JSON parse)
runs in worker threads: the HTTP receiver's and grpcio's own handler
threads. All of it needs the GIL, so a second decoding thread buys no
throughput; it only lengthens the event loop's wait for the GIL. The C
parse of a 4 MB body of 2,000,000 empty messages holds the GIL for its
whole 60-80 ms, and six such threads at once (two HTTP decoders, four gRPC
handlers) kept the loop waiting long enough that 8 to 11 of 50 gated hooks
failed open (a fourteenth outside attack on issue 25: eight
unauthenticated senders repeating a body that is refused 413). Through
:data:`LANE` one decode runs at a time, and after a long one the lane
rests as long as the decode took past CPython's switch interval (5 ms, the
GIL's own unit of fairness; :data:`REST`), so however many senders keep it
busy with slow bodies, the loop has the GIL at least half the time and
waits at most one decode for it. Ordinary exports (200 Codex records
decode in about 1 ms) never rest.

Turns go by arrival, each body counted as arriving later by its size
(:data:`SECONDS_PER_BYTE`: a second per MiB), so a legitimate export of a
few KB passes a queue of 4 MB bodies that arrived in the seconds before it
and waits only for the decode in progress: one unauthenticated sender of
bodies under the caps that take 1.5 s each to decode had kept every other
export waiting 2-4 s, and eight had HTTP exports answered 503 (a fifteenth
outside attack). Among equal sizes the order is first come, first served;
no body waits forever behind smaller ones (its lead shrinks as time
passes); a plain lock lets a waiter lose every race.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

LANE_WAIT_S = 5.0
"""Seconds a decode waits for its turn before its request is answered
retryable (HTTP 503 with ``Retry-After``, gRPC ``UNAVAILABLE``) and counted
``otlp.decode_timeout``."""


SECONDS_PER_BYTE = 1 / (1 << 20)
"""How much later a body counts as arrived, per byte of it, for its turn
in the lane."""

REST = 1.0
"""Seconds the lane rests (held, its thread asleep without the GIL) per
second a decode held it past the switch interval: 1.0 leaves the event
loop at least half of the time while slow decodes come back to back."""

MAX_REST_S = 1.0
"""Longest rest after one decode, in seconds."""


class LaneBusy(Exception):
    """The lane did not come free within the wait asked for."""


class Lane:
    """A first-come, first-served lock for threads (``threading`` only: the
    trio side reaches it through :func:`trio.to_thread.run_sync`).

    ``held(timeout)`` waits at most ``timeout`` seconds for its turn, then
    raises :class:`LaneBusy` (and leaves the queue); after the ``with``
    body, the lane stays held for ``rest`` times as long as the body took
    past ``grace`` seconds (default: ``sys.getswitchinterval()``; at most
    :data:`MAX_REST_S`), its thread asleep. ``clock`` and ``sleep`` are
    ``time.monotonic`` and ``time.sleep`` but in tests.
    ``waiting`` and ``busy`` are for tests."""

    def __init__(self, rest: float = REST, *, grace: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rest = rest
        self.grace = sys.getswitchinterval() if grace is None else grace
        self._clock = clock
        self._sleep = sleep
        self._cond = threading.Condition()
        self._queue: list[tuple[float, int]] = []  # (turn key, ticket)
        self._tickets = 0
        self._busy = False

    @property
    def waiting(self) -> int:
        """Threads queued for the lane (the holder not counted)."""
        with self._cond:
            return len(self._queue)

    @property
    def busy(self) -> bool:
        """Whether a thread holds the lane."""
        return self._busy

    @contextmanager
    def held(self, timeout: float, size: int = 0) -> Iterator[None]:
        """Hold the lane for the ``with`` body, a decode of ``size`` bytes
        (its turn key: now + ``size`` x :data:`SECONDS_PER_BYTE`; the
        smallest key goes next, ties by arrival); raises :class:`LaneBusy`
        when the turn does not come within ``timeout`` seconds."""
        now = self._clock()
        deadline = now + timeout
        with self._cond:
            self._tickets += 1
            me = (now + max(size, 0) * SECONDS_PER_BYTE, self._tickets)
            self._queue.append(me)
            while self._busy or min(self._queue) != me:
                left = deadline - self._clock()
                if left <= 0:
                    self._queue.remove(me)
                    self._cond.notify_all()  # the next turn may be another's now
                    raise LaneBusy(f"no turn to decode within {timeout:g}s")
                self._cond.wait(left)
            self._queue.remove(me)
            self._busy = True
        start = self._clock()
        try:
            yield
        finally:
            over = self._clock() - start - self.grace
            if self.rest > 0 and over > 0:
                self._sleep(min(over * self.rest, MAX_REST_S))
            with self._cond:
                self._busy = False
                self._cond.notify_all()


LANE = Lane()
"""The process's one OTLP decoding lane (both transports, every profile)."""
