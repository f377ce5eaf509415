"""The daemon's side of control across hosts (issue 14): its stable id,
its session claims in KV ``S_claims``, its entry in KV ``S_daemons``, and
the command listener on ``S.cmd.<daemon>`` (the shapes:
:mod:`supervisor.jetstream.subjects`).

- **Id** (:func:`daemon_id`): ``<host>-<10 ULID chars>``, made once and
  kept in ``AEP_STATE_DIR/daemon-id``, so a restarted daemon keeps its
  command subject and its claims' keys.
- **Claims** (:class:`Claims`, pure): a bridge claims a session when it
  emits a sequenced event of it, as in the embedded relay (AEP-0004 §4.5),
  and binds it to the fleet in KV ``S_bindings`` (no remote emitter on any
  relay may claim it then, :mod:`supervisor.jetstream.owners`; a session a
  per-emitter credential holds there, or a shared-token one whose ``at``
  is within ``AEP_CLAIM_GRACE`` plus a refresh, is not taken: not claimed, the
  fleet's events in it dropped, :meth:`Presence.refuses`; a shared-token
  one is asked about again as the fleet's events come, at most once a
  claim refresh, and taken back once free: :mod:`.lost`),
  bounded per bridge to ``AEP_MAX_SESSIONS`` (least recently used
  released); :class:`Presence` puts each new claim at once (one that
  fails, a bucket electing its leader, again after a short backoff) and
  every claim again each ``AEP_NATS_CLAIM_TTL / 3`` (the buckets' TTL is
  the claim TTL: a daemon gone that long has no claims), deletes released
  ones and, on shutdown, all of its own.
- **Commands**: a request on ``S.cmd.<daemon>`` is routed to the member
  bridge that claims the command's session, through the same hand-off as
  the embedded relay's routing (the fleet's ``hand`` callback: the bridge's
  bounded inbox, then its ledger, which dedupes ``(source, id)``: a
  relay's retry is acked once, by a byte-identical re-ack). The reply is
  immediate (accepted for delivery or refused, :func:`route`); the ack and
  the outcome travel as ordinary events through the publisher.

Nothing here logs a command's content or a credential.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections import OrderedDict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import trio
from aep_sdk import ulid

from bridges.core.aep import is_command_type
from bridges.core.backoff import backoff_delay
from bridges.core.paths import write_atomic
from supervisor.relay import fleet_refusal

from .config import NatsConfig
from .lost import LostSessions
from .subjects import (
    binding_value,
    bindings_bucket,
    claim_key,
    claim_value,
    claims_bucket,
    command_reply,
    command_subject,
    daemon_value,
    daemons_bucket,
    parse_value,
    token,
)

if TYPE_CHECKING:
    from .link import Link

log = logging.getLogger("aep.nats.presence")

#: sessions :attr:`Presence.lost` remembers (:class:`~.lost.LostSessions`)
_LOST_CAP = 4096
#: lost sessions asked about again per pass of :meth:`Presence._keep`
_RECHECKS_PER_PASS = 32

_HOST_SAFE = re.compile(r"[^A-Za-z0-9_-]+")
ID_FILE = "daemon-id"


def daemon_id(state_dir: Path, host: str) -> str:
    """This daemon's id: read from ``state_dir/daemon-id``, else made
    (``<host>-<10 lower-case ULID random chars>``, the host reduced to
    ``[A-Za-z0-9_-]``) and written there. When the state directory cannot
    be written the id is made anew (logged; claims of the old one expire)."""
    path = Path(state_dir) / ID_FILE
    try:
        got = path.read_text().strip()
        if got and re.fullmatch(r"[A-Za-z0-9_-]{1,128}", got):
            return got
    except OSError:
        pass
    made = f"{_HOST_SAFE.sub('-', host).strip('-')[:48] or 'host'}-{ulid().lower()[-10:]}"
    try:
        write_atomic(path, made + "\n", fsync=True)
    except OSError as e:
        log.warning("nats: daemon id not persisted (%s): it changes at the next start",
                    type(e).__name__)
    return made


class Claims:
    """Which member bridge claims which ``(agent, session)`` (pure).

    :meth:`note` an event a bridge emitted: a sequenced event (``session``
    and ``seq``) claims its session; returns what changed (``(added,
    released)`` keys). Bounded per bridge to ``max_sessions``, least
    recently used released first."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._by_bridge: dict[str, OrderedDict[tuple[str, str], None]] = {}

    def note(self, bridge: str, event: Mapping[str, Any]
             ) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
        session, agent, seq = event.get("session"), event.get("agent"), event.get("seq")
        if not (isinstance(session, str) and session and isinstance(agent, str)
                and isinstance(seq, int)) or is_command_type(event.get("type")):
            return None, None
        mine = self._by_bridge.setdefault(bridge, OrderedDict())
        key = (agent, session)
        if key in mine:
            mine.move_to_end(key)
            return None, None
        mine[key] = None
        released = None
        if len(mine) > self.max_sessions:
            released, _ = mine.popitem(last=False)
        return key, released

    def forget(self, session: str) -> list[tuple[str, str, str]]:
        """Drop every claim of ``session``; the dropped ones as
        ``(bridge, agent, session)``."""
        gone = []
        for b, claims in self._by_bridge.items():
            for key in [k for k in claims if k[1] == session]:
                del claims[key]
                gone.append((b, *key))
        return gone

    def holders(self, session: str) -> list[str]:
        """The bridges claiming ``session`` (any agent)."""
        return [b for b, claims in self._by_bridge.items()
                if any(s == session for (_, s) in claims)]

    def items(self) -> list[tuple[str, str, str]]:
        """Every claim as ``(bridge, agent, session)``."""
        return [(b, a, s) for b, claims in self._by_bridge.items() for (a, s) in claims]


