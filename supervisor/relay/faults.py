"""Connection faults: a secret-free name for an exception and rate-limited
logging, shared by the server's connection barrier
(:mod:`supervisor.relay.serve`) and the relay app's handler barrier
(:mod:`supervisor.relay.app`).

A hostile client can make a connection fail on purpose, as often as it
likes; the answer is one log line per kind of failure (then at most one per
:data:`FAULT_LOG_INTERVAL_S`, with a count), never a traceback per request.
Only exception *type names* are logged at WARNING: an h11 or parser message
can quote request bytes, and a request can carry the token. The stack
frames of each logged occurrence (no message, no values) go to DEBUG."""
from __future__ import annotations

import logging
import time
import traceback

#: After the first log line of a fault kind, at most one more per this many seconds.
FAULT_LOG_INTERVAL_S = 60.0
_MAX_KINDS = 256


def fault_kind(exc: BaseException) -> str:
    """A short, secret-free name for a fault: the sorted, de-duplicated type
    names of its leaf exceptions (``"LocalProtocolError"``,
    ``"KeyError+LocalProtocolError"``); never an exception message."""
    leaves: set[str] = set()

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.add(type(e).__name__)

    walk(exc)
    return "+".join(sorted(leaves)) or type(exc).__name__


class FaultLog:
    """Rate-limited fault logging on ``logger``: the first fault of each
    kind at each place (``where``) is logged at WARNING; later ones at most once per ``interval``
    seconds (monotonic clock), with how many were suppressed in between.
    At most ``_MAX_KINDS`` kinds are remembered (oldest forgotten)."""

    def __init__(self, logger: logging.Logger, interval: float = FAULT_LOG_INTERVAL_S) -> None:
        self.log = logger
        self.interval = interval
        self._kinds: dict[str, list[float]] = {}  # where+kind -> [last logged at, suppressed since]

    def record(self, kind: str, where: str, exc: BaseException | None = None) -> bool:
        """Note one fault of ``kind`` at ``where`` (a listener or handler
        name); returns whether a line was logged."""
        now = time.monotonic()
        slot = f"{where}\0{kind}"
        seen = self._kinds.get(slot)
        if seen is None:
            if len(self._kinds) >= _MAX_KINDS:
                self._kinds.pop(next(iter(self._kinds)))
            self._kinds[slot] = [now, 0]
            suppressed = None
        elif now - seen[0] >= self.interval:
            suppressed = int(seen[1])
            seen[0], seen[1] = now, 0
        else:
            seen[1] += 1
            return False
        tail = "" if suppressed is None else f" ({suppressed} more of this kind since the last report)"
        self.log.warning("%s: a connection failed (%s); closed it, serving on%s", where, kind, tail)
        if exc is not None and self.log.isEnabledFor(logging.DEBUG):
            # where it failed, without any exception message (they can quote request bytes)
            self.log.debug("%s: %s raised at:\n%s", where, kind, "".join(_frames(exc)))
        return True


def _frames(exc: BaseException) -> list[str]:
    """The stack frames (file, line, function, source line) of ``exc`` and,
    for a group, of its first leaf; never a message or a local value."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return traceback.format_tb(exc.__traceback__)
