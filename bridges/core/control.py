"""The one control shape every controllable bridge implements (issue 7,
"one control shape"; AEP-0004 §2.3-§7; DESIGN.md "The command ledger is
shared").

A bridge that can be steered hands the fleet a :class:`Controller` for the
current run (built inside ``run()`` from that run's state, so a restart
starts clean). The fleet, and only the fleet, builds the
:class:`~bridges.core.ledger.CommandLedger` around it and feeds it the
bridge's routed commands. For every command the ledger:

1. dedupes on ``(source, id)`` and re-acks a decided command byte-identically;
2. nacks ``unsupported`` anything outside :attr:`Controller.accepts`;
3. calls :meth:`Controller.check` -> a *plan* (or :class:`Refuse`): validation
   against the bridge's last-observed vendor state, no I/O to the vendor;
4. calls :meth:`Controller.note` with the plan: the pending-outcome note (a
   settling mark, a pending cancel) that cause-links the vendor's outcome to
   the command id even when the vendor's event beats the REST reply; it
   returns the ``undo`` the ledger calls exactly once if the command ends
   rejected or a late write fails;
5. runs :meth:`Controller.perform` with the plan under the REST-settled guard:
   the bridge's only write path to the vendor.

The ledger carries the plan from step 3 to 5: no side dictionaries keyed by
command id. A bridge with no controller (gate closed, or not controllable)
has every command nacked ``unsupported`` by the fleet's ledger and has no
write path at all.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol, TypeVar

from .ledger import Refuse, Unreachable, WriteResult

__all__ = ["Controller", "Refuse", "Unreachable", "WriteResult", "Undo"]

Command = dict[str, Any]
"""A command envelope (``control.*`` or a vendor ``x.<agent>.control.*``)
as routed by the relay: ``{id, source, session, type, run?, data}``."""

Undo = Callable[[], None]

PlanT = TypeVar("PlanT")


class Controller(Protocol[PlanT]):
    """What a controllable bridge implements for one run.

    - ``accepts``: the declared ``control.accepts`` (AEP-0004 §4.2).
    - ``ack_window_ms``: the declared ack window (``hello``).
    - ``guard_ms``: the REST-settled ack guard (``*_ACK_GUARD_MS``).
    """

    accepts: tuple[str, ...]
    ack_window_ms: int
    guard_ms: int

    def check(self, cmd: Command) -> PlanT | Awaitable[PlanT]:
        """Validate ``cmd`` against the last-observed vendor state and return
        the plan to perform. Raises :class:`Refuse` (reason + detail) to nack;
        never writes to the vendor."""
        ...

    def note(self, plan: PlanT) -> Undo | None:
        """Set the pending-outcome note for ``plan`` just before
        :meth:`perform` starts; return its undo (called once if the command
        ends rejected or its write fails late), or ``None``."""
        ...

    async def perform(self, plan: PlanT) -> WriteResult:
        """The one REST write for ``plan``: return the vendor's HTTP status
        (+ short detail); raise :class:`Unreachable` when the vendor cannot
        be reached, :class:`Refuse` for a vendor-side refusal."""
        ...
