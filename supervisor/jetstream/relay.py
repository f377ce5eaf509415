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

Here: the relay's set-up (the stream and buckets, its command subject), its
health and capabilities, its ``/socket`` connections and close. Its bases
hold the three paths (issue 26): :class:`~.subscribe.Subscriptions`
(subscriptions and resume), :class:`~.ingest.Ingest` (publishing) and, below
it, :class:`~.routing.Routing` (the claims, the roster and control).
"""
from __future__ import annotations

import logging
import secrets
from typing import Any, Sequence

import nats.js.errors
import trio
from nats.js.api import StreamConfig

from bridges.core.backoff import backoff_delay
from supervisor.relay import Connection, Outlet, SocketConnection, Subscriber

from .config import NatsConfig
from .ingest import Ingest, _Acks
from .link import _NATS_ERRORS, Link, Outage, aio
from .publish import wanted_stream
from .subjects import bindings_bucket, claims_bucket, command_subject, daemons_bucket, parse_event_subject
from .subscribe import Subscriptions

log = logging.getLogger("aep.relay.jetstream")

MAX_SESSION_ENTRIES = 10_000
"""Sessions one ``sessions`` answer names at most (then ``complete`` is false)."""


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

    def send_sessions(self, rid: str) -> None:
        self.relay.spawn(self._sessions_async, rid)

    async def _sessions_async(self, rid: str) -> None:
        try:
            entries, complete = await self.relay.sessions_async()
        except _NATS_ERRORS as e:
            self.error("unavailable", f"the stream did not answer ({type(e).__name__})", id=rid)
            return
        self.send({"type": "sessions", "id": rid, "entries": entries, "complete": complete})

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


class JetStreamRelay(Ingest, Subscriptions):
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
        self._kv_bindings: Any = None
        self._bound: dict[Connection, dict[str, str]] = {}
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
                nursery.start_soon(self._refresh_bindings)
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
        # bindings live as long as the stream keeps events (.owners)
        self._kv_bindings = await self._bucket(bindings_bucket(self.stream),
                                               max(cfg.max_age, cfg.claim_ttl))
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
        caps["experimental"] = {**caps["experimental"], "jetstream": {k: r[k] for k in
                                              ("stream", "max_age_s", "max_bytes", "max_msgs",
                                               "replicas") if k in r}}
        return caps

    async def sessions_async(self) -> tuple[list[dict[str, Any]], bool]:
        """The ``sessions`` frame's answer from the stream (the embedded
        relay's :meth:`~supervisor.relay.core.Relay.held_sessions`): every
        session with messages on ``S.ev.>``, ended ones included, ``events``
        = its messages (over all agents), from one ``STREAM.INFO`` with a
        subject filter. At most :data:`MAX_SESSION_ENTRIES` entries;
        ``complete`` is false past that. Raises the NATS errors."""
        info = await aio(self.link.js.stream_info)(self.stream, subjects_filter=f"{self.stream}.ev.>")
        counts: dict[str, int] = {}
        complete = True
        for subject, n in (info.state.subjects or {}).items():
            try:
                _, session = parse_event_subject(self.stream, subject)
            except ValueError:
                continue
            if session is None:  # agent-scoped events: no session
                continue
            if session not in counts and len(counts) >= MAX_SESSION_ENTRIES:
                complete = False
                continue
            counts[session] = counts.get(session, 0) + int(n)
        return [{"session": s, "events": n} for s, n in counts.items()], complete

    # -- connections -------------------------------------------------------------
    def open_socket(self, authenticated: bool, principal: str = "anonymous") -> SocketConnection:
        conn = JsSocketConnection(self, authenticated, principal)
        self._conns.add(conn)
        self._outlets.add(conn.outlet)
        return conn
    async def close(self, reason: str = "shutting down", *, grace: float = 2.0) -> None:
        """The relay's orderly close, then this relay's claims deleted."""
        await super().close(reason, grace=grace)
        with trio.move_on_after(2.0):
            for conn, agents in list(self._claim_agents.items()):
                for session, agent in list(agents.items()):
                    await self._kv_delete(self._claim_key(conn, agent, session))


__all__: Sequence[str] = ("JetStreamRelay", "JsSocketConnection", "MAX_SESSION_ENTRIES")
