"""The console's ASGI wrapper (:mod:`supervisor.console.app`): the page's
files and headers, and how a browser's ``/socket`` upgrade is made to fit
the relay's rules (same origin allowed, the token from the
``aep.bearer.<base64url>`` subprotocol, never from the URL). The relay
behind it is a recording stub here; the real one is in
``tests/integration/console``."""
from __future__ import annotations

import base64
from typing import Any

from supervisor.console import BEARER_PREFIX, CSP, SUBPROTOCOL, console_app, static_files


class Inner:
    """A stand-in for the relay's app: records the scope, accepts sockets."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.scopes.append(scope)
        if scope["type"] == "websocket":
            await send({"type": "websocket.accept"})
        else:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})


async def call(app, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"} if scope["type"] == "websocket" else \
            {"type": "http.request", "body": b""}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    await app(scope, receive, send)
    return sent


def http(path: str, host: str = "127.0.0.1:8787", method: str = "GET") -> dict[str, Any]:
    return {"type": "http", "path": path, "method": method, "query_string": b"",
            "headers": [(b"host", host.encode())], "server": ("127.0.0.1", 8787)}


def ws(headers: list[tuple[bytes, bytes]], subprotocols: list[str] | None = None) -> dict[str, Any]:
    return {"type": "websocket", "path": "/socket", "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8787"), *headers],
            "subprotocols": subprotocols or [], "server": ("127.0.0.1", 8787)}


def b64(token: str) -> str:
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def test_static_files_ship_in_the_package() -> None:
    files = static_files()
    assert {"/", "/console/app.js", "/console/dom.js", "/console/forms.js", "/console/gist.js", "/console/fleet.js", "/console/ids.js", "/console/keys.js", "/console/lists.js",
            "/console/app.css", "/console/index.html"} <= set(files)
    assert files["/"] == files["/console/index.html"]
    page = files["/"][0].decode()
    assert '<script type="module" src="/console/app.js">' in page and "<script>" not in page
    for path, (body, ctype) in files.items():  # payloads become text nodes, never markup
        if path.endswith(".js"):
            assert ctype.startswith(b"text/javascript") and b"innerHTML" not in body
            assert b"insertAdjacentHTML" not in body and b"document.write" not in body


async def test_the_page_answers_with_a_strict_policy() -> None:
    inner = Inner()
    app = console_app(inner)
    start, body = await call(app, http("/"))
    headers = dict(start["headers"])
    assert start["status"] == 200 and headers[b"content-security-policy"] == CSP.encode()
    assert b"'unsafe-inline'" not in headers[b"content-security-policy"]
    assert headers[b"x-content-type-options"] == b"nosniff"
    assert headers[b"content-type"].startswith(b"text/html")
    assert body["body"].startswith(b"<!doctype html>")
    assert inner.scopes == []
    head = await call(app, http("/console/app.js", method="HEAD"))
    assert head[1]["body"] == b""
    # a rebinding Host is refused, as on the relay; a POST is not served
    assert (await call(app, http("/", host="evil.example")))[0]["status"] == 403
    assert (await call(app, http("/", method="POST")))[0]["status"] == 405
    # everything else is the relay's
    await call(app, http("/healthz"))
    assert [s["path"] for s in inner.scopes] == ["/healthz"]


async def test_same_origin_socket_reaches_the_relay_without_origin() -> None:
    inner = Inner()
    app = console_app(inner)
    await call(app, ws([(b"origin", b"http://127.0.0.1:8787")]))
    assert (b"origin", b"http://127.0.0.1:8787") not in inner.scopes[-1]["headers"]
    for foreign in (b"http://evil.example", b"http://127.0.0.1:9999", b"null"):
        await call(app, ws([(b"origin", foreign)]))
        assert (b"origin", foreign) in inner.scopes[-1]["headers"]  # the relay refuses it


async def test_bearer_subprotocol_becomes_the_authorization_header() -> None:
    inner = Inner()
    app = console_app(inner)
    token = "s3cret/with+odd=chars é"
    sent = await call(app, ws([], [SUBPROTOCOL, BEARER_PREFIX + b64(token)]))
    auth = [v for k, v in inner.scopes[-1]["headers"] if k == b"authorization"]
    assert auth == [b"Bearer " + token.encode()]
    # accepted with aep.v0.1: the token is never echoed back
    assert sent == [{"type": "websocket.accept", "subprotocol": SUBPROTOCOL}]
    assert inner.scopes[-1]["query_string"] == b""
    # a header already present wins; garbage is no token; no subprotocol offered, none chosen
    await call(app, ws([(b"authorization", b"Bearer other")], [BEARER_PREFIX + b64(token)]))
    assert [v for k, v in inner.scopes[-1]["headers"] if k == b"authorization"] == [b"Bearer other"]
    await call(app, ws([], [BEARER_PREFIX + "%%%"]))
    assert not [v for k, v in inner.scopes[-1]["headers"] if k == b"authorization"]
    assert await call(app, ws([], [])) == [{"type": "websocket.accept"}]


async def test_same_origin_on_an_open_bind_needs_a_token() -> None:
    """A non-loopback listener has no Host guard: a DNS-rebinding page's
    ``Host: evil.example`` and ``Origin: http://evil.example`` match, so the
    same-origin rule holds there only for a socket that presents a token
    (the relay then checks it); a tokenless one keeps its Origin (refused)."""
    inner = Inner()
    app = console_app(inner)
    rebound = [(b"host", b"evil.example:8787"), (b"origin", b"http://evil.example:8787")]

    def open_bind(subprotocols: list[str] | None = None) -> dict[str, Any]:
        return {**ws([], subprotocols), "headers": rebound, "server": ("0.0.0.0", 8787)}

    await call(app, open_bind())
    assert (b"origin", b"http://evil.example:8787") in inner.scopes[-1]["headers"]
    await call(app, open_bind([SUBPROTOCOL, BEARER_PREFIX + b64("t0ken")]))
    assert (b"origin", b"http://evil.example:8787") not in inner.scopes[-1]["headers"]
    # on a loopback bind the Host guard has vetted Host: no token needed
    await call(app, ws([(b"origin", b"http://127.0.0.1:8787")]))
    assert (b"origin", b"http://127.0.0.1:8787") not in inner.scopes[-1]["headers"]
