"""``aep-bridges relay`` over JetStream (issue 14; DESIGN.md "Past one
machine"): the standard AEP bindings served from the stream, by any number
of relay instances at once, none holding history in memory.

:class:`JetStreamRelay` is the embedded :class:`~supervisor.relay.core.Relay`
with its store swapped: the ASGI app, the SSE/WS writers, filter and
``from`` parsing, the capture-ceiling down-level, auth and the limits are
the relay's own (:mod:`supervisor.relay`); what changes is where events go
and come from.

- **Subscriptions.** Each AEP subscription is one ephemeral pull consumer
  (``AckPolicy.NONE``, memory storage) whose subject filters are the
  filter's agent/session terms (:func:`~.plan.subject_plan`); the rest of
  the attr-match filter runs in process. A consumer that fails (its node
  died, the stream leader moved) is made again from the stream sequence
  after the last one delivered, so order holds and nothing repeats (the
  ordered-consumer rule, done by hand so the outlet's room paces the
  fetches: a reader that keeps up is never shed, §8.4).
- **Resume.** ``from`` / ``Last-Event-ID`` positions resolve to stream
  sequences by a binary search with ``next_by_subj`` message gets
  (:func:`~.plan.resolve_after`, the position in the ``Aep-Pos`` header);
  the replay phase (the named sessions' subjects, from the earliest start,
  up to the stream's last sequence at subscribe time, each session past its
  own position) then the live phase (the filter's subjects from the next
  sequence): no gap, no duplicate. ``replay-exhausted`` when the session's
  earliest held position is past the asked one; ``from=all`` replays from
  the stream's first sequence; ``live=0`` ends after the replay.
- **Ingest.** Events POSTed or sent on ``/socket`` are published
  (``Nats-Msg-Id`` = ``(source, id)``: the server drops redeliveries,
  acknowledged before the emitter is answered; a cluster that does not
  acknowledge within :data:`PUBLISH_DEADLINE_S` is ``503 unavailable``). A
  ``/socket`` emitter's sessions are claimed in the claims bucket under this
  relay's id, refreshed within the bucket's TTL, deleted when it goes.
- **Control.** A command (authenticated bindings only) routes by the
  claims bucket: no claimant ``no-route``, several ``ambiguous``, a verb
  outside the claimant's declared ``control.accepts`` ``unsupported``;
  else a NATS request to ``S.cmd.<daemon>``; the ack and outcome come back
  through the stream as ordinary events. This relay answers its own
  ``S.cmd.<relay id>`` for its ``/socket`` emitters.
"""
from __future__ import annotations

import json
import logging
import secrets
import time
from collections import deque
from typing import Any, Sequence

import nats
import nats.errors
import nats.js.errors
import trio
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from bridges.core.aep import dumps, is_command_type, loads
from bridges.core.backoff import backoff_delay
from supervisor.relay.buffer import Entry, Position
from supervisor.relay.connections import Connection, SocketConnection, TooLarge, Unavailable
from supervisor.relay.core import Relay
from supervisor.relay.envelope import trusted_entry
from supervisor.relay.outlet import OPEN, Outlet, Subscriber, frame_text
from supervisor.relay.replay import exhausted_marker

from .config import NatsConfig
from .link import Link, Outage, aio
from .plan import Found, resolve_after, session_subject, subject_plan
from .publish import _ack_of, wanted_stream
from .subjects import (
    POS,
    claim_key,
    claim_value,
    claimants,
    claims_bucket,
    command_reply,
    command_subject,
    daemons_bucket,
    event_headers,
    event_subject_of,
    parse_command_reply,
    parse_pos,
    parse_value,
    session_claims_filter,
    token,
)

log = logging.getLogger("aep.relay.jetstream")

