"""Reconnect and restart delays, one rule for the whole daemon (DESIGN.md:
"restarted with capped exponential backoff and jitter")."""
from __future__ import annotations

import random
from typing import Callable


def backoff_delay(attempt: int, initial: float, cap: float,
                  rng: Callable[[], float] = random.random) -> float:
    """Capped exponential backoff with jitter, never zero: uniform in
    ``[0.5, 1.0] * min(cap, initial * 2**attempt)`` seconds (``attempt``
    counts from 0)."""
    return min(cap, initial * (2 ** min(max(attempt, 0), 30))) * (0.5 + 0.5 * rng())
