"""The daemon's bare health app (uplink mode): counts only with the token,
and a credential it cannot read is an unauthenticated request, not a crash."""
from __future__ import annotations

import json

from supervisor.web.http import health_app


async def _get(app, headers, query=b""):
    sent = []

    async def send(m):
        sent.append(m)

    async def receive():
        return {"type": "http.disconnect"}

    await app({"type": "http", "path": "/healthz", "method": "GET", "headers": headers,
               "query_string": query}, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


async def test_counts_need_the_token_and_odd_bytes_do_not_crash():
    app = health_app("s3cret", lambda authed: {"ok": True, "authed": authed})
    assert await _get(app, [(b"authorization", b"Bearer s3cret")]) == (200, {"ok": True, "authed": True})
    assert await _get(app, [], b"access_token=s3cret") == (200, {"ok": True, "authed": True})
    assert await _get(app, [(b"authorization", b"Bearer \xe9\xff")]) == (200, {"ok": True, "authed": False})
    open_app = health_app(None, lambda authed: {"authed": authed})
    assert await _get(open_app, []) == (200, {"authed": True})  # no token: counts are public
