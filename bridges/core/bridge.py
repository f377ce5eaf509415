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

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ContextManager,
    NamedTuple,
    NotRequired,
    Protocol,
    TypedDict,
    cast,
)

import trio

from .aep import ACK_TYPES as _ACK_TYPES
from .envelope import Emission, Stamper
from .envelope import Gating as Gating  # the emission's hints, here beside the Bridge shapes as before
from .settings import Address

if TYPE_CHECKING:
    from .control import Controller

Envelope = dict[str, Any]
"""A stamped AEP envelope (AEP-0001 §5), as it goes on the relay channel."""


class ControlDeclaration(TypedDict):
    """``hello.capabilities.control`` (AEP-0003 §4, AEP-0004 §4.2): the
    command types the bridge accepts (``[]``: none; gated off) and its ack
    window in milliseconds."""

    accepts: list[str]
    ack_window_ms: int


class Capabilities(TypedDict):
    """The ``hello`` capability block of one emitter (AEP-0003 §4):
    ``emits`` (type families and the vendor namespace, ``["session", ...,
    "x.opencode"]``), ``capture`` (the levels it may send, ``["none",
    "metadata"]``), and ``control`` when it declares any."""

    emits: list[str]
    capture: list[str]
    control: NotRequired[ControlDeclaration]


class Outbound(NamedTuple):
    """One item on the fleet's relay channel.

    ``bridge`` names the emitting bridge identity (the key the sinks use to
    pick the emitter connection); ``event`` is a stamped AEP envelope;
    ``redelivery`` marks a byte-identical re-send of an already-logged event
    (AEP-0004 §3 re-acknowledgement): sinks forward it, the JSONL log does
    not append it twice."""

    bridge: str
    event: Envelope
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


ASGIApp = Callable[..., Any]
"""An ASGI 3 application ``async (scope, receive, send) -> None``."""


class Mounts(Protocol):
    """Paths a bridge serves on the daemon's own listener (``AEP_LISTEN``),
    for vendor surfaces that push to the daemon (the ACP tees). The daemon
    puts the listener's guards in front (Host guard, no browser
    ``Origin``, ``AEP_TOKEN`` when set); a path not mounted falls through
    to the relay (404)."""

    def mount(self, path: str, app: ASGIApp) -> ContextManager[None]:
        """Serve ``path`` (exact match) with ``app`` while the context is
        open. Raises ``ValueError`` when another bridge holds ``path``."""
        ...


