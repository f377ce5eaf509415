"""The fleet supervisor: one nursery per bridge, the one relay channel, and
its sinks (DESIGN.md "The supervisor", "How data flows").

Order of delivery for every event a bridge emits: the JSONL session log first
(durable history), then the bridge's emitter connection: the embedded
relay's in-process emitter connection (the same path a remote emitter's
WebSocket takes, so routing and refusals are one code path) or, when
``AEP_RELAY_URL`` is set, the bridge's own uplink WebSocket.

A bridge that raises is logged and restarted with capped exponential backoff
and full jitter; it never takes its siblings, the pump or the relay down.

Control (one path for every bridge, :func:`run_bridge`): each run of a
bridge hands back its :class:`~bridges.core.bridge.BridgeRun` handle; the
fleet builds that run's :class:`~bridges.core.ledger.CommandLedger` around
the handle's controller (none: every command nacked ``unsupported``) and
serves the bridge's command inbox with it.

Here: each bridge's run and its supervision, the fleet's set-up, shutdown
and health. The fleet's two bases hold the rest (issue 26):
:class:`~supervisor.pump.Pump` (the relay channel's one consumer: the
batches, the session log, the sinks, JetStream) and
:class:`~supervisor.handoff.HandOff` (a routed command onto its bridge's
inbox, the ack latency).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

import trio

from bridges.core.aep import SUPPORTED_VERSIONS
from bridges.core.backoff import backoff_delay
from bridges.core.bridge import Bridge, BridgeContext, BridgeHealth, BridgeRun, Outbound
from bridges.core.envelope import EpochStore, Stamper
from bridges.core.errors import root_cause
from bridges.core.ledger import CommandLedger

from .config import Config
from .handoff import HandOff, _NotingInbox
from .pump import REFUSED_RED_S, Member, Pump, Sink, _RelaySink, _UplinkSink
from .sessionlog.retention import RetainingSessionLog
from .sessionlog.spares import SPARE_DIR, SpareFiles
from .web.metrics import Metrics

if TYPE_CHECKING:
    from .jetstream.sink import JetStreamSink
    from .relay.core import Relay

log = logging.getLogger("aep.fleet")

BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a run this long resets the backoff
BRIDGES_END_S = 2.0  # drain waits at most this long for the cancelled bridges to end


def hello_for(bridge: Bridge, host: str) -> dict[str, Any]:
    """The AEP-0003 §4 emitter ``hello`` for one bridge identity."""
    return {
        "type": "hello",
        "versions": list(SUPPORTED_VERSIONS),
        "role": "emitter",
        "identity": {"agent": bridge.agent, "instance": f"{host}/{os.getpid()}/{bridge.name}"},
        "capabilities": bridge.capabilities(),
    }


async def run_bridge(bridge: Bridge, ctx: BridgeContext, *,
                     task_status: trio.TaskStatus[BridgeRun] = trio.TASK_STATUS_IGNORED) -> None:
    """Run one bridge once, with its command service: the only place a
    :class:`~bridges.core.ledger.CommandLedger` is built.

    Starts ``bridge.run(ctx)``; once it has called ``task_status.started``
    (its listeners bound) builds this run's ledger around the handle's
    controller (``None``, or a bare ``started()``: every command is nacked
    ``unsupported``), serves ``ctx.commands`` with it, sets
    ``ctx.health.control`` (the declared gate: ``capabilities()`` accepts
    something) and hands the :class:`BridgeRun` up (``started(handle)``; a bare
    ``started()`` becomes ``BridgeRun()``). Returns when the bridge's run
    returns (the ledger and its lingering writes are cancelled); raises what
    it raises. Tests drive a bridge through this too, exactly as the fleet
    does."""
    async with trio.open_nursery() as nursery:
        got = await nursery.start(_run_then_stop, bridge, ctx, nursery.cancel_scope)
        handle = got if isinstance(got, BridgeRun) else BridgeRun()
        ctx.health.control = _check_declaration(bridge, handle)
        nursery.start_soon(_serve_commands, ctx, handle)
        task_status.started(handle)


def _check_declaration(bridge: Bridge, handle: BridgeRun) -> bool:
    """Whether the bridge declares control; a controller whose ``accepts``
    differs from the ``hello`` declaration is a bridge bug, logged (the
    controller's set is what the ledger honors)."""
    control = bridge.capabilities().get("control")
    declared = tuple(control.get("accepts") or ()) if control else ()
    c = handle.controller
    if (tuple(c.accepts) if c is not None else ()) != declared:
        log.warning("bridge %s declares control.accepts %s but its run %s", bridge.name,
                    list(declared), f"accepts {list(c.accepts)}" if c is not None
                    else "has no controller (every command is nacked unsupported)")
    return bool(declared)


async def _run_then_stop(bridge: Bridge, ctx: BridgeContext, scope: trio.CancelScope, *,
                         task_status: trio.TaskStatus[BridgeRun | None]) -> None:
    await bridge.run(ctx, task_status=task_status)
    scope.cancel()  # the run is over: so is its command service


async def _serve_commands(ctx: BridgeContext, handle: BridgeRun) -> None:
    """The run's ledger over the inbox. A bridge that declares no control
    still gets its commands answered (``unsupported``, AEP-0004 §4.2, §7: a
    relay that routes anyway, e.g. a remote one in uplink mode)."""
    async with CommandLedger(ctx, handle.controller) as ledger:
        await ledger.serve(ctx.commands)


class Fleet(Pump, HandOff):
    """Owns the bridges, the relay channel and the sinks.

    ``relay`` is the embedded :class:`supervisor.relay.core.Relay` (``None``
    when uplinking). Use :meth:`run` inside a nursery via ``nursery.start``;
    :meth:`drain` performs the orderly part of shutdown."""

    def __init__(self, cfg: Config, bridges: list[Bridge], *, relay: Relay | None = None,
                 host: str | None = None, mounts: Any = None) -> None:
        self.cfg = cfg
        self.relay = relay
        self.mounts = mounts
        self.host = host or socket.gethostname() or "localhost"
        self.epoch = EpochStore(cfg.state_dir).next_epoch()
        # a bridgeless fleet (`aep-bridges relay`, which holds no state lock)
        # writes no session log: it neither scans, repairs nor sweeps the
        # directory a daemon owns, nor reports its bytes in /healthz (issue 29)
        self.session_log = RetainingSessionLog(cfg.state_dir / "logs", cfg.retention,
                                               max_open=cfg.log_max_open, scan=bool(bridges))
        if bridges:
            self.session_log.repair()  # a tail torn by a crash or a full disk, before any append
        # new sessions' files are linked from spares made off the loop (issue 11)
        self.spares = self.session_log.spares = SpareFiles(cfg.state_dir / "logs" / SPARE_DIR,
                                                           target=cfg.log_spares)
        #: (bridge, type family) -> events; (bridge, decision, reason) -> acks (/metrics)
        self.emitted: Counter[tuple[str, str]] = Counter()
        self.acks: Counter[tuple[str, str, str]] = Counter()
        self._arrivals: OrderedDict[str, float] = OrderedDict()
        self.metrics = Metrics()
        self._send, self._recv = trio.open_memory_channel[Outbound](cfg.channel_size)
        self._room = trio.lowlevel.ParkingLot()  # bridges waiting for channel room
        self.members: dict[str, Member] = {}
        self.started_at = time.monotonic()
        self.counters: dict[str, int] = {"events": 0, "sink_errors": 0}
        self._families: dict[str, str] = {}  # event type -> its /metrics family (the prefix)
        for b in bridges:
            health = BridgeHealth()
            inbox_send, inbox_recv = trio.open_memory_channel[dict[str, Any]](256)
            stamper = Stamper(b.agent, epoch=self.epoch, host=self.host, policy=cfg.policy)
            ctx = BridgeContext(b.name, stamper, self._send.clone(), inbox_recv, health,
                                logging.getLogger(f"aep.bridge.{b.name}"), mounts=mounts,
                                room=self._room)
            health.control = bool(b.capabilities().get("control", {}).get("accepts"))
            ctx.attach_log(self._log_writable)
            self.members[b.name] = Member(b, ctx, health, inbox_send)
        if self.session_log.writers is not None:  # retention: an open bridge's files rank lowest
            self.session_log.writers.open_writers.update(
                n for n, m in self.members.items() if getattr(m.bridge, "open_sessions", False))
        self.jetstream: JetStreamSink | None = None
        if cfg.nats is not None:  # AEP_NATS_URL: every event also published to JetStream
            from .jetstream.presence import daemon_id
            from .jetstream.sink import JetStreamSink
            self.jetstream = JetStreamSink(
                cfg.nats, daemon_id(cfg.state_dir, self.host), host=self.host, epoch=self.epoch,
                hellos={n: hello_for(m.bridge, self.host) for n, m in self.members.items()},
                max_sessions=cfg.max_sessions, hand=self._hand_by_name, state_dir=cfg.state_dir,
                claim_grace_s=cfg.claim_grace)
        self.metrics.watch(self)
        self._bridges_scope = trio.CancelScope()
        self._bridges_done: trio.Event | None = None  # set once every bridge task has ended
        self._pump_done = trio.Event()
        self._pumping = False  # the pump task is in its loop (drain() then leaves the channel to it)
        self._js_wait: trio.CancelScope | None = None  # the pump waiting for JetStream outbox room
        self._draining = False

    # -- running -------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Attach sinks, start the pump and every bridge; ``started()`` once
        every bridge has bound its listeners (or failed its first start)."""
        async with trio.open_nursery() as nursery:
            for m in self.members.values():
                await self._attach(nursery, m)
            if self.jetstream is not None:
                await nursery.start(self.jetstream.run)
            nursery.start_soon(self._pump)
            if self.members:  # a bridgeless fleet (`aep-bridges relay`) writes no session log
                nursery.start_soon(self.session_log.maintain)
                nursery.start_soon(self.spares.keep)
            self._bridges_done = done = trio.Event()
            try:
                with self._bridges_scope:
                    async with trio.open_nursery() as bridges:
                        for m in self.members.values():
                            bridges.start_soon(self._supervise, m)
                        for m in self.members.values():
                            await m.started.wait()
                        task_status.started()
                        await trio.sleep_forever()
            finally:
                done.set()

    async def _attach(self, nursery: trio.Nursery, m: Member) -> None:
        hello = hello_for(m.bridge, self.host)
        sink: Sink
        if self.relay is not None:
            conn = self.relay.attach_emitter(
                hello, self._inbox_deliver(m),
                open_sessions=bool(getattr(m.bridge, "open_sessions", False)),
                source_base=m.ctx.stamper.source(None))  # its sources are its own from now on
            sink = _RelaySink(conn)
        else:
            from .delivery.uplink import Uplink
            assert self.cfg.relay_url is not None  # no embedded relay: uplinking
            inbox: Any = _NotingInbox(m.inbox, self._note_arrival)
            m.uplink = Uplink(self.cfg.relay_url, self.cfg.token, hello, inbox)
            sink = _UplinkSink(m.uplink)
            await nursery.start(m.uplink.run)
        m.sink = sink
        m.health.relay = sink.connected

    async def _supervise(self, m: Member) -> None:
        attempt = 0
        while True:
            t0 = trio.current_time()
            try:
                async with trio.open_nursery() as n:
                    await n.start(self._run_bridge, m)
                    m.started.set()
                log.warning("bridge %s returned; restarting", m.bridge.name)
            except Exception as e:  # noqa: BLE001 -- isolate the sibling bridges
                leaf = root_cause(e)
                log.error("bridge %s crashed: %s: %s", m.bridge.name, type(leaf).__name__, leaf,
                          exc_info=log.isEnabledFor(logging.DEBUG))
                m.health.detail = f"crashed: {type(leaf).__name__}"
            m.started.set()
            m.health.source = False
            m.restarts += 1
            m.health.count("restarts")
            if trio.current_time() - t0 > STABLE_AFTER:
                attempt = 0
            delay = backoff_delay(attempt, BACKOFF_INITIAL, BACKOFF_MAX)
            attempt += 1
            log.info("restarting bridge %s in %.1fs", m.bridge.name, delay)
            await trio.sleep(delay)

    async def _run_bridge(self, m: Member, *,
                          task_status: trio.TaskStatus[BridgeRun] = trio.TASK_STATUS_IGNORED
                          ) -> None:
        await run_bridge(m.bridge, m.ctx, task_status=task_status)

    # -- shutdown --------------------------------------------------------------
    async def drain(self) -> None:
        """Stop the bridges (no new input), deliver what the relay channel
        holds, flush the session logs, and close every uplink with a
        ``closing`` frame. Bounded by the caller's deadline."""
        self._bridges_scope.cancel()
        if self._bridges_done is not None:
            # a bridge's last words (the hook bridges dismiss their open asks,
            # AEP-0002 section 7 rule 2) are sent from its finally: let them reach the
            # channel before it closes; bounded, the caller's deadline still holds
            with trio.move_on_after(BRIDGES_END_S):
                await self._bridges_done.wait()
        self._draining = True  # the JetStream outbox no longer holds the pump
        if self._js_wait is not None:
            self._js_wait.cancel()
        if self._pumping:
            # the pump stays the channel's one consumer: with every send side
            # closed it delivers what is queued, the drain it holds first, in
            # channel order, and ends. Taking items here beside it reordered
            # them, and the relay closed under the drain it was handing over
            # (acknowledged events the consumers never saw). A sender after
            # this (an OTLP export finishing) is refused as the channel closed.
            self._send.close()
            for m in self.members.values():
                m.ctx.close_channel()
            await self._pump_done.wait()
        else:  # the pump never ran (or is gone): deliver what the channel holds here
            while True:
                try:
                    item = self._recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
                await self._deliver(item)
        self.session_log.close()
        if self.jetstream is not None:  # what JetStream has not acknowledged yet, within the deadline
            with trio.move_on_after(max(0.5, self.cfg.drain_deadline - 2.5)):
                await self.jetstream.publisher.flush()
        async with trio.open_nursery() as closing:  # concurrently: one deadline for all
            for m in self.members.values():
                if m.uplink is not None:
                    closing.start_soon(m.uplink.close, "shutdown")

    # -- health ----------------------------------------------------------------
    def healthz(self, authorized: bool) -> dict[str, Any]:
        """``{ok, relay, bridges: {name: {ok, relay, source, control}}}``;
        counts only when ``authorized`` (DESIGN.md)."""
        bridges = {}
        for name, m in self.members.items():
            if m.sink is not None:
                m.health.relay = m.sink.connected
            bridges[name] = m.health.public()
            refused = max((t for t in (m.refused_at, getattr(m.uplink, "refused_at", None))
                           if t is not None), default=None)
            if refused is not None and trio.current_time() - refused < REFUSED_RED_S:
                bridges[name]["ok"] = False
                bridges[name]["refused"] = True
            if authorized:
                bridges[name]["counters"] = dict(m.health.counters)
                if m.health.detail:
                    bridges[name]["detail"] = m.health.detail
                if m.uplink is not None:
                    bridges[name]["uplink"] = dict(getattr(m.uplink, "counters", {}))
        relay_ok = all(b["relay"] for b in bridges.values()) if self.relay is None else True
        log_ok = not self.session_log.failing
        body: dict[str, Any] = {
            "ok": relay_ok and log_ok and all(b["ok"] for b in bridges.values()),
            "relay": relay_ok,
            "log": log_ok,
            "bridges": bridges,
        }
        nats_health = self.jetstream.health if self.jetstream is not None else \
            getattr(self.relay, "nats_health", None)  # a JetStream relay's own link
        if nats_health is not None:
            body["nats"] = nats_health(authorized)
            body["ok"] = body["ok"] and body["nats"]["connected"]
        if authorized:
            body["counts"] = {
                **self.counters,
                "jsonl_lines": self.session_log.lines,
                "jsonl_errors": self.session_log.errors,
                "jsonl_bytes": self.session_log.current_bytes(),
                **{f"jsonl_{k}": v for k, v in self.session_log.retained.items()},
                "uptime_s": round(time.monotonic() - self.started_at, 1),
                "epoch": self.epoch,
            }
        return body
