"""The relay channel's one consumer (split from :mod:`supervisor.fleet` by
issue 26): :class:`Pump`, the fleet's base, takes what the bridges put on
the channel in batches (:data:`PUMP_BATCH`), encodes each event once,
appends the new ones to the JSONL session log (one ``write`` per session
file) and reports each verdict to its bridge, then hands each, with its
encoded bytes, to its bridge's :class:`Sink` (the embedded relay's
in-process emitter connection, or the bridge's uplink) and to JetStream,
in channel order (DESIGN.md "How data flows").
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import trio

from bridges.core.aep import dumps, scrub_surrogates
from bridges.core.bridge import Bridge, BridgeContext, BridgeHealth, Envelope, Outbound

from .sessionlog.retention import RetainingSessionLog
from .web.metrics import Metrics

if TYPE_CHECKING:
    from .delivery.uplink import Uplink
    from .jetstream.sink import JetStreamSink
    from .relay.connections import LocalEmitter

log = logging.getLogger("aep.fleet")

REFUSED_RED_S = 300.0  # health stays red this long after the relay refused a bridge's event


class Sink(Protocol):
    """Where one bridge's envelopes go after the JSONL log."""

    @property
    def connected(self) -> bool: ...

    #: ``offer(event, raw) -> bool``: hand a first delivery over without
    #: waiting (``False``: not taken, use :meth:`send`); ``None``: always :meth:`send`
    offer: Callable[[dict[str, Any], bytes], bool] | None

    async def send(self, event: dict[str, Any], redelivery: bool, raw: bytes) -> None: ...



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
        #: ``refuses(event) -> bool``: the relay refuses it whatever the log
        #: says (a per-emitter credential's session): the pump drops it first
        self.refuses: Callable[[dict[str, Any]], bool] | None = getattr(conn, "refuses", None)

    async def send(self, event: dict[str, Any], redelivery: bool, raw: bytes) -> None:
        if self._stamped is None or not self._stamped(event, raw):
            await self.conn.ingest(event)  # a command (routed), or no trusted path


class _UplinkSink:
    offer: Callable[[dict[str, Any], bytes], bool] | None = None  # the uplink's put may wait
    refuses: Callable[[dict[str, Any]], bool] | None = None  # the remote relay answers
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


WOKE_NONE, WOKE_LOOP, WOKE_THREAD = 0, 1, 2
"""What a drain's verdicts woke (:meth:`Pump._logged`): no waiter, waiters
that answer on the event loop, a waiter whose answer a library's thread sends."""


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