FETCH_BATCH = 256
FETCH_TIMEOUT_S = 1.0
IDLE_CHECKS = 5
"""Idle fetches (of :data:`FETCH_TIMEOUT_S`) before a live consumer is
asked whether it still exists (its node may have died quietly)."""
CONSUMER_INACTIVE_S = 30.0
PUBLISH_WINDOW = 256
PUBLISH_DEADLINE_S = 10.0
REQUEST_TIMEOUT_S = 5.0
ROUTE_DEADLINE_S = 8.0
"""Longest a command waits for its route (the claims lookup and the
owner's reply) before it is refused ``no-route`` with retry advice."""
CONSUMER_PREFIX = "aeprelay"

_NATS_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, nats.js.errors.Error,
                                                 TimeoutError, OSError)


def roster_entries(claims: Sequence[tuple[str, bytes]],
                   daemons: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The roster (AEP-0003 §4.1) from the claims bucket: one entry per
    ``(claim key, value)`` (:func:`~.subjects.claim_value` shape),
    ``{session, agent, instance?, control?, emits?}`` with the claim's
    declarations verbatim; what a claim leaves out comes from its bridge's
    hello in the daemon's entry (``daemons``: daemon id -> its
    :func:`~.subjects.daemon_value`). Malformed keys and values, and values
    of another shape version, are skipped; a claim present in both key
    shapes is one entry (:func:`~.subjects.claimants`). Pure."""
    out = []
    for agent, session, daemon, bridge, value in claimants(claims):
        if session is None:
            continue
        hello: dict[str, Any] = {}
        for b in (daemons.get(daemon) or {}).get("bridges") or ():
            if isinstance(b, dict) and b.get("name") == bridge \
                    and isinstance(b.get("hello"), dict):
                hello = b["hello"]
        ident: dict[str, Any] = {}
        if isinstance(value.get("identity"), dict) and value["identity"]:
            ident = value["identity"]
        elif isinstance(hello.get("identity"), dict):
            ident = hello["identity"]
        c = hello.get("capabilities")
        caps: dict[str, Any] = c if isinstance(c, dict) else {}
        entry: dict[str, Any] = {"session": session, "agent": agent}
        if isinstance(ident.get("instance"), str):
            entry["instance"] = ident["instance"]
        for k in ("control", "emits"):
            v = value.get(k, caps.get(k))
            if v is not None:
                entry[k] = v
        out.append(entry)
    return out


def accepts_of(value: dict[str, Any]) -> frozenset[str]:
    """A claim's declared ``control.accepts`` (none declared: nothing)."""
    ctl = value.get("control")
    acc = ctl.get("accepts") if isinstance(ctl, dict) else None
    return frozenset(a for a in acc if isinstance(a, str)) if isinstance(acc, list) else frozenset()


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


class JsSocketConnection(SocketConnection):
    """A ``/socket`` connection of a :class:`JetStreamRelay`: the roster
    comes from the claims bucket (asked without blocking the reader)."""

    relay: JetStreamRelay

    def send(self, frame: dict[str, Any]) -> None:
        # "subscribed" leaves once the consumer's live start is fixed (the
        # stream's last sequence read): a sender that waits for it, as the
        # SDK's ControlClient does before a command, then misses no ack
        if frame.get("type") == "subscribed":
            self.relay.hold_subscribed(self.outlet, frame)
            return
        super().send(frame)

    def send_roster(self, rid: str) -> None:
        self.relay.spawn(self._roster_async, rid)

    async def _roster_async(self, rid: str) -> None:
        try:
            entries = await self.relay.roster_async()
        except _NATS_ERRORS as e:
            self.error("unavailable", f"the claims bucket did not answer ({type(e).__name__})",
                       id=rid)
            return
        self.send({"type": "roster", "id": rid, "entries": entries})


