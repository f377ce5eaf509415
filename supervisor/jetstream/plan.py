"""Planning an AEP subscription over the JetStream stream (issue 14). Pure:
no I/O, no clocks; the one lookup the position search needs is passed in.

- :func:`subject_plan`: which subject filters a consumer gets for an
  ``attr-match`` filter (its ``agent`` and ``session`` terms become
  subjects, :func:`~supervisor.jetstream.subjects.filter_subjects`; every
  other term is applied in process), and for a set of named sessions.
- :func:`resolve_after`: the stream sequence a resume from ``(epoch, seq)``
  starts at, by a binary search over stream sequences with a
  ``next_by_subj`` lookup (the index is the stream itself, no process
  memory), and whether ``replay-exhausted`` is due (AEP-0003 §5: the
  earliest position the stream still holds for the session is later than
  the one right after the asked position).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

from .subjects import events_wildcard, filter_subjects, token

Position = tuple[int, int]

MAX_SUBJECTS = 256
"""At most this many subject filters per consumer (the cross product of a
filter's agents and sessions); past it the consumer takes every event
subject and the filter is applied in process only."""

def _strings(pred: Any) -> list[str] | None:
    """The exact string values an attr-match predicate pins (``None``:
    it pins none, e.g. absent). Non-string scalars can never equal a
    string attribute: they are dropped (an all-dropped list pins nothing
    a subject could hold, ``[]``)."""
    if pred is None:
        return None
    vals = pred if isinstance(pred, list) else [pred]
    return sorted({v for v in vals if isinstance(v, str)})


def subject_plan(stream: str, flt: Mapping[str, Any],
                 sessions: Sequence[str] | None = None) -> list[str]:
    """Subject filters for a consumer of ``flt`` (an attr-match filter
    object, already validated), narrowed to ``sessions`` when given (the
    sessions a resume names). Always a superset of what the filter
    matches; exactly the agent/session part of it when that fits in
    :data:`MAX_SUBJECTS`. A filter whose agent or session terms can match
    no event subject yields ``[]`` (the consumer would deliver nothing)."""
    agents = _strings(flt.get("agent"))
    pinned = _strings(flt.get("session"))
    if sessions is not None:
        named = sorted(set(sessions))
        pinned = named if pinned is None else [s for s in pinned if s in set(named)]
    if agents == [] or pinned == []:
        return []
    subjects = filter_subjects(stream, agents, pinned)
    if len(subjects) > MAX_SUBJECTS:
        if sessions is not None and len(pinned or ()) <= MAX_SUBJECTS:
            return filter_subjects(stream, None, pinned)
        return [events_wildcard(stream)]
    return subjects


def session_subject(stream: str, session: str) -> str:
    """Every event subject of one session, whatever its agent: ``S.ev.*.<session>``."""
    return f"{stream}.ev.*.{token(session)}"


@dataclass(frozen=True)
class Found:
    """One message the lookup found: its stream sequence and AEP position."""
    seq: int
    pos: Position


Lookup = Callable[[int], Awaitable["Found | None"]]
"""``lookup(n)``: the session's first message at stream sequence ``>= n``
(a ``next_by_subj`` get), ``None`` when there is none."""


@dataclass(frozen=True)
class Resolved:
    """Where a resume after ``after`` starts: ``start`` (the stream
    sequence of the first message past ``after``, or ``last + 1`` when
    none is held yet), ``exhausted`` (AEP-0003 §5) and ``earliest`` (the
    session's earliest held position, for the marker)."""
    start: int
    exhausted: bool
    earliest: Position | None


async def resolve_after(after: Position, first: int, last: int, lookup: Lookup) -> Resolved:
    """Binary search for the first message of the session whose position
    is strictly after ``after``, over stream sequences ``first..last``
    (the stream's state). Relies on a session's positions rising with
    stream sequence (one emitter session publishes in order), and takes
    ``O(log(last - first))`` lookups. Exhausted when the earliest held
    position is later than ``(epoch, seq + 1)`` (the buffer rule of the
    embedded relay, :meth:`~supervisor.relay.buffer.SessionBuffers.replay_after`)."""
    if last < first:
        return Resolved(last + 1, False, None)
    head = await lookup(first)
    if head is None:
        return Resolved(last + 1, False, None)
    nxt = (after[0], after[1] + 1)
    exhausted = head.pos > nxt
    if head.pos > after:
        return Resolved(head.seq, exhausted, head.pos)
    # P(n): "the first message at >= n is past `after` (or there is none)"
    # is monotone in n; find the least such n in (head.seq, last + 1]
    lo, hi = head.seq + 1, last + 1
    while lo < hi:
        mid = (lo + hi) // 2
        f = await lookup(mid)
        if f is None or f.pos > after:
            hi = mid
        else:
            lo = f.seq + 1  # every n in [mid, f.seq] finds f: P is false there
    f = await lookup(lo) if lo <= last else None
    return Resolved(f.seq if f is not None else last + 1, exhausted, head.pos)


__all__: Sequence[str] = ("Found", "Lookup", "MAX_SUBJECTS", "Position", "Resolved",
                          "resolve_after", "session_subject", "subject_plan")
