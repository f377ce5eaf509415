"""The command ledger (AEP-0004 §2.3, §3, §7; shared/DESIGN.md). PLACEHOLDER:
the signatures and docstrings below are the contract bridges code against;
the implementation is filled in by the ledger work item.

One ledger per control-capable bridge. For every command envelope routed to
the bridge, :meth:`CommandLedger.handle` makes exactly one ack decision and
emits it as ``control.accepted`` / ``control.rejected`` in the target session
(``cause`` = command id), within the declared ack window."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable


class Refuse(Exception):
    """Raised by a bridge's ``check`` to refuse a command.

    ``reason``: one of ``unsupported``, ``unauthorized``, ``busy``,
    ``refused``, ``invalid`` (``schemas/registry/nack-reasons.json``);
    ``detail``: human text, capture-gated (``redacted``) by the stamper."""

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Unreachable(Exception):
    """Raised by a bridge's ``write`` when the vendor could not be reached
    (connect error, reset); the ledger acks ``busy``."""


@dataclass
class WriteResult:
    """What a bridge's REST write returned: the HTTP ``status`` and a short
    ``detail`` (the vendor's error text; capture-gated before it leaves)."""

    status: int
    detail: str | None = None


Check = Callable[[dict[str, Any]], Awaitable[None] | None]
Write = Callable[[dict[str, Any]], Awaitable[WriteResult]]


class CommandLedger:
    """Dedupe + one ack decision per command + byte-identical re-ack.

    Constructor: ``CommandLedger(ctx, accepts, *, ack_window_ms=10000,
    guard_ms=8000, retain=10000)`` where ``ctx`` is the bridge's
    :class:`bridges.core.bridge.BridgeContext` (acks go out through
    ``ctx.emit`` / ``ctx.redeliver``).

    ``await ledger.handle(cmd, check=..., write=...)`` returns the ack
    envelope (or ``None`` for a duplicate that arrived mid-decision), after:

    1. dedupe on ``(cmd.source, cmd.id)``: a remembered command gets its
       recorded ack re-sent byte-identically (same ``id``, same ``seq``);
       one still being decided gets nothing (no second ack);
    2. ``cmd.type`` not in ``accepts`` -> ``control.rejected`` ``unsupported``;
    3. ``check(cmd)`` (sync or async) may raise :class:`Refuse`;
    4. ``write(cmd)`` (optional; the bridge's only REST write path) runs under
       the REST-settled ack guard: 2xx -> accepted; 4xx -> rejected
       ``refused`` with the vendor detail; 5xx or :class:`Unreachable` ->
       rejected ``busy``; no answer within ``guard_ms`` -> accepted (the write
       keeps running in the ledger's nursery; its outcome arrives as observed
       vendor events). ``guard_ms`` is clamped inside ``ack_window_ms``.
    """
