"""The relay's HTTP surface on a real hypercorn listener (AEP-0003 §3.2,
§3.3 refusals, §3.4, §8.1; docs/relay.md limits): every answer of
``POST /events``, discovery, ``/healthz`` with and without auth, SSE
refusals before any header, and no token in any log line."""
from __future__ import annotations

import json
import logging

import httpx
import pytest

from tests.support.relay_harness import TOKEN, auth, event, running_relay

V = {"AEP-Version": "0.1"}
JSON = {"content-type": "application/json"}
NDJSON = {"content-type": "application/x-ndjson"}


async def held(relay, session="s1"):
    return relay.buffers.held(session)


async def test_post_single_and_batch_accepted():
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers={**V, **JSON, **auth()})
        assert r.status_code == 202 and r.json() == {"accepted": 1}
        body = "\n".join(json.dumps(event(s)) for s in range(1, 4)) + "\n\n"
        r = await c.post(base + "/events", content=body,
                         headers={**V, "content-type": "application/x-ndjson; charset=utf-8", **auth()})
        assert r.status_code == 202 and r.json() == {"accepted": 3}
        assert await held(relay) == 4


async def test_post_batch_rejected_whole_with_line_index():
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        lines = [json.dumps(event(0)), "", json.dumps(event(1)), json.dumps({**event(2), "seq": -2})]
        r = await c.post(base + "/events", content="\n".join(lines), headers={**V, **NDJSON})
        assert r.status_code == 400
        # `line` is the 0-based line of the body (blank lines are skipped, not renumbered)
        assert r.json()["error"] == "invalid-event" and r.json()["line"] == 3
        assert "seq" in r.json()["detail"]
        assert await held(relay) == 0  # nothing from the batch was ingested
        r = await c.post(base + "/events", content="{nope", headers={**V, **JSON})
        assert r.status_code == 400 and r.json()["error"] == "invalid-event"
        r = await c.post(base + "/events", content=b"\xff\xfe", headers={**V, **JSON})
        assert r.status_code == 400
        r = await c.post(base + "/events", content="[1]", headers={**V, **JSON})
        assert r.status_code == 400


@pytest.mark.parametrize("junk", ["\x0b", "\x1c", "\u2028", "\x0c"])
async def test_a_line_of_non_json_whitespace_is_an_error_not_a_blank(junk):
    """Blank means JSON whitespace (space, tab, CR) only: ``str.strip()``
    dropped a line of \\x0b or U+2028 and accepted the batch (fresh-user
    review); AEP-0003 §3.2 answers 400 with the line."""
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        body = "\n".join([json.dumps(event(0)), junk, " \t\r", json.dumps(event(1))])
        r = await c.post(base + "/events", content=body, headers={**V, **NDJSON})
        assert r.status_code == 400 and r.json()["line"] == 1, r.text
        assert await held(relay) == 0


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"},
                                     {"authorization": f"Basic {TOKEN}"}])
async def test_post_needs_the_token_when_one_is_set(headers):
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers={**V, **JSON, **headers})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = await c.post(base + "/events", params={"access_token": TOKEN},
                         content=json.dumps(event(0)), headers={**V, **JSON})
        assert r.status_code == 202


async def test_post_command_refused_control_is_websocket_only():
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        cmd = {"aep": "0.1", "id": "C1", "type": "control.cancel", "time": "2026-11-30T12:00:00Z",
               "source": "aep://box/agent/mc", "agent": "mc", "session": "s1", "data": {"scope": "run"}}
        r = await c.post(base + "/events", content=json.dumps(cmd), headers={**V, **JSON, **auth()})
        assert r.status_code == 403 and r.json()["error"] == "unauthorized"