class BridgeContext:
    """Everything a running bridge may touch (its only way out).

    - :meth:`emit` / :meth:`emit_nowait` stamp an emission and put it on the
      relay channel; the stamped envelope is returned (the ledger records acks
      this way).
    - :meth:`redeliver` re-sends a recorded envelope byte-identically.
    - ``commands`` yields command envelopes (``control.*``) the relay or the
      uplink routed to this bridge's sessions.
    - ``health`` is this bridge's :class:`BridgeHealth`.
    - ``mounts`` serves paths on the daemon's listener (:class:`Mounts`;
      ``None`` where there is no daemon listener, e.g. a bare test context).
    """

    def __init__(self, name: str, stamper: Stamper, channel: trio.MemorySendChannel[Outbound],
                 commands: trio.MemoryReceiveChannel[Envelope], health: BridgeHealth,
                 log: logging.Logger, mounts: Mounts | None = None, *,
                 room: trio.lowlevel.ParkingLot | None = None) -> None:
        self.name = name
        self.stamper = stamper
        self._channel = channel
        #: unparked by the channel's consumer each time it takes items off
        #: (the fleet's pump); ``None``: :meth:`wait_room` polls instead
        self._room = room
        self.commands = commands
        self.health = health
        self.log = log
        self.mounts = mounts
        self._sent = 0  # first deliveries put on the channel (log tickets)
        self._done = 0  # of those, how many the fleet has written or failed
        self._failed_at = 0  # the latest ticket the session log could not write
        self._progress = trio.Event()
        self._waiting = 0  # tasks in logged_since (no one waiting: no Event per verdict)
        #: set by a bridge whose :meth:`logged_since` waiters hand their answer to a
        #: library's thread (the OTLP gRPC handler): the fleet's pump then lets that
        #: thread take the GIL after waking them; a waiter that answers on the event
        #: loop (a hook's HTTP reply) is not delayed by that hand-over
        self.answers_in_thread = False
        self._attached = False
        self._writable: Callable[[], bool] = lambda: True
        #: command id -> set once its ack is out: an outcome ``cause``-linked to a
        #: command still being decided waits for the ack (:meth:`hold_outcomes`)
        self._unacked: dict[str, trio.Event] = {}

    # -- the ack before its outcome (AEP-0004 §1) ------------------------------------
    def hold_outcomes(self, command_id: str) -> None:
        """The ledger took ``command_id`` and has not acked it yet: until
        :meth:`release_outcomes`, an emission ``cause``-linked to it (other
        than the ack itself) waits in :meth:`emit` (:meth:`emit_nowait`
        raises :class:`Saturated` so its caller takes that path). The vendor
        can report what a write did (an abort's error frame) before the
        write's own answer, so its outcome was stamped before the ack, and a
        sender reading from the ack's position on (``aep-bridges cancel``)
        never saw it. Bounded by the ledger's guard: the ack goes out by
        then."""
        self._unacked.setdefault(command_id, trio.Event())

    def release_outcomes(self, command_id: str) -> None:
        """The ack of ``command_id`` is out (or the command was dropped):
        the outcomes held for it go on."""
        ev = self._unacked.pop(command_id, None)
        if ev is not None:
            ev.set()

    def _held(self, emission: Emission, cause: str | None) -> trio.Event | None:
        if cause is None or not self._unacked or emission.get("type") in _ACK_TYPES:
            return None
        return self._unacked.get(cause)

    # -- the durable log's verdicts (set by the fleet) --------------------------------
    def attach_log(self, writable: Callable[[], bool]) -> None:
        """Called by the fleet: this context's first deliveries are written
        to the session log by the fleet's pump, which reports each through
        :meth:`log_result`; ``writable()`` says whether the log writes now."""
        self._attached = True
        self._writable = writable

    def log_result(self, written: bool) -> None:
        """The fleet's verdict on this context's next first delivery, in order."""
        self._done += 1
        if not written:
            self._failed_at = self._done
        if self._waiting:
            self._progress.set()
            self._progress = trio.Event()

    def log_results(self, n: int, last_failed: int = 0) -> bool:
        """``n`` verdicts at once, equal to ``n`` :meth:`log_result` calls
        in order: ``last_failed`` is the 1-based position among them of the
        last ``False`` (``0``: all written). The fleet reports one drain's
        verdicts per bridge in one call (one wake-up, not one per event).
        Returns whether a task waiting in :meth:`logged_since` was woken."""
        if n <= 0:
            return False
        if last_failed:
            self._failed_at = self._done + last_failed
        self._done += n
        if self._waiting:
            self._progress.set()
            self._progress = trio.Event()
            return True
        return False

    def log_writable(self) -> bool:
        """Whether the session log writes right now (false while the disk is full)."""
        return self._writable()

    def log_mark(self) -> int:
        """A mark for :meth:`logged_since`: what has been sent so far."""
        return self._sent

    async def logged_since(self, mark: int, within_s: float = 10.0) -> bool:
        """Wait (at most ``within_s`` seconds) until everything sent after ``mark``
        has reached the session log; ``True`` when all of it was written,
        ``False`` when a line could not be (or the wait timed out). Sends of
        concurrent requests in between count too (conservative: a refusal
        only costs the sender a retry)."""
        if not self._attached:
            return True
        target = self._sent
        self._waiting += 1
        try:
            with trio.move_on_after(within_s):
                while self._done < target:
                    await self._progress.wait()
        finally:
            self._waiting -= 1
        return self._done >= target and self._failed_at <= mark

    @property
    def agent(self) -> str:
        return self.stamper.agent

    async def emit(self, session: str | None, emission: Emission, *, run: str | None = None,
                   cause: str | None = None, time: datetime | str | None = None,
                   severity: str | None = None,
                   extensions: Mapping[str, Any] | None = None) -> Envelope:
        """Stamp ``emission`` for ``session`` (``None`` only for ``agent.*``
        types) and wait for room on the relay channel. ``time``: a datetime
        or an RFC 3339 string (default now); ``severity`` overrides the
        emission's; ``extensions``: AEP-0001 §5.4 attributes. Returns the
        envelope as sent. Raises ``ValueError`` as
        :meth:`bridges.core.envelope.Stamper.stamp` does, and
        ``trio.ClosedResourceError`` / ``trio.BrokenResourceError`` for a
        closed channel; an emit that raises or is cancelled sent nothing,
        and its stamp is taken back unless another came after it."""
        held = self._held(emission, cause)
        if held is not None:
            await held.wait()
        ev = self.stamper.stamp(session, emission, run=run, cause=cause, time=time,
                                severity=severity, extensions=extensions)
        try:
            await self._channel.send(Outbound(self.name, ev))
        except BaseException:
            # not sent (a cancel while waiting for room, a closed channel: trio's
            # send is all or nothing): its seq is handed out again, if still the last
            self.stamper.unstamp(ev)
            raise
        self._sent += 1
        return ev

    def emit_nowait(self, session: str | None, emission: Emission, *, run: str | None = None,
                    cause: str | None = None, time: datetime | str | None = None,
                    severity: str | None = None,
                    extensions: Mapping[str, Any] | None = None,
                    room_seen: bool = False) -> Envelope:
        """Like :meth:`emit` but never waits. Raises :class:`Saturated` when
        the channel is full, ``trio.ClosedResourceError`` /
        ``trio.BrokenResourceError`` when it is closed; nothing is stamped
        then (no ``seq`` is burnt:
        the envelope is stamped, offered, and taken back with
        :meth:`~bridges.core.envelope.Stamper.unstamp` when the channel
        refuses it, all in one synchronous stretch; cheaper than asking the
        channel for its statistics before every event). ``room_seen``: the
        caller counted this send against :meth:`room` in the same
        synchronous stretch (kept for the batch senders that do; the
        refusal is handled the same way). An outcome of a command whose ack
        is not out yet (:meth:`hold_outcomes`) raises :class:`Saturated` too:
        the caller's waiting path (:meth:`emit`) sends it after the ack."""
        if self._unacked and self._held(emission, cause) is not None:
            raise Saturated(self.name)
        ev = self.stamper.stamp(session, emission, run=run, cause=cause, time=time,
                                severity=severity, extensions=extensions)
        try:
            self._channel.send_nowait(Outbound(self.name, ev))
        except trio.WouldBlock:
            self.stamper.unstamp(ev)
            raise Saturated(self.name) from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.stamper.unstamp(ev)  # not sent: its seq is handed out again
            raise
        self._sent += 1
        return ev

    def emit_run(self, session: str, emissions: Sequence[Emission],
                 times: Sequence[datetime | str | None], start: int, stop: int) -> int:
        """:meth:`emit_nowait` of ``emissions[i]`` with ``times[i]`` for
        ``session``, for ``i`` from ``start`` to ``stop``, in one run
        (:meth:`~bridges.core.envelope.Stamper.stamp_run`), at most as many
        as the channel has room for. Never waits, never raises for an
        emission: returns the index of the first one not sent (``stop``
        when all were), which the caller sends with :meth:`emit_nowait` to
        get its answer (the channel full or closed, a stamping refusal),
        nothing of it stamped. The same envelopes on
        the channel as those :meth:`emit_nowait` calls would put there
        (``tests/unit/core/test_stamp_run.py``)."""
        stats = self._channel.statistics()
        if not stats.open_receive_channels:
            return start  # broken: emit_nowait answers (nothing stamped here)
        # no more than the channel holds: what it would refuse is not stamped
        # here at all (emit_nowait stamps and takes it back, as it always does)
        room = stats.max_buffer_size - stats.current_buffer_used
        if room < stop - start:
            stop = start + max(0, int(room))
        send = self._channel.send_nowait
        name = self.name
        i = start
        run = self.stamper.stamp_run(session, emissions, times, start, stop)
        try:
            for ev in run:
                try:
                    send(_new_tuple(Outbound, (name, ev, False)))
                except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    self.stamper.unstamp(ev)
                    break
                i += 1
        except Exception:  # noqa: BLE001 -- raised before its seq was taken: emit_nowait answers it
            pass
        finally:
            run.close()
            self._sent += i - start
        return i

    def close_channel(self) -> None:
        """Close this context's end of the relay channel (the fleet's drain,
        once the bridge is stopped): what it sent is still delivered; a
        later emit raises ``trio.ClosedResourceError`` (an OTLP export is
        refused retryably, :class:`~bridges.otlp_in.status.Unavailable`)."""
        self._channel.close()

    def saturated(self) -> bool:
        stats = self._channel.statistics()
        return stats.current_buffer_used >= stats.max_buffer_size

    def room(self) -> int | float:
        """How many more items the relay channel holds right now (``0``:
        saturated; ``math.inf`` for an unbounded channel). Valid until the
        caller's next checkpoint: only then can another sender run."""
        stats = self._channel.statistics()
        return max(0, stats.max_buffer_size - stats.current_buffer_used)

    async def wait_room(self) -> None:
        """Return once the relay channel has room (no deadline: wrap it in
        one). Wakes when the channel's consumer takes items off (the
        fleet's pump unparks ``room``); without a ``room`` lot it looks
        again every 5 ms."""
        while self.saturated():
            if self._room is not None:
                await self._room.park()
            else:
                await trio.sleep(0.005)

    async def redeliver(self, event: Envelope) -> None:
        """Re-send an already-emitted envelope verbatim (same ``id``, same
        ``(epoch, seq)``), AEP-0004 §3."""
        await self._channel.send(Outbound(self.name, event, redelivery=True))

    async def reannounce(self, envelopes: Iterable[object]) -> int:
        """After a daemon restart, re-send what a bridge's state file
        restored as still open (the stamped ``run.started`` of an open run,
        the ``attention.requested`` of a pending ask) byte-identically, as
        :meth:`redeliver` does: the JSONL session log does not append it
        again, the relay dedupes on ``(source, id)``, and a fresh relay
        learns that this emitter claims those sessions, so commands for them
        route here (AEP-0004 §4.5) and consumers see the open ask.

        ``envelopes``: untrusted (read back from disk); only an envelope of
        this bridge's agent and stamper host with a session, an ``id`` and
        an ``(epoch, seq)`` is re-sent, in ``(session, epoch, seq)`` order.
        Returns how many were re-sent (counted ``reannounced``; the rest
        ``reannounce_skipped``)."""
        good: list[Envelope] = []
        for ev in envelopes:
            ok = isinstance(ev, dict) and isinstance(ev.get("id"), str) and ev["id"] \
                and isinstance(ev.get("type"), str) and isinstance(ev.get("session"), str) \
                and ev.get("agent") == self.stamper.agent \
                and ev.get("source") == self.stamper.source(ev["session"]) \
                and isinstance(ev.get("epoch"), int) and isinstance(ev.get("seq"), int)
            if ok:
                good.append(cast(Envelope, ev))
            else:
                self.health.count("reannounce_skipped")
        good.sort(key=lambda e: (e["session"], e["epoch"], e["seq"]))
        for ev in good:
            await self.redeliver(ev)
            self.health.count("reannounced")
        return len(good)


