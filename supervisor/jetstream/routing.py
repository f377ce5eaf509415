"""The JetStream relay's presence and command routing (split from
:mod:`supervisor.jetstream.relay` by issue 26): :class:`Routing`, a base of
:class:`~supervisor.jetstream.relay.JetStreamRelay`, keeps this relay's
``/socket`` emitters' session claims in the claims bucket (put, refreshed
within the bucket's TTL, deleted when they go), answers the roster from
every claim (:func:`roster_entries`), routes a command by the claims
bucket to the one owning daemon or relay as a NATS request and answers the
requests for this relay's own emitters (the relay module's docstring,
"Control"; AEP-0004 §4).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import nats.errors
import trio

from bridges.core.aep import dumps, loads
from supervisor.relay import Connection, Entry, Relay

from .config import NatsConfig
from .link import _NATS_ERRORS, Link, aio
from .subjects import (
    claim_key,
    claim_value,
    claimants,
    command_reply,
    command_subject,
    parse_command_reply,
    parse_value,
    session_claims_filter,
)

log = logging.getLogger("aep.relay.jetstream")

REQUEST_TIMEOUT_S = 5.0
ROUTE_DEADLINE_S = 8.0
"""Longest a command waits for its route (the claims lookup and the
owner's reply) before it is refused ``no-route`` with retry advice."""


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


class Routing(Relay):
    """Presence and routing of :class:`~supervisor.jetstream.relay.JetStreamRelay`
    (its one subclass, which owns the attributes and callables below)."""

    link: Link
    cfg: NatsConfig
    stream: str
    relay_id: str
    _kv_claims: Any
    _kv_daemons: Any
    _claim_agents: dict[Connection, dict[str, str]]
    spawn: Callable[..., None]

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
        as a NATS request, verbatim. A per-emitter credential's command met
        its scope before this (AEP-0004 §4.3, the bindings bucket:
        :meth:`.owners.Owners._route`)."""
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



__all__ = ["REQUEST_TIMEOUT_S", "ROUTE_DEADLINE_S", "Routing", "accepts_of", "reply_refusal",
           "roster_entries"]
