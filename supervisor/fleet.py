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
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, Sequence

import trio

from bridges.core.aep import SUPPORTED_VERSIONS, dumps, scrub_surrogates
from bridges.core.backoff import backoff_delay
from bridges.core.bridge import Bridge, BridgeContext, BridgeHealth, BridgeRun, Envelope, Outbound
from bridges.core.envelope import EpochStore, Stamper
from bridges.core.errors import root_cause
from bridges.core.ledger import CommandLedger

from .config import Config
from .sessionlog.retention import RetainingSessionLog
from .sessionlog.spares import SPARE_DIR, SpareFiles
from .web.metrics import Metrics

if TYPE_CHECKING:
    from .delivery.uplink import Uplink
    from .jetstream.sink import JetStreamSink
    from .relay.connections import LocalEmitter
    from .relay.core import Relay

log = logging.getLogger("aep.fleet")

BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a run this long resets the backoff
REFUSED_RED_S = 300.0  # health stays red this long after the relay refused a bridge's event
ACK_TRACKED = 10_000  # command arrivals remembered for the ack latency
BRIDGES_END_S = 2.0  # drain waits at most this long for the cancelled bridges to end


class Sink(Protocol):
    """Where one bridge's envelopes go after the JSONL log."""

    @property
    def connected(self) -> bool: ...

    #: ``offer(event, raw) -> bool``: hand a first delivery over without
    #: waiting (``False``: not taken, use :meth:`send`); ``None``: always :meth:`send`
    offer: Callable[[dict[str, Any], bytes], bool] | None

    async def send(self, event: dict[str, Any], redelivery: bool, raw: bytes) -> None: ...


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


class _RelaySink:
    """The embedded relay's in-process emitter connection for one bridge:
    the trusted path (:meth:`LocalEmitter.ingest_stamped
    <supervisor.relay.connections.LocalEmitter.ingest_stamped>`): the
    stamper built the envelope and the fleet encoded it, so the relay takes
    those bytes as they are instead of validating and encoding again."""

    def __init__(self, conn: LocalEmitter) -> None:
        self.conn = conn
        self.connected = True
        self._stamped = getattr(conn, "ingest_stamped", None)  # a connection may offer none
        #: the pump's synchronous hand-off (no coroutine per event): the
        #: trusted path, ``False`` for what it does not take (a command)
        self.offer: Callable[[dict[str, Any], bytes], bool] | None = self._stamped
        #: the same for a run of one drain at once: ``offer_run(pairs, start)``
        #: -> the index of the first pair not taken (``send`` answers it)
        self.offer_run: Callable[[Sequence[tuple[dict[str, Any], bytes]], int], int] | None = \
            getattr(conn, "ingest_stamped_run", None)

    async def send(self, event: dict[str, Any], redelivery: bool, raw: bytes) -> None:
        if self._stamped is None or not self._stamped(event, raw):
            await self.conn.ingest(event)  # a command (routed), or no trusted path


class _UplinkSink:
    offer: Callable[[dict[str, Any], bytes], bool] | None = None  # the uplink's put may wait
    offer_run: Callable[[Sequence[tuple[dict[str, Any], bytes]], int], int] | None = None

    def __init__(self, uplink: Uplink) -> None:
        self.uplink = uplink

    @property
    def connected(self) -> bool:
        return bool(self.uplink.connected)

    async def send(self, event: dict[str, Any], redelivery: bool, raw: bytes) -> None:
        await self.uplink.put(event, redelivery=redelivery, wire=raw.decode("utf-8"))


PUMP_BATCH = 256
"""Most items the pump takes off the relay channel per drain: one JSONL
``write`` per session file and one yield to the relay's writers per drain,
instead of one of each per event; small enough that the relay's
writers, which run between drains, keep a burst under each consumer's
soft budget (AEP-0003 §8.4 sheds slow consumers, not healthy ones)."""


