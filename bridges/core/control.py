"""The one control shape every controllable bridge implements (issue 7,
"one control shape"; AEP-0004 §2.3-§7; DESIGN.md "The command ledger is
shared").

A bridge that can be steered builds a :class:`Controller` inside ``run()``
from that run's state (so a restart starts clean) and hands it to the fleet
in its per-run handle, ``task_status.started(BridgeRun(controller=...))``
(:class:`bridges.core.bridge.BridgeRun`). The fleet, and only the fleet,
builds the :class:`~bridges.core.ledger.CommandLedger` around it
(``supervisor.fleet.run_bridge``) and feeds it the bridge's routed
commands. For every command the ledger:

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
   the bridge's only write path to the vendor;
6. emits the ack, then runs the :attr:`WriteResult.after_ack` the write
   returned, if any (an outcome that must follow the ack, e.g. OpenHands'
   ``x.openhands.input.sent``): right after an in-guard ack, or as soon as a
   write that outlived the guard succeeds (never before its ack is out).

The ledger carries the plan from step 3 to 6: no side dictionaries keyed by
command id. A bridge with no controller (gate closed, or not controllable)
has every command nacked ``unsupported`` by the fleet's ledger and has no
write path at all.

Writing a controller (see ``bridges/sse_common/control.py`` and
``bridges/openhands/control.py``): ``check`` resolves everything the write
needs (route, body, the answer as applied) into an immutable plan object;
``note`` and ``perform`` only read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from .aep import ACK_WINDOW_MS, NACK_REASONS

__all__ = ["ACK_WINDOW_MS", "Command", "Controller", "NACK_CODE", "Refuse", "Unreachable", "Undo",
           "WriteResult"]

Command = dict[str, Any]
"""A command envelope (``control.*`` or a vendor ``x.<agent>.control.*``)
as routed by the relay: ``{id, source, session, type, run?, subject?, data}``."""

Undo = Callable[[], None]
"""Clears exactly the note :meth:`Controller.note` set (sync, idempotent)."""

PlanT = TypeVar("PlanT")


class Controller(Protocol[PlanT]):
    """What a controllable bridge implements for one run.

    - ``accepts``: the declared ``control.accepts`` (AEP-0004 §4.2); must
      equal ``capabilities()["control"]["accepts"]``.
    - ``ack_window_ms``: the declared ack window (``hello``, > 0).
    - ``guard_ms``: the REST-settled ack guard (``*_ACK_GUARD_MS``); the
      ledger clamps it to four fifths of the window.
    """

    # read-only members: a class attribute or an instance attribute satisfies them
    @property
    def accepts(self) -> tuple[str, ...]: ...

    @property
    def ack_window_ms(self) -> int: ...

    @property
    def guard_ms(self) -> int: ...

    def check(self, cmd: Command) -> PlanT | Awaitable[PlanT]:
        """Validate ``cmd`` against the last-observed vendor state and return
        the plan to perform (sync, or a coroutine). Raises :class:`Refuse`
        (reason + detail) to nack; any other exception nacks ``invalid``.
        Never writes to the vendor. Runs under the guard deadline."""
        ...

    def note(self, plan: PlanT) -> Undo | None:
        """Set the pending-outcome note for ``plan`` just before
        :meth:`perform` starts; return its undo (called once if the command
        ends rejected or its write fails late), or ``None``. May raise
        :class:`Refuse`."""
        ...

    async def perform(self, plan: PlanT) -> WriteResult:
        """The one REST write for ``plan``: return the vendor's HTTP status
        (+ short detail, + an optional ``after_ack``); raise
        :class:`Unreachable` when the vendor cannot be reached,
        :class:`Refuse` for a vendor-side refusal."""
        ...


NACK_CODE = re.compile(r"[a-z][a-z0-9-]{0,31}")
"""A :class:`Refuse` ``code``: a lower-case token of at most 32 characters."""


class Refuse(Exception):
    """Raised by a controller's ``check`` (or ``note``, ``perform``) to refuse a command.

    ``reason``: one of ``unsupported``, ``unauthorized``, ``busy``,
    ``refused``, ``invalid`` (``schemas/registry/nack-reasons.json``;
    anything else raises ``ValueError``); ``detail``: human text,
    capture-gated (``redacted``) by the stamper; ``code``: why, as a machine
    token (``answered-oob``, ``timed-out``...: :data:`NACK_CODE`, else
    ``ValueError``), sent as ``control.rejected.data.code``, a vendor member
    of the open payload schema that leaves at ``metadata`` (AEP-0002 §5.4,
    §5.1 rule 4): what a sender can show at the default capture, where the
    ``detail`` is dropped."""

    def __init__(self, reason: str, detail: str | None = None, *,
                 code: str | None = None) -> None:
        if reason not in NACK_REASONS:
            raise ValueError(f"nack reason {reason!r} not in {NACK_REASONS}")
        if code is not None and not NACK_CODE.fullmatch(code):
            raise ValueError(f"nack code {code!r} is not a short lower-case token")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.code = code


class Unreachable(Exception):
    """Raised by a controller's ``perform`` when the vendor could not be reached
    (connect error, reset, timeout); the ledger acks ``busy``. The message
    becomes the (capture-gated) ``detail``: never put a secret in it."""


@dataclass
class WriteResult:
    """What a bridge's REST write returned: the HTTP ``status`` and a short
    ``detail`` (the vendor's error text; capture-gated before it leaves).

    ``after_ack``: an outcome to emit once the command's ``control.accepted``
    ack is out (only for a 2xx; never for a rejected command): right after
    an in-guard ack, or, for a write that outlived the guard, as soon as it
    returns (the ack having gone out already)."""

    status: int
    detail: str | None = None
    after_ack: Callable[[], Awaitable[None]] | None = None
