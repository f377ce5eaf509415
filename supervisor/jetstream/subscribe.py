"""The JetStream relay's subscribe path (split from
:mod:`supervisor.jetstream.relay` by issue 26): :class:`Subscriptions`, a
base of :class:`~supervisor.jetstream.relay.JetStreamRelay`, serves each AEP
subscription from the stream through its own ephemeral pull consumer
(:class:`_Pull`): the ``from`` positions resolved to stream sequences
(:func:`~.plan.resolve_after`), the replay phase then the live phase, a
lost consumer remade after the last delivered sequence, the outlet's room
pacing the fetches (the relay module's docstring, "Subscriptions" and
"Resume").
"""
from __future__ import annotations

import json
import logging
from collections import deque
from typing import Any

import nats.js.errors
import trio
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bridges.core.aep import loads
from bridges.core.backoff import backoff_delay
from bridges.core.pacing import YIELD_BYTES
from supervisor.relay import (
    OPEN,
    Outlet,
    Position,
    Relay,
    Subscriber,
    exhausted_marker,
    frame_text,
    trusted_entry,
)

from .link import _NATS_ERRORS, Link, Outage, aio
from .plan import Found, resolve_after, session_subject, subject_plan
from .subjects import POS, parse_pos, token

log = logging.getLogger("aep.relay.jetstream")

FETCH_BATCH = 256
"""Most messages one pull request asks for."""
FETCH_FIRST = 1
"""Messages a consumer's first pull request asks for: one, until sizes are known."""
FETCH_TIMEOUT_S = 1.0
IDLE_CHECKS = 5
"""Idle fetches (of :data:`FETCH_TIMEOUT_S`) before a live consumer is
asked whether it still exists (its node may have died quietly)."""
CONSUMER_INACTIVE_S = 30.0
CONSUMER_PREFIX = "aeprelay"


