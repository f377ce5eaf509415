"""The embedded AEP relay: ingest, attr-match fan-out, bounded replay, token
auth, command routing, and the roster (AEP-0003, AEP-0004 §4; the reference
relay's frozen ceiling, ``docs/relay.md``).

Transport-free: :mod:`supervisor.relay.app` is the ASGI face (HTTP POST,
SSE, WebSocket) and feeds this module; the fleet's own bridges attach
in-process through :meth:`Relay.attach_emitter`, which is the same
:class:`~.connections.Connection` family a remote WebSocket emitter gets,
so routing, claims and refusals are one code path.

The parts, one concern a module: :mod:`.outlet` (a consumer's bounded
queue, AEP-0003 §8.4, and the rendered views), :mod:`.replay` (replay
plans and the chunked reader), :mod:`.buffer` (the session buffers),
:mod:`.connections` (in-process and WebSocket parties, the claim table),
:mod:`.params` (request parameters), :mod:`.envelope` (validation). This
module is the :class:`Relay` that ties them (its state, auth, declarations,
connections, subscriptions and shutdown), over three mixins, one seam
each: :mod:`.ingest` (the checks and the admission), :mod:`.runs` (an
in-process emitter's trusted runs) and :mod:`.routing` (commands,
AEP-0004 §4). Each event is validated and serialized once at ingest
(compact JSON) and rendered once per ``(event, capture ceiling)`` per
fan-out; the bytes are shared by every subscriber that receives them."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Iterable, Mapping

import trio

from bridges.core.aep import AEP_VERSION, CAPTURE_LEVELS
from bridges.core.asgi import presented_tokens, token_matches

from .acks import AckGate
from .attrmatch import DEFAULT_MAX_TERMS, Filter
from .bindings import ANONYMOUS, SHARED, Bindings, named
from .buffer import Entry, Held, MiB, Position, SessionBuffers
from .connections import (
    Claims,
    CommandRefused,
    Connection,
    LocalEmitter,
    RelayClosed,
    SocketConnection,
)
from .fanout import Fanout
from .fleetsources import FleetSources
from .newsessions import NewSessionBudget
from .outlet import Outlet, Subscriber
from .params import normalize_origin
from .replay import ReplayJob, plan_replay, unheld_positions
from .runs import RunFault, StampedRuns

__all__ = ["Relay", "RelayClosed", "CommandRefused", "LocalEmitter", "normalize_origin",
           "RELAY_AGENT", "RunFault"]

RELAY_AGENT = "aep-bridges-relay"


class Relay(StampedRuns):
    """The embedded relay (AEP-0003 bindings, AEP-0004 §4 routing).

    Parameters: ``token`` (``AEP_TOKEN``; ``None`` = watch-only: every
    binding is unauthenticated, observation is open and every command is
    refused ``unauthorized``), ``buffer`` (``AEP_BUFFER``, events per
    session), ``max_sessions`` (``AEP_MAX_SESSIONS``), ``max_body``
    (``AEP_MAX_BODY``, bytes per POST body and per WS message),
    ``max_batch`` (``AEP_MAX_BATCH``, events per NDJSON POST), ``max_from``
    (``AEP_MAX_FROM``, resume positions per request; default
    ``max_sessions``). Keyword-only tuning: ``heartbeat_s`` (SSE ``: ping``
    interval), ``ws_ping_s`` / ``ws_timeout_s`` (WS liveness, AEP-0003 §3.5
    rule 5), ``queue_soft_bytes`` / ``queue_hard_bytes`` (per consumer,
    §8.4), ``max_subscriptions`` (per WS connection), ``sse_linger_s`` (the
    least time an SSE writer lets a burst gather before one write; see
    :meth:`sse_linger`), ``cors_origins`` (``AEP_CORS_ORIGINS``: browser
    origins, ``scheme://host[:port]``, allowed to use the relay; see
    :mod:`supervisor.relay.app` "Browsers"; raises ``ValueError`` for an
    entry that is not an origin, ``*`` included), ``buffer_bytes``
    (``AEP_BUFFER_BYTES``, accounted bytes held per session buffer, default
    8 MiB) and ``total_bytes`` (``AEP_BUFFER_TOTAL_BYTES``, all buffers
    together, default 256 MiB; must be >= ``buffer_bytes``): replay memory
    is bounded in bytes as well as in events (see :mod:`.buffer`).
    Hardening (issue 10): ``ws_close_wait_s`` (how long a WebSocket waits
    for the peer's close frame after sending its own), ``strict_identity``
    (``AEP_STRICT_IDENTITY``: refuse an emitter's events whose ``agent`` is
    not its hello identity; default accept, count, log once),
    ``max_filter_terms`` (``AEP_MAX_FILTER_TERMS``: alternatives per filter,
    ``limit-exceeded`` past it), ``body_timeout_s`` (``AEP_BODY_TIMEOUT``:
    a ``POST`` body must arrive within it, else 408), ``subscriber_bytes``
    (``AEP_SUBSCRIBER_BYTES``: the per-subscriber byte budget, i.e. the
    hard bound; default ``queue_hard_bytes``), ``stuck_s`` (a consumer
    whose writer is blocked in one send this long while output waits is
    shed). Issue 25: ``max_new_sessions`` (``AEP_RELAY_MAX_NEW_SESSIONS``,
    new sessions one remote request may open while remote events are
    logged) and ``new_sessions_per_s`` (``AEP_RELAY_NEW_SESSIONS_PER_S``,
    over all remote emitters; :mod:`.newsessions`); ``emitter_tokens``
    (``AEP_EMITTER_TOKENS``: name -> per-emitter credential, each as good
    as ``token`` and naming its holder) and ``claim_grace_s``
    (``AEP_CLAIM_GRACE``): the session bindings of :mod:`.bindings`, at
    most ``max_bindings`` of them (``AEP_MAX_BINDINGS``; ``None``: 65,536
    or four times ``max_sessions``, the larger).
    Raises ``ValueError`` for sizes below 1."""

    def __init__(self, token: str | None = None, buffer: int = 10_000, max_sessions: int = 500,
                 max_body: int = 16 * MiB, max_batch: int = 10_000, max_from: int | None = None,
                 *, heartbeat_s: float = 15.0, ws_ping_s: float = 30.0, ws_timeout_s: float = 90.0,
                 queue_soft_bytes: int = 1 * MiB, queue_hard_bytes: int = 8 * MiB,
                 max_subscriptions: int = 64, sse_linger_s: float = 0.001,
                 instance: str | None = None, cors_origins: Iterable[str] | None = None,
                 buffer_bytes: int = 8 * MiB, total_bytes: int = 256 * MiB,
                 ws_close_wait_s: float = 1.0, strict_identity: bool = False,
                 max_filter_terms: int = DEFAULT_MAX_TERMS, body_timeout_s: float = 30.0,
                 subscriber_bytes: int | None = None, stuck_s: float = 10.0,
                 max_new_sessions: int = 100, new_sessions_per_s: float = 50.0,
                 emitter_tokens: Mapping[str, str] | None = None,
                 claim_grace_s: float = 120.0, max_bindings: int | None = None) -> None:
        self._token = token.encode("utf-8") if token else None
        self._emitter_tokens = tuple((named(n), t.encode("utf-8"))
                                     for n, t in (emitter_tokens or {}).items() if t)
        self.cors_origins: frozenset[str] = frozenset(
            normalize_origin(o, strict=True) for o in (cors_origins or ()) if o.strip())
        self.buffer_depth = buffer
        self.max_sessions = max_sessions
        self.max_body = max_body
        self.max_batch = max_batch
        self.max_from = max_from if max_from is not None else max_sessions
        self.heartbeat_s = heartbeat_s
        self.ws_ping_s = ws_ping_s
        self.ws_timeout_s = ws_timeout_s
        self.queue_soft_bytes = queue_soft_bytes
        # the per-subscriber byte budget (AEP_SUBSCRIBER_BYTES) is the hard bound
        self.queue_hard_bytes = max(subscriber_bytes or queue_hard_bytes, queue_soft_bytes)
        self.max_subscriptions = max_subscriptions
        self.sse_linger_s = sse_linger_s
        self.ws_close_wait_s = ws_close_wait_s
        self.strict_identity = strict_identity
        self.max_filter_terms = max_filter_terms
        self.body_timeout_s = body_timeout_s
        self.stuck_s = stuck_s
        self.instance = instance
        self.buffers = SessionBuffers(buffer, max_sessions, buffer_bytes=buffer_bytes,
                                      total_bytes=total_bytes)
        self.closing = False
        self._outlets: set[Outlet] = set()
        self._sse_streams = 0
        self._conns: set[Connection] = set()
        self.claims = Claims(max_sessions)
        #: the fleet bridges' source bases, reserved at attach (:mod:`.fleetsources`)
        self.fleet_sources = FleetSources()
        #: session -> the principal that owns it (:mod:`.bindings`)
        self.bindings = Bindings(max_bindings or max(65_536, 4 * max_sessions), claim_grace_s)
        self._admitted = 0
        #: while :meth:`admit_stamped_run` runs (synchronously), the entries
        #: :meth:`_admit` took (a stretch of appends: one list of held tuples,
        #: :meth:`_stretch`), fanned out at its end; else ``None``
        self._run: list[Entry | list[Held]] | None = None
        self._started = time.monotonic()
        self.counters: dict[str, int] = {
            "events": 0, "invalid_events": 0, "bad_frames": 0, "dropped_low_severity": 0,
            "dropped_debug": 0, "dropped_info": 0,
            "streams_terminated": 0, "connections_aborted": 0, "downlevel_errors": 0, "commands_routed": 0,
            "commands_refused": 0, "connection_errors": 0, "handler_errors": 0, "fanout_errors": 0,
            "refused_origin": 0, "refused_host": 0, "identity_mismatch": 0,
            "refused_owned_source": 0, "refused_owned_session": 0, "replay_exhausted_late": 0,
            "refused_new_sessions": 0, "fleet_reclaimed": 0, "refused_fleet_into_owned": 0,
            "refused_command_scope": 0,
        }
        self._fleet_refusals_logged = OrderedDict()
        self.session_budget = NewSessionBudget(max_new_sessions, new_sessions_per_s,
                                               remember=max(65_536, 4 * max_sessions))
        self.fanout = Fanout(self.counters)
        #: which connection each routed command went to (:mod:`.acks`)
        self.acks = AckGate(self.counters)
        #: ``persist(entries, principal) -> bool``: write remote emitters'
        #: sequenced events (``POST /events``, ``/socket``) durably before
        #: they are admitted and answered (the daemon's session log; the
        #: sender's principal, :meth:`principal`, is the files' writer);
        #: ``False``: not written, refused ``unavailable`` (send again).
        #: ``None``: memory only
        self.persist: Callable[[list[Entry], str | None], bool] | None = None

    def __repr__(self) -> str:  # never the token
        return (f"<Relay buffer={self.buffer_depth} max_sessions={self.max_sessions} "
                f"auth={'on' if self._token else 'off'}>")

    # -- auth ----------------------------------------------------------------
    @property
    def has_token(self) -> bool:
        """Whether a token is configured (the value itself is never exposed)."""
        return self._token is not None

    def check_token(self, presented: str | None) -> bool:
        """Constant-time comparison against the configured token."""
        return token_matches(self._token, presented)

    def authorized(self, headers: Iterable[tuple[bytes, bytes]], query_string: bytes = b"") -> bool:
        """AEP-0003 §8.1: ``Authorization: Bearer <token>`` or
        ``?access_token=<token>`` (the shared token or a per-emitter
        credential). Always true without a configured token (observation
        is open; control is refused regardless)."""
        if self._token is None:
            return True
        return self.authenticated(headers, query_string)

    def authenticated(self, headers: Iterable[tuple[bytes, bytes]], query_string: bytes = b"") -> bool:
        """True only when a token is configured and a credential presented."""
        return self._token is not None and self.principal(headers, query_string) != ANONYMOUS

    def principal(self, headers: Iterable[tuple[bytes, bytes]], query_string: bytes = b"") -> str:
        """Who a request is, as far as its credential proves (:mod:`.bindings`):
        ``emitter:<name>`` for a per-emitter credential, ``token`` for the
        shared one, ``anonymous`` for none (or a wrong one). Every
        configured credential is compared in constant time."""
        if self._token is None:
            return ANONYMOUS
        found = ANONYMOUS
        for presented in presented_tokens(headers, query_string):
            for who, tok in self._emitter_tokens:
                if token_matches(tok, presented):
                    found = who
            if found == ANONYMOUS and token_matches(self._token, presented):
                found = SHARED
        return found

    # -- declarations ----------------------------------------------------------
    def capabilities(self) -> dict[str, Any]:
        """The relay's capability block (``hello`` §4 and discovery §3.4)."""
        return {
            "filters": ["attr-match"],
            "replay": {"buffer": self.buffer_depth, "all": True},
            "capture": list(CAPTURE_LEVELS),
            "control": {"accepts": []},
            "roster": {},
            # the held-sessions frame (:meth:`held_sessions`), beyond AEP 0.1's frame set
            "experimental": {"sessions": {}},
        }

    def discovery(self) -> dict[str, Any]:
        """The discovery document (AEP-0003 §3.4) served at ``GET /events``
        and ``GET /.well-known/aep``. ``replay.buffer`` counts events per
        session."""
        return {
            "aep": [AEP_VERSION],
            "role": "collector",
            "endpoints": {"events": "/events", "stream": "/stream", "socket": "/socket"},
            "capabilities": self.capabilities(),
        }

    def hello_frame(self) -> dict[str, Any]:
        ident: dict[str, Any] = {"agent": RELAY_AGENT}
        if self.instance:
            ident["instance"] = self.instance
        return {"type": "hello", "versions": [AEP_VERSION], "role": "both",
                "identity": ident, "capabilities": self.capabilities()}

    def sse_linger(self) -> float:
        """How long an SSE writer lets output gather before one write:
        ``sse_linger_s`` at least, 0.5 ms per open stream, at most 100 ms.
        Each write costs the same fixed overhead whatever its size, so with
        many streams fewer, larger writes keep fan-out from starving ingest
        (measured: 100 streams, 5 ms -> ~37k deliveries/s, 50 ms -> ~300k)."""
        return min(max(self.sse_linger_s, self._sse_streams * 0.0005), 0.1)

    def stats(self) -> dict[str, Any]:
        """Counts for an authorized ``/healthz`` (topology stays behind auth)."""
        return {
            "sessions": len(self.buffers),
            "sessions_pinned": self.buffers.pinned,
            "buffered_bytes": self.buffers.bytes,
            "subscribers": len(self.fanout),
            "connections": len(self._conns),
            "uptime_s": int(time.monotonic() - self._started),
            "counters": {**self.counters, **self.buffers.counters},
        }

    # -- connections -------------------------------------------------------------
    def attach_emitter(self, hello: dict[str, Any],
                       deliver: Callable[[dict[str, Any]], Awaitable[Any]], *,
                       open_sessions: bool = False, source_base: str | None = None
                       ) -> LocalEmitter:
        """Attach an in-process emitter (a fleet bridge): ``hello`` is the
        AEP-0003 §4 hello object (role ``emitter``/``both``,
        ``identity.agent``, ``identity.instance``, ``capabilities.emits``,
        ``capabilities.control {accepts, ack_window_ms}``); ``deliver`` is
        awaited with each command envelope routed to this connection's
        sessions. ``open_sessions``: the bridge's session ids are chosen by
        unauthenticated senders (OTLP), so it may not enter a session a
        bridge of another agent claims. ``source_base``: the bridge's
        ``aep://{host}/agent/{agent}``: every source at or under it is
        refused to anyone but the fleet from now on (:mod:`.fleetsources`).
        Raises ``ValueError`` for a bad hello, :class:`RelayClosed` after
        :meth:`close`."""
        if self.closing:
            raise RelayClosed("relay is shutting down")
        conn = LocalEmitter(self, hello, deliver, open_sessions=open_sessions)
        if source_base is not None:
            self.fleet_sources.reserve(source_base)
        self._conns.add(conn)
        return conn

    def open_socket(self, authenticated: bool, principal: str = ANONYMOUS) -> SocketConnection:
        """A new WebSocket connection's protocol state (ASGI layer);
        ``principal``: :meth:`principal` of its upgrade request."""
        conn = SocketConnection(self, authenticated, principal)
        self._conns.add(conn)
        self._outlets.add(conn.outlet)
        return conn

    def release(self, conn: Connection) -> None:
        """A connection is gone: drop its claims and forget it (its
        sessions' bindings stay, their grace counting from now)."""
        self.bindings.touch(conn.claims, time.monotonic())
        self.claims.drop(conn)
        self._conns.discard(conn)

    def roster(self) -> list[dict[str, Any]]:
        """Every live (connection, claimed session) pair (AEP-0003 §4.1)."""
        out: list[dict[str, Any]] = []
        for c in list(self._conns):
            out.extend(c.roster_entries())
        return out

    def held_sessions(self) -> tuple[list[dict[str, Any]], bool]:
        """The ``sessions`` frame's answer (an extension frame, declared as
        ``capabilities.experimental.sessions``): every session this relay
        holds replay history of, ended ones included, as ``([{"session",
        "events"}], complete)``: one entry per bare session name (its
        buffers summed, ``events`` = events held), least recently written
        first; ``complete`` is always true here (the buffers are bounded by
        ``max_sessions``). What ``from: "all"`` would replay, named; unlike
        the roster (live claims only), a session whose emitter is gone is
        listed. Metadata only, like the roster (AEP-0003 §4.1 rule 7)."""
        counts: dict[str, int] = {}
        for key in self.buffers.sessions():
            counts[key[1]] = counts.get(key[1], 0) + self.buffers.held(key)
        return [{"session": s, "events": n} for s, n in counts.items()], True

    # -- subscriptions (the fan-out is :mod:`.fanout`) -------------------------------
    def unsubscribe(self, sub: Subscriber) -> None:
        """End one live subscription (its queued output stays)."""
        self.fanout.remove(sub)

    def detach_outlet(self, outlet: Outlet) -> None:
        """End every live subscription feeding ``outlet`` (it is ending)."""
        self.fanout.detach(outlet)

    def outlet_closed(self, outlet: Outlet) -> None:
        """``outlet``'s connection is gone: forget it."""
        self._outlets.discard(outlet)
        if outlet.kind == "sse":
            self._sse_streams -= 1

    @property
    def outlets(self) -> frozenset[Outlet]:
        """The open consumer outlets (SSE streams and WebSockets)."""
        return frozenset(self._outlets)

    def subscribe(self, sub: Subscriber, *, plan_all: bool,
                  positions: list[tuple[str, Position | None]] | None, live: bool,
                  tail: list[Any] | None = None) -> None:
        """Register ``sub`` for live delivery (when ``live``) and queue its
        replay (:func:`.replay.plan_replay`), atomically (no checkpoint in
        between, so no gap and no duplicate). A resume position of a
        session the relay holds nothing of waits for that session's first
        later event (:func:`.replay.unheld_positions`, :class:`.fanout.Fanout`):
        ``replay-exhausted`` then precedes it unless it is the next one."""
        plan = plan_replay(self.buffers, sub.filter, plan_all=plan_all, positions=positions,
                           live=live)
        if live:
            self.fanout.add(sub, unheld_positions(self.buffers, plan_all=plan_all,
                                                  positions=positions, live=live))
        if plan or tail:
            sub.outlet.push_replay(ReplayJob(self.buffers, self.fanout.render, sub, plan,
                                             self._admitted, tail, self.fanout.render_gate))

    def open_stream(self, flt: Filter, ceiling: str | None, *, plan_all: bool,
                    positions: list[tuple[str, Position | None]] | None,
                    live: bool) -> Outlet:
        """An SSE stream's outlet with its subscription registered and replay
        queued (AEP-0003 §3.3). ``live=False`` ends after the replay with
        ``: replay-complete``."""
        outlet = Outlet(self, "sse")
        self._outlets.add(outlet)
        self._sse_streams += 1
        sub = Subscriber(flt, ceiling, outlet)
        tail = None if live else [b": replay-complete\n\n"]
        self.subscribe(sub, plan_all=plan_all, positions=positions, live=live, tail=tail)
        if not live:
            self.end_after_replay(outlet)
        return outlet

    async def live_fixed(self, outlet: Outlet) -> None:
        """Return once where ``outlet``'s live delivery starts is fixed, so
        an event posted after the stream's response began is delivered
        (here at :meth:`subscribe`, at once; a backend that fixes it later,
        the JetStream relay, waits). The SSE response starts after this."""

    def end_after_replay(self, outlet: Outlet) -> None:
        """A ``live=0`` stream ends once its queued replay is written (here
        the replay is queued whole at :meth:`subscribe`; a backend that
        delivers it later ends the outlet itself)."""
        outlet.end(True)

    # -- shutdown ---------------------------------------------------------------------
    async def close(self, reason: str = "shutting down", *, grace: float = 2.0) -> None:
        """Orderly shutdown: every SSE stream gets ``: shutting-down`` and a
        clean end, every WebSocket a ``closing`` frame (with delivered
        positions) then close 1001; in-process connections are closed.
        Waits up to ``grace`` seconds for the streams to drain, then aborts
        whatever is still stuck (a peer that stopped reading)."""
        self.closing = True
        for c in list(self._conns):
            if isinstance(c, LocalEmitter):
                c.close()
        outlets = list(self._outlets)
        for o in outlets:
            o.finish(reason)
        with trio.move_on_after(grace):
            for o in outlets:
                await o.done.wait()
        for o in outlets:
            if not o.done.is_set():
                o.kill()
        # give aborted writers a moment to unwind
        with trio.move_on_after(0.5):
            for o in outlets:
                await o.done.wait()
