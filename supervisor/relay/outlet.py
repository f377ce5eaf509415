"""Outlets: the bounded outbound queue of one consumer connection (an SSE
stream or a WebSocket) and the subscriptions that feed it (AEP-0003 §8.4;
``docs/relay.md`` "Slow consumers").

- The fan-out offers to an :class:`Outlet` without ever blocking. Past
  ``queue_soft_bytes`` queued, ``debug``/``info`` events are dropped and
  counted; a ``notice``+ item that would pass ``queue_hard_bytes`` first
  evicts queued ``debug``/``info`` and, if that is not enough, terminates
  the stream (SSE: end; WS: ``closing`` frame then close 1013) so the
  consumer resumes exactly. ``notice``+ is never dropped silently.
- What is queued is one dataclass per item (:class:`EventItem`,
  :class:`FrameItem`, :class:`ReplayItem`, :class:`EndItem`); the
  connection's writer takes them out in order with :meth:`Outlet.next_batch`.
- An outlet talks to its relay only through the relay's public outlet
  hooks (:class:`OutletHub`): the limits, the counters, and
  ``detach_outlet`` / ``outlet_closed``.

Transport-free: no sockets here; the ASGI layer (:mod:`.app`) writes what
the outlet yields and sets :attr:`Outlet.abort` when the server gives one."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, Union

import trio

from bridges.core.aep import NOTICE_RANK, SEVERITIES, dumps, scrub_surrogates

from .attrmatch import Filter
from .buffer import Entry, Position

__all__ = ["Outlet", "OutletHub", "Rendered", "Chunked", "Subscriber", "Item", "EventItem", "RunItem", "FrameItem", "ReplayItem",
           "EndItem", "OPEN", "FINISHING", "TERMINATED", "CLOSED", "frame_text", "exhausted_marker"]

log = logging.getLogger("aep.relay")

OPEN, FINISHING, TERMINATED, CLOSED = "open", "finishing", "terminated", "closed"


def frame_text(obj: dict[str, Any]) -> str:
    """A connection frame's text (the wire JSON). A frame echoing client
    text that has no UTF-8 form (a lone surrogate in a subscription id)
    carries U+FFFD in its place."""
    try:
        return dumps(obj).decode("utf-8")
    except UnicodeEncodeError:
        return dumps(scrub_surrogates(obj)).decode("utf-8")


def _comment_safe(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A").replace("\0", "%00")


def exhausted_marker(sub: Subscriber, session: str, earliest: Position) -> bytes | str:
    """The ``replay-exhausted`` marker for ``sub`` (AEP-0003 §3.3 item 3,
    §5): the SSE comment ``: replay-exhausted {session} {epoch}:{seq}``
    (bytes; a session's line breaks percent-escaped) or the WS frame
    ``{type: replay-exhausted, sub, session, earliest: {epoch, seq}}``
    (text). ``earliest``: the first position the consumer gets next."""
    if sub.outlet.kind == "sse":
        return f": replay-exhausted {_comment_safe(session)} {earliest[0]}:{earliest[1]}\n\n".encode()
    return frame_text({"type": "replay-exhausted", "sub": sub.sid, "session": session,
                       "earliest": {"epoch": earliest[0], "seq": earliest[1]}})


# -- queued items -----------------------------------------------------------------

@dataclass(slots=True)
class EventItem:
    """A fanned-out event: ``payload`` (SSE bytes or WS text), ``size``
    (accounted bytes), ``sev`` (severity rank: what may be shed) and
    ``mark`` (WS only: ``(sub id, session, position)`` recorded as delivered
    when written). Never changed once made: one SSE item is queued on every
    stream that receives the event (not ``frozen``: that would cost four
    times as much to make, once per WebSocket delivery)."""
    payload: bytes | str
    size: int
    sev: int
    mark: tuple[Any, str, Position] | None = None


@dataclass(slots=True)
class FrameItem:
    """A connection frame (``subscribed``, ``error``, a goodbye...), never
    shed; ``payload`` may be a callable rendered when written (the WS
    ``closing`` frame carries the positions delivered by then)."""
    payload: bytes | str | Callable[[], str]
    size: int = 0


@dataclass(slots=True)
class ReplayItem:
    """Buffered replay pulled chunk by chunk when it reaches the head."""
    job: Chunked
    size: int = 0


@dataclass(slots=True)
class EndItem:
    """End the stream after what precedes it: ``end`` is ``True`` (SSE) or
    ``(close code, reason)`` (WS)."""
    end: Any = True
    size: int = 0


class RunItem:
    """Consecutive SSE events queued as one (:meth:`Outlet.offer_many`):
    ``items`` (:class:`EventItem`, in order; never changed, so one run may
    be queued on every stream that receives all of it) and ``size``, the
    sum of their sizes. The queue means its items: whatever sheds or
    splits output sees them one by one (:meth:`Outlet.flat`); the writer
    takes their payloads joined once (:meth:`joined`, shared).

    Made from ``items``, or from ``payloads`` (the SSE messages) and
    ``sevs`` (their severity ranks, one each): then the items are made
    only when something asks for them (a run queued whole and written
    whole never does)."""

    __slots__ = ("size", "_items", "_payloads", "_sevs", "_joined")

    def __init__(self, items: list[EventItem] | None, size: int, *,
                 payloads: list[bytes] | None = None, sevs: Sequence[int] = ()) -> None:
        self.size = size
        self._items = items
        self._payloads = payloads
        self._sevs = sevs
        self._joined: bytes | None = None

    def __len__(self) -> int:
        """How many events the run holds."""
        return len(self._items if self._items is not None else self._payloads or ())

    @property
    def items(self) -> list[EventItem]:
        """The run's events, in order (made once)."""
        if self._items is None:
            self._items = self.events()
        return self._items

    def events(self) -> list[EventItem]:
        """:attr:`items`, without keeping them when they are not made yet
        (a look at what is queued leaves a lazy run lazy)."""
        if self._items is not None:
            return self._items
        return [EventItem(p, len(p), sev)
                for p, sev in zip(self._payloads or (), self._sevs, strict=True)]

    def last_size(self) -> int:
        """The size of the run's last event."""
        if self._items is None and self._payloads is not None:
            return len(self._payloads[-1])
        return self.items[-1].size

    def joined(self) -> bytes:
        """Every item's payload, in order, as one ``bytes`` (made once)."""
        if self._joined is None:
            payloads = self._payloads
            self._joined = b"".join(payloads if payloads is not None
                                    else [i.payload for i in self.items])  # type: ignore[misc]
        return self._joined


Item = Union[EventItem, RunItem, FrameItem, ReplayItem, EndItem]  # what an outlet queues


class Rendered(Protocol):
    """One event rendered at one capture ceiling, as a subscriber offers it
    (:class:`~.fanout.View`, above this module)."""

    entry: Entry
    raw: bytes

    def sse_item(self) -> EventItem: ...

    def text(self) -> str: ...


class Chunked(Protocol):
    """A replay read chunk by chunk when it reaches the head of the queue
    (:class:`~.replay.ReplayJob`, above this module): ``next_chunk()``, under
    ``gate`` (relay-wide), is the next chunk's items, ``None`` when done."""

    gate: Any

    def next_chunk(self) -> list[Any] | None: ...


class OutletHub(Protocol):
    """What an outlet needs from its relay (public members of
    :class:`~supervisor.relay.core.Relay`)."""

    queue_soft_bytes: int
    queue_hard_bytes: int
    max_sessions: int
    stuck_s: float
    counters: dict[str, int]

    def detach_outlet(self, outlet: Outlet) -> None: ...

    def outlet_closed(self, outlet: Outlet) -> None: ...


# -- outlets (one per consumer connection) ----------------------------------------

class Outlet:
    """The bounded outbound queue of one SSE stream or one WebSocket (§8.4).

    The fan-out calls :meth:`offer` (never blocks); the connection's
    writer task calls :meth:`next_batch`. ``abort`` (set by the ASGI layer
    when the server provides one) closes the underlying socket: the only way
    to shed a consumer whose writer is stuck in a send to a peer that
    stopped reading. ``kind``: ``"sse"`` or ``"ws"``; ``state``: one of
    :data:`OPEN`, :data:`FINISHING`, :data:`TERMINATED`, :data:`CLOSED`."""

    def __init__(self, hub: OutletHub, kind: str) -> None:
        self.hub = hub
        self.kind = kind  # "sse" | "ws"
        self._soft = hub.queue_soft_bytes  # the relay's bounds, fixed at its construction
        self._hard = hub.queue_hard_bytes
        self._stuck_s = hub.stuck_s
        self.state = OPEN
        self.in_send = False
        self.send_started = 0.0  # trio time the current (or last) send began
        self.abort: Callable[[], None] | None = None
        self._killed = False
        self.subs: list[Subscriber] = []
        self.dropped = 0
        #: ws only: sub id -> session -> last delivered (epoch, seq)
        self.delivered: dict[Any, dict[str, Position]] = {}
        self._q: deque[Item] = deque()
        self._bytes = 0
        self._wake = trio.Event()
        #: set while the writer lingers; :meth:`offer` sets it once a
        #: quarter of the soft budget is queued (write now, do not overrun)
        self._urge: trio.Event | None = None
        self.done = trio.Event()

    @property
    def queued(self) -> int:
        """How many items are queued (events, frames, replay, end)."""
        return len(self._q)

    @property
    def queued_bytes(self) -> int:
        """Accounted bytes queued (what the soft and hard bounds measure)."""
        return self._bytes

    def peek(self) -> Item | None:
        """The item at the head of the queue (``None`` when empty)."""
        return self._q[0] if self._q else None

    def flat(self) -> list[Item]:
        """What is queued, in order, a :class:`RunItem` as its events."""
        out: list[Item] = []
        for item in self._q:
            if isinstance(item, RunItem):
                out.extend(item.events())
            else:
                out.append(item)
        return out

    # producer side --------------------------------------------------------
    def _push(self, item: Item) -> None:
        self._q.append(item)
        self._bytes += item.size
        self._wake.set()

    def offer(self, item: EventItem) -> None:
        """Queue one fanned-out event, shedding by severity (module
        docstring). ``item`` may be shared with other outlets (the SSE
        rendering of an event is one item for every stream that gets it)."""
        if self.state != OPEN:
            return
        size, sev = item.size, item.sev
        if self._q:
            if self.in_send and self.shed_if_stuck():
                return
            if sev < NOTICE_RANK and self._bytes + size > self._soft:
                self._drop_low(1, sev)
                return
            if self._bytes + size > self._hard and \
                    not self._evict_low(self._bytes + size - self._hard):
                self.terminate("slow-consumer")
                return
        # the hot path (one call per delivery): _push inlined
        self._q.append(item)
        self._bytes += size
        self._wake.set()
        if self._urge is not None and self._bytes * 4 >= self._soft:
            self._urge.set()

    def offer_many(self, items: list[EventItem] | None, size: int, run: RunItem | None = None) -> None:
        """:meth:`offer` for each of ``items`` in order (``size``: the sum
        of their sizes; ``run``: a :class:`RunItem` of exactly these, to
        share; ``items`` ``None``: ``run``'s). When nothing can be shed
        (the writer is not stuck in a send and all of them fit under the
        soft budget) they are queued in one step, on an SSE stream as one
        :class:`RunItem`; otherwise one :meth:`offer` each. Equal to one
        :meth:`offer` per item, the clock standing still (property tests
        ``tests/unit/relay/test_relay_runs.py``, ``test_relay_runitem.py``)."""
        if self.state != OPEN:
            return
        if items is None:
            assert run is not None, "offer_many needs items or a run"
            if len(run) < 2 or self.kind != "sse":  # (a run is SSE bytes, written joined)
                items = run.items
        if self._bytes + size > self._soft or (self.in_send and self.stuck()):
            for item in items if items is not None else run.items:  # type: ignore[union-attr]
                self.offer(item)
            return
        # each offer would pass every check (not stuck, below the soft
        # budget, so the hard one too) and append: the same queue, one wake-up
        if items is None:  # (a run of two or more, see above)
            self._q.append(run)  # type: ignore[arg-type]
        elif self.kind == "sse" and len(items) > 1:
            self._q.append(run if run is not None else RunItem(items, size))
        else:
            self._q.extend(items)
        self._bytes += size
        self._wake.set()
        if self._urge is not None and self._bytes * 4 >= self._soft:
            self._urge.set()

    def stuck(self) -> bool:
        """Whether the writer has been blocked in one send for ``stuck_s`` or
        more (its peer stopped reading): a consumer that makes no progress
        while output waits is shed, whatever the severity (issue 10 #7);
        one that drains, however slowly, never is."""
        return self.in_send and trio.current_time() - self.send_started >= self._stuck_s

    def shed_if_stuck(self) -> bool:
        """Terminate (and abort) this consumer if it is :meth:`stuck` with
        output waiting; ``True`` when it was."""
        if self.state == OPEN and self._q and self.stuck():
            self.terminate("slow-consumer")
            return True
        return False

    def push_frame(self, payload: bytes | str) -> None:
        """A connection frame (``subscribed``, ``error``, ``pong``...): never
        dropped; a peer that lets them pile past the hard bound is shed."""
        if self.state != OPEN:
            return
        size = len(payload)
        if self._q and self._bytes + size > self._hard:
            self.terminate("slow-consumer")
            return
        self._push(FrameItem(payload, size))

    def push_replay(self, job: Chunked) -> None:
        """Queue a subscription's buffered replay."""
        if self.state == OPEN:
            self._push(ReplayItem(job))

    def _drop_low(self, n: int, sev: int) -> None:
        """Count ``n`` shed events of severity rank ``sev`` (the total and
        ``dropped_{debug,info}``, for ``/metrics``)."""
        self.dropped += n
        counters = self.hub.counters
        counters["dropped_low_severity"] += n
        key = f"dropped_{SEVERITIES[sev]}"
        counters[key] = counters.get(key, 0) + n

    def _evict_low(self, need: int) -> bool:
        freed = 0
        dropped = [0] * NOTICE_RANK  # per severity rank below notice
        kept: deque[Item] = deque()
        for item in self.flat():  # a run's events one by one
            if freed < need and isinstance(item, EventItem) and item.sev < NOTICE_RANK:
                freed += item.size
                dropped[item.sev] += 1
            else:
                kept.append(item)
        if any(dropped):
            self._q = kept
            self._bytes -= freed
            for sev, n in enumerate(dropped):
                if n:
                    self._drop_low(n, sev)
        return freed >= need

    def _goodbye(self, reason: str, *, code: int) -> list[Item]:
        if self.kind == "sse":
            comment = ": shutting-down\n\n" if code == 1001 else f": terminated {reason}\n\n"
            return [FrameItem(comment.encode()), EndItem(True)]

        # rendered when written, so it carries the positions actually delivered
        def closing() -> str:
            return frame_text({"type": "closing", "reason": reason,
                               "delivered": self.delivered_positions()})
        return [FrameItem(closing), EndItem((code, reason))]

    def end(self, end: Any = True) -> None:
        """End the stream once what is queued is written (``end``: ``True``
        for SSE, ``(code, reason)`` for WS): no more offers, subscriptions
        detached. A no-op unless open."""
        if self.state != OPEN:
            return
        self.hub.detach_outlet(self)
        self._push(EndItem(end))
        self.state = FINISHING

    def terminate(self, reason: str, *, code: int = 1013) -> None:
        """Shed this consumer now: queued items are discarded, a goodbye
        (SSE comment / WS ``closing`` + close ``code``) is queued, and if the
        writer is stuck mid-send the socket is aborted (§8.4 disconnect)."""
        if self.state in (TERMINATED, CLOSED):
            return
        self.hub.detach_outlet(self)
        self.state = TERMINATED
        self.hub.counters["streams_terminated"] += 1
        log.info("relay: shedding %s consumer (%s)", self.kind, reason)
        self._q.clear()
        self._bytes = 0
        self._q.extend(self._goodbye(reason, code=code))
        self._wake.set()
        if self.in_send:
            self.kill()

    def finish(self, reason: str) -> None:
        """Orderly end (shutdown): stop offers, flush what is queued, then
        the goodbye (SSE ``: shutting-down``; WS ``closing`` + close 1001)."""
        if self.state != OPEN:
            return
        self.hub.detach_outlet(self)
        self.state = FINISHING
        for item in self._goodbye(reason, code=1001):
            self._push(item)

    def kill(self) -> None:
        """Abort the socket (if the server gave us the means)."""
        if self.abort is not None and not self._killed:
            self._killed = True
            self.hub.counters["connections_aborted"] += 1
            try:
                self.abort()
            except Exception:  # noqa: BLE001 -- already gone
                pass

    def closed(self) -> None:
        """The connection is gone (called by the ASGI layer on exit)."""
        if self.state != CLOSED:
            self.hub.detach_outlet(self)
            self.state = CLOSED
            self._q.clear()
            self._bytes = 0
            self.hub.outlet_closed(self)
            self.done.set()

    # consumer (writer) side ------------------------------------------------
    def mark_delivered(self, sid: Any, session: str, pos: Position) -> None:
        """Track the last delivered position per (subscription, session) for
        the ``closing`` frame; bounded like the buffers (``max_sessions``)."""
        per = self.delivered.setdefault(sid, {})
        per.pop(session, None)  # re-insert: most recent last
        per[session] = pos
        if len(per) > self.hub.max_sessions:
            del per[next(iter(per))]

    def delivered_positions(self) -> list[dict[str, Any]]:
        return [{"sub": sid, "session": s, "epoch": p[0], "seq": p[1]}
                for sid, per in self.delivered.items() for s, p in per.items()]

    async def _replay_chunk(self, item: ReplayItem) -> list[Any] | None:
        """The head replay's next chunk, or ``None`` when there is none to
        write now (ended; nothing matched; cleared meanwhile)."""
        async with item.job.gate:
            chunk = item.job.next_chunk()
        if not self._q or self._q[0] is not item:
            return None  # ended or shed while it waited for the gate
        if chunk is None:
            self._q.popleft()
            return None
        if not chunk:  # a slice scanned, nothing matched: let others run
            await trio.lowlevel.checkpoint()
            return None
        return chunk

    async def next_batch(self, max_bytes: int | None = None, linger: float = 0.0,
                         last_write: float | None = None) -> tuple[list[Any], Any]:
        """Wait for output; returns ``(payloads, end)``: payloads to write in
        order, and ``end`` (not ``None``) when the stream must end after
        them (SSE: ``True``; WS: ``(code, reason)``). ``max_bytes``: how
        much to take (accounted bytes; at least one item); by default half
        the consumer's soft budget (``queue_soft_bytes``; ``debug``/``info``
        are shed past the budget, so that is half of the most they can
        queue), leaving the other half for what ingest queues while that
        write is in flight. Less per turn than ingest queues
        between turns shed a consumer that reads at full speed (a 256 KiB
        cap did, for back-to-back POSTs: issue 11); much more is held again
        as one body per consumer stuck in a send (the whole queue, for 100
        stuck readers: +175 MiB RSS; ``tests/integration/hardening/test_stalls.py``).
        ``linger`` (seconds):
        once output is pending, wait that long before collecting it, so a
        writer makes at most one write per ``linger`` and a burst leaves in
        one write instead of one per event (replay is not delayed).
        ``last_write`` (``trio.current_time()`` of the writer's last write):
        linger only for what is left of ``linger`` since then, so an idle
        stream writes at once (no timer in the way of a lone event) and a
        busy one still writes at most once per ``linger``, or sooner once a
        quarter of the soft budget is queued."""
        while not self._q:
            if self.state == CLOSED:
                return [], True if self.kind == "sse" else (1001, "closed")
            await self._wake.wait()
            self._wake = trio.Event()
        if linger > 0 and last_write is not None:
            linger -= trio.current_time() - last_write
        if linger > 0 and self.state == OPEN and not isinstance(self._q[0], ReplayItem) \
                and self._bytes * 4 < self._soft:
            # a burst fills a quarter of the soft budget: write at once (the
            # fan-out urges), so a consumer that reads at full speed is
            # never shed for the time it lingered (§8.4 sheds slow ones)
            self._urge = trio.Event()
            with trio.move_on_after(linger):
                await self._urge.wait()
            self._urge = None
        out: list[Any] = []
        size = 0
        if max_bytes is None:
            max_bytes = self._soft // 2
        while self._q and size < max_bytes:
            item = self._q[0]
            if isinstance(item, ReplayItem):
                if out:
                    break
                chunk = await self._replay_chunk(item)
                if chunk is None:
                    continue
                return chunk, None
            if isinstance(item, RunItem):
                size = self._take_run(item, out, size, max_bytes)
                continue
            self._q.popleft()
            self._bytes -= item.size
            if isinstance(item, EndItem):
                return out, item.end
            payload = item.payload
            if isinstance(item, EventItem) and item.mark is not None:
                self.mark_delivered(*item.mark)
            elif callable(payload):  # (an event's payload is text or bytes)
                payload = payload()
            out.append(payload)
            size += item.size
        return out, None

    def _take_run(self, run: RunItem, out: list[Any], size: int, max_bytes: int) -> int:
        """:meth:`next_batch` taking the :class:`RunItem` at the head as it
        takes events (while ``size`` < ``max_bytes``): all of it, joined, or
        the events that fit, the rest left at the head as a run. Returns
        ``size`` with what it took."""
        if size + run.size - run.last_size() < max_bytes:  # even its last event fits
            self._q.popleft()
            self._bytes -= run.size
            out.append(run.joined())
            return size + run.size
        items = run.items
        taken = 0
        start = size
        while size < max_bytes:  # one at least: the caller asked with size < max_bytes
            size += items[taken].size
            taken += 1
        self._q[0] = RunItem(items[taken:], run.size - (size - start))
        self._bytes -= size - start
        out.extend([i.payload for i in items[:taken]])
        return size


class Subscriber:
    """One live subscription: an SSE stream, or one ``subscribe`` of a WS
    connection (``sid`` set). ``ceiling`` is the capture ceiling or ``None``."""

    __slots__ = ("filter", "ceiling", "outlet", "sid", "offer", "active", "pending")

    def __init__(self, flt: Filter, ceiling: str | None, outlet: Outlet, sid: Any = None) -> None:
        self.filter = flt
        self.ceiling = ceiling
        self.outlet = outlet
        self.sid = sid
        #: False once replaced, unsubscribed or its connection ended: its
        #: queued replay is then abandoned (issue 10 #3)
        self.active = True
        #: resume positions of sessions the relay held nothing of when this
        #: subscribed (session -> asked position), awaiting that session's
        #: first later event (:meth:`Fanout.add <.fanout.Fanout.add>`);
        #: ``None`` when there are none (the common case)
        self.pending: dict[str, Position] | None = None
        #: ``offer(view)``: queue one rendered event on the outlet (chosen once: the hot path)
        self.offer: Callable[[Rendered], None] = self._offer_sse if outlet.kind == "sse" \
            else self._offer_ws

    def _offer_sse(self, view: Rendered) -> None:
        self.outlet.offer(view.sse_item())

    def _offer_ws(self, view: Rendered) -> None:
        e = view.entry
        mark = (self.sid, e.attrs["session"], e.pos) if e.pos is not None else None
        self.outlet.offer(EventItem(view.text(), len(view.raw), e.sev, mark))
