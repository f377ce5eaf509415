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
- a daemon's fleet bridges *put* theirs as ``fleet``
  (:mod:`supervisor.jetstream.presence`): no remote emitter on any relay
  may claim them;
- bindings are re-put with the claims (``at`` kept fresh while held) and
  live as long as the stream keeps events (the bucket's TTL is
  ``AEP_NATS_MAX_AGE``): a restarted relay forgets none.

A bucket that cannot answer refuses the event ``unavailable`` (nothing
published; the emitter sends it again): ownership is never guessed.
``POST /events`` on a JetStream relay is not checked against the bucket
(it claims nothing; the embedded relay's rule for posts is local)."""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import nats.js.errors
import trio

from supervisor.relay import Connection, Entry, InvalidEvent, Unavailable, binding_refusal

from .link import _NATS_ERRORS, aio
from .routing import Routing
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
        key = token(session)
        kv = self._kv_bindings
        try:
            for _ in range(3):  # a key deleted or taken between two reads: read again
                mine = binding_value(principal=conn.principal, source=source,
                                     owner=self.relay_id, at_ms=_now_ms())
                try:
                    await aio(kv.create)(key, mine)
                    break
                except nats.js.errors.KeyWrongLastSequenceError:
                    pass
                try:
                    entry = await aio(kv.get)(key)
                except nats.js.errors.KeyNotFoundError:
                    continue
                if await self._may_take(conn, session, source, entry, mine):
                    break
            else:
                raise Unavailable("the session bindings changed under this claim; send again")
        except _NATS_ERRORS as exc:
            raise Unavailable(f"the session bindings bucket did not answer "
                              f"({type(exc).__name__}); send again") from None
        bound = self._bound.setdefault(conn, {})
        bound[session] = source
        if len(bound) > 2 * len(conn.claims) + 16:  # the claims' LRU let some go
            for gone in [s for s in bound if s not in conn.claims and s != session]:
                del bound[gone]

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

    async def _touch(self, principal: str, bound: dict[str, str]) -> None:
        """Re-put ``bound``'s bindings with ``at`` now, each only while it
        is still ``principal``'s under that source."""
        kv = self._kv_bindings
        for session, source in bound.items():
            try:
                entry = await aio(kv.get)(token(session))
                v = parse_value(entry.value) or {}
                if v.get("principal") == principal and v.get("source") == source:
                    await aio(kv.update)(token(session), binding_value(
                        principal=principal, source=source, owner=self.relay_id,
                        at_ms=_now_ms()), last=entry.revision)
            except _NATS_ERRORS as e:  # the next claimant reads an older "at": still held
                log.debug("jetstream relay: binding refresh: %s", type(e).__name__)

    async def _refresh_bindings(self) -> None:
        """Every claim refresh, the bindings of the live claims again (``at``
        fresh while held; the bucket's TTL never ends a held one)."""
        period = max(self.cfg.claim_ttl / 3, 0.5)
        while True:
            await trio.sleep(period)
            for conn, bound in list(self._bound.items()):
                if conn.open:
                    await self._touch(conn.principal,
                                      {s: src for s, src in bound.items() if s in conn.claims})
