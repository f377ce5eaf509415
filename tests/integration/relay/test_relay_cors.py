"""Browser-facing guards of the relay (review finding: any web page in the
operator's browser could read the stream and inject events).

- CORS (``AEP_CORS_ORIGINS`` -> ``Relay(cors_origins=[...])``): CORS
  headers only for listed origins; with a token and no list, ``*`` for
  reads only (the bearer token is what protects); a request carrying a
  browser ``Origin`` the relay does not allow is refused 403.
- WebSocket upgrades with an ``Origin`` that is not listed: 403.
- DNS rebinding: on a loopback listener, a ``Host`` that is not a loopback
  name/address (or the bound host) is refused 403."""
from __future__ import annotations

import json

import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from bridges.core.asgi import LISTEN_KEY, host_allowed
from supervisor.relay.app import make_app
from supervisor.relay.core import Relay
from tests.support.relay_harness import TOKEN, auth, event, running_relay

WAIT = 20
V = {"AEP-Version": "0.1", "content-type": "application/json"}
EVIL = "http://evil.example"
DASH = "https://dash.example:8443"
ACAO = "access-control-allow-origin"


def _ws(base: str, token: str | None = None) -> str:
    return base.replace("http://", "ws://") + "/socket" + (f"?access_token={token}" if token else "")


async def _ws_status(base: str, origin: str | None, token: str | None = None) -> int:
    """101 when the upgrade is accepted, else the refusal status."""
    extra = [("origin", origin)] if origin else None
    try:
        with trio.fail_after(WAIT):
            async with open_websocket_url(_ws(base, token), extra_headers=extra) as ws:
                await ws.send_message(json.dumps({"type": "hello", "versions": ["0.1"],
                                                  "role": "consumer", "identity": {"agent": "t"}}))
                assert json.loads(await ws.get_message())["type"] == "hello"
                return 101
    except ConnectionRejected as r:
        return r.status_code


async def test_watch_only_default_gives_no_browser_origin_anything():
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        o = {"origin": EVIL}
        for path in ("/events", "/.well-known/aep"):
            r = await c.get(base + path, headers=o)
            assert r.status_code == 403 and r.json()["error"] == "origin-not-allowed"
            assert ACAO not in r.headers
        with trio.fail_after(WAIT):
            r = await c.get(base + "/stream", params={"live": "0"}, headers=o)
        assert r.status_code == 403 and ACAO not in r.headers
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers={**V, **o})
        assert r.status_code == 403 and relay.counters["events"] == 0
        r = await c.options(base + "/events", headers={**o, "access-control-request-method": "POST"})
        assert r.status_code == 403 and ACAO not in r.headers
        r = await c.options(base + "/stream", headers={**o, "access-control-request-method": "GET"})
        assert r.status_code == 403 and ACAO not in r.headers
        assert await _ws_status(base, EVIL) == 403
        # tools without a browser Origin are unaffected, and get no CORS headers
        r = await c.get(base + "/events")
        assert r.status_code == 200 and ACAO not in r.headers
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers=V)
        assert r.status_code == 202
        assert await _ws_status(base, None) == 101


async def test_listed_origins_get_cors_for_reads_writes_and_the_socket():
    async with running_relay(cors_origins=[DASH + "/", "http://other.example"]) as (relay, base), \
            httpx.AsyncClient() as c:
        o = {"origin": DASH}
        r = await c.get(base + "/events", headers=o)
        assert r.status_code == 200 and r.headers[ACAO] == DASH and "origin" in r.headers["vary"].lower()
        with trio.fail_after(WAIT):
            r = await c.get(base + "/stream", params={"live": "0"}, headers=o)
        assert r.status_code == 200 and r.headers[ACAO] == DASH
        r = await c.options(base + "/events", headers={**o, "access-control-request-method": "POST"})
        assert r.status_code == 204 and r.headers[ACAO] == DASH
        assert "POST" in r.headers["access-control-allow-methods"]
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers={**V, **o})
        assert r.status_code == 202 and r.headers[ACAO] == DASH
        assert await _ws_status(base, DASH) == 101
        # origins compare as scheme://host:port, case-insensitively
        assert await _ws_status(base, DASH.upper()) == 101
        assert await _ws_status(base, "https://dash.example") == 403  # another port
        r = await c.get(base + "/events", headers={"origin": EVIL})
        assert r.status_code == 403 and ACAO not in r.headers


