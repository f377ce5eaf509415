"""Connections: parties attached to the relay that may claim sessions and
receive commands (AEP-0003 §4, §4.1; AEP-0004 §4). :class:`LocalEmitter`
is a fleet bridge in-process, :class:`SocketConnection` the protocol state
of one remote ``/socket`` WebSocket; both feed the relay through its public
ingest API (:meth:`Relay.ingest <supervisor.relay.core.Relay.ingest>`) and
are one code path for routing, claims and refusals. :class:`Claims` is the
relay's session -> claimant table (AEP-0004 §4.5).

Transport-free: the ASGI layer (:mod:`.app`) feeds
:meth:`SocketConnection.handle_text` and writes its :attr:`~SocketConnection.outlet`."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Awaitable, Callable, Protocol, Sequence

import trio

from bridges.core.aep import AEP_VERSION, check_json, is_command_type, loads

from .acks import AckRefused
from .attrmatch import Filter, FilterTooLarge, InvalidFilter
from .bindings import ANONYMOUS, FLEET, key
from .buffer import Position
from .envelope import MAX_ID, InvalidEvent
from .newsessions import TooManySessions
from .outlet import OPEN, Outlet, OutletHub, Subscriber, frame_text
from .params import parse_capture, parse_from

__all__ = ["RelayClosed", "TooLarge", "Unavailable", "CommandRefused", "Connection", "LocalEmitter", "SocketConnection",
           "Claims", "ROLES", "RelayHub"]

ROLES = ("emitter", "consumer", "both")


class RelayClosed(RuntimeError):
    """The relay (or this in-process connection) is closed; nothing was ingested."""


class Unavailable(RuntimeError):
    """The relay's store did not take the events (a JetStream relay whose
    NATS cluster is unreachable): nothing is acknowledged; the emitter
    sends them again (duplicates are dropped on ``(source, id)``)."""


class TooLarge(ValueError):
    """An event the relay's store can never take (a JetStream relay: over
    the server's max payload): ``index`` in the batch; the answer is a
    413, never a "send it again"."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(detail)
        self.index = index


class CommandRefused(Exception):
    """A command sent on an in-process connection was refused by the relay
    (AEP-0004 §4.2 codes: ``unauthorized``, ``unsupported``, ``ambiguous``,
    ``no-route``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class Claims:
    """Which connections claim which session (they sent its sequenced
    events): each connection's claims are bounded to ``max_sessions``,
    least recently used dropped first. A command routes only to a session
    with exactly one claimant (AEP-0004 §4.5)."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._holders: dict[str, dict[Connection, None]] = {}
        self._sources: dict[str, Connection] = {}  # source -> its live owning emitter

    def claim(self, conn: Connection, session: str) -> bool:
        """``conn`` sent a sequenced event of ``session``; whether it is a
        new claim of ``conn``'s."""
        if session in conn.claims:
            conn.claims.move_to_end(session)
            return False
        conn.claims[session] = None
        self._holders.setdefault(session, {})[conn] = None
        if len(conn.claims) > self.max_sessions:
            old, _ = conn.claims.popitem(last=False)
            self._unclaim(conn, old)
        return True

    def evict(self, session: str, keep: type) -> int:
        """Drop every claim of ``session`` by a connection that is not a
        ``keep`` (the fleet took the session back, :mod:`.bindings`);
        returns how many were dropped."""
        gone = [c for c in self._holders.get(session, ()) if not isinstance(c, keep)]
        for c in gone:
            c.claims.pop(session, None)
            self._unclaim(c, session)
        return len(gone)

    def _unclaim(self, conn: Connection, session: str) -> None:
        holders = self._holders.get(session)
        if holders is not None:
            holders.pop(conn, None)
            if not holders:
                del self._holders[session]

    def drop(self, conn: Connection) -> None:
        """Forget every claim of ``conn`` (its sessions and its sources)."""
        for s in conn.claims:
            self._unclaim(conn, s)
        conn.claims.clear()
        for src in conn.sources:
            if self._sources.get(src) is conn:
                del self._sources[src]
        conn.sources.clear()

    def own_source(self, conn: Connection, source: str) -> None:
        """``conn`` sent a sequenced event under ``source``: while it is
        live, nobody else may (issue 10 #8). Bounded like the claims, each
        kept as its :func:`.bindings.key` (a 64 KiB one is 257 characters)."""
        source = key(source)
        if source in conn.sources:
            conn.sources.move_to_end(source)
            return
        if source in self._sources:
            return  # another live owner holds it (the relay refused the event first)
        conn.sources[source] = None
        self._sources[source] = conn
        if len(conn.sources) > self.max_sessions:
            old, _ = conn.sources.popitem(last=False)
            if self._sources.get(old) is conn:
                del self._sources[old]

    def source_owner(self, source: str) -> Connection | None:
        """The live connection that owns ``source``, if any."""
        owner = self._sources.get(key(source))
        return owner if owner is not None and owner.open else None

    def claimed_by_other(self, session: str, conn: Connection) -> bool:
        """Whether a live connection other than ``conn`` claims ``session``
        while ``conn`` does not."""
        holders = self._holders.get(session)
        return bool(holders) and conn not in holders  # type: ignore[operator]

    def holders(self, session: str) -> list[Connection]:
        """The live claimants of ``session`` (oldest claim first)."""
        return list(self._holders.get(session, ()))

    def refusal(self, session: str, type_: str) -> tuple[str, str] | None:
        """Why a command of ``type_`` for ``session`` cannot be routed
        (AEP-0004 §4.2 ``no-route``/``ambiguous``/``unsupported``, with a
        detail), or ``None`` when its one claimant accepts it."""
        holders = self._holders.get(session)
        if not holders:
            return ("no-route", f"no connected emitter owns session {session}")
        if len(holders) > 1:
            return ("ambiguous", f"{len(holders)} connected emitters claim session {session}")
        if type_ not in next(iter(holders)).accepts:
            return ("unsupported", f"the target does not accept {type_}")
        return None


