"""Who may decide a command: the ack gate (AEP-0004 §3, §4; issue 25 row 6).

An ack (``control.accepted`` / ``control.rejected``, ``cause`` = the
command's ``id``) settles its command at the sender: a sender that sees a
``control.rejected`` stops waiting. So the relay admits an ack only from
the connection it routed that command to, for a command it routed there
and that is not yet decided; anything else is refused and counted
(``refused_acks``), never buffered nor fanned out:

- on ``/socket``: a connection-scoped ``error`` frame, ``code``
  ``unauthorized``, ``cause`` the ack's own ``id`` (AEP-0003 §2; the
  connection survives);
- on ``POST /events``: 403 ``unauthorized`` (an HTTP post is no
  connection a command is ever routed to);
- in process (a fleet bridge, :class:`~.connections.LocalEmitter`): an ack
  of a command this relay routed to another connection is refused; an ack
  of a command this relay never routed is admitted (the fleet's own
  bridges are trusted code whose ledger acks only what it received, and a
  command may reach them by another way: the JetStream command listener).

"Decided" is the first ack admitted for the command; the target's
byte-identical re-emission of that recorded ack (same ``(source, id)``,
AEP-0004 §3: how a retried command's lost ack is recovered) is admitted
again, a second, different decision is refused. A command retried with the
same ``id`` re-routes: the entry follows its new target.

The table is bounded (:data:`MAX_ROUTED` commands, least recently routed
dropped first); an entry dropped before its ack makes that ack refused
from a remote connection (its sender times out and retries, which routes
it again)."""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NoReturn

from bridges.core.aep import ACK_TYPES as _ACKS

from .envelope import InvalidEvent

if TYPE_CHECKING:
    from .buffer import Entry

__all__ = ["ACK_TYPES", "AckGate", "AckRefused", "MAX_ROUTED"]

ACK_TYPES = frozenset(_ACKS)
"""The ack Event types (AEP-0004 §3, :data:`bridges.core.aep.ACK_TYPES`): they decide a command."""

MAX_ROUTED = 65_536
"""Commands the gate remembers (``(session, command id)`` -> target)."""


class AckRefused(InvalidEvent):
    """An ack from a party that may not decide its command (see the module
    docstring); the relay counts it ``refused_acks``."""


class AckGate:
    """The routed-command table: ``(session, command id)`` -> ``[target
    connection, the (source, id) of the ack that decided it or None]``.
    ``counters``: the relay's counter dict (``refused_acks`` is added).
    A connection (:class:`~.connections.Connection`, which imports this
    module) is only compared by identity here, so it is typed ``object``
    (no import circle)."""

    def __init__(self, counters: dict[str, int], max_routed: int = MAX_ROUTED) -> None:
        self._routed: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()
        self.max_routed = max_routed
        self.counters = counters
        counters.setdefault("refused_acks", 0)

    def __len__(self) -> int:
        return len(self._routed)

    def routed(self, target: object, session: str, command_id: str) -> None:
        """The relay is handing command ``command_id`` of ``session`` to
        ``target``: its ack may come from ``target`` alone. A retry to the
        same target keeps the recorded decision."""
        key = (session, command_id)
        slot = self._routed.get(key)
        if slot is not None:
            self._routed.move_to_end(key)
            if slot[0] is not target:
                slot[0] = target
            return
        self._routed[key] = [target, None]
        if len(self._routed) > self.max_routed:
            self._routed.popitem(last=False)

    def check(self, e: Entry, conn: object | None, *, trusted: bool = False) -> None:
        """Raise :class:`AckRefused` (counted) unless ``e``, an ack, may be
        admitted from ``conn`` (``None``: ``POST /events``; ``trusted``: an
        in-process fleet bridge). An admitted first ack marks its command
        decided, so call it last, just before the admission."""
        attrs = e.attrs
        cause, session = attrs.get("cause"), attrs.get("session")
        if conn is None:
            self._refuse("an ack (control.accepted/control.rejected) is accepted only from the "
                         "connection its command was routed to (AEP-0004 §3); POST /events is none")
        if not isinstance(cause, str) or not isinstance(session, str):
            self._refuse("an ack must name its command: cause = the command's id (AEP-0004 §6)")
        slot = self._routed.get((session, cause))
        if slot is None:
            if trusted:
                return
            self._refuse(f"no command {str(cause)[:80]!r} of this session was routed to this "
                         "connection; an ack is accepted only from the command's target "
                         "(AEP-0004 §3)")
        if slot[0] is not conn:
            self._refuse(f"command {str(cause)[:80]!r} was routed to another connection; only its "
                         "target may acknowledge it (AEP-0004 §3)")
        if slot[1] is None:
            slot[1] = e.key
        elif slot[1] != e.key:
            self._refuse(f"command {str(cause)[:80]!r} is already decided; only the recorded ack may "
                         "be sent again (AEP-0004 §3)")

    def _refuse(self, detail: str) -> NoReturn:
        self.counters["refused_acks"] += 1
        raise AckRefused(detail)
