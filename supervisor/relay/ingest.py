"""Ingest and admission of the embedded relay (AEP-0003 §5, AEP-0001 §7):
every check an event passes before it is admitted (validation, source and
session ownership, one position one event, one ``(source, id)`` one
content, the hello identity, a command's duplicate keys), the ``POST
/events`` batch path, and the admission itself (claimed, buffered in
:mod:`.buffer`, fanned out by :mod:`.fanout`); a command is handed to
:class:`.routing.Routing`.

:class:`Ingest` is a mixin of :class:`~.core.Relay` (which sets the
attributes declared here); the in-process emitters' trusted runs are
:mod:`.runs`."""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

import trio

from .acks import ACK_TYPES
from .bindings import FLEET, Bindings, is_verified, key
from .buffer import BufKey, Entry, Held, Position, SessionBuffers, same_event
from .connections import Connection, LocalEmitter, Unavailable
from .envelope import InvalidEvent, has_duplicate_keys, is_command_type, is_foreign, to_entry
from .fleetsources import FleetSources
from .newsessions import NewSessionBudget, SessionKey, TooManySessions
from .routing import Routing

__all__ = ["FleetRefused", "Ingest"]

log = logging.getLogger("aep.relay")

#: sessions whose refused fleet events were logged (:meth:`Ingest.fleet_refused`), at most
_LOGGED_REFUSALS = 1024
#: :meth:`Ingest.check_fleet_sources` yields once per this many distinct sources
_YIELD_EVERY = 64


class FleetRefused(InvalidEvent):
    """A fleet bridge's event into a session that is not the fleet's to
    take (:meth:`Ingest.fleet_refusal`: a per-emitter credential's, a
    shared-token emitter's while held, one a fleet bridge of another agent
    claims): refused, counted
    ``refused_fleet_into_owned`` and logged once per session by the relay;
    the fleet drops it (never logged, never a red health: anyone who can
    reach the unauthenticated OTLP receiver can send one)."""


