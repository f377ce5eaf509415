"""``POST /hooks/<agent>``: the ASGI app a hook bridge mounts on the daemon's
listener (``ctx.mounts``; the Host guard, the no-browser-``Origin`` rule and
``AEP_TOKEN`` are in front). Contract: ``/work/hooks-contract.md`` §1.

- The body is the vendor's hook JSON; not a JSON object -> ``400
  {"error": ...}`` (counted ``hooks_bad_body``).
- A moment whose mapping fails (a bridge bug) -> ``500 {"error": ...}``
  (counted ``hooks_map_failed``; the shim spools it, and its hook id is
  not remembered: the spooled copy is taken).
- A request the daemon's guard refuses (no ``AEP_TOKEN``, neither bearer
  nor signed with it: the agent's token differs from the daemon's) is
  told to :meth:`HookEndpoint.refused`: counted ``hooks_unauthorized``,
  one log line a minute at most, never the token (the shim spools such a
  moment; it is ingested later, unheld: the gate was bypassed).
- ``X-AEP-Hook-Id`` (the shim's, else one is made) dedupes;
  ``X-AEP-Hook-Spooled: <Unix ms>`` marks a replayed moment (never held;
  its events carry that time, a live moment's its arrival).
- Not held: ``200`` with the whole reply once the moment is in the session
  log. Held: the response start goes out at once with ``AEP-Hold-Ms``
  (after ``attention.requested`` is in the log), the body when decided or
  when the hold ends (``{}``). A vendor that hangs up stops the hold.
"""
from __future__ import annotations

import json
from typing import Any

import trio

from bridges.core.aep import check_json
from bridges.core.asgi import Receive, Scope, Send, header, read_body, respond
from bridges.core.signed import SIGNED_KEY, SignedAnswer, body_matches

from .hub import HookHub, MappingFailed, now_ms
from .mapping import moment_ms, spooled_ms

__all__ = ["BODY_MAX", "HookEndpoint"]

BODY_MAX = 4 * 1024 * 1024
"""Largest hook body taken (a tool response can be big); larger -> 413."""


def _parsed(body: bytes) -> tuple[Any, str]:
    """The body's JSON value, or ``None`` and why not (absurd nesting is a
    bad body, not a 500; 4 MiB of ``[[],...]`` held the loop a second: a
    tenth outside attack, refused before the parse)."""
    try:
        check_json(body)
    except ValueError as e:
        return None, str(e)
    try:
        return json.loads(body), "the body is not a JSON object"
    except (ValueError, RecursionError):
        return None, "the body is not a JSON object"


class HookEndpoint:
    """The ASGI app around one run's :class:`HookHub`."""

    def __init__(self, hub: HookHub) -> None:
        self.hub = hub

    def refused(self, why: str) -> None:
        """The daemon's guard refused a request to this path (``why``:
        ``"unauthorized"``): counted ``hooks_unauthorized`` and logged at
        most once a minute (:class:`bridges.core.limits.PeerLog`); nothing
        of the request (its credentials least of all) is logged."""
        hub = self.hub
        hub.ctx.health.count("hooks_unauthorized")
        hub._refusals.note(  # noqa: SLF001 (the hub's rate-limited log, shared)
            "unauthorized", trio.current_time(),
            "%s: a hook request was refused %s: the agent's AEP_TOKEN (or the shim's "
            "--token-file) does not match the daemon's; its moment is spooled and taken "
            "later without holding its ask (counted hooks_unauthorized)", hub.profile.key, why)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            return
        if scope.get("method") != "POST":
            await respond(send, 405, {"error": "POST the vendor's hook JSON"},
                          headers=[(b"allow", b"POST")])
            return
        try:
            body = await read_body(receive, BODY_MAX)
        except OverflowError:
            self.hub.ctx.health.count("hooks_bad_body")
            await respond(send, 413, {"error": f"hook body over {BODY_MAX} bytes"})
            return
        if body is None:
            return
        signed: SignedAnswer | None = scope.get(SIGNED_KEY)
        if signed is not None and not body_matches(scope.get("headers", []), body):
            self.hub.ctx.health.count("hooks_bad_signature")
            await respond(send, 401, {"error": "the body is not the one the request signed"})
            return
        moment, why = _parsed(body)
        if not isinstance(moment, dict):  # 400: the shim does not spool it
            self.hub.ctx.health.count("hooks_bad_body")
            await respond(send, 400, {"error": why},
                          headers=[signed.head(400)] if signed is not None else [])
            return
        hook_id = signed.hook_id if signed is not None else header(scope, b"x-aep-hook-id")
        mark = header(scope, b"x-aep-hook-spooled")
        try:
            outcome = await self.hub.handle(moment, hook_id=hook_id, spooled=mark is not None,
                                            at_ms=moment_ms(now_ms(), spooled_ms(mark)))
        except MappingFailed:  # counted by the hub; the shim spools it, its id left unseen
            await respond(send, 500, {"error": "the moment could not be mapped"})
            return
        if outcome.ask is None:
            if signed is None:
                await respond(send, 200, outcome.reply)
            else:  # the decision behind its proof line (bridges/core/signed.py)
                await respond(send, 200, signed.body(json.dumps(outcome.reply).encode()),
                              headers=[signed.head(200)])
            return
        hold = str(round(self.hub.hold_limit(outcome.ask) * 1000))
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"aep-hold-ms", hold.encode()),
            (b"cache-control", b"no-store"), *([signed.head(200, hold)] if signed else [])]})
        hangup = trio.Event()
        reply: dict = {}
        async with trio.open_nursery() as n:
            async def watch() -> None:
                while True:
                    msg = await receive()
                    if msg.get("type") == "http.disconnect":
                        hangup.set()
                        return

            n.start_soon(watch)
            reply = await self.hub.hold(outcome.ask, hangup)
            n.cancel_scope.cancel()
        if not hangup.is_set():
            data = json.dumps(reply).encode()
            await send({"type": "http.response.body",
                        "body": data if signed is None else signed.body(data)})