def accepts_of(hello: Mapping[str, Any]) -> frozenset[str]:
    """``capabilities.control.accepts`` of a hello (empty when malformed)."""
    caps = hello.get("capabilities")
    ctl = caps.get("control") if isinstance(caps, Mapping) else None
    acc = ctl.get("accepts") if isinstance(ctl, Mapping) else None
    return frozenset(a for a in acc if isinstance(a, str)) if isinstance(acc, list) else frozenset()


def route(claims: Claims, hellos: Mapping[str, Mapping[str, Any]], raw: bytes
          ) -> tuple[dict[str, Any] | None, str | None, str | None, str]:
    """Decide where a command request goes (pure): ``(cmd, bridge, code,
    detail)``; ``code`` ``None`` means deliver ``cmd`` to ``bridge``. The
    refusals are those of the embedded relay's routing (AEP-0004 §4.2:
    ``no-route``, ``ambiguous``, ``unsupported``) and ``invalid`` for a
    request that is not a command envelope."""
    try:
        cmd = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, None, "invalid", "the request is not JSON"
    if not isinstance(cmd, dict) or not is_command_type(cmd.get("type")) \
            or not isinstance(cmd.get("session"), str) or not isinstance(cmd.get("id"), str):
        return None, None, "invalid", "not a command envelope with a string id and session"
    holders = claims.holders(cmd["session"])
    if not holders:
        return cmd, None, "no-route", "no bridge of this daemon owns the session"
    if len(holders) > 1:
        return cmd, None, "ambiguous", f"{len(holders)} bridges of this daemon claim the session"
    bridge = holders[0]
    if cmd["type"] not in accepts_of(hellos.get(bridge, {})):
        return cmd, None, "unsupported", f"the target does not accept {cmd['type']}"
    return cmd, bridge, None, ""


def _now_ms() -> int:
    return int(time.time() * 1000)