class JetStreamRelay(Relay):
    """The relay served from JetStream (module docstring). ``link``: the
    open :class:`~.link.Link`; ``cfg``: the ``AEP_NATS_*`` settings; the
    keyword arguments are :class:`~supervisor.relay.core.Relay`'s. Call
    :meth:`run` in a nursery (``await nursery.start(relay.run)``) before
    serving: it makes the stream and buckets if absent and owns every
    consumer task."""

    def __init__(self, link: Link, cfg: NatsConfig, **kwargs: Any) -> None:
        self.relay_id = kwargs.pop("relay_id", None) or f"relay-{secrets.token_hex(6)}"
        kwargs.setdefault("instance", self.relay_id)
        super().__init__(**kwargs)
        self.link = link
        self.cfg = cfg
        self.stream = cfg.stream
        #: how the daemon's start line names this relay
        self.mode = f"JetStream relay {self.relay_id} (stream {cfg.stream})"
        self._nursery: trio.Nursery | None = None
        self._scopes: dict[Outlet, dict[Subscriber, trio.CancelScope]] = {}
        #: (outlet, subscription id) -> its "subscribed" frame, until positioned
        self._held: dict[tuple[Outlet, Any], dict[str, Any]] = {}
        #: SSE outlets whose response waits for their live start (:meth:`live_fixed`)
        self._fixed: dict[Outlet, trio.Event] = {}
        self._acks = _Acks(link)
        self._kv_claims: Any = None
        self._kv_daemons: Any = None
        self._retention: dict[str, Any] = {}
        self._n = 0
        #: per /socket emitter: session -> the agent its claim key names
        self._claim_agents: dict[Connection, dict[str, str]] = {}
        #: consumer name -> its subject filters, for the live consumers of this relay
        self.consumers: dict[str, list[str]] = {}
        self.counters.update({"published": 0, "publish_failed": 0, "consumers_made": 0,
                              "consumers_remade": 0, "bad_stream_messages": 0,
                              "commands_forwarded": 0, "commands_received": 0,
                              "commands_unreachable": 0})
        #: each kind of NATS outage logged once, its recovery once (not per retry)
        self.outage = Outage(log)

    def nats_health(self, authorized: bool) -> dict[str, Any]:
        """``/healthz``'s ``nats`` block: ``{connected}``, with the relay id,
        the stream, the servers (redacted) and the counters when
        ``authorized``; the fleet's ``ok`` is false while not connected."""
        body: dict[str, Any] = {"connected": self.link.connected}
        if authorized:
            body.update(relay=self.relay_id, stream=self.stream,
                        servers=list(self.link.cfg.shown_servers),
                        counters=dict(self.counters), link=dict(self.link.counters))
        return body

    def nats_stats(self) -> dict[str, int]:
        """``/metrics``' NATS figures of this relay (the daemon's names,
        :mod:`supervisor.web.metrics`): ``connected`` (0/1), the link's
        ``disconnects``/``reconnects``/``errors``, the publishes
        (``published``, ``publish_errors``: events not acknowledged in time),
        the consumers (``consumers`` live, ``consumers_made``,
        ``consumers_remade``), ``bad_stream_messages`` and the commands
        (``commands_forwarded`` to an owner, ``commands_received`` for this
        relay's ``/socket`` emitters, ``commands_unreachable``: refused
        ``no-route`` because NATS could not be reached)."""
        c = self.counters
        return {"connected": int(self.link.connected), **{k: int(v) for k, v in
                                                          self.link.counters.items()},
                "published": int(c["published"]), "publish_errors": int(c["publish_failed"]),
                "consumers": len(self.consumers), "consumers_made": int(c["consumers_made"]),
                "consumers_remade": int(c["consumers_remade"]),
                "bad_stream_messages": int(c["bad_stream_messages"]),
                "commands_forwarded": int(c["commands_forwarded"]),
                "commands_received": int(c["commands_received"]),
                "commands_unreachable": int(c["commands_unreachable"])}

    def __repr__(self) -> str:
        return f"<JetStreamRelay {self.relay_id} stream={self.stream} auth={'on' if self.has_token else 'off'}>"

    # -- lifecycle -------------------------------------------------------------
    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Make the stream and the buckets if absent, listen on this relay's
        command subject, keep its claims fresh; runs until cancelled."""
        attempt = 0
        while True:
            try:
                await self._ensure()
                break
            except _NATS_ERRORS as e:  # an election, a cluster still forming, no storage
                delay = backoff_delay(attempt, 0.5, 10.0)
                if attempt % 10 == 0:
                    log.warning("jetstream relay: stream %s or its buckets not ready (%s: %s); "
                                "retrying in %.1fs", self.stream, type(e).__name__,
                                str(getattr(e, "description", "") or "")[:120], delay)
                attempt += 1
                await trio.sleep(delay)
        sub = await aio(self.link.nc.subscribe)(command_subject(self.stream, self.relay_id))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._serve_commands, sub)
                nursery.start_soon(self._refresh_claims)
                nursery.start_soon(self._refresh_retention)
                task_status.started()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                try:
                    await aio(sub.unsubscribe)()
                except _NATS_ERRORS:
                    pass

    def spawn(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the relay's nursery (a no-op once it ended)."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    async def _ensure(self) -> None:
        js = self.link.js
        cfg = self.cfg
        try:
            info = await aio(js.stream_info)(self.stream)
        except nats.js.errors.NotFoundError:
            try:
                # the daemons' settings (they create or update it; a relay only reads)
                info = await aio(js.add_stream)(StreamConfig(**wanted_stream(cfg)))
            except nats.js.errors.BadRequestError:  # another party made it meanwhile
                info = await aio(js.stream_info)(self.stream)
        self._note_retention(info)
        self._kv_claims = await self._bucket(claims_bucket(self.stream), cfg.claim_ttl)
        self._kv_daemons = await self._bucket(daemons_bucket(self.stream), cfg.claim_ttl)
        if self._acks.prefix == "":
            await self._acks.open()

    async def _bucket(self, name: str, ttl: float) -> Any:
        js = self.link.js
        try:
            return await aio(js.key_value)(name)
        except nats.js.errors.BucketNotFoundError:
            pass
        try:
            return await aio(js.create_key_value)(bucket=name, ttl=ttl, history=1,
                                                  replicas=self.cfg.replicas)
        except nats.js.errors.BadRequestError:
            return await aio(js.key_value)(name)

    def _note_retention(self, info: Any) -> None:
        c, st = info.config, info.state
        self._retention = {
            "stream": self.stream, "max_age_s": c.max_age or 0, "max_bytes": c.max_bytes or -1,
            "max_msgs": c.max_msgs or -1, "replicas": c.num_replicas or 1,
            "messages": st.messages, "first_seq": st.first_seq, "last_seq": st.last_seq,
        }

    async def _refresh_retention(self) -> None:
        while True:
            await trio.sleep(5.0)
            try:
                self._note_retention(await aio(self.link.js.stream_info)(self.stream))
            except _NATS_ERRORS as e:
                log.debug("jetstream relay: stream info: %s", type(e).__name__)

    # -- declarations ------------------------------------------------------------
    def capabilities(self) -> dict[str, Any]:
        """The relay's capability block: ``replay.buffer`` is the stream's
        retention as a global count (``max_msgs``, else what it holds now),
        ``replay.all``; the retention itself under ``experimental.jetstream``."""
        caps = super().capabilities()
        r = self._retention
        depth = r.get("max_msgs", -1)
        caps["replay"] = {"buffer": depth if depth and depth > 0 else r.get("messages", 0),
                          "all": True}
        caps["experimental"] = {"jetstream": {k: r[k] for k in
                                              ("stream", "max_age_s", "max_bytes", "max_msgs",
                                               "replicas") if k in r}}
        return caps

    # -- connections -------------------------------------------------------------
    def open_socket(self, authenticated: bool) -> SocketConnection:
        conn = JsSocketConnection(self, authenticated)
        self._conns.add(conn)
        self._outlets.add(conn.outlet)
        return conn

    def release(self, conn: Connection) -> None:
        gone = self._claim_agents.pop(conn, {})
        super().release(conn)
        for session, agent in gone.items():  # this connection's own keys, no one else's
            self.spawn(self._kv_delete, self._claim_key(conn, agent, session))

    def _claim_key(self, conn: Connection, agent: str, session: str) -> str:
        """The claims-bucket key of ``conn``'s claim (the connection is the
        claimant, as a bridge is on a daemon)."""
        return claim_key(agent, session, self.relay_id, _socket_bridge(conn))

    async def roster_async(self) -> list[dict[str, Any]]:
        """Every live claim in the claims bucket (every daemon's, every
        relay's), as roster entries."""
        claims = await self._kv_entries(self._kv_claims, ">")
        daemons: dict[str, dict[str, Any]] = {}
        for _, raw in await self._kv_entries(self._kv_daemons, ">"):
            v = parse_value(raw)
            if v is not None and isinstance(v.get("daemon"), str):
                daemons[v["daemon"]] = v
        return roster_entries(claims, daemons)

    async def _kv_entries(self, kv: Any, keys: str) -> list[tuple[str, bytes]]:
        """``(key, value)`` of every live key matching ``keys`` (a watch that
        ends after the initial values)."""
        w = await aio(kv.watch)(keys, ignore_deletes=True)
        out = []
        try:
            while True:
                e = await aio(w.updates)(timeout=REQUEST_TIMEOUT_S)
                if e is None:
                    break
                if e.value:
                    out.append((e.key, e.value))
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                try:
                    await aio(w.stop)()
                except _NATS_ERRORS:
                    pass
        return out

    async def _kv_delete(self, key: str) -> None:
        try:
            await aio(self._kv_claims.delete)(key)
        except _NATS_ERRORS as e:
            log.debug("jetstream relay: claim delete: %s", type(e).__name__)

    async def _put_claim(self, conn: Connection, agent: str, session: str) -> None:
        value = claim_value(daemon=self.relay_id, bridge=_socket_bridge(conn),
                            hello={"identity": conn.identity, "capabilities": conn.capabilities},
                            agent=agent, session=session, at_ms=int(time.time() * 1000))
        try:
            await aio(self._kv_claims.put)(self._claim_key(conn, agent, session), value)
        except _NATS_ERRORS as e:
            log.warning("jetstream relay: claim of a session not stored (%s); the next "
                        "refresh retries", type(e).__name__)

    async def _refresh_claims(self) -> None:
        period = max(self.cfg.claim_ttl / 3, 0.5)
        while True:
            await trio.sleep(period)
            for conn, agents in list(self._claim_agents.items()):
                for session in list(conn.claims):
                    agent = agents.get(session)
                    if conn.open and agent is not None:
                        await self._put_claim(conn, agent, session)

    # -- ingest: publish ---------------------------------------------------------
    async def ingest(self, ev: Any, conn: Connection | None,
                     raw: str | None = None) -> tuple[str, str] | None:
        """One event from a connection: checked as the embedded relay checks
        it (:meth:`~supervisor.relay.core.Relay.accept`), a command routed by
        the claims bucket, anything else published and acknowledged, then its
        session claimed for ``conn``. Raises :class:`InvalidEvent`,
        :class:`~supervisor.relay.connections.Unavailable`."""
        e = self.accept(ev, conn, raw)
        if is_command_type(e.attrs["type"]):
            return await self._route(ev, e, conn, raw)
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

    async def ingest_http_batch(self, entries: list[Entry], chunk: int = 256) -> int:
        """Publish a checked ``POST /events`` batch; every event is
        acknowledged by the stream before the 202 (raises
        :class:`~supervisor.relay.connections.Unavailable` otherwise: the
        emitter sends the batch again, the server drops what it holds);
        raises :class:`~supervisor.relay.connections.TooLarge` (a 413,
        nothing published) for an event over the server's max payload."""
        limit = self.link.nc.max_payload
        for i, e in enumerate(entries):
            if limit and len(e.raw) > limit:
                self.counters["too_large"] = self.counters.get("too_large", 0) + 1
                raise TooLarge(i, f"event of {len(e.raw)} bytes is over the NATS server's max "
                                  f"payload of {limit} bytes (the stream can never hold it)")
        await self._publish(entries)
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

    # -- control -----------------------------------------------------------------
    async def _claimants(self, session: str) -> list[tuple[str, str, dict[str, Any]]]:
        """``(agent, daemon, claim value)`` of every live claimant of
        ``session`` (one per bridge or ``/socket`` connection, either key
        shape, :func:`~.subjects.claimants`)."""
        entries = await self._kv_entries(self._kv_claims, session_claims_filter(session))
        return [(agent, daemon, value) for agent, _, daemon, _, value in claimants(entries)]

    async def _route(self, ev: dict[str, Any], e: Entry, sender: Connection | None,
                     raw: str | None) -> tuple[str, str] | None:
        """AEP-0004 §4 across hosts: the claims bucket names the one daemon
        (or relay) whose connection owns the session; the command goes to it
        as a NATS request, verbatim."""
        refusal = self.auth_refusal(sender)
        if refusal is None:
            refusal = await self._forward(ev, raw)
        if refusal is not None:
            self.counters["commands_refused"] += 1
            return refusal
        self.counters["commands_routed"] += 1
        return None

    async def _forward(self, ev: dict[str, Any], raw: str | None) -> tuple[str, str] | None:
        """The claims lookup and the request to the owner, answered within
        :data:`ROUTE_DEADLINE_S`; while this relay cannot reach NATS the
        answer is ``no-route`` at once (AEP-0004 §4.2: no owner is
        reachable through this relay now; the §2.3 retry with the same id
        is safe, the target dedupes)."""
        if not self.link.connected:
            return self._unreachable("this relay has no NATS connection")
        with trio.move_on_after(ROUTE_DEADLINE_S):
            return await self._forward_now(ev, raw)
        return self._unreachable(f"no answer within {ROUTE_DEADLINE_S:g}s")

    def _unreachable(self, why: str) -> tuple[str, str]:
        self.counters["commands_unreachable"] += 1
        return ("no-route", f"{why}: the session's owner cannot be reached now; "
                            "retry the command (same id) when NATS is back")

    async def _forward_now(self, ev: dict[str, Any], raw: str | None) -> tuple[str, str] | None:
        session, type_ = ev["session"], ev["type"]
        try:
            holders = await self._claimants(session)
        except _NATS_ERRORS as e:
            return ("no-route", f"the claims bucket did not answer ({type(e).__name__}); "
                                "retry the command (same id)")
        if not holders:
            return ("no-route", f"no connected emitter owns session {session}")
        if len(holders) > 1:
            return ("ambiguous", f"{len(holders)} connected emitters claim session {session}")
        _, daemon, value = holders[0]
        if type_ not in accepts_of(value):
            return ("unsupported", f"the target does not accept {type_}")
        body = raw.encode("utf-8") if raw is not None else dumps(ev)
        try:
            reply = await aio(self.link.nc.request)(command_subject(self.stream, daemon), body,
                                                    timeout=REQUEST_TIMEOUT_S)
        except _NATS_ERRORS as e:
            return ("no-route", f"the owning daemon did not answer ({type(e).__name__})")
        self.counters["commands_forwarded"] += 1
        return reply_refusal(reply.data)

    async def _serve_commands(self, sub: Any) -> None:
        """Commands for this relay's own ``/socket`` emitters (their claims
        name this relay): delivered to the one local claimant, answered
        with the reply shape of :func:`reply_refusal`."""
        while True:
            try:
                msg = await aio(sub.next_msg)(timeout=None)
            except TimeoutError:
                continue
            except nats.errors.Error as e:
                log.warning("jetstream relay: command subscription: %s", type(e).__name__)
                await trio.sleep(1.0)
                continue
            self.counters["commands_received"] += 1
            answer = await self._deliver_local(msg.data)
            try:
                await aio(msg.respond)(answer)
            except _NATS_ERRORS as e:
                log.debug("jetstream relay: command reply: %s", type(e).__name__)

    async def _deliver_local(self, data: bytes) -> bytes:
        """The :func:`~.subjects.command_reply` to one command request."""
        me = self.relay_id
        try:
            text = data.decode("utf-8")
            cmd = loads(text)
        except ValueError:
            return command_reply(me, code="invalid", detail="not a JSON command")
        if not isinstance(cmd, dict) or not isinstance(cmd.get("session"), str) \
                or not isinstance(cmd.get("type"), str):
            return command_reply(me, code="invalid", detail="not a command envelope")
        refusal = self.claims.refusal(cmd["session"], cmd["type"])
        if refusal is not None:
            return command_reply(me, code=refusal[0], detail=refusal[1])
        target = self.claims.holders(cmd["session"])[0]
        if isinstance(cmd.get("id"), str):  # its ack is admitted from this target alone
            self.acks.routed(target, cmd["session"], cmd["id"])
        try:
            await target.deliver_command(cmd, text)
        except Exception as e:  # noqa: BLE001 -- a dead target is no route
            return command_reply(me, code="no-route",
                                 detail=f"the owning connection is going away ({type(e).__name__})")
        return command_reply(me, bridge=_socket_bridge(target))

    # -- subscriptions -----------------------------------------------------------
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
                while outlet.state == OPEN:
                    await self._room(outlet)
                    msgs = await pull.fetch(FETCH_BATCH, FETCH_TIMEOUT_S, no_wait=stop is not None)
                    if not msgs:
                        idle += 1
                        if stop is not None or idle >= IDLE_CHECKS:
                            idle = 0  # raises NotFoundError when the consumer is gone
                            ci = await aio(self.link.js.consumer_info)(self.stream, pull.name)
                            if stop is not None and ci.num_pending == 0:
                                return
                        continue
                    idle = 0
                    for m in msgs:
                        meta = m.metadata
                        sseq = meta.sequence.stream
                        if stop is not None and sseq > stop:
                            return
                        if sseq <= done:
                            continue
                        done = sseq
                        self._deliver(sub, m.data, after)
                        if stop is not None and (sseq >= stop or meta.num_pending == 0):
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

    async def close(self, reason: str = "shutting down", *, grace: float = 2.0) -> None:
        """The relay's orderly close, then this relay's claims deleted."""
        await super().close(reason, grace=grace)
        with trio.move_on_after(2.0):
            for conn, agents in list(self._claim_agents.items()):
                for session, agent in list(agents.items()):
                    await self._kv_delete(self._claim_key(conn, agent, session))


def _socket_bridge(conn: Connection) -> str:
    """The claimant name of a ``/socket`` connection (``socket-<hex>``)."""
    return f"socket-{id(conn):x}"


def reply_refusal(data: bytes | None) -> tuple[str, str] | None:
    """A daemon's (or relay's) reply on ``S.cmd.<daemon>``
    (:func:`~.subjects.parse_command_reply`): ``None`` when it took the
    command, else the AEP-0004 §4.2 ``(code, detail)`` to answer the
    sender (a reply of no known shape is ``no-route``). Pure."""
    status, code, detail = parse_command_reply(data)
    if status == "accepted":
        return None
    if status == "refused" and code is not None:
        if code == "busy":  # the bridge's inbox was full: dropped, the retry recovers it
            return ("no-route", detail or "the owning bridge is busy; retry")
        if code == "invalid":
            return ("invalid-event", detail or "the owning daemon found the command invalid")
        return (code, detail or code)
    return ("no-route", "the owning daemon answered something unreadable")


__all__: Sequence[str] = (
    "CONSUMER_INACTIVE_S", "CONSUMER_PREFIX", "FETCH_BATCH", "FETCH_TIMEOUT_S", "IDLE_CHECKS",
    "JetStreamRelay", "JsSocketConnection", "PUBLISH_DEADLINE_S", "PUBLISH_WINDOW",
    "REQUEST_TIMEOUT_S", "ROUTE_DEADLINE_S", "accepts_of", "reply_refusal", "roster_entries",
)