_new_tuple = tuple.__new__  # a named tuple without its Python-level __new__


#: bytes (JSON) of an open run's / ask's envelope a bridge keeps in its state
#: file for :meth:`BridgeContext.reannounce`; a bigger one is not kept (its id is)
REANNOUNCE_MAX = 64 * 1024


def keepable(envelope: Envelope | None) -> Envelope | None:
    """``envelope`` when a bridge may persist it for
    :meth:`BridgeContext.reannounce` (JSON-serializable, at most
    :data:`REANNOUNCE_MAX` bytes), else ``None``."""
    if envelope is None:
        return None
    try:
        return envelope if len(json.dumps(envelope)) <= REANNOUNCE_MAX else None
    except (TypeError, ValueError):
        return None


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
    supervisor restarts it with backoff, calling :meth:`run` again).
    :meth:`listeners` names every socket the bridge binds itself
    (``{"grpc": ("127.0.0.1", 4317), "http": None}``; ``None``: that listener
    is off; ``{}`` for a bridge that only dials out): the bound addresses
    while a run serves, the configured ones otherwise; the daemon refuses a
    configuration whose relay address is one of them. May raise
    ``ValueError`` for an unparsable configured address (its preflight
    reports it)."""

    name: str
    agent: str

    def capabilities(self) -> Capabilities: ...

    def preflight(self, *, check_ports: bool = True) -> list[str]: ...

    def listeners(self) -> dict[str, Address | None]: ...

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[BridgeRun | None] = trio.TASK_STATUS_IGNORED
                  ) -> None: ...
