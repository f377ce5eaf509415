"""bridges.core.asgi: the credential check every listener shares (AEP-0003
§8.1), the DNS-rebinding guard as a wrapper, and the response helper."""
from __future__ import annotations

import json

import pytest

from bridges.core.asgi import (
    LISTEN_KEY,
    bearer_ok,
    header,
    host_guard,
    presented_tokens,
    respond,
    token_matches,
)

AUTH = b"authorization"


def test_presented_tokens_are_every_bearer_then_every_query_token():
    hs = [(AUTH, b"Bearer  a "), (b"Authorization", b"bearer b"), (AUTH, b"Basic c"),
          (b"x-other", b"Bearer d")]
    assert list(presented_tokens(hs, b"access_token=e&x=1&access_token=")) == ["a", "b", "e", ""]
    assert list(presented_tokens([], b"")) == []


@pytest.mark.parametrize("headers,query,ok", [
    ([(AUTH, b"Bearer s3cret")], b"", True),
    ([(AUTH, b"BEARER s3cret")], b"", True),
    ([], b"access_token=s3cret", True),
    ([(AUTH, b"Bearer wrong")], b"access_token=s3cret", True),
    ([(AUTH, b"Bearer wrong")], b"", False),
    ([(AUTH, b"Bearer s3cret\xe9")], b"", False),  # non-ASCII header bytes compare, never raise
    ([(AUTH, "Bearer é".encode("latin-1"))], b"access_token=%C3%A9", False),
    ([], b"access_token=s3cre", False),
    ([(AUTH, b"s3cret")], b"", False),  # no scheme
])
def test_bearer_ok(headers, query, ok):
    assert bearer_ok("s3cret", headers, query) is ok
    assert bearer_ok(b"s3cret", headers, query) is ok


def test_no_configured_token_authenticates_nobody():
    assert not bearer_ok(None, [(AUTH, b"Bearer x")], b"access_token=x")
    assert not bearer_ok("", [(AUTH, b"Bearer ")], b"")
    assert not token_matches("x", None) and not token_matches(None, "x")
    assert token_matches("é", "é") and not token_matches("é", "e")


class Sent(list):
    async def __call__(self, message):
        self.append(message)


async def _nothing():
    return {"type": "websocket.connect"}


def _scope(kind: str, host: bytes | None, bound: str = "127.0.0.1") -> dict:
    hs = [(b"host", host)] if host is not None else []
    return {"type": kind, "headers": hs, "state": {LISTEN_KEY: (bound, 8787)}, "path": "/"}


async def test_host_guard_refuses_a_rebound_name_and_counts_it():
    reached, refused = [], []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    guarded = host_guard(app, on_refuse=lambda: refused.append(1))
    sent = Sent()
    await guarded(_scope("http", b"evil.example:8787"), _nothing, sent)
    start, body = sent
    assert start["status"] == 403 and (b"connection", b"close") in start["headers"]
    assert json.loads(body["body"]) == {"error": "host-not-allowed"}
    sent = Sent()
    await guarded(_scope("websocket", b"evil.example"), _nothing, sent)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    for ok in (b"localhost:8787", b"127.0.0.1", b"[::1]:1", b"a.localhost", None):
        await guarded(_scope("http", ok), _nothing, Sent())
    await guarded(_scope("http", b"evil.example", bound="0.0.0.0"), _nothing, Sent())  # exposed on purpose
    assert refused == [1, 1] and reached == ["http"] * 6


async def test_respond_shapes_one_complete_response():
    sent = Sent()
    await respond(sent, 204, headers=[(b"allow", b"GET")])
    assert sent[0]["headers"] == [(b"content-length", b"0"), (b"allow", b"GET")]
    assert sent[1]["body"] == b""
    sent = Sent()
    await respond(sent, 400, {"error": "x"}, close=True)
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    assert json.loads(sent[1]["body"]) == {"error": "x"}
    assert header({"headers": [(b"x-a", b"1"), (b"x-a", b"2")]}, b"x-a") == "1"
    assert header({}, b"x-a") is None
