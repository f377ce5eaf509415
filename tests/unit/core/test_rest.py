""":mod:`bridges.core.rest`: a vendor REST answer read within bounds
(round 15 of issue 25, finding 2), against a hostile server on loopback
(``tests/support/hostile_vendor.py``): a body past the byte cap and an
endless one are refused with the rest unread, a slow drip ends at the
deadline (not per read), nesting past the parser's limit is a refusal,
never a ``RecursionError``."""
from __future__ import annotations

import json
import math
from contextlib import asynccontextmanager

import httpx
import pytest
import trio

from bridges.core.rest import MAX_BODY, BadAnswer, fetch, parse_json
from tests.support.hostile_vendor import HostileVendor

#: what the kernel's socket buffers and one read may hold beyond the cap
#: (bytes sent that the client never read)
SLACK = 16 << 20


@asynccontextmanager
async def vendor(mode: str, **kw):
    server = HostileVendor(mode, **kw)
    async with trio.open_nursery() as n, httpx.AsyncClient(base_url="http://x", timeout=10,
                                                           trust_env=False) as client:
        await n.start(server.serve)
        client.base_url = httpx.URL(server.url)
        yield server, client
        n.cancel_scope.cancel()


async def until(pred, what: str) -> None:
    with trio.fail_after(30):  # a bound on waiting, not a timing assertion
        while not pred():
            await trio.sleep(0.02)


async def test_an_answer_within_the_bounds_is_its_status_headers_and_body():
    async with vendor("ok", body={"items": [{"id": "a"}], "f": 1.5}) as (server, client):
        r = await fetch(client, "GET", "/api/x", params={"limit": 3})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert "transfer-encoding" not in r.headers
        assert parse_json(r.content) == {"items": [{"id": "a"}], "f": 1.5}
        assert server.answers[0].path == "/api/x?limit=3" and server.answers[0].done
        r.raise_for_status()  # the request is kept


@pytest.mark.parametrize("mode", ["huge", "endless"])
async def test_a_body_past_the_cap_is_refused_and_the_rest_never_read(mode):
    async with vendor(mode, size=40_000_000) as (server, client):
        with pytest.raises(BadAnswer) as e:
            await fetch(client, "GET", "/api/conversations/search")
        assert e.value.status == 200 and f"over {MAX_BODY}" in str(e.value)
        assert isinstance(e.value, ValueError)  # what every caller counts as a bad answer
        await until(lambda: server.answers[0].cut, "the server to see the connection closed")
        assert MAX_BODY < server.answers[0].sent < MAX_BODY + SLACK


async def test_a_lower_cap_is_the_callers_choice():
    async with vendor("huge", size=3_000_000) as (server, client):
        with pytest.raises(BadAnswer):
            await fetch(client, "GET", "/x", max_bytes=1_000_000)
        assert (await fetch(client, "GET", "/x")).status_code == 200


async def test_a_drip_ends_at_the_deadline_not_per_read():
    """One byte every 50 ms never trips httpx's 10 s per-read timeout: the
    deadline bounds the whole exchange."""
    async with vendor("drip") as (server, client):
        with pytest.raises(BadAnswer) as e:
            await fetch(client, "GET", "/session/status", deadline=0.5)
        assert e.value.status == 200 and "not whole within 0.5s" in str(e.value)
        await until(lambda: server.answers[0].cut, "the server to see the connection closed")


async def test_status_only_keeps_the_status_and_drops_a_bad_body():
    async with vendor("endless") as (server, client):
        r = await fetch(client, "POST", "/api/x", json={"a": 1}, status_only=True)
        assert r.status_code == 200 and r.content == b""
    async with vendor("drip") as (server, client):
        r = await fetch(client, "POST", "/api/x", status_only=True, deadline=0.3)
        assert r.status_code == 200 and r.content == b""


async def test_no_answer_within_the_deadline_is_a_bad_answer_without_a_status():
    async def never(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError

    async with httpx.AsyncClient(transport=httpx.MockTransport(never)) as client:
        for status_only in (False, True):
            with pytest.raises(BadAnswer) as e:
                await fetch(client, "GET", "http://x/", deadline=0.1, status_only=status_only)
            assert e.value.status is None


async def test_an_announced_length_past_the_cap_is_refused_unread():
    async def body():
        raise AssertionError("read")
        yield b""

    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda req: httpx.Response(
            200, headers={"content-length": str(MAX_BODY + 1)}, content=body()))) as client:
        with pytest.raises(BadAnswer):
            await fetch(client, "GET", "http://x/")


async def test_a_gzip_answer_is_capped_as_decoded():
    import gzip
    packed = gzip.compress(b"[" + b" " * (MAX_BODY + 10) + b"]")  # ~16 KiB on the wire
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda req: httpx.Response(
            200, headers={"content-encoding": "gzip"}, content=packed))) as client:
        with pytest.raises(BadAnswer):
            await fetch(client, "GET", "http://x/")
    small = gzip.compress(b'{"a": 1}')
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda req: httpx.Response(
            200, headers={"content-encoding": "gzip"}, content=small))) as client:
        r = await fetch(client, "GET", "http://x/")
        assert parse_json(r.content) == {"a": 1} and "content-encoding" not in r.headers


@pytest.mark.parametrize("depth", [200_000, 60_000, 5_000])
async def test_nesting_past_the_parser_is_a_bad_answer_never_a_recursion_error(depth):
    """200,000 ``[`` is over ``check_json``'s container cap (refused before
    the parse); 60,000 and 5,000 are under it and deeper than the parser
    goes (its ``RecursionError`` is the refusal)."""
    with pytest.raises(BadAnswer) as e:
        parse_json(b"[" * depth + b"]" * depth, 200)
    assert e.value.status == 200
    with pytest.raises(BadAnswer):
        parse_json(b"[" * depth)
    async with vendor("deep") as (server, client):
        r = await fetch(client, "GET", "/x")
        with pytest.raises(BadAnswer):
            parse_json(r.content)


@pytest.mark.parametrize("raw", [
    b"[" + b",".join([b"[]"] * 65_537) + b"]",  # one array over the cap
    b"1" * 300,  # an int over the digits' cap
    b"<html>proxy</html>", b"", b'{"a": 1',
])
def test_a_body_over_the_caps_or_not_json_is_a_bad_answer(raw):
    with pytest.raises(BadAnswer):
        parse_json(raw)


def test_a_body_within_the_caps_is_what_json_loads_reads():
    raw = json.dumps({"x": [[]] * 1000, "n": 10**200, "f": 1.5, "s": "\u00e9"}).encode()
    assert parse_json(raw) == json.loads(raw)
    nan = parse_json(b'{"a": NaN, "b": -Infinity}')  # a vendor may send them: json's reading
    assert math.isnan(nan["a"]) and nan["b"] == -math.inf
