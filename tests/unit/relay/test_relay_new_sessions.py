"""The new-session budget of the embedded relay's remote ingest (issue 25,
finding 3: one token holder made 100,000 session log files; every later
start grew with them): ``supervisor/relay/newsessions.py`` and its use on
``POST /events`` (429 ``too-many-sessions``, the batch refused whole) and
``/socket`` (a ``limit-exceeded`` error frame); the fleet's own bridges
(``LocalEmitter``) and known sessions are never refused."""
from __future__ import annotations

import json

import pytest

from bridges.core.aep import dumps
from supervisor.relay.app import make_app
from supervisor.relay.core import Relay
from supervisor.relay.newsessions import NewSessionBudget
from tests.unit.relay.test_relay_core import ev, hello, take, ws


def test_a_request_past_the_cap_is_refused_and_takes_nothing():
    b = NewSessionBudget(per_request=3, per_s=1.0)
    keys = [("a", f"s{i}") for i in range(4)]
    refused = b.check(keys, 0.0)
    assert refused is not None and "AEP_RELAY_MAX_NEW_SESSIONS=3" in refused[0]
    assert b.check(keys[:3], 0.0) is None  # the whole burst was still there
    assert b.check([("a", "s0"), ("a", "s1")], 0.0) is None  # known: free


def test_the_bucket_is_all_or_nothing_and_refills():
    b = NewSessionBudget(per_request=3, per_s=1.0)
    assert b.check([("a", "s1"), ("a", "s2")], 0.0) is None
    refused = b.check([("a", "s3"), ("a", "s4")], 0.0)  # one token left: both refused
    assert refused is not None and "AEP_RELAY_NEW_SESSIONS_PER_S" in refused[0]
    assert refused[1] >= 1
    assert b.check([("a", "s3")], 0.0) is None  # the token was given back
    assert b.check([("a", "s4")], 0.0) is not None
    assert b.check([("a", "s4")], 1.0) is None  # refilled
    # another agent's file of a known session name is a new session
    assert b.check([("b", "s1")], 1.0) is not None
    assert b.check([("b", "s1")], 1.0, claimed=lambda k: k == ("b", "s1")) is None


def _relay(**kw) -> tuple[Relay, list]:
    relay = Relay(token="t", max_new_sessions=3, new_sessions_per_s=0.001, **kw)
    logged: list = []
    relay.persist = lambda entries, principal: logged.extend(entries) or True
    return relay, logged


async def _post(relay: Relay, events: list[dict]):
    sent: list = []
    body = "\n".join(json.dumps(e) for e in events).encode()
    scope = {"type": "http", "path": "/events", "method": "POST", "query_string": b"",
             "server": ("127.0.0.1", 1), "headers": [
                 (b"host", b"127.0.0.1"), (b"content-type", b"application/x-ndjson"),
                 (b"aep-version", b"0.1"), (b"authorization", b"Bearer t")]}
    msgs = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive():
        return next(msgs)

    async def send(m):
        sent.append(m)
    await make_app(relay)(scope, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"]), json.loads(sent[1]["body"])


async def test_post_refuses_a_batch_of_too_many_new_sessions_whole():
    relay, logged = _relay()
    status, headers, body = await _post(relay, [ev(1, f"n{i}") for i in range(4)])
    assert status == 429 and body["error"] == "too-many-sessions", body
    assert int(headers[b"retry-after"]) >= 1
    assert logged == [] and relay.counters["events"] == 0
    assert relay.counters["refused_new_sessions"] == 4
    # within the budget: admitted; then the bucket is empty for new ones...
    assert (await _post(relay, [ev(1, f"n{i}") for i in range(3)]))[0] == 202
    assert (await _post(relay, [ev(1, "n9")]))[0] == 429
    # ...but known sessions are never refused
    status, _, body = await _post(relay, [ev(2, f"n{i}") for i in range(3)])
    assert (status, body) == (202, {"accepted": 3})
    assert len(logged) == 6


async def test_a_socket_emitter_gets_an_error_frame_per_event_past_the_budget():
    relay, logged = _relay()
    conn = await ws(relay, role="emitter")
    for i in range(4):
        await conn.handle_text(json.dumps(ev(1, f"w{i}")))
    got = await take(conn.outlet)
    assert [(f["code"], f["cause"]) for f in got] == [("limit-exceeded", "w3-1")], got
    assert relay.counters["refused_new_sessions"] == 1
    await conn.handle_text(json.dumps(ev(2, "w0")))  # its own known session
    assert await take(conn.outlet) == []
    assert len(logged) == 4 and relay.buffers.held("w0") == 2


async def test_restored_sessions_are_known_and_the_fleet_is_not_budgeted():
    relay, logged = _relay()
    relay.restore([relay.entry(ev(1, f"old{i}")) for i in range(5)])
    status, _, _ = await _post(relay, [ev(2, f"old{i}") for i in range(5)])
    assert status == 202
    bridge = relay.attach_emitter(hello(agent="a"), lambda c: None)
    for i in range(10):  # the trusted path: the bridges have their own caps
        assert bridge.ingest_stamped(ev(1, f"fleet{i}"), dumps(ev(1, f"fleet{i}"))) is True
    assert relay.counters["refused_new_sessions"] == 0


def test_the_budget_needs_positive_sizes():
    with pytest.raises(ValueError):
        NewSessionBudget(per_request=0)
