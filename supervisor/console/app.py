"""The console's ASGI face (issue 28): the single-page console at ``/`` and
its static files under ``/console/``, in front of the relay's own app.

The page speaks only the relay's bindings (``/socket``, ``/healthz``), so
this wrapper adds nothing to the protocol; it serves files and makes two
browser facts fit the relay's existing rules, both only on ``/socket``:

- **Same origin.** A browser always sends ``Origin`` on a WebSocket; the
  relay refuses every ``Origin`` it was not given (``AEP_CORS_ORIGINS``).
  The page's own origin (``http://`` + the request's ``Host``, which the
  relay's DNS-rebinding guard has vetted on a loopback bind) is allowed by
  removing that header before the relay sees the upgrade; a foreign origin
  still reaches the relay and is refused there (403 ``origin-not-allowed``).
  On a non-loopback bind (no Host guard) the same-origin rule applies only
  to a socket that presents a token: a tokenless one keeps its ``Origin``
  (list the console's origin in ``AEP_CORS_ORIGINS`` to watch without one).
- **The token, never in a URL.** A browser cannot set ``Authorization`` on
  a WebSocket. The page offers the subprotocols ``aep.v0.1`` and
  ``aep.bearer.<base64url(token)>`` (the pattern Kubernetes uses for the
  same problem): a handshake header, not the URL (AEP-0003 §8.1 and §11:
  the query token is the weak spot). The wrapper turns it into
  ``Authorization: Bearer`` for the relay's own check, and accepts with
  ``aep.v0.1`` (the token is never echoed).

Every page response carries a strict ``Content-Security-Policy`` (no inline
script or style, nothing but this origin), ``nosniff``, no referrer and no
framing. Static files are read once from the package (``static/``)."""
from __future__ import annotations

import base64
import binascii
from importlib import resources

from bridges.core.asgi import (
    App,
    Message,
    Receive,
    Scope,
    Send,
    header,
    host_allowed,
    is_loopback_listener,
    listen_host,
    respond,
)
from supervisor.relay import normalize_origin

__all__ = ["CSP", "SUBPROTOCOL", "BEARER_PREFIX", "console_app", "static_files"]

#: the page's policy: scripts, styles, images and connections from this origin only
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: the subprotocol the console's socket is accepted with
SUBPROTOCOL = "aep.v0.1"
#: the subprotocol prefix carrying ``base64url(token)`` (no padding)
BEARER_PREFIX = "aep.bearer."

_TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
          ".css": b"text/css; charset=utf-8", ".svg": b"image/svg+xml"}
_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"),
            (b"cache-control", b"no-store")]


def static_files() -> dict[str, tuple[bytes, bytes]]:
    """``{url path: (body, content type)}`` for the package's ``static/``
    files: ``index.html`` at ``/``, every file at ``/console/<name>``."""
    out: dict[str, tuple[bytes, bytes]] = {}
    for item in resources.files(__package__).joinpath("static").iterdir():
        name = item.name
        ext = name[name.rfind("."):]
        if ext in _TYPES and item.is_file():
            out[f"/console/{name}"] = (item.read_bytes(), _TYPES[ext])
    if "/console/index.html" in out:
        out["/"] = out["/console/index.html"]
    return out


def _bearer(protocols: list[str]) -> str | None:
    """The token in an ``aep.bearer.<base64url>`` subprotocol, if any."""
    for p in protocols:
        if p.startswith(BEARER_PREFIX):
            raw = p[len(BEARER_PREFIX):]
            try:
                token = base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_",
                                         validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                return None
            return token or None
    return None


def _same_origin(scope: Scope) -> bool:
    """Whether the request's ``Origin`` is the page's own: ``http://`` +
    its ``Host`` (the listener serves plain HTTP; TLS ends at a proxy,
    which forwards ``Host``: then the origin is ``https://`` + it)."""
    origin, host = header(scope, b"origin"), header(scope, b"host")
    if not origin or not host:
        return False
    try:
        theirs = normalize_origin(origin)
        return theirs in (normalize_origin("http://" + host), normalize_origin("https://" + host))
    except ValueError:
        return False


def _socket_scope(scope: Scope) -> tuple[Scope, bool]:
    """The ``/socket`` scope the relay sees (see the module docstring) and
    whether the page's subprotocol is to be selected on accept."""
    headers = list(scope.get("headers", []))
    protocols = [str(p) for p in scope.get("subprotocols") or []]
    token = _bearer(protocols)
    # "the page's own origin" is only as good as the Host it is built from: on a
    # loopback bind the Host guard vetted it; elsewhere (no Host guard) only a
    # socket that carries a token may pass, or a DNS-rebinding page would read
    # the stream of an open (tokenless) relay
    vetted = is_loopback_listener(listen_host(scope)) or token is not None or any(
        k.lower() == b"authorization" for k, _ in headers)
    if vetted and _same_origin(scope):
        headers = [(k, v) for k, v in headers if k.lower() != b"origin"]
    if token is not None and not any(k.lower() == b"authorization" for k, _ in headers):
        headers.append((b"authorization", b"Bearer " + token.encode("utf-8", "surrogateescape")))
    return {**scope, "headers": headers}, SUBPROTOCOL in protocols


def console_app(inner: App) -> App:
    """``inner`` (the relay's app, :func:`supervisor.relay.app.make_app`)
    with the console in front: ``GET``/``HEAD`` of ``/`` and
    ``/console/<file>`` answered here (Host guard first, as on the relay;
    403 ``host-not-allowed``), ``/socket`` adapted for a browser (module
    docstring), everything else passed through untouched."""
    files = static_files()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http" and scope["path"] in files:
            if not host_allowed(header(scope, b"host") or "", listen_host(scope)):
                return await respond(send, 403, {"error": "host-not-allowed"}, close=True)
            if scope["method"] not in ("GET", "HEAD"):
                return await respond(send, 405, {"error": "method-not-allowed"})
            body, ctype = files[scope["path"]]
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", ctype), (b"content-length", str(len(body)).encode()),
                *_HEADERS]})
            return await send({"type": "http.response.body",
                               "body": b"" if scope["method"] == "HEAD" else body})
        if kind == "websocket" and scope.get("path") == "/socket":
            scope, select = _socket_scope(scope)
            if select:
                send = _accepting(send)
        await inner(scope, receive, send)

    return app


def _accepting(send: Send) -> Send:
    """``send`` that selects :data:`SUBPROTOCOL` on ``websocket.accept``."""
    async def wrapped(message: Message) -> None:
        if message["type"] == "websocket.accept":
            message = {**message, "subprotocol": SUBPROTOCOL}
        await send(message)
    return wrapped
