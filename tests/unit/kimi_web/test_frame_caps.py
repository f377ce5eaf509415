"""Vendor JSON passes :func:`bridges.core.aep.check_json` before its parse
(round 12 of issue 25, finding 4): a socket frame over the caps is
:data:`~bridges.kimi_web.mapping.NOT_JSON` (counted ``frames_not_json``),
a REST answer over them or over :data:`~bridges.core.rest.MAX_BODY`
bytes is a :class:`~bridges.kimi_web.rest.VendorError` (the not-JSON path)."""
from __future__ import annotations

import json

import httpx
import pytest

from bridges.core.rest import MAX_BODY
from bridges.kimi_web import mapping as M
from bridges.kimi_web.discovery import Endpoint
from bridges.kimi_web.rest import AuthRefused, VendorError, VendorRest, envelope

#: valid JSON of 65,538 arrays (one over the cap): the old parse took it
WIDE = "[" + ",".join(["[]"] * 65_537) + "]"
LONG = "1" * 300  # a valid int, over the 256-digit cap


@pytest.mark.parametrize("inner", [WIDE, LONG])
def test_a_frame_over_the_caps_is_not_json(inner):
    frame = '{"type": "event", "seq": 1, "payload": {"x": ' + inner + "}}"
    assert M.parse_frame(frame) is M.NOT_JSON
    assert M.parse_frame(frame.encode()) is M.NOT_JSON


def test_a_frame_within_the_caps_parses_as_before():
    frame = json.dumps({"type": "event", "seq": 3, "payload": {"x": [[]] * 1000, "n": 10**200, "f": 1.5}})
    assert M.parse_frame(frame) == json.loads(frame)
    assert M.parse_frame(b"not json") is M.NOT_JSON and M.parse_frame(None) is M.NOT_JSON


@pytest.mark.parametrize("inner", [WIDE, LONG])
def test_a_rest_answer_over_the_caps_is_a_vendor_error(inner):
    r = httpx.Response(200, content=('{"code": 0, "msg": "", "data": ' + inner + "}").encode())
    with pytest.raises(VendorError):
        envelope(r)


def _rest(handler) -> VendorRest:
    rest = VendorRest()
    rest._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    rest.endpoint = Endpoint("http://kimi.invalid", "t0ken")
    return rest


async def _chunks(n: int, size: int):
    for _ in range(n):
        yield b" " * size


async def test_a_rest_answer_over_max_body_is_refused_unread():
    pulled = []

    async def body():
        yield b'{"code": 0, "msg": "", "data": ['
        async for c in _chunks(10_000, 64 * 1024):  # 640 MB of whitespace if read whole
            pulled.append(len(c))
            yield c
        yield b"]}"

    rest = _rest(lambda req: httpx.Response(200, content=body()))
    with pytest.raises(VendorError) as e:
        await rest.request("GET", "/sessions")
    assert "over" in e.value.msg and sum(pulled) <= MAX_BODY + 2 * 64 * 1024


async def test_an_announced_length_over_max_body_is_refused():
    rest = _rest(lambda req: httpx.Response(200, headers={"content-length": str(MAX_BODY + 1)},
                                            content=b'{"code": 0, "msg": "", "data": 1}'))
    with pytest.raises(VendorError):
        await rest.request("GET", "/sessions")


async def test_a_rest_answer_within_the_cap_is_its_data():
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.method, str(req.url), req.headers["authorization"], req.content))
        return httpx.Response(200, json={"code": 0, "msg": "success", "data": {"items": [{"id": "s1"}]}})

    rest = _rest(handler)
    assert await rest.request("POST", "/sessions/x", {"a": 1}) == {"items": [{"id": "s1"}]}
    assert seen == [("POST", "http://kimi.invalid/api/v1/sessions/x", "Bearer t0ken", b'{"a":1}')]
    rest401 = _rest(lambda req: httpx.Response(401, content=b"x" * (MAX_BODY + 10)))
    rest401._refresh_endpoint = lambda: None  # type: ignore[method-assign]
    with pytest.raises(AuthRefused):
        await rest401.request("GET", "/sessions")