@pytest.mark.parametrize("version", [None, "0.2", "1.0", ""])
async def test_post_version_header_required(version):
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        hs = dict(JSON)
        if version is not None:
            hs["AEP-Version"] = version
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers=hs)
        assert r.status_code == 426 and r.json()["versions"] == ["0.1"]
        # the body names the header, so a first POST without it says what to add
        assert "AEP-Version: 0.1" in r.json()["detail"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/cloudevents+json", None])
async def test_post_wrong_content_type(ctype):
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        hs = dict(V)
        if ctype:
            hs["content-type"] = ctype
        r = await c.post(base + "/events", content=json.dumps(event(0)), headers=hs)
        assert r.status_code == 415


async def test_post_oversize_body_and_batch_say_which():
    async with running_relay(max_body=4096, max_batch=5) as (relay, base), httpx.AsyncClient() as c:
        big = json.dumps(event(0, data={"pad": "x" * 5000}))
        r = await c.post(base + "/events", content=big, headers={**V, **JSON})
        assert r.status_code == 413
        assert r.json() == {"error": "payload-too-large", "max_bytes": 4096}

        async def chunks():  # no content-length: the limit bites while streaming
            for _ in range(10):
                yield b" " * 1000

        r = await c.post(base + "/events", content=chunks(), headers={**V, **JSON})
        assert r.status_code == 413 and r.json()["error"] == "payload-too-large"
        batch = "\n".join(json.dumps(event(s)) for s in range(6))
        r = await c.post(base + "/events", content=batch, headers={**V, **NDJSON})
        assert r.status_code == 413
        assert r.json() == {"error": "too-many-events", "max": 5, "count": 6}
        assert await held(relay) == 0


async def test_discovery_document_on_both_paths():
    async with running_relay(token=TOKEN, buffer=77) as (relay, base), httpx.AsyncClient() as c:
        assert (await c.get(base + "/events")).status_code == 401
        a = await c.get(base + "/events", headers=auth())
        b = await c.get(base + "/.well-known/aep", headers=auth())
        assert a.status_code == b.status_code == 200
        assert a.headers["content-type"] == "application/json"
        assert a.json() == b.json() == relay.discovery()
        doc = a.json()
        assert doc["aep"] == ["0.1"]
        assert doc["endpoints"] == {"events": "/events", "stream": "/stream", "socket": "/socket"}
        caps = doc["capabilities"]
        assert caps["filters"] == ["attr-match"] and caps["replay"] == {"buffer": 77, "all": True}
        assert caps["roster"] == {}


async def test_healthz_bare_without_auth_counts_with_auth():
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        r = await c.get(base + "/healthz")
        assert r.status_code == 200 and r.json() == {"ok": True}
        r = await c.get(base + "/healthz", headers=auth())
        body = r.json()
        assert body["ok"] is True
        for k in ("sessions", "subscribers", "connections", "uptime_s", "counters"):
            assert k in body
        assert "dropped_low_severity" in body["counters"]


async def test_healthz_without_token_configured_shows_counts():
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        assert "sessions" in (await c.get(base + "/healthz")).json()


async def test_daemon_healthz_callable_replaces_the_body():
    seen = []

    def healthz(authorized):
        seen.append(authorized)
        return {"ok": True, "bridges": {"x": {"ok": True}}}

    async with running_relay(token=TOKEN, healthz=healthz) as (relay, base), httpx.AsyncClient() as c:
        assert (await c.get(base + "/healthz")).json() == {"ok": True, "bridges": {"x": {"ok": True}}}
        body = (await c.get(base + "/healthz", params={"access_token": TOKEN})).json()
        assert body["bridges"] == {"x": {"ok": True}} and "sessions" in body["relay_counts"]
        assert seen == [False, True]


async def test_unknown_path_and_wrong_method():
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        assert (await c.get(base + "/nope")).status_code == 404
        assert (await c.delete(base + "/events")).status_code == 405
        assert (await c.post(base + "/stream")).status_code == 405
        r = await c.options(base + "/stream")  # not a preflight (no Origin): no CORS grant
        assert r.status_code == 204 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("params,error", [
    ({"filter": "{bad json"}, "invalid-filter"),
    ({"filter": json.dumps({"seq": 3})}, "invalid-filter"),
    ({"filter": json.dumps({"NotAnAttr": "y"})}, "invalid-filter"),
    ({"filter": '{"epoch": NaN}'}, "invalid-filter"),
    ({"filter": "[" * 3000}, "invalid-filter"),  # nesting past the recursion limit
    ({"capture": "everything"}, "invalid-filter"),
    ({"from": "[{"}, "invalid-filter"),
    ({"from": json.dumps({"session": "s1"})}, "invalid-filter"),
    ({"from": json.dumps([{"session": "s1", "epoch": 0, "seq": "7"}])}, "invalid-filter"),
    ({"from": json.dumps([{"session": f"s{i}", "epoch": 0, "seq": 1} for i in range(4)])},
     "limit-exceeded"),
])
async def test_sse_refusals_before_headers(params, error):
    async with running_relay(max_from=3) as (relay, base), httpx.AsyncClient() as c:
        r = await c.get(base + "/stream", params=params)
        assert r.status_code == 400 and r.json()["error"] == error
        assert r.headers["content-type"] == "application/json"
        assert relay.stats()["subscribers"] == 0


async def test_sse_needs_the_token_when_one_is_set():
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        r = await c.get(base + "/stream", params={"access_token": "nope", "live": "0"})
        assert r.status_code == 401
        r = await c.get(base + "/stream", params={"access_token": TOKEN, "live": "0"})
        assert r.status_code == 200 and r.text.endswith(": replay-complete\n\n")


async def test_tokens_never_reach_any_log(caplog):
    caplog.set_level(logging.DEBUG)
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        for url in ("/stream", "/events", "/healthz", "/nope"):
            await c.get(base + url, params={"access_token": TOKEN, "live": "0"})
            await c.get(base + url, params={"access_token": "guess-" + TOKEN})
        await c.post(base + "/events", params={"access_token": TOKEN}, content="{",
                     headers={**V, **JSON})
    # everything the server side logged (the test's own httpx client logs URLs)
    server = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    text = "\n".join(r.getMessage() for r in server)
    assert TOKEN not in text
    assert "access_token" not in text
