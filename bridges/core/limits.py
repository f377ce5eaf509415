"""Bounds on what an unauthenticated peer may cost the daemon (issue 25):
a per-peer log limiter for bad input, and the new-session token bucket
(each new session is a session log file). Pure (the clock is passed in:
``trio.current_time()`` or ``time.monotonic()`` seconds); used by the ACP
bridge (:mod:`bridges.acp.bridge`) and the hook family
(:mod:`bridges.hooks_common.hub`)."""
from __future__ import annotations

import logging
from collections import OrderedDict

__all__ = ["BURST_S", "LOG_INTERVAL_S", "PeerLog", "SessionBucket"]

LOG_INTERVAL_S = 60.0
"""After a peer's first line about bad input, at most one more per this many seconds."""
_MAX_PEERS = 1024
BURST_S = 5
"""A new-session bucket holds this many seconds of its rate (a burst of
``per_s * BURST_S`` new sessions)."""


class PeerLog:
    """Rate-limited WARNING lines about bad input, per peer (a client
    address or a tee id): the first line of a peer is logged; later ones at
    most once per ``interval`` seconds, with how many were suppressed since.
    At most ``_MAX_PEERS`` peers are remembered (least recently logged
    forgotten). Lines carry no traceback and no input bytes: the caller
    passes a short description."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL_S) -> None:
        self.log = logger
        self.interval = interval
        self._peers: OrderedDict[str, list[float]] = OrderedDict()  # peer -> [logged at, suppressed]
        self.suppressed = 0

    def note(self, peer: str, now: float, msg: str, *args: object) -> bool:
        """Log ``msg % args`` for ``peer`` unless it had a line within the
        interval (then count it); returns whether a line was logged."""
        seen = self._peers.get(peer)
        if seen is not None and now - seen[0] < self.interval:
            seen[1] += 1
            self.suppressed += 1
            return False
        tail = f" ({int(seen[1])} more from this peer since the last report)" \
            if seen is not None and seen[1] else ""
        self._peers[peer] = [now, 0]
        self._peers.move_to_end(peer)
        while len(self._peers) > _MAX_PEERS:
            self._peers.popitem(last=False)
        self.log.warning(msg + "%s", *args, tail)
        return True


class SessionBucket:
    """New sessions (each a session log file) of one bridge (over all of
    an ACP agent id's tees; over all of a hook bridge's POSTs and spool):
    bursts up to ``burst``, refilled at ``per_s`` a second (like the OTLP
    bridge's ``AEP_OTLP_NEW_SESSIONS_PER_S``). :meth:`take` answers whether
    one more new session may open at ``now`` (seconds, monotonic)."""

    def __init__(self, per_s: float, burst: int) -> None:
        self.per_s = per_s
        self.burst = burst
        self.tokens = float(burst)
        self._at: float | None = None

    def take(self, now: float) -> bool:
        if self._at is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self._at) * self.per_s)
        self._at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
