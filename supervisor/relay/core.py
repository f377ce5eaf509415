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
module is the :class:`Relay` that ties them: each event is validated and
serialized once at ingest (compact JSON) and rendered once per ``(event,
capture ceiling)`` per fan-out; the bytes are shared by every subscriber
that receives them."""
from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence

import trio

from bridges.core.aep import AEP_VERSION, CAPTURE_LEVELS
from bridges.core.asgi import bearer_ok, token_matches

from .acks import ACK_TYPES, AckGate
from .attrmatch import DEFAULT_MAX_TERMS, Filter
from .buffer import AppendFault, BufKey, Entry, Held, MiB, Position, SessionBuffers, same_event
from .connections import (
    Claims,
    CommandRefused,
    Connection,
    LocalEmitter,
    RelayClosed,
    SocketConnection,
    Unavailable,
)
from .envelope import (
    InvalidEvent,
    has_duplicate_keys,
    is_command_type,
    is_foreign,
    to_entry,
    trusted_entry,
)
from .fanout import Fanout
from .outlet import Outlet, Subscriber
from .params import normalize_origin
from .replay import ReplayJob, plan_replay, unheld_positions

__all__ = ["Relay", "RelayClosed", "CommandRefused", "LocalEmitter", "normalize_origin",
           "RELAY_AGENT", "RunFault"]

log = logging.getLogger("aep.relay")

RELAY_AGENT = "aep-bridges-relay"



class RunFault(Exception):
    """:meth:`Relay.admit_stamped_run` failed inside the admission of a
    pair: every pair before index ``taken`` (that one included) was handed
    to the relay, so a caller resumes at ``taken`` (the cause is chained)."""

    def __init__(self, taken: int) -> None:
        super().__init__(f"admission failed at pair {taken - 1}")
        self.taken = taken

class Relay:
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
    shed). Raises ``ValueError`` for sizes below 1."""

    def __init__(self, token: str | None = None, buffer: int = 10_000, max_sessions: int = 500,
                 max_body: int = 16 * MiB, max_batch: int = 10_000, max_from: int | None = None,
                 *, heartbeat_s: float = 15.0, ws_ping_s: float = 30.0, ws_timeout_s: float = 90.0,
                 queue_soft_bytes: int = 1 * MiB, queue_hard_bytes: int = 8 * MiB,
                 max_subscriptions: int = 64, sse_linger_s: float = 0.001,
                 instance: str | None = None, cors_origins: Iterable[str] | None = None,
                 buffer_bytes: int = 8 * MiB, total_bytes: int = 256 * MiB,
                 ws_close_wait_s: float = 1.0, strict_identity: bool = False,
                 max_filter_terms: int = DEFAULT_MAX_TERMS, body_timeout_s: float = 30.0,
                 subscriber_bytes: int | None = None, stuck_s: float = 10.0) -> None:
        self._token = token.encode("utf-8") if token else None
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
        }
        self.fanout = Fanout(self.counters)
        #: which connection each routed command went to (:mod:`.acks`)
        self.acks = AckGate(self.counters)
        #: ``persist(entries) -> bool``: write remote emitters' sequenced
        #: events (``POST /events``, ``/socket``) durably before they are
        #: admitted and answered (the daemon's session log); ``False``: not
        #: written, refused ``unavailable`` (send again). ``None``: memory only
        self.persist: Callable[[list[Entry]], bool] | None = None

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
        ``?access_token=<token>``. Always true without a configured token
        (observation is open; control is refused regardless)."""
        if self._token is None:
            return True
        return self.authenticated(headers, query_string)

    def authenticated(self, headers: Iterable[tuple[bytes, bytes]], query_string: bytes = b"") -> bool:
        """True only when a token is configured and presented
        (:func:`bridges.core.asgi.bearer_ok`)."""
        return bearer_ok(self._token, headers, query_string)

    # -- declarations ----------------------------------------------------------
    def capabilities(self) -> dict[str, Any]:
        """The relay's capability block (``hello`` §4 and discovery §3.4)."""
        return {
            "filters": ["attr-match"],
            "replay": {"buffer": self.buffer_depth, "all": True},
            "capture": list(CAPTURE_LEVELS),
            "control": {"accepts": []},
            "roster": {},
            "experimental": {},
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
            "buffered_bytes": self.buffers.bytes,
            "subscribers": len(self.fanout),
            "connections": len(self._conns),
            "uptime_s": int(time.monotonic() - self._started),
            "counters": {**self.counters, **self.buffers.counters},
        }

    # -- connections -------------------------------------------------------------
    def attach_emitter(self, hello: dict[str, Any],
                       deliver: Callable[[dict[str, Any]], Awaitable[Any]]) -> LocalEmitter:
        """Attach an in-process emitter (a fleet bridge): ``hello`` is the
        AEP-0003 §4 hello object (role ``emitter``/``both``,
        ``identity.agent``, ``identity.instance``, ``capabilities.emits``,
        ``capabilities.control {accepts, ack_window_ms}``); ``deliver`` is
        awaited with each command envelope routed to this connection's
        sessions. Raises ``ValueError`` for a bad hello, :class:`RelayClosed`
        after :meth:`close`."""
        if self.closing:
            raise RelayClosed("relay is shutting down")
        conn = LocalEmitter(self, hello, deliver)
        self._conns.add(conn)
        return conn

    def open_socket(self, authenticated: bool) -> SocketConnection:
        """A new WebSocket connection's protocol state (ASGI layer)."""
        conn = SocketConnection(self, authenticated)
        self._conns.add(conn)
        self._outlets.add(conn.outlet)
        return conn

    def release(self, conn: Connection) -> None:
        """A connection is gone: drop its claims and forget it."""
        self.claims.drop(conn)
        self._conns.discard(conn)

    def roster(self) -> list[dict[str, Any]]:
        """Every live (connection, claimed session) pair (AEP-0003 §4.1)."""
        out: list[dict[str, Any]] = []
        for c in list(self._conns):
            out.extend(c.roster_entries())
        return out

    # -- ingest --------------------------------------------------------------------
    #: ``entry(ev, text=None, *, owned=False) -> Entry``: validate and
    #: serialize one event (:func:`.envelope.to_entry` itself, no wrapper
    #: frame per event: ``text`` the JSON it was parsed from, ``owned``
    #: ``ev`` handed over; raises :class:`InvalidEvent`)
    entry = staticmethod(to_entry)

    def check_position(self, e: Entry) -> None:
        """Raise :class:`InvalidEvent` when a different event of the same
        emitter session already holds ``e``'s ``(epoch, seq)`` (AEP-0001 §7
        rule 2: one position, one event; an emitter fault). A redelivery of
        the same ``(source, id)`` is not refused."""
        if e.pos is not None and self.buffers.conflict(e):
            raise InvalidEvent(_POSITION_TAKEN)
        if e.pos is not None and self.buffers.conflicting_duplicate(e):
            raise InvalidEvent(_ID_TAKEN)

    def check_owner(self, e: Entry, conn: Connection | None) -> None:
        """Raise :class:`InvalidEvent` when ``e``'s ``source`` belongs to
        another live emitter connection (a fleet bridge or an uplinked
        emitter): anyone who reads ``/stream`` learns a bridge's source and
        epoch, and a forged position would push its real events out
        (issue 10 #8). ``conn`` ``None`` is ``POST /events``."""
        owner = self.claims.source_owner(e.attrs["source"])
        if owner is not None and owner is not conn:
            self.counters["refused_owned_source"] += 1
            raise InvalidEvent("this source belongs to a connected emitter; only that "
                               "connection may send under it")

    def check_session_owner(self, e: Entry, conn: Connection | None) -> None:
        """Raise :class:`InvalidEvent` (counted ``refused_owned_session``)
        when a remote connection's sequenced event would claim a session
        another live connection already claims (issue 25: one such event
        made every command to the owner's session ``ambiguous``). The
        first live claimant keeps the session until it goes; a second
        remote emitter's events there are refused, so it never becomes a
        claimant (AEP-0004 §4.5 still refuses ``ambiguous`` whenever two
        connections do claim it, e.g. two of the fleet's own bridges).
        ``POST /events`` claims nothing and is not refused; neither is a
        fleet bridge (:class:`LocalEmitter`, the daemon's own code)."""
        if e.pos is None or conn is None or not conn.can_claim or isinstance(conn, LocalEmitter):
            return
        if self.claims.claimed_by_other(e.attrs["session"], conn):
            self.counters["refused_owned_session"] += 1
            raise InvalidEvent("this session is claimed by another connected emitter; only "
                               "that connection may send its sequenced events while it is "
                               "connected (a second claimant would make its commands "
                               "ambiguous, AEP-0004 §4.5)")

    def check_batch(self, entries: list[Entry]) -> tuple[int, str] | None:
        """Everything :meth:`ingest_http` would refuse, checked before any of
        ``entries`` is ingested (a batch is accepted or rejected whole):
        ``(index, detail)`` of the first problem, or ``None``. Positions are
        checked against the buffers and against earlier entries of the batch."""
        if self._fresh_run(entries):  # no position can be refused: the sources alone
            checked: set[str] = set()
            for i, e in enumerate(entries):
                src = e.attrs["source"]
                if src not in checked:
                    try:
                        self.check_owner(e, None)
                    except InvalidEvent as exc:
                        return i, str(exc)
                    checked.add(src)
            return None
        seen: dict[tuple[BufKey, Position], tuple[str, str]] = {}
        ids: dict[tuple[str, str], Entry] = {}
        buffers = self.buffers
        sources: set[str] = set()  # checked once per batch: a batch has few
        for i, e in enumerate(entries):
            src = e.attrs["source"]
            if src not in sources:
                try:
                    self.check_owner(e, None)
                except InvalidEvent as exc:
                    return i, str(exc)
                sources.add(src)
            if e.pos is None:
                continue
            fresh = buffers.fresh(e)  # neither check can refuse it (the common case)
            slot = (e.bkey, e.pos)
            held = seen.get(slot)
            if (held is not None and held != e.key) or \
                    (held is None and not fresh and buffers.conflict(e)):
                return i, _POSITION_TAKEN
            first = ids.get(e.key)
            if (first is not None and not same_event(first.raw, e.raw)) or \
                    (first is None and not fresh and buffers.conflicting_duplicate(e)):
                return i, _ID_TAKEN
            seen[slot] = e.key
            if first is None:
                ids[e.key] = e
        return None

    def _fresh_run(self, entries: list[Entry]) -> bool:
        """Whether every sequenced entry of ``entries`` is of one buffer, in
        strictly increasing positions, of distinct ids, and
        :meth:`~.buffer.SessionBuffers.fresh` (past what the buffer holds,
        its ``(source, id)`` not held): then no two of them share a
        position or an id and none meets a held one, so :meth:`check_batch`
        can refuse none of them for its position (an emitter appending, the
        common case: one lookup an entry instead of the batch's tables).
        :meth:`check_batch` with it equals :meth:`check_batch` without it
        (property test ``tests/unit/relay/test_relay_runs.py``)."""
        buffers = self.buffers
        bkey: BufKey | None = None
        prev: Position | None = None
        held: dict[str, Any] | None = None  # the first entry's buffer's ids
        ids: set[str] = set()
        count = 0
        for e in entries:
            pos = e.pos
            if pos is None:
                continue
            if bkey is None:
                if not buffers.fresh(e):
                    return False
                bkey = e.bkey
                held = buffers.held_ids(bkey)
            elif e.bkey != bkey or not pos > prev or (held is not None and e.key[1] in held):  # type: ignore[operator]
                # (same buffer, past the first, which is past the buffer's
                # last: fresh() is the id lookup alone)
                return False
            prev = pos
            ids.add(e.attrs["id"])
            count += 1
        return len(ids) == count

    def ingest_http(self, entries: list[Entry]) -> None:
        """Ingest validated, non-command entries from ``POST /events``
        (no connection: HTTP emitters claim nothing) that passed
        :meth:`check_batch`."""
        for e in entries:
            self._admit(e, None)

    async def ingest_http_batch(self, entries: list[Entry], chunk: int = 256) -> int:
        """:meth:`ingest_http` in chunks of ``chunk`` entries with a yield
        between them, so every consumer's writer drains between chunks and
        a burst reaches a consumer that reads at full speed whole instead
        of overrunning its soft budget (AEP-0003 §8.4 sheds *slow*
        consumers). A position another ingest took while this one yielded
        is refused then (counted ``invalid_events``: one position, one
        event). Returns how many entries were ingested."""
        n = 0
        counters = self.counters
        if self.persist is not None:  # on disk before the 202 (like an OTLP export)
            sequenced = [e for e in entries if e.pos is not None]
            if sequenced:
                self._persist(sequenced)
        for i in range(0, len(entries), chunk):
            if i:
                mark = counters["events"]
                await trio.lowlevel.checkpoint()
                # positions are re-checked only when another ingest ran meanwhile
                recheck = counters["events"] != mark
            else:
                recheck = False
            part = entries[i:i + chunk]
            if not recheck:
                self._admit_run(part)
                n += len(part)
                continue
            for e in part:
                if e.pos is not None and (self.buffers.conflict(e) or
                                          self.buffers.conflicting_duplicate(e)):
                    counters["invalid_events"] += 1
                    continue
                self._admit(e, None)
                n += 1
        return n

    async def ingest(self, ev: Any, conn: Connection | None,
                     raw: str | None = None) -> tuple[str, str] | None:
        """One event from a connection (``raw``: its text as received, for
        a command's byte-identical forwarding): validated, then a command is
        routed (AEP-0004 §4) and anything else admitted (claimed, buffered,
        fanned out). Returns a command refusal ``(code, detail)`` or
        ``None``; raises :class:`InvalidEvent`."""
        e = self.accept(ev, conn, raw)
        if is_command_type(e.attrs["type"]):
            return await self._route(ev, e, conn, raw)
        if e.pos is not None and self.persist is not None and not isinstance(conn, LocalEmitter):
            self._persist([e])  # (a fleet bridge's events are logged by the fleet)
        self._admit(e, conn)
        return None

    def _persist(self, entries: list[Entry]) -> None:
        """:attr:`persist` or raise :class:`Unavailable` (nothing admitted)."""
        assert self.persist is not None
        if not self.persist(entries):
            self.counters["unpersisted"] = self.counters.get("unpersisted", 0) + len(entries)
            raise Unavailable("the session log did not take these events (disk full or "
                              "unwritable?); nothing was accepted: send them again")

    def accept(self, ev: Any, conn: Connection | None, raw: str | None = None) -> Entry:
        """Every check :meth:`ingest` makes before it routes or admits
        ``ev`` (validation, source ownership, position, identity; a
        command's duplicate keys); the entry, or :class:`InvalidEvent`."""
        e = self.entry(ev)
        self.check_owner(e, conn)
        self.check_session_owner(e, conn)
        self.check_position(e)
        if conn is not None and conn.agent is not None and ev["agent"] != conn.agent \
                and not is_foreign(e.attrs["type"]):
            # the connection's own events (sequenced and agent.*); commands and
            # attention.routed speak for their sender, not a declared emitter
            self._identity_mismatch(conn, ev["agent"])
        if is_command_type(e.attrs["type"]) and raw is not None and has_duplicate_keys(raw):
            raise InvalidEvent("duplicate attribute names in command")
        if e.attrs["type"] in ACK_TYPES:  # last: an admitted first ack decides its command
            self.acks.check(e, conn, trusted=isinstance(conn, LocalEmitter))
        return e

    def _identity_mismatch(self, conn: Connection, agent: Any) -> None:
        """An event whose ``agent`` is not the connection's hello identity
        (AEP-0003 §4 rule 3 says they match; the protocol's own conformance
        tooling sends hello as ``aep-live-check-roster`` and events as
        ``aep-live-check``). A policy (issue 10 #2): ``strict_identity``
        (``AEP_STRICT_IDENTITY=1``) refuses it ``invalid-event``; by default it
        is accepted and claims, counted ``identity_mismatch`` and logged once
        per connection. The roster shows the hello identity either way."""
        if self.strict_identity:
            raise InvalidEvent("event agent does not match this connection's hello "
                               "identity.agent (AEP-0003 §4 rule 3)")
        self.counters["identity_mismatch"] += 1
        if not conn.mismatch_logged:
            conn.mismatch_logged = True
            log.warning("relay: an emitter declared identity.agent %r but sends events as %r; "
                        "accepted (AEP_STRICT_IDENTITY=1 refuses them; counted in "
                        "identity_mismatch)", conn.agent, str(agent)[:64])

    def admit_stamped(self, ev: dict[str, Any], raw: bytes, conn: Connection) -> None:
        """Admit a non-command envelope an in-process emitter's own stamper
        built, with its wire bytes ``raw`` (:func:`.envelope.trusted_entry`:
        no re-validation, no re-encoding; the stamper's capture gate
        already holds ``data`` to its ``capture``). Still refused
        (:class:`InvalidEvent`): another emitter's ``source``, a taken
        ``(epoch, seq)`` or ``id`` (the checks that protect other emitters);
        another agent than the connection's is :meth:`_identity_mismatch`."""
        e = trusted_entry(ev, raw)
        self.check_owner(e, conn)
        self.check_position(e)
        if conn.agent is not None and ev["agent"] != conn.agent and not is_foreign(e.attrs["type"]):
            self._identity_mismatch(conn, ev["agent"])
        if e.attrs["type"] in ACK_TYPES:
            self.acks.check(e, conn, trusted=isinstance(conn, LocalEmitter))
        self._admit(e, conn)

    def admit_stamped_run(self, pairs: Sequence[tuple[dict[str, Any], bytes]], start: int,
                          conn: Connection) -> int:
        """:meth:`admit_stamped` for ``pairs[start:]`` in order, in one
        call (the fleet's pump hands a drain over at once): returns the
        index of the first pair it does not take, ``len(pairs)`` when it
        took them all. It stops, having done nothing of that pair, at a
        command or at an envelope :meth:`admit_stamped` would refuse or
        call an identity mismatch: the caller hands that one to
        :meth:`admit_stamped` (its refusal, its count) and goes on after
        it. Equal to one :meth:`admit_stamped` per pair (property test
        ``tests/unit/relay/test_admit_run.py``); the owner check is made
        once per run of one ``source`` (only this loop's own admissions,
        which make ``conn`` the owner, run in between). A pair whose checks
        raise is not taken (its index is returned, nothing of it done); a
        pair whose admission raises part way raises :class:`RunFault`
        (``taken``: the index after it), so the caller never hands an
        admitted pair over again."""
        taken: list[Entry | list[Held]] = []
        self._run = taken  # _admit collects the run's entries instead of offering each
        try:
            return self._admit_stamped_run(pairs, start, conn)
        finally:
            self._run = None
            # the run's fan-out, once its admissions are done (nothing reads
            # the fan-out in between; a refused pair's own answer comes after)
            if taken:
                self._offer_taken(taken)

    def _offer_taken(self, taken: list[Entry | list[Held]]) -> None:
        """Fan out what :meth:`admit_stamped_run` took, in order: entries
        with :meth:`.fanout.Fanout.offer_run`, a stretch's held tuples with
        :meth:`.fanout.Fanout.offer_held` (each equal to one
        :meth:`.fanout.Fanout.offer` per event, so the pieces in order are)."""
        fanout = self.fanout
        if len(taken) == 1 and taken[0].__class__ is list:
            fanout.offer_held(taken[0])  # the common drain: one stretch
            return
        entries: list[Entry] = []
        for x in taken:
            if x.__class__ is list:
                if entries:
                    fanout.offer_run(entries)
                    entries = []
                fanout.offer_held(x)
            else:
                entries.append(x)  # type: ignore[arg-type]
        if entries:
            fanout.offer_run(entries)

    def _admit_stamped_run(self, pairs: Sequence[tuple[dict[str, Any], bytes]], start: int,
                           conn: Connection) -> int:
        """:meth:`admit_stamped_run`'s checks and admissions (each
        :meth:`_admit` collects its entry for the caller's one fan-out).
        After each sequenced admission, the pairs that follow it and merely
        append to its buffer (one emitter session's drain) are admitted in
        one :meth:`.buffer.SessionBuffers.append_stamped` call, their held
        tuples collected for the fan-out in place of the entry (:meth:`_stretch`)."""
        buffers, claims, agent = self.buffers, self.claims, conn.agent
        checked: str | None = None  # the source last found not owned by another
        plain: set[str] = set()  # the types found not commands (a run has few)
        i, end = start, len(pairs)
        while i < end:
            try:
                ev, raw = pairs[i]
                type_ = ev.get("type")
                if type_.__class__ is not str or type_ not in plain:
                    if is_command_type(type_) or type_ in ACK_TYPES:  # routed / gated
                        return i
                    if type_.__class__ is str:
                        plain.add(type_)
                e = trusted_entry(ev, raw)
                src = e.attrs["source"]
                if src != checked:
                    owner = claims.source_owner(src)
                    if owner is not None and owner is not conn:
                        return i
                    checked = src
                # fresh(): one lookup says neither check can refuse it (an
                # emitter appending); else both checks, as admit_stamped makes
                if e.pos is not None and not buffers.fresh(e) and \
                        (buffers.conflict(e) or buffers.conflicting_duplicate(e)):
                    return i
                if agent is not None and ev["agent"] != agent and not is_foreign(e.attrs["type"]):
                    return i
            except Exception:  # noqa: BLE001 -- nothing of it done: its own answer on the one-event path
                return i
            try:
                self._admit(e, conn)
            except Exception as exc:
                raise RunFault(i + 1) from exc
            i += 1
            if e.pos is not None and i < end:
                i = self._stretch(e, pairs, i, agent, plain)
        return end

    def _stretch(self, e: Entry, pairs: Sequence[tuple[dict[str, Any], bytes]], i: int,
                 agent: str | None, plain: set[str]) -> int:
        """Right after ``e``'s admission: the pairs from ``i`` on that the
        run would check and :meth:`_admit` as mere appends to ``e``'s buffer
        (:meth:`.buffer.SessionBuffers.append_stamped`), admitted at once;
        returns the index of the first one not taken. Their source's owner
        check is ``e``'s, and their claims are ``e``'s (the same session and
        source, just made the most recent: claiming again changes nothing).
        In the run's fan-out list, ``e`` is replaced by one list: its held
        tuple then theirs (:meth:`.fanout.Fanout.offer_held`). Raises
        :class:`RunFault` when an append raises part way."""
        try:
            stop, n, held = self.buffers.append_stamped(e.bkey, pairs, i, self._admitted, agent, plain)
        except AppendFault as f:
            stop, n, held = f.taken, f.n, f.held
            fault: BaseException | None = f.__cause__ or f
        else:
            fault = None
        taken = stop - i
        if taken:
            self.counters["events"] += taken
            self._admitted = n
            run = self._run
            if held and run is not None:
                if run and run[-1] is e:  # (it is, unless _admit is not the relay's own)
                    held.insert(0, e.held())
                    run[-1] = held  # a stretch: its held tuples
                else:
                    run.append(held)
        if fault is not None:
            raise RunFault(stop) from fault
        return stop

    def _admit(self, e: Entry, conn: Connection | None) -> None:
        self.counters["events"] += 1
        if e.pos is not None:
            if conn is not None and conn.can_claim:
                self.claims.claim(conn, e.attrs["session"])
                self.claims.own_source(conn, e.attrs["source"])
            self._admitted += 1
            e.n = self._admitted
            self.buffers.admit(e)
        # agent.* and seq-less foreign events are live-only; every event is
        # fanned out as received, duplicates included (AEP-0003 §5)
        run = self._run
        if run is not None:  # inside admit_stamped_run: fanned out with its run
            run.append(e)
        else:
            self.fanout.offer(e)

    def restore(self, entries: Sequence[Entry]) -> int:
        """Re-admit history read back from the session logs at start
        (:mod:`.restore`): buffered only (no claim, no fan-out: nobody is
        subscribed yet), each with its own position and id; one whose
        position or ``(source, id)`` is held already is skipped. Returns how
        many were buffered."""
        buffers = self.buffers
        n = 0
        for e in entries:
            if buffers.conflict(e) or buffers.conflicting_duplicate(e):
                continue
            self._admitted += 1
            e.n = self._admitted
            if buffers.admit(e):
                n += 1
        return n

    def _admit_run(self, entries: Sequence[Entry]) -> None:
        """``_admit(e, None)`` for each of ``entries`` in order (no
        connection: ``POST /events``), in one call: every sequenced one
        buffered (:meth:`.buffer.SessionBuffers.admit_run`), then the run fanned out (:meth:`.fanout.Fanout.offer_run`;
        nothing reads the buffers in between, there is no checkpoint).
        Equal to one :meth:`_admit` each (property test
        ``tests/unit/relay/test_relay_runs.py``)."""
        self.counters["events"] += len(entries)
        n = self._admitted
        held = []
        for e in entries:
            if e.pos is not None:
                n += 1
                e.n = n
                held.append(e)
        self._admitted = n
        self.buffers.admit_run(held)
        self.fanout.offer_run(entries)

    async def _route(self, ev: dict[str, Any], e: Entry, sender: Connection | None,
                     raw: str | None) -> tuple[str, str] | None:
        """AEP-0004 §4: deliver to exactly one live claimant or refuse."""
        refusal = self._route_check(ev, sender)
        if refusal is None:
            target = self.claims.holders(ev["session"])[0]
            self.acks.routed(target, ev["session"], ev["id"])  # before: an ack may come at once
            try:
                await target.deliver_command(ev, raw)
            except Exception as exc:  # noqa: BLE001 -- a dead target is no route
                log.warning("relay: command delivery failed: %s", type(exc).__name__)
                refusal = ("no-route", "the owning connection is going away")
        if refusal is not None:
            self.counters["commands_refused"] += 1
            return refusal
        self.counters["commands_routed"] += 1
        self.fanout.offer(e)  # audit visibility, live only: commands carry no seq
        return None

    def _route_check(self, ev: dict[str, Any], sender: Connection | None) -> tuple[str, str] | None:
        return self.auth_refusal(sender) or self.claims.refusal(ev["session"], ev["type"])

    def auth_refusal(self, sender: Connection | None) -> tuple[str, str] | None:
        """``unauthorized`` unless ``sender`` is an authenticated binding
        (AEP-0004 §4.1); ``None`` when it may send commands."""
        if sender is None or not sender.authenticated:
            if self._token is None:
                return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1); "
                        "this relay runs without AEP_TOKEN (watch-only)")
            return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1)")
        return None

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
                                             self._admitted, tail))

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


_ID_TAKEN = ("another event with this (source, id) is already held with different content; "
             "the first is kept (AEP-0001 §7 rule 4)")

_POSITION_TAKEN = ("another event of this emitter session already holds this (epoch, seq) "
                   "position (AEP-0001 §7 rule 2)")