class RelayHub(OutletHub, Protocol):
    """What a connection needs from its relay (public members of
    :class:`~supervisor.relay.core.Relay`, which builds the connections and
    so sits above this module: the shape lives here, as
    :class:`~.outlet.OutletHub` does for the outlets)."""

    closing: bool
    max_from: int
    max_subscriptions: int
    max_filter_terms: int

    @property
    def has_token(self) -> bool: ...

    def hello_frame(self) -> dict[str, Any]: ...

    def roster(self) -> list[dict[str, Any]]: ...

    def held_sessions(self) -> tuple[list[dict[str, Any]], bool]: ...

    def release(self, conn: Connection) -> None: ...

    async def ingest(self, ev: Any, conn: Connection | None,
                     raw: str | None = None) -> tuple[str, str] | None: ...

    def admit_stamped(self, ev: dict[str, Any], raw: bytes, conn: Connection) -> None: ...

    def fleet_refused(self, session: str, conn: Connection) -> str | None: ...

    def admit_stamped_run(self, pairs: Sequence[tuple[dict[str, Any], bytes]], start: int,
                          conn: Connection) -> int: ...

    def subscribe(self, sub: Subscriber, *, plan_all: bool,
                  positions: list[tuple[str, Position | None]] | None, live: bool) -> None: ...

    def unsubscribe(self, sub: Subscriber) -> None: ...