async def test_with_a_token_and_no_list_reads_are_star_writes_need_a_listed_origin():
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        o = {"origin": EVIL}
        r = await c.get(base + "/events", headers={**o, **auth()})
        assert r.status_code == 200 and r.headers[ACAO] == "*"
        r = await c.get(base + "/events", headers=o)  # the token is still what protects
        assert r.status_code == 401 and r.headers[ACAO] == "*"
        r = await c.options(base + "/stream", headers={**o, "access-control-request-method": "GET"})
        assert r.status_code == 204 and r.headers[ACAO] == "*"
        assert "POST" not in r.headers["access-control-allow-methods"]
        r = await c.options(base + "/events", headers={**o, "access-control-request-method": "POST"})
        assert r.status_code == 403
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers={**V, **o, **auth()})
        assert r.status_code == 403 and relay.counters["events"] == 0
        assert await _ws_status(base, EVIL, TOKEN) == 403
        assert await _ws_status(base, None, TOKEN) == 101


@pytest.mark.parametrize("host,ok", [
    ("evil.example", False), ("evil.example:{port}", False), ("127.0.0.1.evil.example", False),
    ("localhost.evil.example:{port}", False), ("10.0.0.1:{port}", False),
    ("127.0.0.1:{port}", True), ("localhost:{port}", True), ("LOCALHOST", True),
    ("app.localhost:{port}", True), ("127.0.0.2", True), ("[::1]:{port}", True),
])
async def test_loopback_listener_refuses_foreign_host_headers(host, ok):
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        port = base.rsplit(":", 1)[1]
        h = {"host": host.format(port=port)}
        for path in ("/healthz", "/events"):
            r = await c.get(base + path, headers=h)
            assert (r.status_code == 200) is ok, (path, r.status_code)
            if not ok:
                assert r.status_code == 403 and r.json()["error"] == "host-not-allowed"
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers={**V, **h})
        assert (r.status_code == 202) is ok
        stream = await trio.open_tcp_stream("127.0.0.1", int(port))
        async with stream:
            await stream.send_all(
                b"GET /socket HTTP/1.1\r\nHost: " + h["host"].encode() + b"\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n")
            with trio.fail_after(WAIT):
                head = await stream.receive_some(200)
        assert head.startswith(b"HTTP/1.1 101" if ok else b"HTTP/1.1 403"), head


def test_host_allowed_rules():
    assert host_allowed("evil.example", "0.0.0.0") and host_allowed("evil.example", "192.0.2.7")
    assert not host_allowed("evil.example", "127.0.0.1") and not host_allowed("evil", "::1")
    assert host_allowed("", "127.0.0.1")  # no Host at all (HTTP/1.0 tools): not a browser
    assert host_allowed("127.0.0.1:80", "::1") and host_allowed("[::1]", "127.0.0.1")
    assert host_allowed("127.0.0.5:9", "127.0.0.5")
    assert not host_allowed("[::1", "127.0.0.1") and not host_allowed("[fe80::1]:3", "::1")


async def test_a_non_loopback_listener_takes_any_host():
    """Through the ASGI app directly: the listener address comes from the
    connection state :func:`serve_app` sets (a LAN bind is not guarded: it
    is exposed on purpose and needs the token)."""
    app = make_app(Relay())
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": "GET", "path": "/healthz", "query_string": b"",
             "headers": [(b"host", b"evil.example")], "server": ("127.0.0.1", 1),
             "state": {LISTEN_KEY: ("0.0.0.0", 8787)}}
    await app(scope, receive, send)
    assert sent[0]["status"] == 200
    sent.clear()
    await app({**scope, "state": {LISTEN_KEY: ("127.0.0.1", 8787)}}, receive, send)
    assert sent[0]["status"] == 403
    sent.clear()
    await app({**scope, "state": {}}, receive, send)  # stock hypercorn: scope["server"]
    assert sent[0]["status"] == 403


async def test_serve_app_tells_the_app_its_bound_listener():
    from bridges.core.http import bind_socket, serve_app

    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        seen.append(scope["state"][LISTEN_KEY])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    stop = trio.Event()
    async with trio.open_nursery() as n, httpx.AsyncClient() as c:
        host, port = await n.start(serve_app, app, bind_socket("127.0.0.1", 0), stop)
        r = await c.get(f"http://127.0.0.1:{port}/")
        stop.set()
    assert r.status_code == 204 and seen == [("127.0.0.1", port)]


def test_cors_origins_setting_is_validated():
    with pytest.raises(ValueError, match="not an origin"):
        Relay(cors_origins=["*"])
    with pytest.raises(ValueError, match="not an origin"):
        Relay(cors_origins=["https://dash.example/path"])
    assert Relay(cors_origins=["https://Dash.example:443/", " "]).cors_origins == {"https://dash.example"}