class Presence:
    """The claims, the daemon entry and the command listener over one
    :class:`~supervisor.jetstream.link.Link` (see the module docstring).

    ``hellos``: bridge name -> its emitter hello; ``hand(bridge, cmd) ->
    bool``: put the command on the bridge's inbox (``False``: full, counted
    by the fleet). ``counters``: ``claims_put``, ``claims_deleted``,
    ``kv_errors``, ``commands_received``, ``commands_delivered``,
    ``commands_refused``, ``refused_fleet_into_owned``, ``fleet_reclaimed``
    (shared-token bindings taken back), ``lost_evicted`` (lost sessions
    forgotten past their cap, :mod:`.lost`)."""

    def __init__(self, cfg: NatsConfig, daemon: str, *, host: str, epoch: int,
                 hellos: Mapping[str, Mapping[str, Any]], max_sessions: int,
                 hand: Callable[[str, dict[str, Any]], bool],
                 claim_grace_s: float = 120.0) -> None:
        self.cfg = cfg
        #: ``AEP_CLAIM_GRACE``: a shared-token binding younger than it (plus
        #: one claim refresh) is held (:meth:`_bind`)
        self.claim_grace_s = claim_grace_s
        self.daemon = daemon
        self.host = host
        self.epoch = epoch
        self.hellos = dict(hellos)
        self.claims = Claims(max_sessions)
        self.hand = hand
        self.started = datetime.now(timezone.utc).isoformat(timespec="milliseconds") \
            .replace("+00:00", "Z")
        self.counters: dict[str, int] = {"claims_put": 0, "claims_deleted": 0, "kv_errors": 0,
                                         "commands_received": 0, "commands_delivered": 0,
                                         "commands_refused": 0, "refused_fleet_into_owned": 0,
                                         "fleet_reclaimed": 0, "lost_evicted": 0}
        #: sessions found held by another principal in KV ``S_bindings``
        #: (:meth:`_bind`): the fleet's events there are dropped
        #: (:meth:`refuses`), the bucket asked again at most once a claim
        #: refresh per session (:meth:`_recheck_one`); the most recent :data:`_LOST_CAP`
        self.lost = LostSessions(_LOST_CAP, every=max(0.5, cfg.claim_ttl / 3))
        #: lost sessions due to be asked about again (by :meth:`_keep`)
        self._recheck: dict[str, None] = {}
        self._new: list[tuple[str, str, str]] = []
        self._gone: list[tuple[str, str, str]] = []
        self._changed = trio.Event()
        self._kv: Any = None
        self._daemons_kv: Any = None
        self._bindings_kv: Any = None

    # -- the fleet's side (sync, on the pump) -----------------------------------------
    def refuses(self, event: Mapping[str, Any]) -> bool:
        """Whether ``event`` of a bridge is in a session a per-emitter
        credential (or a shared-token emitter within its hold) holds in KV
        ``S_bindings`` (:attr:`lost`): counted
        ``refused_fleet_into_owned``; the fleet drops it (not logged, not
        published, not kept). Commands are not refused. A refused event
        whose session is due (:meth:`.lost.LostSessions.due`: once a claim
        refresh) has the bucket asked again (:meth:`_recheck_one`): once the
        remote claim is free, the fleet's later events there flow."""
        session = event.get("session")
        if session not in self.lost or is_command_type(event.get("type")):
            return False
        self.counters["refused_fleet_into_owned"] += 1
        if isinstance(session, str) and self.lost.due(session, trio.current_time()):
            self._recheck[session] = None
            self._changed.set()
        return True

    def note(self, bridge: str, event: Mapping[str, Any]) -> None:
        """An event ``bridge`` emitted (see :meth:`Claims.note`)."""
        if self.lost and event.get("session") in self.lost:
            return  # (dropped by the pump; never claimed again)
        added, released = self.claims.note(bridge, event)
        if added is not None:
            self._new.append((bridge, *added))
            self._changed.set()
        if released is not None:
            self._gone.append((bridge, *released))
            self._changed.set()

    # -- running ---------------------------------------------------------------------
    async def run(self, link: Link) -> None:
        """Open the buckets, put the daemon entry, serve commands and keep
        the claims fresh until cancelled; then withdraw (bounded, shielded)."""
        try:
            async with trio.open_nursery() as n:
                await self._open_buckets(link)
                n.start_soon(self._serve_commands, link)
                await self._keep(link)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                if link.connected:  # a dead link cannot delete: the TTL will
                    await self.withdraw()

    async def _open_buckets(self, link: Link) -> None:
        from nats.js.api import KeyValueConfig

        from .link import aio
        attempt = 0
        while True:
            try:
                self._kv = await self._bucket(link, aio, KeyValueConfig,
                                              claims_bucket(self.cfg.stream))
                self._daemons_kv = await self._bucket(link, aio, KeyValueConfig,
                                                      daemons_bucket(self.cfg.stream))
                self._bindings_kv = await self._bucket(
                    link, aio, KeyValueConfig, bindings_bucket(self.cfg.stream),
                    ttl=max(self.cfg.max_age, self.cfg.claim_ttl))
                return
            except Exception as e:  # noqa: BLE001 -- retried: NATS may be electing
                self.counters["kv_errors"] += 1
                if attempt % 20 == 0:
                    log.warning("nats: claims buckets not ready (%s); retrying", type(e).__name__)
                await trio.sleep(backoff_delay(attempt, 0.2, 5.0))
                attempt += 1

    async def _bucket(self, link: Link, aio: Any, kv_config: Any, name: str,
                      ttl: float | None = None) -> Any:
        import nats.js.errors as jerr
        try:
            return await aio(link.js.key_value)(name)
        except jerr.BucketNotFoundError:
            return await aio(link.js.create_key_value)(kv_config(
                bucket=name, history=1, ttl=ttl or self.cfg.claim_ttl,
                replicas=self.cfg.replicas))

    async def _keep(self, link: Link) -> None:
        """Put new claims as they come, delete released ones, ask the bucket
        again about lost sessions that are due (:meth:`_recheck_one`); every TTL/3
        put them all again (and the daemon entry). What one pass does is
        read against what is held at its start: a claim released and
        claimed again before the pass is put, not deleted, and one claimed
        and released is deleted, not put. A put or a delete that fails (a
        KV bucket electing its leader: just created, or a node killed) is
        tried again after the shared backoff (about 0.2 s, doubling to
        5 s), each claim once however often it changed meanwhile, not first
        at the next refresh: a relay asked to route a command meanwhile
        would find no owner (``no-route``) or a stale second one
        (``ambiguous``)."""
        period = max(0.5, self.cfg.claim_ttl / 3)
        next_full = 0.0
        retry_put: dict[tuple[str, str, str], None] = {}
        retry_delete: dict[tuple[str, str, str], None] = {}
        retry_at = math.inf
        daemon_due = False
        attempt = 0
        while True:
            now = trio.current_time()
            if now >= next_full:
                daemon_due = True
                self._new = self.claims.items()
                self._gone = [*retry_delete, *self._gone]
                retry_put, retry_delete = {}, {}
                next_full = now + period
                retry_at = now
            elif now >= retry_at:
                self._new = [*retry_put, *self._new]
                self._gone = [*retry_delete, *self._gone]
                retry_put, retry_delete = {}, {}
            if daemon_due and now >= retry_at:
                daemon_due = not await self._put_daemon()
            held = set(self.claims.items())
            new = dict.fromkeys(c for c in self._new if c in held)
            gone = dict.fromkeys(c for c in self._gone if c not in held)
            self._new, self._gone = [], []
            if self._recheck:  # a few a pass: the claims' puts are not held behind them
                todo = list(self._recheck)[:_RECHECKS_PER_PASS]
                for session in todo:
                    del self._recheck[session]
                    if link is None or link.connected:  # (else: due again a refresh later)
                        await self._recheck_one(session)
            for c in new:
                if not await self._put_claim(*c):
                    retry_put[c] = None
            for b, a, s in gone:
                if not await self._delete(claim_key(a, s, self.daemon, b)):
                    retry_delete[(b, a, s)] = None
            self._changed = trio.Event()
            if not (retry_put or retry_delete or daemon_due):
                attempt, retry_at = 0, math.inf
            elif retry_at <= now or retry_at == math.inf:
                retry_at = trio.current_time() + backoff_delay(attempt, 0.2, 5.0)
                attempt += 1
            if self._new or self._gone or self._recheck:
                continue
            with trio.move_on_at(min(next_full, retry_at)):
                await self._changed.wait()

    async def _put_claim(self, bridge: str, agent: str, session: str) -> bool:
        """Put one claim, its session bound to the fleet first (:meth:`_bind`;
        a session a per-emitter credential holds is not claimed: :meth:`_lose`);
        ``False`` when the bucket did not take it (counted ``kv_errors``;
        :meth:`_keep` tries again)."""
        from .link import aio
        if session in self.lost:
            return True  # (a claim noted before the session was found lost)
        if not await self._bind(session):
            self._lose(session)
            return True
        value = claim_value(daemon=self.daemon, bridge=bridge, hello=self.hellos.get(bridge, {}),
                            agent=agent, session=session, at_ms=_now_ms())
        try:
            await aio(self._kv.put)(claim_key(agent, session, self.daemon, bridge), value)
            self.counters["claims_put"] += 1
        except Exception as e:  # noqa: BLE001 -- tried again (_keep)
            self.counters["kv_errors"] += 1
            log.debug("nats: claim put failed: %s", type(e).__name__)
            return False
        return True

    async def _bind(self, session: str) -> bool:
        """Bind ``session`` to the fleet in KV ``S_bindings`` (:meth:`_try_bind`):
        ``False`` when another principal holds it (nothing written); a bucket
        that did not answer counts as bound, tried again with the claim's
        next refresh (counted ``kv_errors``)."""
        return await self._try_bind(session) is not False

    async def _try_bind(self, session: str) -> bool | None:
        """Bind ``session`` to the fleet in KV ``S_bindings``, so no remote
        emitter on any relay may claim it (:mod:`.owners`): created, or
        taken back (compare-and-set, counted ``fleet_reclaimed``) from the
        shared or anonymous principal once its ``at`` is older than
        ``AEP_CLAIM_GRACE`` plus one claim refresh (its relays re-put ``at``
        while a claimant is connected), never from a per-emitter credential
        (:func:`~supervisor.relay.fleet_refusal`). ``True`` bound, ``False``
        held by another (nothing written), ``None`` the bucket did not
        answer (counted ``kv_errors``)."""
        import nats.js.errors as jerr

        from .link import aio
        kv = self._bindings_kv
        if kv is None:
            return True
        key = token(session)
        try:
            for _ in range(3):  # changed between two reads: read again
                mine = binding_value(principal="fleet", source="", owner=self.daemon,
                                     at_ms=_now_ms())
                try:
                    await aio(kv.create)(key, mine)
                    return True
                except jerr.KeyWrongLastSequenceError:
                    pass
                try:
                    entry = await aio(kv.get)(key)
                except (jerr.KeyNotFoundError, jerr.KeyDeletedError):
                    continue
                v = parse_value(entry.value) or {}
                bound = v.get("principal")
                if not isinstance(bound, str):
                    bound = "anonymous"  # unreadable: a shared one, free when idle
                at = v["at"] if isinstance(v.get("at"), int) else 0
                # a claimant's liveness on another relay is not known here:
                # its relay re-puts "at" each claim refresh while it is
                # connected, so one older than the grace plus a refresh is idle
                idle_ms = (self.claim_grace_s + max(self.cfg.claim_ttl / 3, 0.5)) * 1000
                if fleet_refusal(bound, free=_now_ms() - at >= idle_ms) is not None:
                    return False
                try:
                    await aio(kv.update)(key, mine, last=entry.revision)
                except jerr.KeyWrongLastSequenceError:
                    continue
                if bound != "fleet":
                    self.counters["fleet_reclaimed"] += 1
                return True
            raise RuntimeError("session binding changed under each try")
        except Exception as e:  # noqa: BLE001 -- again at the next refresh
            self.counters["kv_errors"] += 1
            log.debug("nats: session binding failed: %s", type(e).__name__)
            return None

    async def _recheck_one(self, session: str) -> None:
        """Ask the bucket again about lost ``session`` (due: :meth:`refuses`):
        bound to the fleet now (the remote claim went free: taken back by
        compare-and-set) -> no longer lost, the fleet's next event claims it
        as any; still held -> lost, due again a refresh later; no answer ->
        lost, due again at the time :meth:`refuses` set."""
        if session not in self.lost:
            return  # (forgotten meanwhile: its next event binds it anew)
        got = await self._try_bind(session)
        if got is True:
            self.lost.regain(session)
            log.info("nats: session %r is free again in the bindings bucket; the bridges of "
                     "this daemon emit into it again (counted in fleet_reclaimed)", session[:128])
        elif got is False:
            self.lost.lose(session, trio.current_time())

    def _lose(self, session: str) -> None:
        """A per-emitter credential, or a shared-token emitter within its
        hold, holds ``session`` in KV ``S_bindings``:
        the fleet's claims of it are withdrawn (its commands reach the
        holder alone) and its later events there are dropped
        (:meth:`refuses`) until a check finds it free (:meth:`_recheck_one`);
        logged once per session lost."""
        lost = self.lost
        if lost.lose(session, trio.current_time()):
            log.warning("nats: a bridge of this daemon emitted into session %r, which a "
                        "per-emitter credential (or a shared-token emitter still connected or "
                        "within AEP_CLAIM_GRACE) holds in the bindings bucket; its events there "
                        "are dropped while it is held (an OTLP sender naming that session? "
                        "counted in refused_fleet_into_owned)", session[:128])
        self.counters["lost_evicted"] = lost.evicted
        gone = self.claims.forget(session)
        if gone:
            self._gone.extend(gone)
            self._changed.set()

    async def _put_daemon(self) -> bool:
        """Put the daemon entry; ``False`` when the bucket did not take it."""
        from .link import aio
        value = daemon_value(daemon=self.daemon, host=self.host, pid=os.getpid(),
                             epoch=self.epoch, started=self.started, hellos=self.hellos,
                             at_ms=_now_ms())
        try:
            await aio(self._daemons_kv.put)(token(self.daemon), value)
            return True
        except Exception as e:  # noqa: BLE001 -- tried again (_keep)
            self.counters["kv_errors"] += 1
            log.debug("nats: daemon entry put failed: %s", type(e).__name__)
            return False

    async def _delete(self, key: str, kv: Any = None) -> bool:
        """Delete one key; ``False`` when the bucket did not (counted
        ``kv_errors``; :meth:`_keep` tries again, else the TTL ends it)."""
        from .link import aio
        try:
            await aio((kv or self._kv).delete)(key)
            self.counters["claims_deleted"] += 1
            return True
        except Exception as e:  # noqa: BLE001 -- tried again, else the TTL ends it
            self.counters["kv_errors"] += 1
            log.debug("nats: claim delete failed: %s", type(e).__name__)
            return False

    async def withdraw(self) -> None:
        """Delete this daemon's claims and entry (shutdown: relays answer
        ``no-route`` at once instead of after the TTL)."""
        if self._kv is None:
            return
        for b, a, s in self.claims.items():
            await self._delete(claim_key(a, s, self.daemon, b))
        if self._daemons_kv is not None:
            await self._delete(token(self.daemon), self._daemons_kv)

    async def _serve_commands(self, link: Link) -> None:
        """Requests on ``S.cmd.<daemon>``, one at a time, each answered at
        once (the hand-off never waits)."""
        from .link import aio
        sub = await aio(link.nc.subscribe)(command_subject(self.cfg.stream, self.daemon))
        try:
            while True:
                msg = await aio(sub.next_msg)(timeout=None)
                reply = self.handle(msg.data)
                if msg.reply:
                    try:
                        await aio(link.nc.publish)(msg.reply, reply)
                    except Exception as e:  # noqa: BLE001 -- the relay's request times out
                        log.debug("nats: command reply failed: %s", type(e).__name__)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                try:
                    await aio(sub.unsubscribe)()
                except Exception:  # noqa: BLE001 -- closing anyway
                    pass

    def handle(self, raw: bytes) -> bytes:
        """One command request -> its reply bytes (routed and handed)."""
        self.counters["commands_received"] += 1
        cmd, bridge, code, detail = route(self.claims, self.hellos, raw)
        if code is None and cmd is not None and bridge is not None:
            if self.hand(bridge, cmd):
                self.counters["commands_delivered"] += 1
                return command_reply(self.daemon, bridge=bridge)
            code, detail = "busy", "the bridge's command inbox is full; retry with the same id"
        self.counters["commands_refused"] += 1
        return command_reply(self.daemon, code=code or "invalid", detail=detail)


__all__: Sequence[str] = ("Claims", "ID_FILE", "Presence", "accepts_of", "daemon_id", "route")