class Ingest(Routing):
    """The relay's ingest and admission (a mixin of :class:`~.core.Relay`)."""

    buffers: SessionBuffers
    bindings: Bindings
    fleet_sources: FleetSources
    strict_identity: bool
    _admitted: int
    _run: list[Entry | list[Held]] | None
    persist: Callable[[list[Entry], str | None], bool] | None
    #: sessions whose refused fleet events were logged (bounded, least recent first)
    _fleet_refusals_logged: OrderedDict[str, None]
    #: the new-session budget of remote ingest while it is logged
    #: (:mod:`.newsessions`); ``None``: unbudgeted (the JetStream relay)
    session_budget: NewSessionBudget | None = None

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

    def check_owner(self, e: Entry, conn: Connection | None, fleet: bool = True) -> None:
        """Raise :class:`InvalidEvent` when ``e``'s ``source`` belongs to
        another live emitter connection (a fleet bridge or an uplinked
        emitter): anyone who reads ``/stream`` learns a bridge's source and
        epoch, and a forged position would push its real events out
        (issue 10 #8). ``conn`` ``None`` is ``POST /events``. A source at or
        under a fleet bridge's ``aep://{host}/agent/{agent}``
        (:mod:`.fleetsources`, from the daemon's start) is
        refused to every party but the fleet's own connections, used yet
        or not (fifth outside attack on issue 25); ``fleet`` ``False``:
        :meth:`check_fleet_sources` did that part."""
        source = e.attrs["source"]
        owner = self.claims.source_owner(source)
        if owner is not None and owner is not conn:
            self.counters["refused_owned_source"] += 1
            raise InvalidEvent("this source belongs to a connected emitter; only that "
                               "connection may send under it")
        if fleet and not isinstance(conn, LocalEmitter) and self.fleet_sources.owns(source):
            self.counters["refused_owned_source"] += 1
            raise InvalidEvent(_FLEET_SOURCE)

    async def check_fleet_sources(self, entries: Sequence[Entry]) -> tuple[int, str] | None:
        """The fleet's reserved sources (:meth:`check_owner`'s second half)
        for a ``POST /events`` batch, with a checkpoint every
        :data:`_YIELD_EVERY` distinct sources: ``(index, detail)`` of the
        first refused, counted ``refused_owned_source``, else ``None``.
        Bounded work a source (:mod:`.fleetsources`), and yet one batch of
        6,000 distinct ones held the event loop 12 s, and a gated hook
        meanwhile failed open (an eighth outside attack). The verdicts
        change only with a reservation (at the start), so yielding here
        cannot let a refused batch in; :meth:`check_batch` then skips them."""
        owns, seen = self.fleet_sources.owns, set[str]()
        for i, e in enumerate(entries):
            src = e.attrs["source"]
            if src in seen:
                continue
            if len(seen) % _YIELD_EVERY == _YIELD_EVERY - 1:
                await trio.lowlevel.checkpoint()
            seen.add(src)
            if owns(src):
                self.counters["refused_owned_source"] += 1
                return i, _FLEET_SOURCE
        return None

    def check_session_owner(self, e: Entry, conn: Connection | None) -> None:
        """Raise :class:`InvalidEvent` (counted ``refused_owned_session``)
        when a remote connection's sequenced event would claim a session
        that is not its to claim (issue 25): another live connection claims
        it (a second claimant would make its commands ``ambiguous``,
        AEP-0004 §4.5), or its binding (:mod:`.bindings`) names another
        principal: the fleet's own sessions, a per-emitter credential's
        sessions whether their owner is connected or not, a shared-token
        session held for its source while its claimant is connected and
        ``AEP_CLAIM_GRACE`` seconds after. ``POST /events`` is
        :meth:`check_posted_sessions`'; a fleet bridge (:class:`LocalEmitter`, the
        daemon's own code) meets :meth:`check_fleet_session`."""
        if isinstance(conn, LocalEmitter):
            self.check_fleet_session(e, conn)
            return
        if e.pos is None or conn is None or not conn.can_claim:
            return
        session = e.attrs["session"]
        if session in conn.claims:
            return
        live = self.claims.claimed_by_other(session, conn)
        why = self.bindings.refusal(session, conn.principal, e.attrs["source"],
                                    time.monotonic(), live=live)
        if why is None and live:
            why = ("this session is claimed by another connected emitter; only that connection "
                   "may send its sequenced events while it is connected (a second claimant "
                   "would make its commands ambiguous, AEP-0004 §4.5)")
        if why is not None:
            self.counters["refused_owned_session"] += 1
            raise InvalidEvent(why)

    def check_fleet_session(self, e: Entry, conn: LocalEmitter) -> None:
        """Raise :class:`FleetRefused` when ``e``, an event of the fleet
        bridge ``conn`` that is not a command, is in a session that is not
        the fleet's to take (:meth:`fleet_refused`). An ack meets its own,
        stricter rule (:mod:`.acks`: only from the connection its command
        was routed to)."""
        session, type_ = e.attrs.get("session"), e.attrs["type"]
        if session.__class__ is str and not is_command_type(type_) and type_ not in ACK_TYPES:
            why = self.fleet_refused(session, conn)
            if why is not None:
                raise FleetRefused(why)

    def fleet_refusal(self, session: str, conn: Connection) -> str | None:
        """Why the fleet bridge ``conn`` may not emit into ``session``, or
        ``None`` (pure: nothing counted). The OTLP receiver is
        unauthenticated and a ``conversation.id`` becomes the session
        verbatim, so a fleet bridge's event names a session anyone chose
        (outside review of issue 25): it may not enter a session

        - bound to a per-emitter credential (:func:`.bindings.fleet_refusal`);
        - bound to the shared or anonymous principal while a remote
          claimant of it is connected or within ``AEP_CLAIM_GRACE`` after
          the last one left (the rule any other claimant meets), nor one
          a remote connection claims now whatever its binding;
        - for a bridge whose session ids unauthenticated senders choose
          (``conn.open_sessions``: the OTLP receiver), claimed now by a
          fleet bridge of another agent (hello ``identity.agent``): two
          claimants make every command ``ambiguous`` (AEP-0004 §4.5). Two
          bridges of one agent (Codex's hook bridge and its OTLP bridge in
          companion mode) share sessions by design, and two agents whose
          own ids collide (two ACP agents both saying ``sess-1``) are two
          claimants as the protocol says: session identity is
          emitter-scoped (AEP-0001 §5.2).

        A session ``conn`` claims already is its own (nothing above can
        have entered it since)."""
        if session in conn.claims:
            return None
        live = False
        open_sessions = isinstance(conn, LocalEmitter) and conn.open_sessions
        for c in self.claims.holders(session):
            if not isinstance(c, LocalEmitter):
                live = True
            elif open_sessions and c.agent != conn.agent:
                return ("this session is claimed by a bridge of this daemon for another agent; "
                        "a second claimant would make its commands ambiguous (AEP-0004 §4.5)")
        why = self.bindings.fleet_refusal(session, time.monotonic(), live)
        if why is None and live:  # (its binding forgotten: the claim holds it)
            why = ("this session is claimed by a connected emitter; a bridge of this daemon "
                   "takes it only once it is free")
        return why

    def fleet_refused(self, session: str, conn: Connection) -> str | None:
        """:meth:`fleet_refusal`, counted: a refusal is counted
        ``refused_fleet_into_owned`` (one per call: one per event) and
        logged once per session (the last :data:`_LOGGED_REFUSALS`
        sessions remembered). The fleet's pump asks before it logs an
        event, so a refused one reaches neither the session log nor the
        relay."""
        why = self.fleet_refusal(session, conn)
        if why is None:
            return None
        self.counters["refused_fleet_into_owned"] += 1
        logged, k = self._fleet_refusals_logged, key(session)
        if k in logged:
            logged.move_to_end(k)
        else:
            logged[k] = None
            if len(logged) > _LOGGED_REFUSALS:
                logged.popitem(last=False)
            b = self.bindings.get(session)
            log.warning("relay: a bridge of this daemon (agent %r) emitted into session %r "
                        "(bound to %r): %s; refused, not logged (an OTLP sender naming that "
                        "session? counted in refused_fleet_into_owned)",
                        str(conn.agent)[:64], session[:128],
                        b.principal[:72] if b is not None else None, why)
        return why

    def check_posted_sessions(self, entries: Sequence[Entry], principal: str
                              ) -> tuple[int, str] | None:
        """The session bindings for a ``POST /events`` batch by
        ``principal`` (:mod:`.bindings`; counted ``refused_owned_session``):
        ``(index, detail)`` of the first sequenced event in a session that
        is not the poster's to enter, else ``None``: the fleet's or another
        per-emitter credential's for any poster; for a per-emitter
        credential's post also what ``/socket`` holds (outside review of
        issue 25: a credential posted into a shared-token emitter's live
        session under another source and got 202): a session another live
        connection claims, or one bound to the shared principal under
        another source within its hold (:meth:`.bindings.Bindings.refusal`).
        A shared-token (or tokenless) post claims nothing and is not held
        off a shared-token session. Binds nothing: :meth:`bind_posted` does
        once the batch is admitted."""
        bindings, claims, seen = self.bindings, self.claims, set()
        held = is_verified(principal)
        now = time.monotonic()
        for i, e in enumerate(entries):
            if e.pos is None or (s := e.attrs["session"]) in seen:
                continue
            seen.add(s)
            b = bindings.get(s)
            why = None
            if b is not None and b.named and b.principal != principal:
                why = ("this session belongs to a bridge of this daemon" if b.principal == FLEET
                       else "this session is bound to another emitter credential")
            elif held:
                holders = claims.holders(s)
                why = bindings.refusal(s, principal, e.attrs["source"], now, live=bool(holders))
                if why is None and any(c.principal != principal for c in holders):
                    why = ("this session is claimed by another connected emitter; only that "
                           "connection may send its sequenced events while it is connected")
            if why is not None:
                self.counters["refused_owned_session"] += 1
                return i, why
        return None

    def bind_posted(self, entries: Sequence[Entry], principal: str | None) -> None:
        """A ``POST /events`` batch by ``principal`` is being admitted: a
        per-emitter credential's post binds each still unbound session of
        its sequenced events to it, and every session posted into is marked
        live. Called once nothing can refuse the batch any more (after the
        new-session budget and the session log took it, before any
        checkpoint since :meth:`check_posted_sessions`): a refused batch
        (429, 503) binds nothing, else a credential bound any number of
        sessions without one event admitted and pushed real owners out of
        the table (outside review of issue 25)."""
        bindings, now = self.bindings, time.monotonic()
        binder = principal if principal is not None and is_verified(principal) else None
        seen: set[str] = set()
        for e in entries:
            if e.pos is None or (s := e.attrs["session"]) in seen:
                continue
            seen.add(s)
            if binder is not None and bindings.get(s) is None:
                bindings.bind(s, binder, e.attrs["source"], now)
        bindings.touch(seen, now)

    def check_batch(self, entries: list[Entry], fleet: bool = True) -> tuple[int, str] | None:
        """Everything :meth:`ingest_http` would refuse, checked before any of
        ``entries`` is ingested (a batch is accepted or rejected whole):
        ``(index, detail)`` of the first problem, or ``None``. Positions are
        checked against the buffers and against earlier entries of the batch.
        ``fleet`` ``False``: :meth:`check_fleet_sources` passed the batch."""
        if self._fresh_run(entries):  # no position can be refused: the sources alone
            checked: set[str] = set()
            for i, e in enumerate(entries):
                src = e.attrs["source"]
                if src not in checked:
                    try:
                        self.check_owner(e, None, fleet)
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
                    self.check_owner(e, None, fleet)
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

    def check_new_sessions(self, entries: Sequence[Entry], conn: Connection | None) -> None:
        """Raise :class:`~.newsessions.TooManySessions` (counted
        ``refused_new_sessions``, one per event refused) when the sequenced
        ``entries`` of one remote request (a ``POST /events`` batch, one
        ``/socket`` event) open more new session log files than
        :attr:`session_budget` admits (issue 25: one token holder made
        100,000 files, and every later start grew with them). Only while
        remote events are logged (:attr:`persist`); the fleet's own bridges
        (:class:`LocalEmitter`) are never budgeted here. A session known to
        the relay (admitted or restored, or claimed by a live connection of
        that agent) costs nothing."""
        budget = self.session_budget
        if budget is None or self.persist is None or isinstance(conn, LocalEmitter):
            return
        keys = [(e.attrs["agent"], e.attrs["session"]) for e in entries if e.pos is not None]
        if not keys:
            return
        refused = budget.check(keys, trio.current_time(), self._claimed_by_agent)
        if refused is not None:
            self.counters["refused_new_sessions"] = \
                self.counters.get("refused_new_sessions", 0) + len(keys)
            raise TooManySessions(*refused)

    def _claimed_by_agent(self, key: SessionKey) -> bool:
        return any(c.agent == key[0] for c in self.claims.holders(key[1]))

    def ingest_http(self, entries: list[Entry]) -> None:
        """Ingest validated, non-command entries from ``POST /events``
        (no connection: HTTP emitters claim nothing) that passed
        :meth:`check_batch`."""
        for e in entries:
            self._admit(e, None)

    async def ingest_http_batch(self, entries: list[Entry], chunk: int = 256,
                                principal: str | None = None) -> int:
        """:meth:`ingest_http` in chunks of ``chunk`` entries with a yield
        between them, so every consumer's writer drains between chunks and
        a burst reaches a consumer that reads at full speed whole instead
        of overrunning its soft budget (AEP-0003 §8.4 sheds *slow*
        consumers). A position another ingest took while this one yielded
        is refused then (counted ``invalid_events``: one position, one
        event). Returns how many entries were ingested. (``principal``, the
        poster's, was checked by :meth:`check_posted_sessions`; a relay
        whose bindings are elsewhere reads it here.)"""
        n = 0
        counters = self.counters
        if self.persist is not None:  # on disk before the 202 (like an OTLP export)
            sequenced = [e for e in entries if e.pos is not None]
            if sequenced:
                self._persist(sequenced, principal)
        self.bind_posted(entries, principal)
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
            self.check_new_sessions([e], conn)
            # (a fleet bridge's events are logged by the fleet)
            self._persist([e], conn.principal if conn is not None else None)
        self._admit(e, conn)
        return None

    def _persist(self, entries: list[Entry], principal: str | None) -> None:
        """:attr:`persist` (``principal``: the sender's) or raise
        :class:`Unavailable` (nothing admitted)."""
        assert self.persist is not None
        if not self.persist(entries, principal):
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

    def _admit(self, e: Entry, conn: Connection | None) -> None:
        self.counters["events"] += 1
        if e.pos is not None:
            fleet = False  # an authenticated fleet bridge's: evicted after the open kind (.pins)
            if conn is not None and conn.can_claim:
                if self.claims.claim(conn, e.attrs["session"]):
                    self._bind(e, conn)
                self.claims.own_source(conn, e.attrs["source"])
                fleet = isinstance(conn, LocalEmitter) and not conn.open_sessions
            self._admitted += 1
            e.n = self._admitted
            self.buffers.admit(e, fleet)
        # agent.* and seq-less foreign events are live-only; every event is
        # fanned out as received, duplicates included (AEP-0003 §5)
        run = self._run
        if run is not None:  # inside admit_stamped_run: fanned out with its run
            run.append(e)
        else:
            self.fanout.offer(e)

    def _bind(self, e: Entry, conn: Connection) -> None:
        """``conn``'s new claim of ``e``'s session, bound (:mod:`.bindings`):
        a fleet bridge's binds to the fleet, taking a free shared-token
        binding back (counted ``fleet_reclaimed``; a session that is not
        free, or a per-emitter credential's, never got here:
        :meth:`check_fleet_session`)."""
        session, now = e.attrs["session"], time.monotonic()
        if isinstance(conn, LocalEmitter):  # an open bridge's kept apart (.bindings, finding 6)
            if self.bindings.bind_fleet(session, e.attrs["source"], now, conn.open_sessions):
                self.counters["fleet_reclaimed"] += 1
                self.claims.evict(session, LocalEmitter)  # (none: it was free)
        else:
            self.bindings.bind(session, conn.principal, e.attrs["source"], now)

    def restore(self, entries: Sequence[Entry]) -> int:
        """Re-admit history read back from the session logs at start
        (:mod:`.restore`): buffered only (no claim, no fan-out: nobody is
        subscribed yet), each with its own position and id; one whose
        position or ``(source, id)`` is held already is skipped. Returns how
        many were buffered."""
        buffers = self.buffers
        if self.session_budget is not None:  # their files exist: known sessions
            self.session_budget.note({(e.attrs["agent"], e.attrs["session"]) for e in entries})
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


_FLEET_SOURCE = ("this source is a bridge of this daemon's (aep://{host}/agent/{agent}, its "
                 "agent-scoped and per-session sources); only that bridge may send under it")

_ID_TAKEN = ("another event with this (source, id) is already held with different content; "
             "the first is kept (AEP-0001 §7 rule 4)")

_POSITION_TAKEN = ("another event of this emitter session already holds this (epoch, seq) "
                   "position (AEP-0001 §7 rule 2)")
