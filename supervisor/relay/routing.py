"""Command routing of the embedded relay (AEP-0004 §4): a command goes to
exactly one live claimant of its session or is refused, only an
authenticated binding may send one (§4.1), and a per-emitter credential
commands only the sessions bound to it (§4.3 item 3, per-sender scoping at
the relay: :func:`.bindings.command_refusal`, counted
``refused_command_scope``).

:class:`Routing` is the bottom of the :class:`~.core.Relay`'s mixins
(:class:`.ingest.Ingest` routes what it accepts through it): it declares
the relay state it reads (the claim table, the ack gate, the fan-out,
the counters, the token), which :class:`~.core.Relay` builds."""
from __future__ import annotations

import logging
from typing import Any

from .acks import AckGate
from .bindings import Bindings, command_refusal
from .buffer import Entry
from .connections import Claims, Connection
from .fanout import Fanout

__all__ = ["Routing"]

log = logging.getLogger("aep.relay")


class Routing:
    """The relay's command routing (a mixin of :class:`~.core.Relay`,
    which sets the attributes declared here)."""

    _token: bytes | None
    claims: Claims
    bindings: Bindings
    acks: AckGate
    fanout: Fanout
    counters: dict[str, int]

    async def _route(self, ev: dict[str, Any], e: Entry, sender: Connection | None,
                     raw: str | None) -> tuple[str, str] | None:
        """AEP-0004 §4: deliver to exactly one live claimant or refuse."""
        refusal = self._route_check(ev, sender)
        if refusal is None:
            target = self.claims.holders(ev["session"])[0]
            self.acks.routed(target, ev["session"], ev["id"])  # before: an ack may come at once
            try:
                await target.deliver_command(ev, raw)
            except Exception as exc:  # noqa: BLE001 -- a dead target is no route
                log.warning("relay: command delivery failed: %s", type(exc).__name__)
                refusal = ("no-route", "the owning connection is going away")
        if refusal is not None:
            self.counters["commands_refused"] += 1
            return refusal
        self.counters["commands_routed"] += 1
        self.fanout.offer(e)  # audit visibility, live only: commands carry no seq
        return None

    def _route_check(self, ev: dict[str, Any], sender: Connection | None) -> tuple[str, str] | None:
        """The refusals in order: authentication (§4.1), the sender's scope
        (§4.3; before the claims, so a refused sender learns nothing of who
        is connected), then the claim table's (§4.2, §4.5)."""
        return (self.auth_refusal(sender) or self.scope_refusal(ev["session"], sender)
                or self.claims.refusal(ev["session"], ev["type"]))

    def scope_refusal(self, session: str, sender: Connection | None) -> tuple[str, str] | None:
        """``unauthorized`` (counted ``refused_command_scope``) when
        ``sender``'s principal is a per-emitter credential and ``session``
        is not bound to it (unbound, the fleet's, another credential's, a
        shared-token emitter's: :func:`.bindings.command_refusal`); ``None``
        when it may command the session (the shared token and the fleet
        may command every one)."""
        if sender is None:
            return None
        b = self.bindings.get(session)
        why = command_refusal(sender.principal, b.principal if b is not None else None)
        if why is None:
            return None
        self.counters["refused_command_scope"] += 1
        return ("unauthorized", why)

    def auth_refusal(self, sender: Connection | None) -> tuple[str, str] | None:
        """``unauthorized`` unless ``sender`` is an authenticated binding
        (AEP-0004 §4.1); ``None`` when it may send commands."""
        if sender is None or not sender.authenticated:
            if self._token is None:
                return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1); "
                        "this relay runs without AEP_TOKEN (watch-only)")
            return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1)")
        return None
