"""The JetStream relay's ingest (split from :mod:`supervisor.jetstream.relay`
by issue 26): :class:`Ingest`, a base of
:class:`~supervisor.jetstream.relay.JetStreamRelay`, publishes each event
POSTed or sent on ``/socket`` to the stream, acknowledged before the emitter
is answered (one lane per session, the acks on one inbox: :class:`_Acks`),
claims its session for a ``/socket`` emitter and hands a command to the
routing (the relay module's docstring, "Ingest").
"""
from __future__ import annotations

import logging
from typing import Any

import trio

from bridges.core.aep import is_command_type
from bridges.core.backoff import backoff_delay
from supervisor.relay import Connection, Entry, TooLarge, Unavailable

from .link import _NATS_ERRORS, Link, aio
from .owners import Owners
from .publish import _ack_of
from .subjects import event_headers, event_subject_of

log = logging.getLogger("aep.relay.jetstream")

PUBLISH_WINDOW = 256
PUBLISH_DEADLINE_S = 10.0


class _Acks:
    """JetStream publishes whose acknowledgements come back on one wildcard
    inbox subscription (``<inbox>.<n>``), read in a callback: under
    trio-asyncio nats-py's ``js.publish`` (a request with its own future
    and timeout each) measured ~6k/s for 10k events, against ~30k/s for the
    same calls on plain asyncio; the callback path keeps the per-message
    asyncio work to a minimum."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.prefix = ""
        self._n = 0
        self._waiting: dict[str, list[Any]] = {}

    async def open(self) -> None:
        self.prefix = self.link.nc.new_inbox()

        async def got(msg: Any) -> None:
            w = self._waiting.pop(msg.subject.rpartition(".")[2], None)
            if w is not None:
                w[1] = msg
                w[0].set()
        await aio(self.link.nc.subscribe)(self.prefix + ".*", cb=got)

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str], *,
                      ack_wait_s: float) -> dict[str, Any]:
        """The stream's ack (``{stream, seq, duplicate?}``); raises
        ``TimeoutError`` (no answer), ``nats.errors.NoRespondersError`` (no
        stream leader yet) or ``nats.js.errors.APIError`` (refused)."""
        self._n += 1
        key = str(self._n)
        w: list[Any] = [trio.Event(), None]
        self._waiting[key] = w
        try:
            await aio(self.link.nc.publish)(subject, payload, reply=f"{self.prefix}.{key}",
                                            headers=headers)
            with trio.fail_after(ack_wait_s):
                await w[0].wait()
        except trio.TooSlowError:
            raise TimeoutError("no publish acknowledgement") from None
        finally:
            self._waiting.pop(key, None)
        return _ack_of(w[1])  # the publisher's PubAck reading, one for both


class Ingest(Owners):
    """The ingest of :class:`~supervisor.jetstream.relay.JetStreamRelay` (its
    one subclass, which owns the attributes below)."""

    _acks: _Acks

    # -- ingest: publish ---------------------------------------------------------
    async def ingest(self, ev: Any, conn: Connection | None,
                     raw: str | None = None) -> tuple[str, str] | None:
        """One event from a connection: checked as the embedded relay checks
        it (:meth:`~supervisor.relay.core.Relay.accept`), a command routed by
        the claims bucket, anything else published and acknowledged, then its
        session claimed for ``conn`` (its first event there bound first in the
        bindings bucket, :mod:`.owners`). Raises :class:`InvalidEvent`,
        :class:`~supervisor.relay.connections.Unavailable`."""
        e = self.accept(ev, conn, raw)
        if is_command_type(e.attrs["type"]):
            return await self._route(ev, e, conn, raw)
        if e.pos is not None and conn is not None and conn.can_claim \
                and e.attrs["session"] not in conn.claims:
            await self.claim_binding(conn, e)  # visible to every relay (.owners)
        await self._publish([e])
        if e.pos is not None and conn is not None and conn.can_claim:
            session, agent = e.attrs["session"], e.attrs["agent"]
            agents = self._claim_agents.setdefault(conn, {})
            new = agents.get(session) != agent
            agents[session] = agent
            self.claims.claim(conn, session)
            self.claims.own_source(conn, e.attrs["source"])
            if len(agents) > len(conn.claims):  # the claim table's LRU dropped some
                for gone in [s for s in agents if s not in conn.claims]:
                    self.spawn(self._kv_delete, self._claim_key(conn, agents.pop(gone), gone))
            if new:
                await self._put_claim(conn, agent, session)
        return None

    async def ingest_http_batch(self, entries: list[Entry], chunk: int = 256,
                                principal: str | None = None) -> int:
        """Publish a checked ``POST /events`` batch; every event is
        acknowledged by the stream before the 202 (raises
        :class:`~supervisor.relay.connections.Unavailable` otherwise: the
        emitter sends the batch again, the server drops what it holds);
        raises :class:`~supervisor.relay.connections.TooLarge` (a 413,
        nothing published) for an event over the server's max payload, and
        :class:`InvalidEvent` for a session another principal owns
        (``principal``: the poster's, :meth:`~.owners.Owners.check_posted`)."""
        limit = self.link.nc.max_payload
        for i, e in enumerate(entries):
            if limit and len(e.raw) > limit:
                self.counters["too_large"] = self.counters.get("too_large", 0) + 1
                raise TooLarge(i, f"event of {len(e.raw)} bytes is over the NATS server's max "
                                  f"payload of {limit} bytes (the stream can never hold it)")
        if principal is not None:
            await self.check_posted(entries, principal)
        await self._publish(entries)
        self.bind_posted(entries, principal)  # published: nothing refuses it any more
        return len(entries)

    async def _publish(self, entries: list[Entry]) -> None:
        """Publish ``entries``, each acknowledged by the stream: one lane per
        subject (session), each lane one publish at a time (a retry never
        lands a session's event after its successor: the stream holds every
        session in order, which resume relies on), the lanes concurrent (at
        most :data:`PUBLISH_WINDOW`). Raises :class:`Unavailable`."""
        lanes: dict[str, list[Entry]] = {}
        for e in entries:
            lanes.setdefault(event_subject_of(self.stream, e.attrs), []).append(e)
        failed: list[BaseException] = []
        limit = trio.Semaphore(PUBLISH_WINDOW)
        async with trio.open_nursery() as nursery:
            for subject, lane in lanes.items():
                await limit.acquire()
                nursery.start_soon(self._publish_lane, subject, lane, limit, failed)
        if failed:
            self.counters["publish_failed"] += len(failed)
            raise Unavailable(f"the JetStream stream did not acknowledge {len(failed)} of "
                              f"{len(entries)} events ({type(failed[0]).__name__}); send them "
                              "again (duplicates are dropped)")

    async def _publish_lane(self, subject: str, lane: list[Entry], limit: trio.Semaphore,
                            failed: list[BaseException]) -> None:
        try:
            for i, e in enumerate(lane):
                err = await self._publish_one(subject, e)
                if err is not None:  # the rest of this session waits for the resend
                    failed.extend([err] * (len(lane) - i))
                    return
        finally:
            limit.release()

    async def _publish_one(self, subject: str, e: Entry) -> BaseException | None:
        headers = event_headers(e.attrs, self.relay_id)
        attempt = 0
        last: BaseException = TimeoutError("no acknowledgement")
        with trio.move_on_after(PUBLISH_DEADLINE_S):
            while True:
                try:
                    await self._acks.publish(subject, e.raw, headers, ack_wait_s=2.0)
                    self.counters["published"] += 1
                    self.counters["events"] += 1
                    return None
                except _NATS_ERRORS as exc:
                    last = exc
                    await trio.sleep(backoff_delay(attempt, 0.1, 1.0))
                    attempt += 1
        return last

__all__ = ["Ingest", "PUBLISH_DEADLINE_S", "PUBLISH_WINDOW"]