def next_batch(msgs: list[Any], room: int) -> int:
    """How many messages the next pull request asks for after ``msgs`` (a
    non-empty batch): ``room`` bytes (what the outlet takes before its
    soft budget) by their mean size, between 1 and :data:`FETCH_BATCH`.
    256 events of 1-4 MB pulled at once overran the relay's NATS
    connection (nats-server cut it as a slow consumer) and the outlet's
    budget, whose low-severity drops then cut 13-20 of 100 from a replay
    to one reader (a sixteenth outside attack on issue 25)."""
    mean = max(1, sum(len(m.data or b"") for m in msgs) // len(msgs))
    return max(1, min(FETCH_BATCH, room // mean))


class _ConsumerGone(Exception):
    """The server ended a pull request for a reason other than "no more
    messages" (409: the consumer was deleted, its leader changed...)."""


_CONSUMER_ERRORS: tuple[type[BaseException], ...] = (*_NATS_ERRORS, _ConsumerGone)


class _Pull:
    """One pull consumer read through a core NATS subscription on an inbox
    of our own: each :meth:`fetch` publishes one ``CONSUMER.MSG.NEXT``
    request and collects what the server sends back, ending on a full
    batch or a 404/408 status. Measured under trio-asyncio (10k events):
    nats-py's ``PullSubscription.fetch`` ~5k msgs/s, this ~88k/s (fetch
    awaits an asyncio timeout per message; this appends in a callback). The
    callback runs on the trio-asyncio loop of :mod:`.link`, inside the trio
    run: it only appends and sets a ``trio.Event``."""

    def __init__(self, link: Link, stream: str, name: str) -> None:
        self.link = link
        self.stream = stream
        self.name = name
        self._buf: deque[Any] = deque()
        self._wake = trio.Event()
        self._sub: Any = None
        self._inbox = ""
        self._outstanding = 0  # messages the open pull request may still bring

    async def open(self) -> None:
        nc = self.link.nc
        self._inbox = nc.new_inbox()

        async def got(msg: Any) -> None:
            self._buf.append(msg)
            self._wake.set()
        self._sub = await aio(nc.subscribe)(self._inbox, cb=got,
                                            pending_msgs_limit=16 * FETCH_BATCH)

    async def close(self) -> None:
        if self._sub is not None:
            await aio(self._sub.unsubscribe)()
            self._sub = None

    async def fetch(self, batch: int, expires_s: float, *, no_wait: bool = False) -> list[Any]:
        """The next data messages, as soon as any arrive. One pull request
        (``batch`` messages, open ``expires_s``; ``no_wait``: answered at
        once with what is there) is kept outstanding and renewed when it
        ends, so a live message is delivered the moment the server sends
        it, and at most ``batch`` are in flight (the caller paces by
        calling). ``[]``: a request ended with nothing (idle). Raises
        ``TimeoutError`` when the server answers nothing, not even the
        expiry (the consumer's node is gone), :class:`_ConsumerGone` on a
        409-class status."""
        if self._outstanding <= 0:
            req: dict[str, Any] = {"batch": batch}
            if no_wait:
                req["no_wait"] = True
            else:
                req["expires"] = int(expires_s * 1e9)
            await aio(self.link.nc.publish)(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.name}", json.dumps(req).encode(),
                reply=self._inbox)
            self._outstanding = batch
        out: list[Any] = []
        with trio.move_on_after(expires_s + 2.0) as waited:
            while not self._buf:
                self._wake = trio.Event()
                await self._wake.wait()
        if waited.cancelled_caught:  # not even the expiry came back: the node is gone
            self._outstanding = 0
            raise TimeoutError("no answer to the pull request")
        while self._buf:
            m = self._buf.popleft()
            status = (m.headers or {}).get("Status")
            if status is None:
                out.append(m)
                self._outstanding -= 1
            elif status in ("404", "408"):
                self._outstanding = 0
            elif status != "100":  # 100: an idle heartbeat
                self._outstanding = 0
                if out:
                    return out
                raise _ConsumerGone(f"{status} {(m.headers or {}).get('Description', '')}")
        return out


class Subscriptions(Relay):
    """The subscribe path of :class:`~supervisor.jetstream.relay.JetStreamRelay`
    (its one subclass, which owns the attributes below)."""

    link: Link
    stream: str
    relay_id: str
    outage: Outage
    consumers: dict[str, list[str]]
    _nursery: trio.Nursery | None
    _scopes: dict[Outlet, dict[Subscriber, trio.CancelScope]]
    _held: dict[tuple[Outlet, Any], dict[str, Any]]
    _fixed: dict[Outlet, trio.Event]
    _n: int

    def subscribe(self, sub: Subscriber, *, plan_all: bool,
                  positions: list[tuple[str, Position | None]] | None, live: bool,
                  tail: list[Any] | None = None) -> None:
        """Start ``sub``'s consumer task (replay, then live when ``live``)."""
        if live:
            self.fanout.add(sub)  # the outlet's bookkeeping; nothing is fanned out in process
        scope = trio.CancelScope()
        self._scopes.setdefault(sub.outlet, {})[sub] = scope
        if self._nursery is None:
            sub.outlet.terminate("shutting-down", code=1001)
            return
        if sub.outlet.kind == "sse":
            self._fixed.setdefault(sub.outlet, trio.Event())
        self._nursery.start_soon(self._consume, scope, sub, plan_all, positions, live, tail)

    def hold_subscribed(self, outlet: Outlet, frame: dict[str, Any]) -> None:
        """Keep a WS ``subscribed`` frame until its consumer task has fixed
        where live delivery starts (:meth:`_serve_sub` sends it)."""
        self._held[(outlet, frame.get("id"))] = frame

    async def live_fixed(self, outlet: Outlet) -> None:
        """An SSE stream's response waits, like a WS ``subscribed`` frame,
        until its consumer task has fixed where live delivery starts (or
        given up: a NATS outage releases it at once, as for WS)."""
        ready = self._fixed.get(outlet)
        if ready is not None:
            await ready.wait()

    def _release_subscribed(self, sub: Subscriber) -> None:
        frame = self._held.pop((sub.outlet, sub.sid), None)
        if frame is not None:
            sub.outlet.push_frame(frame_text(frame))
        self._release_stream(sub.outlet)

    def _release_stream(self, outlet: Outlet) -> None:
        ready = self._fixed.pop(outlet, None)
        if ready is not None:
            ready.set()

    def end_after_replay(self, outlet: Outlet) -> None:
        pass  # the consumer task ends a live=0 stream after its replay

    def unsubscribe(self, sub: Subscriber) -> None:
        super().unsubscribe(sub)
        self._held.pop((sub.outlet, sub.sid), None)
        scope = self._scopes.get(sub.outlet, {}).pop(sub, None)
        if scope is not None:
            scope.cancel()

    def detach_outlet(self, outlet: Outlet) -> None:
        super().detach_outlet(outlet)
        for key in [k for k in self._held if k[0] is outlet]:
            del self._held[key]
        self._release_stream(outlet)
        for scope in self._scopes.pop(outlet, {}).values():
            scope.cancel()

    async def _consume(self, scope: trio.CancelScope, sub: Subscriber, plan_all: bool,
                       positions: list[tuple[str, Position | None]] | None, live: bool,
                       tail: list[Any] | None) -> None:
        with scope:
            try:
                try:
                    await self._serve_sub(sub, plan_all, positions, live, tail)
                finally:
                    self._release_stream(sub.outlet)  # a waiting response goes on (to its end)
            except _NATS_ERRORS as e:
                log.warning("jetstream relay: a subscription failed to start (%s)",
                            type(e).__name__)
                sub.outlet.terminate("unavailable", code=1011)
            except Exception as e:  # noqa: BLE001 -- one subscription never takes the relay down
                log.error("jetstream relay: a subscription failed: %s: %s", type(e).__name__,
                          str(e)[:200])
                sub.outlet.terminate("unavailable", code=1011)
        per = self._scopes.get(sub.outlet)
        if per is not None and per.get(sub) is scope:
            del per[sub]

    async def _serve_sub(self, sub: Subscriber, plan_all: bool,
                         positions: list[tuple[str, Position | None]] | None, live: bool,
                         tail: list[Any] | None) -> None:
        first, last = await self._bounds(sub)
        flt = sub.filter.source
        if plan_all:
            subjects = subject_plan(self.stream, flt)
            await self._phase(sub, subjects, first, None if live else last, {})
        else:
            after: dict[str, Position] = {}
            starts: list[int] = []
            for session, pos in positions or ():
                assert pos is not None
                r = await resolve_after(pos, first, last, self._lookup(session))
                if r.exhausted and r.earliest is not None:
                    sub.outlet.push_frame(exhausted_marker(sub, session, r.earliest))
                prior = after.get(session)
                after[session] = pos if prior is None else min(prior, pos)
                starts.append(r.start)
            named = list(after)
            if not live:  # a replay-only request replays the sessions the filter pins
                named += [s for s in sub.filter.sessions if s not in after]
                starts += [first] * (len(named) - len(after))
            if named and min(starts) <= last:
                await self._phase(sub, subject_plan(self.stream, flt, named), min(starts), last,
                                  after)
            if live:
                await self._phase(sub, subject_plan(self.stream, flt), last + 1, None, {})
        if tail and sub.outlet.state == OPEN:
            for t in tail:
                sub.outlet.push_frame(t)
        if not live:
            sub.outlet.end(True)

    async def _bounds(self, sub: Subscriber) -> tuple[int, int]:
        """The stream's ``(first, last)`` sequence, fixing where ``sub``'s
        live delivery starts, then its held ``subscribed`` frame released.
        While NATS cannot be reached the frame is released at once (the
        subscription stands: a sender waiting for it, the SDK's
        ``ControlClient``, goes on and its command is refused ``no-route``
        with retry advice) and the stream is asked again when the link is
        back: live delivery then starts from the stream's end at that time."""
        attempt = 0
        while True:
            if self.link.connected:
                try:
                    info = await aio(self.link.js.stream_info)(self.stream)
                    break
                except _NATS_ERRORS as e:
                    why = type(e).__name__
            else:
                why = "no NATS connection"
            self._release_subscribed(sub)
            self.outage.failed("subscribe", "jetstream relay: cannot read stream %s (%s); "
                               "new subscriptions wait for it", self.stream, why)
            await self.link.wait_connected()
            await trio.sleep(backoff_delay(attempt, 0.2, 5.0))
            attempt += 1
        self._release_subscribed(sub)
        if attempt:
            self.outage.recovered("subscribe", "jetstream relay: stream %s answers again; "
                                  "waiting subscriptions started", self.stream)
        return info.state.first_seq, info.state.last_seq

    def _lookup(self, session: str) -> Any:
        subject = session_subject(self.stream, session)

        async def lookup(n: int) -> Found | None:
            try:
                m = await aio(self.link.js.get_msg)(self.stream, seq=max(n, 1), subject=subject,
                                                    next=True)
            except nats.js.errors.NotFoundError:
                return None
            pos = parse_pos((m.headers or {}).get(POS))
            if pos is None:
                try:
                    ev = loads(m.data or b"")
                    pos = (int(ev.get("epoch", 0)), int(ev["seq"]))
                except (ValueError, KeyError, TypeError, AttributeError):
                    return None
            return Found(int(m.seq or 0), pos)
        return lookup

    async def _room(self, outlet: Outlet) -> None:
        """Wait until the outlet's queue is below half its soft budget."""
        half = self.queue_soft_bytes // 2
        # no event marks "below a level"; the writer drains in ~ms steps
        while outlet.state == OPEN and outlet.queued_bytes > half:  # noqa: ASYNC110
            await trio.sleep(0.005)

    async def _open_consumer(self, subjects: list[str], start: int) -> _Pull:
        self._n += 1
        name = f"{CONSUMER_PREFIX}_{token(self.relay_id)}_{self._n}"
        cfg = ConsumerConfig(
            name=name, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(start, 1),
            ack_policy=AckPolicy.NONE, inactive_threshold=CONSUMER_INACTIVE_S,
            mem_storage=True, num_replicas=1, max_waiting=4)
        if len(subjects) == 1:
            cfg.filter_subject = subjects[0]
        else:
            cfg.filter_subjects = subjects
        await aio(self.link.js.add_consumer)(self.stream, config=cfg)
        pull = _Pull(self.link, self.stream, name)
        await pull.open()
        self.counters["consumers_made"] += 1
        self.consumers[name] = list(subjects)
        return pull

    async def _drop_consumer(self, pull: _Pull) -> None:
        self.consumers.pop(pull.name, None)
        with trio.CancelScope(shield=True), trio.move_on_after(2.0):
            try:
                await pull.close()
                await aio(self.link.js.delete_consumer)(self.stream, pull.name)
            except _CONSUMER_ERRORS:
                pass  # gone with its node; the inactive threshold removes the rest

    async def _phase(self, sub: Subscriber, subjects: list[str], start: int, stop: int | None,
                     after: dict[str, Position]) -> None:
        """Deliver the stream from ``start`` on ``subjects`` to ``sub``: up
        to ``stop`` (replay) or until cancelled (live). A failed consumer is
        remade after the last delivered sequence."""
        if not subjects:
            if stop is None:
                await trio.sleep_forever()
            return
        outlet = sub.outlet
        done = start - 1
        attempt = 0
        while outlet.state == OPEN:
            pull = None
            try:
                pull = await self._open_consumer(subjects, done + 1)
                if attempt:
                    self.counters["consumers_remade"] += 1
                    self.outage.recovered("consumers", "jetstream relay: NATS is back; "
                                          "consumers remade, subscriptions resumed")
                attempt = 0
                idle = 0
                batch = FETCH_FIRST
                while outlet.state == OPEN:
                    await self._room(outlet)
                    msgs = await pull.fetch(batch, FETCH_TIMEOUT_S, no_wait=stop is not None)
                    if not msgs:
                        idle += 1
                        if stop is not None or idle >= IDLE_CHECKS:
                            idle = 0  # raises NotFoundError when the consumer is gone
                            ci = await aio(self.link.js.consumer_info)(self.stream, pull.name)
                            if stop is not None and ci.num_pending == 0:
                                return
                        continue
                    idle = 0
                    batch = next_batch(msgs, self.queue_soft_bytes // 2)
                    done, finished = await self._deliver_batch(sub, msgs, done, stop, after)
                    if finished:
                        return
                return
            except _CONSUMER_ERRORS as e:
                await self._consumer_lost(e, done, attempt)
                attempt += 1
            finally:
                if pull is not None:
                    await self._drop_consumer(pull)

    async def _consumer_lost(self, e: BaseException, done: int, attempt: int) -> None:
        """Wait before a lost consumer is remade: for NATS itself while it is
        unreachable (said once per outage, :class:`~.link.Outage`), then the
        shared backoff."""
        delay = backoff_delay(attempt, 0.2, 5.0)
        if not self.link.connected or self.outage.down("consumers"):
            # nothing can be remade until NATS is back
            self.outage.failed("consumers", "jetstream relay: NATS unreachable (%s); "
                               "subscriptions wait and resume where they stopped",
                               type(e).__name__)
            await self.link.wait_connected()
        else:
            log.info("jetstream relay: consumer lost (%s); remaking it from stream "
                     "sequence %d in %.1fs", type(e).__name__, done + 1, delay)
        await trio.sleep(delay)

    async def _deliver_batch(self, sub: Subscriber, msgs: list[Any], done: int, stop: int | None,
                             after: dict[str, Position]) -> tuple[int, bool]:
        """Deliver one fetched batch past stream sequence ``done``: ``(the
        last sequence delivered, whether the phase ended at ``stop``)``. A
        checkpoint every :data:`~bridges.core.pacing.YIELD_BYTES` of
        messages: a render below an event's capture parses and re-encodes
        it (a twelfth outside attack held the embedded relay's loop so)."""
        work = 0
        for m in msgs:
            if work >= YIELD_BYTES:
                work = 0
                await trio.lowlevel.checkpoint()
            work += len(m.data)
            meta = m.metadata
            sseq = meta.sequence.stream
            if stop is not None and sseq > stop:
                return done, True
            if sseq <= done:
                continue
            done = sseq
            self._deliver(sub, m.data, after)
            if stop is not None and (sseq >= stop or meta.num_pending == 0):
                return done, True
        return done, False

    def _deliver(self, sub: Subscriber, data: bytes, after: dict[str, Position]) -> None:
        try:
            ev = json.loads(data)
            e = trusted_entry(ev, data)
        except (ValueError, KeyError, TypeError, AttributeError):
            self.counters["bad_stream_messages"] += 1
            return
        if after and e.pos is not None:
            held = after.get(e.attrs.get("session"))  # type: ignore[arg-type]
            if held is not None and e.pos <= held:
                return
        if not sub.filter.matches(e.attrs):
            return
        try:
            sub.offer(self.fanout.render(e, sub.ceiling))
        except Exception as exc:  # noqa: BLE001 -- one bad event sheds one subscriber, as fan-out does
            self.counters["fanout_errors"] += 1
            log.error("jetstream relay: delivery failed (%s); shedding the subscriber",
                      type(exc).__name__)
            sub.outlet.terminate("internal-error")

__all__ = ["CONSUMER_INACTIVE_S", "CONSUMER_PREFIX", "FETCH_BATCH", "FETCH_FIRST", "FETCH_TIMEOUT_S",
           "IDLE_CHECKS", "Subscriptions", "next_batch"]