class Pump:
    """The fleet's delivery (:class:`~supervisor.fleet.Fleet` is the one
    subclass; it owns the attributes and callables below)."""

    members: dict[str, Member]
    session_log: RetainingSessionLog
    jetstream: JetStreamSink | None
    metrics: Metrics
    counters: dict[str, int]
    emitted: Counter[tuple[str, str]]
    _families: dict[str, str]
    _recv: trio.MemoryReceiveChannel[Outbound]
    _room: trio.lowlevel.ParkingLot
    _pump_done: trio.Event
    _pumping: bool
    _js_wait: trio.CancelScope | None
    _draining: bool
    _observe_ack: Callable[[str, dict[str, Any]], None]

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
        refused = self._refused(outs, pairs)
        if refused:  # out before the log: a restart never replays them
            woke = self._log_refusing(outs, pairs, refused)
            outs = [item for k, item in enumerate(outs) if k not in refused]
            pairs = [p for k, p in enumerate(pairs) if k not in refused]
        else:
            if redelivered:  # a re-send is forwarded, never logged twice
                keep = [k for k, item in enumerate(outs) if not item.redelivery]
                fresh_outs, fresh = [outs[k] for k in keep], [pairs[k] for k in keep]
            else:
                fresh_outs, fresh = outs, pairs
            # each file's writer, its bridge: the group retention's cap is shared by
            woke = self._logged(fresh_outs, fresh, self.session_log.write_raw_batch(
                fresh, [item.bridge for item in fresh_outs])) if fresh else WOKE_NONE
        if woke:
            await self._let_answer(woke)
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

    def _refused(self, outs: list[Outbound], pairs: list[tuple[dict[str, Any], bytes]]
                 ) -> set[int] | None:
        """The indices of the events their bridge's sink refuses whatever
        happens (``sink.refuses``: the embedded relay's, for an event into
        a session that is not the fleet's to take, a per-emitter
        credential's, a shared-token emitter's while held, or another
        agent's bridge's (:meth:`~supervisor.relay.ingest.Ingest.fleet_refusal`),
        counted and logged once per session there; JetStream's, a session such a credential holds
        in KV ``S_bindings``: :meth:`~supervisor.jetstream.presence.Presence.refuses`),
        or ``None``. One question per change of bridge or session (a drain
        has few)."""
        members = self.members
        js = self.jetstream
        js_refuses = js.presence.refuses if js is not None and js.presence.lost else None
        last: tuple[str, Any] | None = None  # (bridge, session) last found not refused
        refused: set[int] | None = None
        for k, item in enumerate(outs):
            ev = pairs[k][0]
            key = (item.bridge, ev.get("session"))
            if key == last:
                continue
            m = members.get(item.bridge)
            refuses = getattr(m.sink, "refuses", None) if m is not None else None
            if (refuses is not None and refuses(ev)) or (js_refuses is not None and js_refuses(ev)):
                if refused is None:
                    refused = set()
                refused.add(k)
            else:
                last = key
        return refused

    def _log_refusing(self, outs: list[Outbound], pairs: list[tuple[dict[str, Any], bytes]],
                      refused: set[int]) -> int:
        """:meth:`_deliver_batch`'s log step for a drain with ``refused``
        events (:meth:`_refused`): those are not written, and their verdict
        to their bridge is "done" (sending them again changes nothing: an
        OTLP export is answered, not retried for ever); the rest as ever.
        Returns what :meth:`_logged` woke."""
        keep = [k for k, item in enumerate(outs) if not item.redelivery]
        if not keep:
            return WOKE_NONE
        got = iter(self.session_log.write_raw_batch(
            [pairs[k] for k in keep if k not in refused],
            [outs[k].bridge for k in keep if k not in refused]))
        written = [True if k in refused else next(got) for k in keep]
        return self._logged([outs[k] for k in keep], [pairs[k] for k in keep], written)

    @staticmethod
    async def _let_answer(woke: int) -> None:
        """A sender waits on the verdicts just reported (an OTLP export's, a
        hook's answer): let it answer before the relay's fan-out, so the
        next request arrives while the relay works (issue 11). Two turns:
        trio runs a turn's tasks in random order, so the woken sender has
        surely run once the pump is back from the second (shielded: a cancel
        here must not lose what the log already has). The GIL hand-over
        only for an answer a library's thread sends (:data:`WOKE_THREAD`):
        its zero sleep is a syscall that can lose the CPU on a loaded
        machine, for a scheduler slice a loop-side answer (a hook's) would
        wait out (issue 27: 22% of the daemon's samples on the hooks bench)."""
        await trio.lowlevel.cancel_shielded_checkpoint()
        await trio.lowlevel.cancel_shielded_checkpoint()
        if woke == WOKE_THREAD:
            _drop_gil()

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
            if type(e).__name__ == "FleetRefused":
                # a session not the fleet's to take (a credential's, a held
                # shared one, another agent's bridge's), since the pump asked (:meth:`_refused`): a drop the relay counted and
                # logged, not a fault (one OTLP record can send one)
                return
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
                written: list[bool]) -> int:
        """Count the first deliveries ``outs`` (their ``(event, bytes)``
        pairs ``fresh``) the session log was given and report each verdict
        in ``written`` to its bridge, in order. Returns :data:`WOKE_NONE`
        when no bridge had a task waiting on its verdicts (``logged_since``),
        :data:`WOKE_THREAD` when one was woken whose bridge answers from a
        library's thread (``ctx.answers_in_thread``), else :data:`WOKE_LOOP`."""
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
        woke = WOKE_NONE
        for name, (n, last_failed) in verdicts.items():
            m = members.get(name)
            if m is not None and m.ctx.log_results(n, last_failed):
                woke = WOKE_THREAD if m.ctx.answers_in_thread else max(woke, WOKE_LOOP)
        return woke

    def _log_writable(self) -> bool:
        return self.session_log.writable()

    def _log_result(self, bridge: str, written: bool) -> None:
        m = self.members.get(bridge)
        if m is not None:
            m.ctx.log_result(written)
