"""The command hand-off (split from :mod:`supervisor.fleet` by issue 26):
:class:`HandOff`, the fleet's base, puts a routed command on its bridge's
inbox without ever blocking the relay (the embedded relay's routing, the
JetStream command listener, an uplink's inbox through
:class:`_NotingInbox`), notes each command's arrival and observes the ack
latency when the bridge's ``control.accepted`` / ``control.rejected``
passes the pump (AEP-0004 §2.3, §4).
"""
from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from typing import Any, Awaitable, Callable

import trio

from bridges.core.bridge import Envelope

from .pump import Member
from .web.metrics import Metrics

log = logging.getLogger("aep.fleet")

ACK_TRACKED = 10_000  # command arrivals remembered for the ack latency


class _NotingInbox:
    """A bridge's control inbox as its uplink sees it: each command's
    arrival is noted (the ack latency) before it is handed on."""

    def __init__(self, inbox: trio.MemorySendChannel, note: Callable[[dict[str, Any]], None]) -> None:
        self.inbox = inbox
        self.note = note

    def send_nowait(self, cmd: dict[str, Any]) -> None:
        self.note(cmd)
        self.inbox.send_nowait(cmd)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inbox, name)


class HandOff:
    """The fleet's command hand-off (:class:`~supervisor.fleet.Fleet` is
    the one subclass; it owns the attributes below)."""

    members: dict[str, Member]
    metrics: Metrics
    acks: Counter[tuple[str, str, str]]
    _arrivals: OrderedDict[str, float]

    def _inbox_deliver(self, m: Member) -> Callable[[Envelope], Awaitable[None]]:
        """Hand a routed command to the bridge without ever blocking the
        relay: a full inbox drops it and counts (the sender's retry with the
        same id recovers it, AEP-0004 §2.3). Its arrival time is noted for
        the ack latency (:meth:`_observe_ack`)."""
        async def deliver(cmd: dict[str, Any]) -> None:
            self._hand(m, cmd)
        return deliver

    def _hand(self, m: Member, cmd: dict[str, Any]) -> bool:
        """The one command hand-off (the embedded relay's routing and the
        JetStream command listener): note the arrival, put it on the
        bridge's inbox; ``False`` when full (dropped, counted, warned once
        per full spell)."""
        self._note_arrival(cmd)
        try:
            m.inbox.send_nowait(cmd)
            m.inbox_full_warned = False
            return True
        except trio.WouldBlock:
            m.health.count("commands_dropped")
            if not m.inbox_full_warned:  # once per full spell, not once per command
                m.inbox_full_warned = True
                log.warning("bridge %s control inbox full; commands dropped until it drains "
                            "(counted in commands_dropped)", m.bridge.name)
            return False

    def _hand_by_name(self, bridge: str, cmd: dict[str, Any]) -> bool:
        m = self.members.get(bridge)
        return m is not None and self._hand(m, cmd)
    def _note_arrival(self, cmd: dict[str, Any]) -> None:
        """Remember when a command reached the fleet (bounded; a retry with
        the same id keeps the first arrival)."""
        if isinstance(cmd.get("id"), str) and cmd["id"] not in self._arrivals:
            self._arrivals[cmd["id"]] = time.monotonic()
            while len(self._arrivals) > ACK_TRACKED:
                self._arrivals.popitem(last=False)

    def _observe_ack(self, bridge: str, ack: dict[str, Any]) -> None:
        """Count a first-time ack by decision and observe its latency from
        the command's arrival (:meth:`_note_arrival`)."""
        if ack["type"] == "control.accepted":
            key = (bridge, "accepted", "")
        else:
            key = (bridge, "rejected", str((ack.get("data") or {}).get("reason") or "unknown"))
        self.acks[key] += 1
        arrived = self._arrivals.pop(str(ack.get("cause")), None)
        if arrived is not None:
            self.metrics.ack_latency.observe(time.monotonic() - arrived)