class Connection:
    """A party attached to the relay that may claim sessions and receive
    commands: the base of :class:`LocalEmitter` (the fleet's in-process
    bridges) and :class:`SocketConnection` (remote WebSocket parties).

    ``role``: ``emitter``/``consumer``/``both`` (``None`` before ``hello``);
    ``identity``/``capabilities``: from the party's ``hello``, verbatim;
    ``agent``: ``identity.agent`` when declared (the connection's own
    events, sequenced and ``agent.*``, carrying another envelope ``agent``
    are invalid, AEP-0003 §4 rule 3; commands and ``attention.routed``
    are exempt: they speak for their sender);
    ``authenticated``: whether this binding is authenticated (commands
    from an unauthenticated binding are refused, AEP-0004 §4.1);
    ``principal``: who its credential proves it is (:mod:`.bindings`);
    ``claims``: sessions this connection owns (it sent their sequenced
    events), bounded to ``max_sessions``, least recently used first."""

    def __init__(self, relay: RelayHub, authenticated: bool, principal: str = ANONYMOUS) -> None:
        self.relay = relay
        self.authenticated = authenticated
        self.principal = principal
        self.role: str | None = None
        self.identity: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.accepts: frozenset[str] = frozenset()
        #: the hello's ``identity.agent``: every event this connection sends
        #: must carry it as its envelope ``agent`` (AEP-0003 §4 rule 3)
        self.agent: str | None = None
        self.claims: OrderedDict[str, None] = OrderedDict()
        #: sources this connection's sequenced events used (:meth:`Claims.own_source`)
        self.sources: OrderedDict[str, None] = OrderedDict()
        self.open = True
        self.mismatch_logged = False  # an identity mismatch was logged (once per connection)

    @property
    def can_claim(self) -> bool:
        return self.role in ("emitter", "both")

    def adopt_hello(self, hello: dict[str, Any]) -> None:
        """Take ``identity``, ``capabilities`` and ``control.accepts`` from
        the party's ``hello`` (verbatim; malformed blocks read as empty)."""
        ident = hello.get("identity")
        caps = hello.get("capabilities")
        self.identity = ident if isinstance(ident, dict) else {}
        self.capabilities = caps if isinstance(caps, dict) else {}
        agent = self.identity.get("agent")
        self.agent = agent if isinstance(agent, str) and agent else None
        ctl = self.capabilities.get("control")
        acc = ctl.get("accepts") if isinstance(ctl, dict) else None
        # control.accepts is authoritative (AEP-0003 §4 rule 5): none declared
        # means nothing is accepted
        self.accepts = frozenset(a for a in acc if isinstance(a, str)) \
            if isinstance(acc, list) else frozenset()

    def roster_entries(self) -> list[dict[str, Any]]:
        """One entry per live claim, declarations verbatim (AEP-0003 §4.1)."""
        if not self.open or not self.can_claim:
            return []
        base: dict[str, Any] = {}
        if isinstance(self.identity.get("agent"), str):
            base["agent"] = self.identity["agent"]
        if isinstance(self.identity.get("instance"), str):
            base["instance"] = self.identity["instance"]
        if "control" in self.capabilities:
            base["control"] = self.capabilities["control"]
        if "emits" in self.capabilities:
            base["emits"] = self.capabilities["emits"]
        return [{"session": s, **base} for s in self.claims]

    async def deliver_command(self, cmd: dict[str, Any], raw: str | None) -> None:
        """Hand a command routed to this connection to its party (the
        envelope, and ``raw``: its text as received, for byte-identical
        forwarding). Raises when it cannot be delivered (no route)."""
        raise NotImplementedError

    def release(self) -> None:
        """The connection is gone: its claims are dropped (idempotent)."""
        if self.open:
            self.open = False
            self.relay.release(self)


