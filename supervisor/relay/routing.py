"""Command routing of the embedded relay (AEP-0004 §4): a command goes to
exactly one live claimant of its session or is refused, and only an
authenticated binding may send one (§4.1).

:class:`Routing` is the bottom of the :class:`~.core.Relay`'s mixins
(:class:`.ingest.Ingest` routes what it accepts through it): it declares
the relay state it reads (the claim table, the ack gate, the fan-out,
the counters, the token), which :class:`~.core.Relay` builds."""
from __future__ import annotations

import logging
from typing import Any

from .acks import AckGate
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
        return self.auth_refusal(sender) or self.claims.refusal(ev["session"], ev["type"])

    def auth_refusal(self, sender: Connection | None) -> tuple[str, str] | None:
        """``unauthorized`` unless ``sender`` is an authenticated binding
        (AEP-0004 §4.1); ``None`` when it may send commands."""
        if sender is None or not sender.authenticated:
            if self._token is None:
                return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1); "
                        "this relay runs without AEP_TOKEN (watch-only)")
            return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1)")
        return None
