"""Session bindings across JetStream relays and daemons (issue 25): the
embedded relay's rule (:mod:`supervisor.relay.bindings`: a session belongs
to the principal that first claimed it) made visible to every relay and
daemon on one NATS, so an emitter on relay B cannot claim a session owned
through relay A (before: both claims landed in ``S_claims`` and every
command to the session was refused ``ambiguous``).

KV ``S_bindings`` (:func:`~.subjects.bindings_bucket`), key
``token(session)``, value (:func:`~.subjects.binding_value`)::

    {"v": 1, "principal": "token" | "emitter:<name>" | "fleet" | "anonymous",
     "source": "<the first claimant's source>", "owner": "<relay or daemon id>",
     "at": <unix ms: last known live>}

- a ``/socket`` emitter's first event in a session *creates* the key
  (create-only: of two relays racing, one wins) before the event is
  published; a key that exists is checked with :func:`binding_refusal`
  (a shared-token binding is free when no claim of the session is in
  ``S_claims`` and ``at`` is older than ``AEP_CLAIM_GRACE`` plus one claim
  refresh: then it is taken over with a compare-and-set ``update``);
- a daemon's fleet bridges bind theirs as ``fleet``
  (:mod:`supervisor.jetstream.presence`: created, or taken back from the
  shared or anonymous principal, never from a per-emitter credential,
  whose session the fleet's events then never enter): no remote emitter
  on any relay may claim them;
- bindings are re-put with the claims (``at`` kept fresh while held) and
  live as long as the stream keeps events (the bucket's TTL is
  ``AEP_NATS_MAX_AGE``): a restarted relay forgets none. The bucket has
  no count cap, so no binding is pushed out by others' (the embedded
  relay's bounded table keeps the open bridges' apart for that: round 8
  outside attack, finding 6, :mod:`supervisor.relay.bindings`).

- a ``POST /events`` batch's sessions are read before it is published: a
  sequenced event in a session of the fleet or of another per-emitter
  credential is refused (a post claims nothing, so a shared-token session
  is not held against it, as on the embedded relay); a per-emitter
  credential's post creates its unbound sessions' keys;
- a ``/socket`` emitter whose session a daemon's fleet bound meanwhile
  loses its claim at the next refresh (within ``AEP_NATS_CLAIM_TTL``/3),
  as the embedded relay drops it at once.

- a command from a per-emitter credential is routed only into a session
  the bucket binds to that credential (AEP-0004 §4.3 item 3, per-sender
  scoping at the relay, :func:`~supervisor.relay.command_refusal`): any
  other, unbound included, is refused ``unauthorized`` on the relay the
  sender is on, before the claims are read (counted
  ``refused_command_scope``; :meth:`Owners._route`).

A bucket that cannot answer refuses the event ``unavailable`` (nothing
published, counted ``bindings_unavailable``; the emitter sends it again),
and a credential's command ``no-route`` (retry with the same id):
ownership is never guessed."""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import nats.js.errors
import trio

from supervisor.relay import (
    Connection,
    Entry,
    InvalidEvent,
    LocalEmitter,
    Unavailable,
    binding_refusal,
    command_refusal,
    is_credential,
    is_verified,
)

from .link import _NATS_ERRORS, aio
from .routing import REQUEST_TIMEOUT_S, Routing
from .subjects import binding_value, parse_value, token

__all__: Sequence[str] = ("Owners",)

log = logging.getLogger("aep.relay.jetstream")


def _now_ms() -> int:
    return int(time.time() * 1000)