def take_batch(recv: trio.MemoryReceiveChannel[Any], first: Any, limit: int = PUMP_BATCH) -> list[Any]:
    """``first`` and whatever else ``recv`` holds right now, at most
    ``limit`` items in all, without waiting (the pump's one drain)."""
    batch = [first]
    while len(batch) < limit:
        try:
            batch.append(recv.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    return batch


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


@dataclass
class Member:
    """One bridge in the fleet with everything the supervisor keeps for it."""

    bridge: Bridge
    ctx: BridgeContext
    health: BridgeHealth
    inbox: trio.MemorySendChannel[Envelope]
    sink: Sink | None = None
    uplink: Uplink | None = None
    restarts: int = 0
    refused_at: float | None = None  # trio time of the relay's last refusal of its event
    inbox_full_warned: bool = False
    started: trio.Event = field(default_factory=trio.Event)


def _drop_gil() -> None:
    """Let another thread take the GIL now, if one waits for it. The sender
    that :meth:`Fleet._deliver_batch` let answer first may answer from a
    library's thread (grpcio's handler, waiting on
    :func:`trio.from_thread.run`): it needs the GIL to send, and the event
    loop, going on to the relay's fan-out, would keep it for a whole switch
    interval (:data:`supervisor.daemon.GIL_SWITCH_S`). Measured on the
    OTLP gRPC bench (issue 11): the export's end to the handler's return
    went from 0.77 ms to 0.20 ms (median), so the relay's work overlaps
    the exporter's next request instead of delaying this answer.
    ``time.sleep(0)`` releases the GIL and takes it back: a few
    microseconds when no thread waits."""
    time.sleep(0)  # noqa: ASYNC251 -- a zero sleep: the GIL's hand-over, not a wait


class Fleet:
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
        self.jetstream: JetStreamSink | None = None
        if cfg.nats is not None:  # AEP_NATS_URL: every event also published to JetStream
            from .jetstream.presence import daemon_id
            from .jetstream.sink import JetStreamSink
            self.jetstream = JetStreamSink(
                cfg.nats, daemon_id(cfg.state_dir, self.host), host=self.host, epoch=self.epoch,
                hellos={n: hello_for(m.bridge, self.host) for n, m in self.members.items()},
                max_sessions=cfg.max_sessions, hand=self._hand_by_name, state_dir=cfg.state_dir)
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
            conn = self.relay.attach_emitter(hello, self._inbox_deliver(m))
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

    async def _pump(self) -> None:
        """The relay channel's one consumer: JSONL first, then the sink.
        Moves batches: whatever is queued (up to :data:`PUMP_BATCH`) is
        encoded, appended to the session logs (one ``write`` per file) and
        handed to the sinks in order, then the pump yields once: the
        channel's ``receive`` always does (it parks when nothing is queued,
        else it is a checkpoint), so the relay's writers get their turn
        between drains without a checkpoint of its own, which cost an idle
        pump one more wake-up per event, in the writers' turn (issue 11).
        Its only other yields: two turns between the log and the sinks when
        an export waits on the drain's verdicts (:meth:`_deliver_batch`), and
        a sink's own waits. At shutdown it stays the channel's one consumer
        until the channel ends (:meth:`drain`)."""
        recv = self._recv
        self._pumping = True
        try:
            async for item in recv:
                batch = take_batch(recv, item)
                self._room.unpark_all()  # the channel has room again
                await self._deliver_batch(batch)
        finally:
            self._pumping = False
            self._pump_done.set()

    def _encode(self, item: Outbound, *, report: bool = True
                ) -> tuple[dict[str, Any], bytes] | None:
        """``(event, wire bytes)`` (:func:`~bridges.core.aep.dumps`, no
        newline), the event repaired when its text had no UTF-8 form;
        ``None`` for an event that is not JSON (counted, logged; its
        bridge told it was not written unless ``report`` is false: the
        caller tells it, in order)."""
        ev = item.event
        try:
            return ev, dumps(ev)
        except UnicodeEncodeError:
            # vendor text with a lone surrogate: no UTF-8 form, so not an AEP
            # event as it stands; U+FFFD it, once, for the log and the relay
            ev = scrub_surrogates(ev)
            self.counters["unencodable_text"] = self.counters.get("unencodable_text", 0) + 1
            return ev, dumps(ev)
        except (TypeError, ValueError) as e:  # not JSON at all: a bridge bug, never fatal
            self.counters["unserializable"] = self.counters.get("unserializable", 0) + 1
            log.error("bridge %s emitted an unserializable event (%s): dropped",
                      item.bridge, type(e).__name__)
            if report and not item.redelivery:
                self._log_result(item.bridge, False)
            return None

    async def _deliver(self, item: Outbound) -> None:
        await self._deliver_batch([item])

    async def _deliver_batch(self, items: list[Outbound]) -> None:
        """Encode each event once; append the new ones to the session log
        (one ``write`` per session file) and report each to its bridge
        (:meth:`~bridges.core.bridge.BridgeContext.log_result`, in order);
        then hand each, with its encoded bytes, to its bridge's sink, in
        channel order. The bytes are the wire form without a newline (what
        the relay, the uplink and JetStream take); the session log's join
        puts the newlines in (no per-event copy to add or cut one)."""
        # two parallel lists, no per-event tuple beyond the (event, bytes)
        # pair: ``pairs`` is what the session log and the relay take as it is
        outs: list[Outbound] = []
        pairs: list[tuple[dict[str, Any], bytes]] = []
        redelivered = False
        for k, item in enumerate(items):
            try:  # the common case inline; _encode has the repairs and refusals
                pairs.append((item.event, dumps(item.event)))
            except (TypeError, ValueError):
                got = self._encode(item, report=False)
                if got is None:
                    # not JSON: its verdict (unwritten) reaches its bridge in channel
                    # order, after those before it and before those after it (a
                    # bridge's logged_since reads the order: an export whose event
                    # was dropped must not be the one acknowledged)
                    if k:
                        await self._deliver_batch(items[:k])
                    if not item.redelivery:
                        self._log_result(item.bridge, False)
                    if k + 1 < len(items):
                        await self._deliver_batch(items[k + 1:])
                    return
                pairs.append(got)
            outs.append(item)
            if item.redelivery:
                redelivered = True
        if redelivered:  # a re-send is forwarded, never logged twice
            keep = [k for k, item in enumerate(outs) if not item.redelivery]
            fresh_outs, fresh = [outs[k] for k in keep], [pairs[k] for k in keep]
        else:
            fresh_outs, fresh = outs, pairs
        if fresh:
            if self._logged(fresh_outs, fresh, self.session_log.write_raw_batch(fresh)):
                # a sender waits on these verdicts (an OTLP export's answer):
                # let it answer before the relay's fan-out, so the exporter's
                # next request arrives while the relay works (issue 11). Two
                # turns: trio runs a turn's tasks in random order, so the woken
                # sender has surely run once the pump is back from the second.
                # The drain still reaches the sinks next, in order (shielded:
                # a cancel here must not lose what the log already has).
                await trio.lowlevel.cancel_shielded_checkpoint()
                await trio.lowlevel.cancel_shielded_checkpoint()
                _drop_gil()
        await self._hand_over(outs, pairs)
        js = self.jetstream
        if js is not None:  # the JetStream sink: the same bytes, in channel order
            i = 0
            if not self._draining:
                # its waits for outbox room (NATS down, notice+ piling up) hold
                # the pump; drain() ends them: from the one it cancels on, the
                # events are offered without waiting (they are in the log)
                self._js_wait = scope = trio.CancelScope()
                with scope:
                    for i, (item, (ev, raw)) in enumerate(zip(outs, pairs, strict=True)):  # noqa: B007 -- i is read after: where a cancel stopped the loop
                        await js.put(ev, raw, item.bridge)
                    i = len(outs)
                self._js_wait = None
            for item, (ev, raw) in zip(outs[i:], pairs[i:], strict=True):
                await js.put(ev, raw, item.bridge, wait=False)

    async def _hand_over(self, outs: list[Outbound],
                         pairs: list[tuple[dict[str, Any], bytes]]) -> None:
        """Hand each encoded event (``pairs[i]``, of ``outs[i]``) to its
        bridge's sink, in channel order: a run of one bridge's first
        deliveries through the sink's ``offer_run`` (the list itself when
        the run goes to the end), the rest one by one (:meth:`_to_sink`)."""
        members = self.members
        i, n = 0, len(outs)
        while i < n:
            item = outs[i]
            m = members.get(item.bridge)
            if m is None or m.sink is None:
                i += 1
                continue
            run = None if item.redelivery else getattr(m.sink, "offer_run", None)
            if run is not None:
                # the trusted path takes this bridge's next first deliveries in
                # one call; the pair it stops at (a command, a refusal) and a
                # run that raises take the one-event path below, in order
                j = i + 1
                while j < n and outs[j].bridge == item.bridge and not outs[j].redelivery:
                    j += 1
                whole = j == n  # to the end: the list itself, indices as they are
                try:
                    i = run(pairs, i) if whole else i + run(pairs[i:j], 0)
                except Exception as exc:  # noqa: BLE001 -- answered event by event below
                    taken = getattr(exc, "taken", None)  # RunFault: pairs before it were taken
                    if taken is not None:  # counted like _to_sink's fault, never handed over again
                        self.counters["sink_errors"] += 1
                        cause = exc.__cause__ or exc
                        log.error("sink for %s failed: %s: %s", item.bridge, type(cause).__name__, cause)
                        i = taken if whole else i + taken
                        continue
                    # raised before taking anything (e.g. the relay closed)
                if i == j:
                    continue
                item = outs[i]
            ev, raw = pairs[i]
            await self._to_sink(m, item, ev, raw)
            i += 1

    async def _to_sink(self, m: Member, item: Outbound, ev: dict[str, Any], raw: bytes) -> None:
        """Hand one encoded event (``raw``: its wire bytes) to ``m``'s sink;
        a sink fault is counted and logged, never raised (a refusal of the
        relay turns health red)."""
        assert m.sink is not None
        try:
            offer = m.sink.offer if not item.redelivery else None
            if offer is None or not offer(ev, raw):
                await m.sink.send(ev, item.redelivery, raw)
        except Exception as e:  # noqa: BLE001 -- a sink fault must not stop the pump
            self.counters["sink_errors"] += 1
            if type(e).__name__ == "InvalidEvent":
                # the relay refused the bridge's own event (a forged position took
                # its place, issue 10 #8): consumers miss it, so health goes red
                m.health.count("relay_refused")
                m.health.detail = f"relay refused an event: {str(e)[:120]}"
                first = m.refused_at is None or \
                    trio.current_time() - m.refused_at > REFUSED_RED_S
                m.refused_at = trio.current_time()
                if first:
                    log.error("relay refused an event of %s (%s); health is red (counted "
                              "in relay_refused)", item.bridge, e)
                return
            log.error("sink for %s failed: %s: %s", item.bridge, type(e).__name__, e)

    def _logged(self, outs: list[Outbound], fresh: list[tuple[dict[str, Any], bytes]],
                written: list[bool]) -> bool:
        """Count the first deliveries ``outs`` (their ``(event, bytes)``
        pairs ``fresh``) the session log was given and report each verdict
        in ``written`` to its bridge, in order. Returns whether a bridge
        had a task waiting on its verdicts (``logged_since``), now woken."""
        self.counters["events"] += len(fresh)
        families = self._families
        # per bridge [verdicts, 1-based position of the last failure]: one
        # log_results call per bridge per drain instead of one per event
        verdicts: dict[str, list[int]] = {}
        # per bridge, events per exact type (one dict step an event, no key
        # tuple), folded into the (bridge, family) counts once per drain
        types: dict[str, dict[str, int]] = {}
        bridge: str | None = None
        tally: list[int] = []
        seen: dict[str, int] = {}
        for item, (ev, _), ok in zip(outs, fresh, written, strict=True):
            if item.bridge != bridge:
                bridge = item.bridge
                tally = verdicts.get(bridge) or verdicts.setdefault(bridge, [0, 0])
                seen = types.get(bridge) or types.setdefault(bridge, {})
            tally[0] += 1
            if not ok:
                self.counters["jsonl_unwritten"] = self.counters.get("jsonl_unwritten", 0) + 1
                tally[1] = tally[0]
            type_ = ev.get("type", "")
            if type_.__class__ is not str:
                type_ = str(type_)
            seen[type_] = seen.get(type_, 0) + 1
            if type_ in ("control.accepted", "control.rejected"):
                self._observe_ack(bridge, ev)
        emitted = self.emitted
        for name, counts in types.items():
            for type_, n in counts.items():
                family = families.get(type_)
                if family is None:
                    family = type_.split(".", 1)[0]
                    if len(families) < 4096:  # a bound: types are vendor-chosen
                        families[type_] = family
                emitted[(name, family)] += n
        members = self.members
        woke = False
        for name, (n, last_failed) in verdicts.items():
            m = members.get(name)
            if m is not None:
                woke = m.ctx.log_results(n, last_failed) or woke
        return woke

    def _log_writable(self) -> bool:
        return self.session_log.writable()

    def _log_result(self, bridge: str, written: bool) -> None:
        m = self.members.get(bridge)
        if m is not None:
            m.ctx.log_result(written)

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
