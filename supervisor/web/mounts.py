"""Bridge-served paths on the daemon's own listener (``AEP_LISTEN``).

Some vendor surfaces push to the daemon instead of being read by it (the
ACP tees, :mod:`bridges.acp`). A bridge mounts an ASGI app on an exact path
for as long as its ``run()`` is inside ``ctx.mounts.mount(path, app)``
(:class:`bridges.core.bridge.Mounts`); :meth:`Mounts.wrap` puts the
dispatcher in front of the daemon's app (the embedded relay, or the health
app in uplink mode), so it is the same hypercorn listener, not another one.

Guards in front of every mounted app, before it sees the request:

- the relay's DNS-rebinding Host guard (:func:`supervisor.relay.app.host_allowed`);
- a request carrying a browser ``Origin`` is refused 403 (a page must not
  inject observations; tools send no ``Origin``);
- with ``AEP_TOKEN`` set, ``Authorization: Bearer`` (or ``?access_token=``)
  is required, 401 otherwise (told to the mounted app's ``refused(why)``
  when it has one, so a bridge counts and logs it); on the hook paths (``/hooks/...``) a request
  signed with the token (:mod:`bridges.core.signed`, the command shim's way:
  the token never crosses the socket) is taken too, the proofs of the
  daemon's answer left in the scope for the hook endpoint.

A refused WebSocket upgrade gets a real HTTP status (hypercorn's ASGI
websocket denial extension). A path nobody mounts falls through to the
wrapped app (the relay answers 404), so a bridge restarting looks like a
missing path for the moment its backoff lasts.

A fault barrier like the relay app's: an exception out of a refusal or a
mounted app (h11 refusing our answer on a connection a hostile client broke
on purpose, e.g. an upgrade with bytes pipelined behind it, hypercorn#225)
is counted in ``refused["fault"]`` and logged once per kind per interval
(:class:`bridges.core.http.FaultLog`, type names only), never a traceback
per request."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

from bridges.core.asgi import bearer_ok, header, host_allowed, listen_host, refuse_upgrade, respond
from bridges.core.bridge import ASGIApp
from bridges.core.http import FaultLog, fault_kind
from bridges.core.signed import SIGNED_KEY, SignedAnswer, SignedRequests

__all__ = ["Mounts", "refuse"]

_FAULTS = FaultLog(logging.getLogger("aep.web.mounts"))


async def refuse(scope: dict[str, Any], receive: Callable, send: Callable, status: int,
                 error: str) -> None:
    """Answer ``{"error": error}`` with ``status``: an HTTP response, or a
    refused WebSocket upgrade (:func:`bridges.core.asgi.refuse_upgrade`)."""
    if scope["type"] == "http":
        extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
        return await respond(send, status, {"error": error}, headers=extra)
    msg = await receive()
    if msg["type"] == "websocket.connect":
        await refuse_upgrade(scope, send, status, {"error": error})


class Mounts:
    """The daemon's registry of bridge-mounted paths (see the module
    docstring). ``token``: the daemon's ``AEP_TOKEN`` (``None``: open)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self._signed = SignedRequests(token) if token else None
        self._apps: dict[str, ASGIApp] = {}
        self.refused: dict[str, int] = {}

    @contextlib.contextmanager
    def mount(self, path: str, app: ASGIApp) -> Iterator[None]:
        if path in self._apps:
            raise ValueError(f"{path} is already mounted by another bridge")
        self._apps[path] = app
        try:
            yield
        finally:
            if self._apps.get(path) is app:
                del self._apps[path]

    def mounted(self) -> list[str]:
        return sorted(self._apps)

    def _count(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with the mounted paths dispatched in front of it."""

        async def dispatch(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
            target = self._apps.get(scope.get("path", "")) if scope["type"] in (
                "http", "websocket") else None
            if target is None:
                return await app(scope, receive, send)
            try:
                await guarded(target, scope, receive, send)
            except Exception as e:  # noqa: BLE001 -- one request's fault stays with it
                self._count("fault")
                _FAULTS.record(fault_kind(e), f"mounted {scope.get('path', '')}", e)

        async def guarded(target: ASGIApp, scope: dict[str, Any], receive: Callable,
                          send: Callable) -> None:
            if not host_allowed(header(scope, b"host") or "", listen_host(scope)):
                self._count("host")
                return await refuse(scope, receive, send, 403, "host-not-allowed")
            if header(scope, b"origin") is not None:
                self._count("origin")
                return await refuse(scope, receive, send, 403, "origin-not-allowed")
            if self.token and not bearer_ok(self.token, scope.get("headers", []),
                                            scope.get("query_string", b"")):
                signed = self._signed_hook(scope)
                if signed is None:
                    self._count("unauthorized")
                    # the mounted app's own count and log line (a hook bridge's
                    # hooks_unauthorized): a wrong token is otherwise silent there
                    notice = getattr(target, "refused", None)
                    if callable(notice):
                        notice("unauthorized")
                    return await refuse(scope, receive, send, 401, "unauthorized")
                scope = {**scope, SIGNED_KEY: signed}
            await target(scope, receive, send)

        return dispatch

    def _signed_hook(self, scope: dict[str, Any]) -> SignedAnswer | None:
        """The answer proofs of a hook request signed with the token, else ``None``."""
        path = scope.get("path", "")
        if self._signed is None or scope["type"] != "http" or not path.startswith("/hooks/"):
            return None
        hook_id = self._signed.verify(scope.get("headers", []), path)
        return None if hook_id is None else self._signed.answer(hook_id)