class Owners(Routing):
    """The bindings bucket of :class:`~supervisor.jetstream.relay.JetStreamRelay`
    (a base of its ingest; the relay opens :attr:`_kv_bindings`)."""

    _kv_bindings: Any
    #: per /socket emitter: session -> the source its binding names
    _bound: dict[Connection, dict[str, str]]

    async def claim_binding(self, conn: Connection, e: Entry) -> None:
        """``conn``'s first sequenced event of ``e``'s session: bound to
        ``conn``'s principal in the bucket, or :class:`InvalidEvent`
        (counted ``refused_owned_session``) when another owns it, or
        :class:`Unavailable` when the bucket does not answer."""
        session, source = e.attrs["session"], e.attrs["source"]
        kv = self._kv_bindings
        try:
            for _ in range(3):  # a key deleted or taken between two reads: read again
                mine = binding_value(principal=conn.principal, source=source,
                                     owner=self.relay_id, at_ms=_now_ms())
                try:
                    await aio(kv.create)(token(session), mine)
                    break
                except nats.js.errors.KeyWrongLastSequenceError:
                    pass
                entry = await self._binding(session)
                if entry is None:
                    continue
                if await self._may_take(conn, session, source, entry, mine):
                    break
            else:
                raise Unavailable("the session bindings changed under this claim; send again")
        except _NATS_ERRORS as exc:
            self.counters["bindings_unavailable"] = self.counters.get("bindings_unavailable", 0) + 1
            raise Unavailable(f"the session bindings bucket did not answer "
                              f"({type(exc).__name__}); send again") from None
        bound = self._bound.setdefault(conn, {})
        bound[session] = source
        if len(bound) > 2 * len(conn.claims) + 16:  # the claims' LRU let some go
            for gone in [s for s in bound if s not in conn.claims and s != session]:
                del bound[gone]

    async def _binding(self, session: str) -> Any:
        """The bucket's entry for ``session`` (its ``value`` is a
        :func:`~.subjects.binding_value`, read with
        :func:`~.subjects.parse_value`; ``revision`` for a compare-and-set),
        or ``None`` when the session is unbound. Raises ``_NATS_ERRORS`` when
        the bucket does not answer. The one reader of the bucket: claims,
        posts, refreshes and the command scope all read through it."""
        try:
            return await aio(self._kv_bindings.get)(token(session))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None

    async def _route(self, ev: dict[str, Any], e: Entry, sender: Connection | None,
                     raw: str | None) -> tuple[str, str] | None:
        """A command from a per-emitter credential meets its scope first
        (:meth:`command_scope`: only into a session the bucket binds to
        it), then the routing by the claims bucket
        (:meth:`~.routing.Routing._route`). A named sender is authenticated
        (a credential needs ``AEP_TOKEN``), so §4.1 has nothing to say first."""
        if sender is not None and is_credential(sender.principal):
            refusal = await self.command_scope(ev["session"], sender.principal)
            if refusal is not None:
                self.counters["commands_refused"] += 1
                return refusal
        return await super()._route(ev, e, sender, raw)

    async def command_scope(self, session: str, principal: str) -> tuple[str, str] | None:
        """AEP-0004 §4.3 per-sender scoping across relays: ``unauthorized``
        (counted ``refused_command_scope``) unless the bindings bucket binds
        ``session`` to ``principal`` (:func:`~supervisor.relay.command_refusal`:
        unbound, the fleet's, another credential's, a shared-token
        emitter's are refused); ``no-route`` (retry, same id) when the
        bucket cannot be read now: a scope is never guessed."""
        if not self.link.connected:
            return self._unreachable("this relay has no NATS connection")
        exc: BaseException | None = None
        entry = None
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                entry = await self._binding(session)
        except trio.TooSlowError as e:
            exc = e
        except _NATS_ERRORS as e:
            exc = e
        if exc is not None:
            self.counters["bindings_unavailable"] = self.counters.get("bindings_unavailable", 0) + 1
            return ("no-route", f"the session bindings bucket did not answer "
                                f"({type(exc).__name__}); retry the command (same id)")
        bound = None
        if entry is not None:
            p = (parse_value(entry.value) or {}).get("principal")
            bound = p if isinstance(p, str) else None
        why = command_refusal(principal, bound)
        if why is None:
            return None
        self.counters["refused_command_scope"] += 1
        return ("unauthorized", why)

    async def _may_take(self, conn: Connection, session: str, source: str, entry: Any,
                        mine: bytes) -> bool:
        """Whether ``conn`` may claim ``session`` bound as ``entry``: ``True``
        (its own binding, or a free one it took over), ``False`` (changed
        meanwhile: try again); raises :class:`InvalidEvent` when refused."""
        v = parse_value(entry.value) or {}
        bound, bound_source = v.get("principal"), v.get("source")
        if not isinstance(bound, str) or not isinstance(bound_source, str):
            bound, bound_source = "anonymous", ""  # unreadable: a shared one, free when idle
        why = binding_refusal(bound, bound_source, conn.principal, source, free=False)
        if why is None:
            return True
        at = v["at"] if isinstance(v.get("at"), int) else 0
        idle_ms = (self.bindings.grace_s + max(self.cfg.claim_ttl / 3, 0.5)) * 1000
        if binding_refusal(bound, bound_source, conn.principal, source, free=True) is None \
                and _now_ms() - at >= idle_ms and not await self._claimants(session):
            try:
                await aio(self._kv_bindings.update)(token(session), mine, last=entry.revision)
                return True
            except nats.js.errors.KeyWrongLastSequenceError:
                return False
        self.counters["refused_owned_session"] += 1
        raise InvalidEvent(why)

    def release(self, conn: Connection) -> None:
        super().release(conn)
        bound = self._bound.pop(conn, {})
        if bound:  # the grace of its shared-token sessions counts from now
            self.spawn(self._touch, conn.principal, bound)

    async def _touch(self, principal: str, bound: dict[str, str],
                     conn: Connection | None = None) -> None:
        """Re-put ``bound``'s bindings with ``at`` now, each only while it
        is still ``principal``'s under that source; one the fleet took
        meanwhile ends ``conn``'s claim of it (:meth:`_lose`)."""
        kv = self._kv_bindings
        for session, source in bound.items():
            try:
                entry = await self._binding(session)
                if entry is None:
                    continue
                v = parse_value(entry.value) or {}
                if v.get("principal") == principal and v.get("source") == source:
                    await aio(kv.update)(token(session), binding_value(
                        principal=principal, source=source, owner=self.relay_id,
                        at_ms=_now_ms()), last=entry.revision)
                elif v.get("principal") == "fleet" and conn is not None:
                    self._lose(conn, session)
            except _NATS_ERRORS as e:  # the next claimant reads an older "at": still held
                log.debug("jetstream relay: binding refresh: %s", type(e).__name__)

    def _lose(self, conn: Connection, session: str) -> None:
        """A daemon's fleet bound ``session``: this relay's ``/socket``
        claimants of it lose their claims (commands go to the fleet's one
        claimant, never ``ambiguous``), counted ``fleet_reclaimed``."""
        holders = [c for c in self.claims.holders(session) if not isinstance(c, LocalEmitter)]
        self.counters["fleet_reclaimed"] += self.claims.evict(session, LocalEmitter)
        for c in holders:
            self._bound.get(c, {}).pop(session, None)
            agent = self._claim_agents.get(c, {}).pop(session, None)
            if agent is not None:
                self.spawn(self._kv_delete, self._claim_key(c, agent, session))

    async def check_posted(self, entries: Sequence[Entry], principal: str) -> None:
        """A ``POST /events`` batch by ``principal``: :class:`InvalidEvent`
        (counted ``refused_owned_session``) when a sequenced event is in a
        session bound to the fleet or to another per-emitter credential;
        :class:`Unavailable` when the bucket does not answer. The sessions
        are read at most 32 at a time. A per-emitter credential's post
        creates the binding of each unbound session (create-only, as a
        ``/socket`` claim; before the publish: a batch refused after it
        leaves its bindings, the emitter sends it again), so its session is
        its own on every relay as on the embedded one (outside review of
        issue 25: the post only read the bucket, and another credential on
        another relay claimed the session)."""
        sources = {e.attrs["session"]: e.attrs["source"] for e in reversed(entries)
                   if e.pos is not None}  # (each session's first source)
        refused: list[str] = []
        failed: list[BaseException] = []
        limit = trio.Semaphore(32)
        kv = self._kv_bindings

        async def one(session: str, create: bool) -> None:
            async with limit:
                try:
                    if create:  # a credential's post binds its session on every relay
                        try:
                            await aio(kv.create)(token(session), binding_value(
                                principal=principal, source=sources[session],
                                owner=self.relay_id, at_ms=_now_ms()))
                            return
                        except nats.js.errors.KeyWrongLastSequenceError:
                            pass  # another relay bound it meanwhile: read whose
                    entry = await self._binding(session)
                except _NATS_ERRORS as exc:
                    failed.append(exc)
                    return
                if entry is None:
                    unbound.append(session)
                    return
                bound = (parse_value(entry.value) or {}).get("principal")
                if isinstance(bound, str) and is_verified(bound) and bound != principal:
                    refused.append(bound)

        unbound: list[str] = []
        async with trio.open_nursery() as n:
            for s in sources:
                n.start_soon(one, s, False)
        if unbound and is_verified(principal) and not refused and not failed:
            # only once the whole batch passed: a refused one binds nothing
            todo, unbound = unbound, []
            async with trio.open_nursery() as n:
                for s in todo:
                    n.start_soon(one, s, True)
        if refused:
            self.counters["refused_owned_session"] += 1
            raise InvalidEvent("this session belongs to a bridge of a daemon" if refused[0] == "fleet"
                               else "this session is bound to another emitter credential")
        if failed:
            self.counters["bindings_unavailable"] = self.counters.get("bindings_unavailable", 0) + 1
            raise Unavailable(f"the session bindings bucket did not answer "
                              f"({type(failed[0]).__name__}); send again")

    async def _refresh_bindings(self) -> None:
        """Every claim refresh, the bindings of the live claims again (``at``
        fresh while held; the bucket's TTL never ends a held one)."""
        period = max(self.cfg.claim_ttl / 3, 0.5)
        while True:
            await trio.sleep(period)
            for conn, bound in list(self._bound.items()):
                if conn.open:
                    await self._touch(conn.principal,
                                      {s: src for s, src in bound.items() if s in conn.claims},
                                      conn)