class LocalEmitter(Connection):
    """An in-process emitter connection (one per fleet bridge identity).

    Built by :meth:`Relay.attach_emitter`. ``await ingest(event)`` validates,
    claims the event's session for this connection, buffers and fans out
    (raises :class:`InvalidEvent`, :class:`RelayClosed`, or
    :class:`CommandRefused` for a command it is not allowed to route).
    Commands routed to its sessions are handed to ``deliver`` (awaited in
    the sender's connection task: it should hand off promptly, e.g. into a
    bounded trio channel). ``close()`` drops its claims."""

    def __init__(self, relay: RelayHub, hello: dict[str, Any],
                 deliver: Callable[[dict[str, Any]], Awaitable[Any]], *,
                 open_sessions: bool = False) -> None:
        super().__init__(relay, authenticated=relay.has_token, principal=FLEET)
        #: the bridge's session ids come from unauthenticated senders (the OTLP
        #: receiver's ``conversation.id``): it may not enter a session another
        #: agent's bridge claims (:meth:`Ingest.fleet_refusal`)
        self.open_sessions = open_sessions
        if not isinstance(hello, dict):
            raise ValueError("hello must be an object")
        role = hello.get("role", "emitter")
        if role not in ("emitter", "both"):
            raise ValueError(f"an in-process emitter connection needs role emitter/both, not {role!r}")
        versions = hello.get("versions", [AEP_VERSION])
        if not isinstance(versions, list) or AEP_VERSION not in versions:
            raise ValueError(f"hello.versions must include {AEP_VERSION!r}")
        self.role = role
        self.adopt_hello(hello)
        if not isinstance(self.identity.get("agent"), str) or not self.identity["agent"]:
            raise ValueError("hello.identity.agent is required for emitters (AEP-0003 §4 rule 3)")
        self._deliver = deliver

    async def ingest(self, event: dict[str, Any]) -> None:
        if not self.open or self.relay.closing:
            raise RelayClosed("connection closed")
        refusal = await self.relay.ingest(event, self)
        if refusal is not None:
            raise CommandRefused(*refusal)
        # a checkpoint per event: a tight ingest loop never starves the writers
        await trio.lowlevel.checkpoint()

    def ingest_stamped(self, event: dict[str, Any], raw: bytes) -> bool:
        """The fleet's trusted path for an envelope its own stamper built
        and its pump already encoded (``raw``: :func:`bridges.core.aep.dumps`
        of ``event``): admitted without re-validating or re-encoding
        (:meth:`Relay.admit_stamped <supervisor.relay.core.Relay.admit_stamped>`).
        Never waits: the caller yields once per batch. Returns ``False``,
        having done nothing, for a command (use :meth:`ingest`: commands are
        routed, not admitted). Raises :class:`InvalidEvent` (position taken,
        another agent) and :class:`RelayClosed`."""
        if is_command_type(event.get("type")):
            return False
        if not self.open or self.relay.closing:
            raise RelayClosed("connection closed")
        self.relay.admit_stamped(event, raw, self)
        return True

    def refuses(self, event: dict[str, Any]) -> bool:
        """Whether the relay refuses ``event`` of this fleet bridge because
        its session is not the fleet's to take (a per-emitter credential's,
        a shared-token emitter's while held, another agent's bridge's; not a command;
        :meth:`Relay.fleet_refused <supervisor.relay.ingest.Ingest.fleet_refused>`:
        counted ``refused_fleet_into_owned``, logged once per session). The
        fleet's pump asks before it logs the event and drops a refused one:
        neither the session log nor a later restart's replay ever holds it."""
        session = event.get("session")
        if session.__class__ is not str or is_command_type(event.get("type")):
            return False
        return self.relay.fleet_refused(session, self) is not None

    def ingest_stamped_run(self, pairs: Sequence[tuple[dict[str, Any], bytes]],
                           start: int = 0) -> int:
        """:meth:`ingest_stamped` for ``pairs[start:]`` in one call: the
        index of the first pair not taken (a command, or one the relay
        would refuse: hand it to :meth:`ingest_stamped` or :meth:`ingest`
        for its answer), ``len(pairs)`` when all were admitted
        (:meth:`Relay.admit_stamped_run
        <supervisor.relay.core.Relay.admit_stamped_run>`). Raises
        :class:`RelayClosed`."""
        if not self.open or self.relay.closing:
            raise RelayClosed("connection closed")
        return self.relay.admit_stamped_run(pairs, start, self)

    def close(self) -> None:
        """Detach: drop this connection's claims."""
        self.release()

    async def deliver_command(self, cmd: dict[str, Any], raw: str | None) -> None:
        await self._deliver(cmd)


