"""The new-session budget of the embedded relay's remote ingest (issue 25,
finding 3 of the outside attack): every remote emitter's sequenced event
(``POST /events``, ``/socket``) is written to the session log
(``logs/{agent}/{session}.jsonl``) before it is admitted, so each new
``(agent, session)`` is one more file that every later start opens and
stats. Bounded like the OTLP bridge's (``AEP_OTLP_MAX_NEW_SESSIONS``,
``AEP_OTLP_NEW_SESSIONS_PER_S``): at most ``per_request`` new sessions a
request (a ``POST`` batch; a ``/socket`` event is one), and a token bucket
of ``per_s`` a second over all remote emitters, bursting to
``per_request``. A session already known is never refused: one the relay
admitted or restored from the logs (remembered, least recently used
forgotten past ``remember``), or one a live connection with that agent
claims. The fleet's own bridges (:class:`~.connections.LocalEmitter`) are
not budgeted here: their bridges have their own caps.

Pure (the clock is passed in, ``trio.current_time()`` seconds)."""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Iterable

from bridges.core.limits import SessionBucket

__all__ = ["NewSessionBudget", "SessionKey", "TooManySessions"]

SessionKey = tuple[str, str]
"""``(agent, session)``: one session log file."""


class TooManySessions(Exception):
    """A request's new sessions are past the budget: nothing of it is
    admitted (``POST /events`` 429 ``too-many-sessions`` with
    ``Retry-After``, ``/socket`` a ``limit-exceeded`` error frame).
    ``retry_after``: whole seconds until the bucket could take them."""

    def __init__(self, detail: str, retry_after: float) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class NewSessionBudget:
    """Admit or refuse the new sessions of one request.

    ``per_request`` (``AEP_RELAY_MAX_NEW_SESSIONS``, >= 1), ``per_s``
    (``AEP_RELAY_NEW_SESSIONS_PER_S``, > 0), ``remember``: how many known
    sessions are remembered (least recently used forgotten first; a
    forgotten one costs one token when it comes back)."""

    def __init__(self, per_request: int = 100, per_s: float = 50.0,
                 remember: int = 65_536) -> None:
        if per_request < 1 or per_s <= 0 or remember < 1:
            raise ValueError("per_request, per_s and remember must be positive")
        self.per_request = per_request
        self.per_s = per_s
        self.bucket = SessionBucket(per_s, per_request)
        self.remember = remember
        self._known: OrderedDict[SessionKey, None] = OrderedDict()

    def note(self, keys: Iterable[SessionKey]) -> None:
        """Remember ``keys`` as known (admitted, or restored from the logs)."""
        known = self._known
        for k in keys:
            if k in known:
                known.move_to_end(k)
            else:
                known[k] = None
        while len(known) > self.remember:
            known.popitem(last=False)

    def known(self, key: SessionKey) -> bool:
        return key in self._known

    def check(self, keys: Iterable[SessionKey], now: float,
              claimed: Callable[[SessionKey], bool] = lambda k: False) -> tuple[str, float] | None:
        """``None`` when the request's sessions ``keys`` may be admitted
        (their new ones take a token each, and all are remembered), else
        ``(detail, retry_after_s)`` and nothing is taken. ``claimed(key)``:
        whether a live connection holds that session (known too)."""
        wanted = set(keys)
        fresh = [k for k in wanted if k not in self._known and not claimed(k)]
        if len(fresh) > self.per_request:
            return (f"{len(fresh)} new sessions in one request; at most "
                    f"AEP_RELAY_MAX_NEW_SESSIONS={self.per_request} (each is a session log "
                    f"file): send them in smaller batches", math.ceil(len(fresh) / self.per_s))
        bucket = self.bucket
        taken = 0
        for _ in fresh:
            if not bucket.take(now):
                bucket.tokens += taken  # all or nothing: give back what this request took
                short = len(fresh) - bucket.tokens
                return (f"new sessions arrive faster than AEP_RELAY_NEW_SESSIONS_PER_S="
                        f"{self.per_s:g} over all remote emitters (each is a session log "
                        "file); nothing of this request was accepted: retry later",
                        max(1, math.ceil(short / self.per_s)))
            taken += 1
        self.note(wanted)
        return None
