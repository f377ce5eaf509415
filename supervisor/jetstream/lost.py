"""The sessions a daemon's fleet was refused in KV ``S_bindings`` (issue 25,
hardening round two), and when each may be asked about again (pure: the
clock is passed in, trio seconds in :class:`~.presence.Presence`).

A session is *lost* when a bridge emitted into it and the bucket said a
per-emitter credential holds it, or a shared-token emitter within its hold
(:meth:`~.presence.Presence._bind`). The fleet's events there are dropped
(counted, never buffered), and the bucket is asked again as they come, at
most once per ``every`` seconds per session (one claim refresh: a held
shared-token binding's ``at`` cannot go stale faster), so a session whose
remote claim went free is taken back as the embedded relay takes it, without
a KV round trip per event and without a restart (before: lost until the
daemon restarted). At most ``cap`` sessions are remembered, the one lost
longest ago forgotten first (counted :attr:`LostSessions.evicted`; a
forgotten session is asked about again at its next event)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

__all__: Sequence[str] = ("LostSessions",)


class LostSessions:
    """The lost sessions, each with the time (``now``'s clock, seconds) from
    which it is due to be asked about again (see the module docstring).

    ``cap``: how many are remembered (at least 1); ``every``: seconds
    between two checks of one session. ``evicted``: sessions forgotten to
    stay within ``cap``."""

    def __init__(self, cap: int, every: float) -> None:
        self.cap = max(1, cap)
        self.every = every
        self.evicted = 0
        self._due: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, session: object) -> bool:
        return session in self._due

    def __len__(self) -> int:
        return len(self._due)

    def lose(self, session: str, now: float) -> bool:
        """``session`` found held (again) at ``now``: due again at ``now +
        every``, remembered as the most recent (the oldest forgotten past
        ``cap``, counted). Returns whether it was not lost before."""
        new = session not in self._due
        self._due[session] = now + self.every
        self._due.move_to_end(session)
        while len(self._due) > self.cap:
            self._due.popitem(last=False)
            self.evicted += 1
        return new

    def due(self, session: str, now: float) -> bool:
        """Whether the bucket should be asked about lost ``session`` now: at
        most once per ``every`` (a ``True`` moves its next time on, so the
        events meanwhile ask nothing). ``False`` for a session not lost."""
        at = self._due.get(session)
        if at is None or now < at:
            return False
        self._due[session] = now + self.every
        return True

    def regain(self, session: str) -> bool:
        """``session`` is the fleet's again: forgotten (its events flow).
        Returns whether it was lost."""
        return self._due.pop(session, None) is not None