class SocketConnection(Connection):
    """The protocol state of one ``/socket`` WebSocket (AEP-0003 §3.5, §4,
    §6.5; AEP-0004 §4). The ASGI layer feeds :meth:`handle_text` /
    :meth:`handle_binary` and writes what :attr:`outlet` yields."""

    def __init__(self, relay: RelayHub, authenticated: bool, principal: str = ANONYMOUS) -> None:
        super().__init__(relay, authenticated, principal)
        self.outlet = Outlet(relay, "ws")
        self.hello_done = False
        self.subs: dict[Any, Subscriber] = {}

    # -- output ------------------------------------------------------------
    def send(self, frame: dict[str, Any]) -> None:
        self.outlet.push_frame(frame_text(frame))

    def _fatal(self, frame: dict[str, Any], code: int, reason: str) -> None:
        """An error frame, then close (hello failures, binary frames)."""
        if self.outlet.state != OPEN:
            return
        self.send(frame)
        self.outlet.end((code, reason))
        self.release()

    def error(self, code: str, detail: str | None = None, **extra: Any) -> None:
        frame: dict[str, Any] = {"type": "error", "code": code}
        frame.update(extra)
        if detail:
            frame["detail"] = detail
        self.send(frame)

    # -- input -------------------------------------------------------------
    def handle_binary(self) -> None:
        self.relay.counters["bad_frames"] += 1
        self._fatal({"type": "error", "code": "binary-unsupported",
                     "detail": "binary frames are reserved in AEP 0.1 (AEP-0003 §3.5)"},
                    1003, "binary frames unsupported")

    async def handle_text(self, text: str) -> None:
        if self.outlet.state != OPEN:
            return
        try:
            check_json(text)  # before the parse (a tenth outside attack)
            msg = loads(text)
        except ValueError as e:
            msg = None
            if self.hello_done:
                self.relay.counters["bad_frames"] += 1
                self.error("bad-json", f"frame refused: {str(e)[:200]}")
                return
        if not isinstance(msg, dict):
            if self.hello_done:
                self.relay.counters["bad_frames"] += 1
                self.error("bad-frame", "frame must be a JSON object")
                return
        mtype = msg.get("type") if isinstance(msg, dict) else None
        if not self.hello_done:
            if mtype != "hello":
                self._fatal({"type": "error", "code": "hello-required",
                             "detail": "the first frame must be hello (AEP-0003 §3.5)"},
                            1002, "hello required")
                return
            self._hello(msg)
            return
        assert isinstance(msg, dict)
        if isinstance(mtype, str) and "." in mtype:
            await self._event(msg, text)
            return
        handler = self._FRAMES.get(mtype) if isinstance(mtype, str) else None
        if handler is not None:
            handler(self, msg)
        # unknown frame types are ignored (AEP-0003 §2)

    def _hello(self, msg: dict[str, Any]) -> None:
        versions = msg.get("versions")
        if not isinstance(versions, list) or AEP_VERSION not in versions:
            self._fatal({"type": "error", "code": "version-unsupported", "versions": [AEP_VERSION],
                         "detail": f"this relay speaks AEP {AEP_VERSION}"},
                        1002, "version unsupported")
            return
        role = msg.get("role", "both")
        if role not in ROLES:
            self._fatal({"type": "error", "code": "invalid-hello",
                         "detail": "role must be emitter, consumer or both"}, 1002, "invalid hello")
            return
        self.adopt_hello(msg)
        if role == "emitter" and not (isinstance(self.identity.get("agent"), str)
                                      and self.identity["agent"]):
            self._fatal({"type": "error", "code": "invalid-hello",
                         "detail": "identity.agent is required for emitters (AEP-0003 §4 rule 3)"},
                        1002, "invalid hello")
            return
        self.role = role
        self.hello_done = True
        self.send(self.relay.hello_frame())

    async def _event(self, ev: dict[str, Any], text: str) -> None:
        cause = ev.get("id")
        if not isinstance(cause, str) or len(cause) > MAX_ID:
            cause = None  # an id past the bound is refused, never echoed back
        try:
            refusal = await self.relay.ingest(ev, self, raw=text)
        except AckRefused as e:  # counted refused_acks (AEP-0004 §3: only the target decides)
            self.error("unauthorized", str(e), **({"cause": cause} if cause else {}))
            return
        except InvalidEvent as e:
            self.relay.counters["invalid_events"] += 1
            extra = {"cause": cause} if cause else {}
            self.error("invalid-event", str(e), **extra)
            return
        except Unavailable as e:
            self.error("unavailable", str(e), **({"cause": cause} if cause else {}))
            return
        except TooManySessions as e:  # counted refused_new_sessions (.newsessions)
            self.error("limit-exceeded", str(e), **({"cause": cause} if cause else {}))
            return
        if refusal is not None:
            code, detail = refusal
            self.send({"type": "error", "cause": ev["id"], "code": code, "detail": detail})

    def _subscribe(self, msg: dict[str, Any]) -> None:
        sid = msg.get("id")
        if not (isinstance(sid, str) or (isinstance(sid, int) and not isinstance(sid, bool))):
            self.error("invalid-filter", "subscribe needs an id (string)")
            return
        if self.role == "emitter":
            self.error("unauthorized", "subscribe is answered on consumer/both connections", id=sid)
            return
        try:
            flt = Filter(msg.get("filter", {}), max_terms=self.relay.max_filter_terms)
            ceiling = parse_capture(msg.get("capture"))
            plan_all, positions = parse_from(msg.get("from"))
        except FilterTooLarge as e:
            self.error("limit-exceeded", str(e), id=sid)
            return
        except InvalidFilter as e:
            self.error("invalid-filter", str(e), id=sid)
            return
        if positions is not None and len(positions) > self.relay.max_from:
            self.error("limit-exceeded",
                       f"from exceeds AEP_MAX_FROM={self.relay.max_from} resume positions", id=sid)
            return
        if sid not in self.subs and len(self.subs) >= self.relay.max_subscriptions:
            self.error("limit-exceeded",
                       f"more than {self.relay.max_subscriptions} concurrent subscriptions", id=sid)
            return
        old = self.subs.pop(sid, None)
        if old is not None:
            self.relay.unsubscribe(old)
        sub = Subscriber(flt, ceiling, self.outlet, sid)
        self.subs[sid] = sub
        self.send({"type": "subscribed", "id": sid})
        self.relay.subscribe(sub, plan_all=plan_all, positions=positions, live=True)

    def _unsubscribe(self, msg: dict[str, Any]) -> None:
        sid = msg.get("id")
        sub = self.subs.pop(sid, None) if isinstance(sid, (str, int)) else None
        if sub is not None:
            self.relay.unsubscribe(sub)
            self.outlet.delivered.pop(sid, None)
        self.send({"type": "unsubscribed", "id": sid})

    def _roster(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        if not isinstance(rid, str):
            self.error("invalid-request", "roster needs an id (string)")
            return
        if self.role == "emitter":
            self.error("unauthorized", "roster is answered on consumer/both connections", id=rid)
            return
        self.send_roster(rid)

    def send_roster(self, rid: str) -> None:
        """Answer a ``roster`` request ``rid`` (AEP-0003 §4.1)."""
        self.send({"type": "roster", "id": rid, "entries": self.relay.roster()})

    def _sessions(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        if not isinstance(rid, str):
            self.error("invalid-request", "sessions needs an id (string)")
            return
        if self.role == "emitter":
            self.error("unauthorized", "sessions is answered on consumer/both connections", id=rid)
            return
        self.send_sessions(rid)

    def send_sessions(self, rid: str) -> None:
        """Answer a ``sessions`` request ``rid``: the sessions the relay
        holds history of (:meth:`~.core.Relay.held_sessions`)."""
        entries, complete = self.relay.held_sessions()
        self.send({"type": "sessions", "id": rid, "entries": entries, "complete": complete})

    def _ping(self, msg: dict[str, Any]) -> None:
        self.send({"type": "pong", "t": msg.get("t")})

    def _ignore(self, msg: dict[str, Any]) -> None:
        pass

    _FRAMES: dict[str, Callable[[SocketConnection, dict[str, Any]], None]] = {
        "subscribe": _subscribe,
        "unsubscribe": _unsubscribe,
        "roster": _roster,
        "sessions": _sessions,
        "ping": _ping,
        "pong": _ignore,
    }

    def ping(self, t: int) -> None:
        if self.hello_done:
            self.send({"type": "ping", "t": t})

    async def deliver_command(self, cmd: dict[str, Any], raw: str | None) -> None:
        # byte-identical forwarding (AEP-0004 §4.4): the frame as received
        self.outlet.push_frame(raw if raw is not None else frame_text(cmd))
        if self.outlet.state != OPEN:
            raise RelayClosed("target connection is closing")

    def close(self) -> None:
        """The socket is gone: drop subscriptions and claims."""
        for sub in self.subs.values():
            self.relay.unsubscribe(sub)
        self.subs.clear()
        self.release()
        self.outlet.closed()
