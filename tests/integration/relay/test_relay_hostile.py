"""Hostile clients against the relay's listeners (and the OTLP/HTTP
listener, served through the same ``serve_app``): every answer is a
defined refusal or a closed connection, never a dead server.

Each test sends what a hostile-client review found to break the daemon,
then asserts the listener still answers an ordinary request."""
from __future__ import annotations

import json
import logging

import httpx
import trio

from tests.support.relay_harness import running_relay

WAIT = 20

UPGRADE = (b"GET /socket HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\n\r\n")


def _masked_text_frame(text: str) -> bytes:
    b = text.encode()
    mask = b"\x01\x02\x03\x04"
    return bytes([0x81, 0x80 | len(b)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(b))


async def _raw(port: int, payload: bytes) -> bytes:
    """Send ``payload`` on a fresh TCP connection in one write and read
    whatever comes back until the server closes (or a short quiet time)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    got = b""
    async with stream:
        await stream.send_all(payload)
        with trio.move_on_after(2):
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                got += chunk
    return got


HOSTILE = [
    UPGRADE + b"x",  # hypercorn#225: h11 LocalProtocolError out of the connection handler
    UPGRADE + _masked_text_frame('{"type":"hello","versions":["0.1"]}'),
    UPGRADE.replace(b"/socket", b"/nowhere") + b"x",
    UPGRADE.replace(b"Version: 13", b"Version: 12") + b"x",
    b"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Content-Length: 1\r\n\r\nx",
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: h2c\r\n"
    b"Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\nx",
]


async def test_pipelined_websocket_upgrade_never_kills_the_relay(caplog):
    caplog.set_level(logging.DEBUG)
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        port = int(base.rsplit(":", 1)[1])
        for _ in range(3):  # repeated: each kind is logged once, counted every time
            with trio.fail_after(WAIT):
                async with trio.open_nursery() as n:
                    for payload in HOSTILE:
                        n.start_soon(_raw, port, payload)
        with trio.fail_after(WAIT):
            r = await c.get(base + "/healthz")
        assert r.status_code == 200 and r.json()["ok"] is True
        assert relay.counters["connection_errors"] >= 3
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        faults = [r.getMessage() for r in warned if "connection failed" in r.getMessage()]
        assert faults and len(faults) == len(set(faults))  # once per kind, not per connection
        assert not any(r.exc_info for r in warned)  # no traceback per hostile request


async def test_pipelined_upgrade_never_kills_the_otlp_http_listener():
    from tests.integration.otlp_in.test_otlp_receiver import local, running, url

    bridge = local()
    async with running(bridge) as (ctx, recv), httpx.AsyncClient() as c:
        port = bridge.http_address[1]
        req = UPGRADE.replace(b"/socket", b"/v1/logs")
        for payload in (req + b"x", req + b"xyz"):
            with trio.fail_after(WAIT):
                await _raw(port, payload)
        with trio.fail_after(WAIT):
            r = await c.post(url(bridge), content=json.dumps({"resourceLogs": []}),
                             headers={"content-type": "application/json"})
        assert r.status_code == 200
        assert ctx.health.counters.get("otlp.connection_errors", 0) >= 1


V = {"AEP-Version": "0.1"}
NDJSON = {"content-type": "application/x-ndjson"}


async def test_batch_with_a_lone_surrogate_is_rejected_whole_before_any_ingest():
    from tests.support.relay_harness import event

    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        poisoned = json.dumps(event(1)).replace('"session": "s1"', '"session": "p\\ud800"')
        assert "\\ud800" in poisoned
        body = "\n".join([json.dumps(event(0)), poisoned, json.dumps(event(2))])
        r = await c.post(base + "/events", content=body, headers={**V, **NDJSON})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "invalid-event" and r.json()["line"] == 1
        assert "UTF-8" in r.json()["detail"]
        assert relay.counters["events"] == 0 and relay.buffers.held("s1") == 0
        r = await c.post(base + "/events", content=json.dumps(event(3)), headers={**V, **NDJSON})
        assert r.status_code == 202
        with trio.fail_after(WAIT):
            r = await c.get(base + "/stream", params={"from": "all", "live": "0"})
        assert r.status_code == 200 and r.text.count("data: ") == 1
        assert r.text.rstrip().endswith(": replay-complete")


async def test_malformed_last_event_id_is_ignored_without_a_traceback(caplog):
    caplog.set_level(logging.DEBUG)
    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        for lei in ("s:0:\u00b2".encode("latin-1"), b"s:0:" + b"9" * 5000):
            with trio.fail_after(WAIT):
                r = await c.get(base + "/stream", params={"live": "0"},
                                headers={"last-event-id": lei})
            assert r.status_code == 200 and r.text.rstrip().endswith(": replay-complete")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def test_batch_claiming_a_held_position_with_another_event_is_rejected_whole():
    from tests.support.relay_harness import event

    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        post = lambda evs: c.post(base + "/events", content="\n".join(map(json.dumps, evs)),  # noqa: E731
                                  headers={**V, **NDJSON})
        assert (await post([event(0), event(1)])).status_code == 202
        # against the buffer: line 1 reuses seq 1 with another id
        r = await post([event(2), event(1, id="other"), event(3)])
        assert r.status_code == 400 and r.json()["line"] == 1 and "(epoch, seq)" in r.json()["detail"]
        # inside the batch: line 2 claims line 0's position
        r = await post([event(5), event(6), event(5, id="again")])
        assert r.status_code == 400 and r.json()["line"] == 2
        assert relay.buffers.held("s1") == 2 and relay.counters["events"] == 2  # nothing ingested
        r = await post([event(0), event(1), event(2)])  # redelivery plus one new
        assert r.status_code == 202 and relay.buffers.held("s1") == 3


async def test_replay_memory_is_bounded_in_bytes_and_trims_are_announced():
    """A few huge events no longer pin their size times the event cap: the
    byte budgets trim oldest first, and a resume from a trimmed position
    hears ``replay-exhausted``."""
    from tests.support.relay_harness import event

    mib = 1 << 20
    async with running_relay(buffer_bytes=3 * mib, total_bytes=5 * mib) as (relay, base), \
            httpx.AsyncClient(timeout=WAIT) as c:
        blob = "x" * mib
        for s in range(12):  # 12 MiB posted over three sessions
            r = await c.post(base + "/events", content=json.dumps(event(s, session=f"big{s % 3}",
                                                                        data={"blob": blob})),
                             headers={**V, "content-type": "application/json"})
            assert r.status_code == 202
        assert relay.buffers.bytes <= 5 * mib
        assert all(relay.buffers.held(f"big{i}") <= 2 for i in range(3))
        r = await c.get(base + "/healthz")
        assert r.json()["buffered_bytes"] == relay.buffers.bytes
        with trio.fail_after(WAIT):
            r = await c.get(base + "/stream", params={
                "live": "0", "from": json.dumps([{"session": "big0", "epoch": 0, "seq": 0}])})
        assert ": replay-exhausted big0 0:" in r.text
        # a single event over the per-session budget is delivered live, never held
        big = event(100, session="huge", data={"blob": "y" * (3 * mib)})
        r = await c.post(base + "/events", content=json.dumps(big),
                         headers={**V, "content-type": "application/json"})
        assert r.status_code == 202 and relay.buffers.held("huge") == 0
        assert relay.buffers.bytes <= 5 * mib


async def test_a_batch_with_data_above_its_declared_capture_is_rejected_whole():
    from tests.support.relay_harness import event

    async with running_relay() as (relay, base), httpx.AsyncClient() as c:
        lie = event(1, capture="metadata", data={"tool": {"name": "B"}, "result": "SECRET"})
        body = "\n".join(map(json.dumps, [event(0), lie, event(2)]))
        r = await c.post(base + "/events", content=body, headers={**V, **NDJSON})
        assert r.status_code == 400 and r.json()["line"] == 1
        assert "exceeds its declared capture" in r.json()["detail"]
        assert "SECRET" not in r.text and relay.counters["events"] == 0
        honest = event(1, capture="full", data={"tool": {"name": "B"}, "result": "SECRET"})
        r = await c.post(base + "/events", content=json.dumps(honest), headers={**V, **NDJSON})
        assert r.status_code == 202


def test_fault_log_is_once_per_kind_and_place_then_rate_limited(caplog):
    import logging as _logging

    from bridges.core.http import FaultLog, fault_kind

    log = _logging.getLogger("test.faults")
    caplog.set_level(_logging.DEBUG, logger="test.faults")
    fl = FaultLog(log, interval=3600)
    try:
        raise ExceptionGroup("x", [KeyError("secret-token-value"), ValueError("y")])
    except ExceptionGroup as e:
        err = e
    assert fault_kind(err) == "KeyError+ValueError"
    assert fl.record("KeyError+ValueError", "relay", err)
    assert not fl.record("KeyError+ValueError", "relay", err)  # suppressed within the interval
    assert fl.record("KeyError+ValueError", "otlp", err)  # another listener: its own first line
    warned = [r.getMessage() for r in caplog.records if r.levelno == _logging.WARNING]
    assert len(warned) == 2 and not any("secret-token-value" in m for m in warned)
    fl.interval = 0
    assert fl.record("KeyError+ValueError", "relay", err)
    warned = [r.getMessage() for r in caplog.records if r.levelno == _logging.WARNING]
    assert "(1 more of this kind since the last report)" in warned[-1]
    assert not any("secret-token-value" in r.getMessage() for r in caplog.records)
    assert "secret-token-value" not in caplog.text and "raised at" in caplog.text


async def test_the_otlp_http_listener_refuses_a_rebound_host():
    """DNS rebinding bypasses CORS (the page and the listener share the
    attacker's name): the loopback OTLP/HTTP listener checks Host too."""
    from tests.integration.otlp_in.test_otlp_receiver import local, running, url

    bridge = local()
    async with running(bridge) as (ctx, recv), httpx.AsyncClient() as c:
        body = json.dumps({"resourceLogs": []})
        r = await c.post(url(bridge), content=body, headers={"content-type": "application/json",
                                                             "host": "attacker.example:4318"})
        assert r.status_code == 403 and r.json()["error"] == "host-not-allowed"
        r = await c.post(url(bridge), content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200
