"""The contract between a bridge and the fleet supervisor.

A bridge is a vendor adapter: its receiver (trio tasks it owns) turns what the
vendor publishes into *emissions* (the mapping pins' ``expected`` shape:
``{type, data?, subject?, step?, severity?}``) and hands them to its
:class:`BridgeContext`, which stamps them into AEP envelopes
(:class:`bridges.core.envelope.Stamper`) and feeds the fleet's one relay
channel. Commands routed to the bridge's sessions arrive on
``ctx.commands`` and are served by the fleet through the bridge's
per-run :class:`BridgeRun` handle (its :class:`~bridges.core.control.Controller`,
or none). Design: ``shared/DESIGN.md`` ("How data flows",
"Identity": each bridge is its own emitter).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import trio

from .envelope import Stamper

if TYPE_CHECKING:
    from .control import Controller

Emission = dict[str, Any]
"""One mapped moment, shaped like a mapping pin's ``expected`` object:
``{"type": str, "data"?: dict, "subject"?: str, "step"?: str,
"severity"?: str}``."""


class Outbound(NamedTuple):
    """One item on the fleet's relay channel.

    ``bridge`` names the emitting bridge identity (the key the sinks use to
    pick the emitter connection); ``event`` is a stamped AEP envelope;
    ``redelivery`` marks a byte-identical re-send of an already-logged event
    (AEP-0004 §3 re-acknowledgement): sinks forward it, the JSONL log does
    not append it twice."""

    bridge: str
    event: dict[str, Any]
    redelivery: bool = False


class Saturated(Exception):
    """The relay channel is full; the caller must push back on its source
    (OTLP answers 503/UNAVAILABLE with Retry-After) instead of dropping."""


@dataclass
class BridgeHealth:
    """What ``/healthz`` reports per bridge (DESIGN.md "The supervisor").

    ``source``: the vendor surface is reachable and healthy (``False`` while
    disconnected, ``"degraded"`` for a connected but silent stream);
    ``relay``: the bridge's emitter connection is up (set by the fleet);
    ``control``: the control gate is open (``True``) or closed (``False``);
    ``detail``: one short human line on the last problem (never a secret);
    ``counters``: monotonic counts (drops, malformed frames...) shown only
    behind the token."""

    source: bool | str = False
    relay: bool = False
    control: bool = False
    detail: str | None = None
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.source is True and self.relay

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def public(self) -> dict[str, Any]:
        return {"ok": self.ok, "relay": self.relay, "source": self.source,
                "control": self.control}


class BridgeContext:
    """Everything a running bridge may touch (its only way out).

    - :meth:`emit` / :meth:`emit_nowait` stamp an emission and put it on the
      relay channel; the stamped envelope is returned (the ledger records acks
      this way).
    - :meth:`redeliver` re-sends a recorded envelope byte-identically.
    - ``commands`` yields command envelopes (``control.*``) the relay or the
      uplink routed to this bridge's sessions.
    - ``health`` is this bridge's :class:`BridgeHealth`.
    """

    def __init__(self, name: str, stamper: Stamper, channel: trio.MemorySendChannel,
                 commands: trio.MemoryReceiveChannel, health: BridgeHealth,
                 log: logging.Logger) -> None:
        self.name = name
        self.stamper = stamper
        self._channel = channel
        self.commands = commands
        self.health = health
        self.log = log

    @property
    def agent(self) -> str:
        return self.stamper.agent

    async def emit(self, session: str, emission: Emission, **envelope: Any) -> dict[str, Any]:
        """Stamp ``emission`` for ``session`` and wait for room on the relay
        channel. ``envelope`` keywords: ``run``, ``cause``, ``time``
        (datetime or RFC 3339 str), ``severity``, ``extensions``. Returns the
        envelope as sent."""
        ev = self.stamper.stamp(session, emission, **envelope)
        await self._channel.send(Outbound(self.name, ev))
        return ev

    def emit_nowait(self, session: str, emission: Emission, **envelope: Any) -> dict[str, Any]:
        """Like :meth:`emit` but never waits. Raises :class:`Saturated` when
        the channel is full; nothing is stamped then (no ``seq`` is burnt)."""
        if self.saturated():
            raise Saturated(self.name)
        ev = self.stamper.stamp(session, emission, **envelope)
        try:
            self._channel.send_nowait(Outbound(self.name, ev))
        except trio.WouldBlock:  # raced to full between check and send
            raise Saturated(self.name) from None
        return ev

    def saturated(self) -> bool:
        stats = self._channel.statistics()
        return stats.current_buffer_used >= stats.max_buffer_size

    async def redeliver(self, event: dict[str, Any]) -> None:
        """Re-send an already-emitted envelope verbatim (same ``id``, same
        ``(epoch, seq)``), AEP-0004 §3."""
        await self._channel.send(Outbound(self.name, event, redelivery=True))


@dataclass
class BridgeRun:
    """The per-run handle a bridge's :meth:`Bridge.run` hands the fleet with
    ``task_status.started(handle)`` once its listeners are bound.

    ``controller``: this run's :class:`bridges.core.control.Controller`
    (``None``: the gate is closed or the bridge is not controllable; every
    command is then nacked ``unsupported``). The fleet builds the run's
    :class:`~bridges.core.ledger.CommandLedger` around it and serves
    ``ctx.commands``; bridges never build a ledger.

    A bridge subclasses this with the rest of its run state (receiver,
    tracker, state file...): everything a run owns lives here, never on the
    bridge object, so a restart starts clean (only what the bridge
    deliberately persisted to disk carries over). Tests reach a run's
    internals through the handle ``nursery.start`` returns."""

    controller: Controller[Any] | None = None


class Bridge(Protocol):
    """What the supervisor runs. One instance per emitter identity.

    ``name``: config/health key (``otlp_in.codex``); ``agent``: the AEP agent
    id; :meth:`capabilities` is the ``hello`` capability block (``emits``,
    ``capture``, ``control: {accepts, ack_window_ms}``); :meth:`preflight`
    returns one problem line per bad setting (checked before anything binds;
    ``check_ports=False`` skips the are-my-ports-free probe, for ``aep-bridges check``);
    :meth:`run` owns every task of the bridge in its own nursery, builds
    its per-run state, calls ``task_status.started(BridgeRun(...))`` (or a
    subclass; plain ``started()`` means no controller) once its listeners
    are bound, and returns or raises only when the bridge stops (the
    supervisor restarts it with backoff, calling :meth:`run` again)."""

    name: str
    agent: str

    def capabilities(self) -> dict[str, Any]: ...

    def preflight(self, *, check_ports: bool = True) -> list[str]: ...

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[BridgeRun | None] = trio.TASK_STATUS_IGNORED
                  ) -> None: ...
