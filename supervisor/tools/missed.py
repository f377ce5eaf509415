"""The sessions a restarted ``aep-bridges tail`` missed while it was closed
(issue 29).

The saved position (:mod:`.resume`) names the sessions the tail had shown,
and resuming from it (AEP-0003 §7: ``from`` = those positions) replays
those sessions and nothing of one that began while the tail was closed.
AEP 0.1 has no "sessions since" resume (``from`` is positions or ``all``,
§3.3, §5; ``time`` is not filterable, §6.2), so the tail asks with what
every endpoint that replays offers:

1. :func:`missed`: one replay-only read of what the endpoint holds that
   matches the tail's filter (``GET /stream?from=all&live=0``, §3.3, §5),
   keeping per session only whether it counts: a session not in the saved
   position with an event timed at or after the save less
   :data:`SLACK_S` (a vendor's clock behind ours, an event in flight when
   the tail closed), or holding an ask that no outcome in that read, nor in
   ``settled``, settles (an open ask counts whatever its clock says);
2. :func:`replay`: those sessions' held events from the earliest held,
   one replay-only read per :data:`BATCH` sessions (the tail's filter with
   ``session`` pinned to them, §6.1).

Bounded by what the endpoint holds (its replay bounds), by ``deadline``
(a ``time.monotonic()`` instant: what was read by then counts) and by
:data:`MAX_SEEN` sessions looked at. Best effort, as the saved position is:
an endpoint that refuses (no replay-all) or fails gives what was read, and
neither function raises for it."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Collection, Iterator, Mapping

from .gist import AskKey, ask_key
from .tailstream import held, settle

__all__ = ["BATCH", "CATCH_UP_S", "MAX_SEEN", "MAX_SESSIONS", "REPLAY_S", "SLACK_S", "catch_up", "missed", "replay"]

SLACK_S = 60.0
"""Seconds before the save that still count as "after it" (clock skew, an
event stamped before the close and delivered after it)."""
BATCH = 100
"""Sessions pinned per replay read (a filter's terms are bounded by the
endpoint: ``AEP_MAX_FILTER_TERMS``, 1,024 by default)."""
MAX_SEEN = 100_000
"""The most sessions :func:`missed` looks at (and open asks it keeps)."""


def _when(ev: Mapping[str, Any]) -> float | None:
    """An event's ``time`` as Unix seconds (``None``: absent or unreadable)."""
    t = ev.get("time")
    if not isinstance(t, str):
        return None
    try:
        return datetime.fromisoformat(t).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def missed(url: str, token: str | None, flt: Mapping[str, Any], *, known: Collection[str],
           since: float, settled: Mapping[AskKey, str], deadline: float) -> list[str]:
    """The sessions ``url`` holds, matching ``flt``, that are not in
    ``known`` (the saved position's) and count (see the module docstring:
    an event timed at or after ``since`` - :data:`SLACK_S`, ``since`` in
    Unix seconds, or an open ask), in the order the replay names them."""
    counts: dict[str, bool] = {}
    asks: dict[AskKey, str] = {}  # open so far, of sessions not counting yet
    done: dict[AskKey, str] = dict(settled)
    cut = since - SLACK_S
    for ev in held(url, token, dict(flt), deadline=deadline):
        session = ev.get("session")
        if not isinstance(session, str) or session in known or counts.get(session):
            continue
        if session not in counts:
            if len(counts) >= MAX_SEEN:
                continue
            counts[session] = False
        when = _when(ev)
        if when is not None and when >= cut:
            counts[session] = True
        elif ev.get("type") == "attention.requested":
            if (key := ask_key(ev)) is not None and len(asks) < MAX_SEEN:
                asks[key] = session
        else:
            settle(ev, done)
    for key, session in asks.items():
        if key not in done:
            counts[session] = True
    return [s for s, c in counts.items() if c]


def replay(url: str, token: str | None, flt: Mapping[str, Any], sessions: list[str], *,
           deadline: float) -> Iterator[dict[str, Any]]:
    """The held events of ``sessions`` matching ``flt``, each session from
    the earliest held: ``flt`` with ``session`` pinned to :data:`BATCH`
    of them per replay-only read (the sessions came from a read under
    ``flt``, so they already satisfy any ``session`` it names), until
    ``deadline``."""
    for i in range(0, len(sessions), BATCH):
        pinned = {**flt, "session": sessions[i:i + BATCH]}
        yield from held(url, token, pinned, deadline=deadline)


CATCH_UP_S = 10.0
"""Seconds :func:`catch_up` gives the endpoint to say which sessions count."""
REPLAY_S = 60.0
"""Seconds :func:`catch_up`'s events are read for (counted from the first)."""
MAX_SESSIONS = 1000
"""The most sessions :func:`catch_up` replays (the last the endpoint names)."""


def catch_up(url: str, *, token: str | None, flt: Mapping[str, Any], known: Collection[str],
             since: float, settled: Mapping[AskKey, str],
             timeout_s: float = CATCH_UP_S, replay_s: float = REPLAY_S,
             ) -> tuple[list[str], Iterator[dict[str, Any]]]:
    """:func:`missed` within ``timeout_s``, then :func:`replay` within ``replay_s``:
    ``(sessions, their held events)``, at most :data:`MAX_SESSIONS`
    sessions. The events are read as they are iterated."""
    import time
    sessions = missed(url, token, flt, known=known, since=since, settled=settled,
                      deadline=time.monotonic() + timeout_s)[-MAX_SESSIONS:]

    def events() -> Iterator[dict[str, Any]]:
        yield from replay(url, token, flt, sessions, deadline=time.monotonic() + replay_s)
    return sessions, events()
