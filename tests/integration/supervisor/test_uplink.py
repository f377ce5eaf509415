"""The uplink (supervisor/delivery/uplink.py) against a real WebSocket server on
loopback: a small fault-injecting AEP relay stub written with trio-websocket
(AEP-0003 §3.5/§4 hello, ping/pong, error frames; killable and restartable
on the same port; can send commands). The embedded relay of
supervisor/relay/ is exercised end to end in test_uplink_relay.py.

Real sockets run on the real clock (MockClock's autojump would fire
timeouts while tasks wait on I/O), so every wait is a generous
``trio.fail_after`` and nothing asserts a duration."""
from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, serve_websocket

from supervisor.delivery.uplink import Uplink, socket_url
from tests.support.net import free_port

TOKEN = "s3cret-token-value"
WAIT = 15  # seconds; generous on a noisy machine


def event(i: int, severity: str | None = "notice", session: str = "ses-1") -> dict[str, Any]:
    ev: dict[str, Any] = {"aep": "0.1", "id": f"EV{i:05d}", "type": "progress.status",
                          "time": "2026-11-30T12:00:00.000Z",
                          "source": f"aep://box/agent/codex/session/{session}",
                          "agent": "codex", "session": session, "seq": i, "epoch": 3,
                          "capture": "metadata", "data": {"i": i}}
    if severity and severity != "info":
        ev["severity"] = severity
    return ev


def hello() -> dict[str, Any]:
    return {"type": "hello", "versions": ["0.1"], "role": "emitter",
            "identity": {"agent": "codex", "instance": "box/4242/otlp_in.codex"},
            "capabilities": {"emits": ["session", "run", "tool"],
                             "control": {"accepts": ["control.cancel"], "ack_window_ms": 10000}}}


class StubRelay:
    """A fault-injecting AEP relay: answers ``hello`` (or ``mode``
    ``version-unsupported`` / ``bad-version``), records every frame per
    incarnation, answers pings unless ``answer_pings`` is off, and can be
    killed (cancelled, no close handshake) and restarted on the same port.

    ``durable[k]``: the Events incarnation ``k`` had *processed*: those
    received before the last ping it answered. A kill loses the rest, the
    way a crashing relay loses what it had read but not handled."""

    def __init__(self, port: int = 0, *, token: str | None = TOKEN) -> None:
        self.port = port
        self.token = token
        self.mode = "ok"
        self.answer_pings = True
        self.auth: list[str | None] = []
        self.hellos: list[dict[str, Any]] = []
        self.frames: list[list[dict[str, Any]]] = []
        self.raw: list[list[str]] = []
        self.durable: list[list[dict[str, Any]]] = []
        self.closes: list[Any] = []
        self.ws: Any = None
        self.up = trio.Event()
        self._scope: trio.CancelScope | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.frames.append([]); self.raw.append([]); self.durable.append([])
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as n:
                server = await n.start(partial(serve_websocket, self._handler, "127.0.0.1",
                                               self.port, None, handler_nursery=n))
                self.port = server.port
                task_status.started()

    def kill(self) -> None:
        assert self._scope is not None
        self._scope.cancel()
        self.ws = None
        self.up = trio.Event()

    async def send(self, obj: Any) -> None:
        await self.ws.send_message(obj if isinstance(obj, (str, bytes)) else json.dumps(obj))

    async def _handler(self, request: Any) -> None:
        auth = dict((k.lower(), v) for k, v in request.headers).get(b"authorization")
        self.auth.append(auth.decode() if auth else None)
        if self.token and auth != f"Bearer {self.token}".encode():
            await request.reject(401)
            return
        ws = await request.accept()
        inc = len(self.frames) - 1
        try:
            first = json.loads(await ws.get_message())
            self.hellos.append(first)
            if self.mode == "version-unsupported":
                await ws.send_message(json.dumps({"type": "error", "code": "version-unsupported",
                                                  "versions": ["9.0"]}))
                await ws.aclose()
                return
            chosen = ["9.0"] if self.mode == "bad-version" else ["0.1"]
            await ws.send_message(json.dumps({"type": "hello", "versions": chosen,
                                              "role": "collector", "capabilities": {}}))
            self.ws = ws
            self.up.set()
            unprocessed: list[dict[str, Any]] = []
            while True:
                raw = await ws.get_message()
                self.raw[inc].append(raw)
                msg = json.loads(raw)
                self.frames[inc].append(msg)
                if msg.get("type") == "ping":
                    if self.answer_pings:
                        self.durable[inc].extend(unprocessed)
                        unprocessed.clear()
                        await ws.send_message(json.dumps({"type": "pong", "t": msg.get("t")}))
                elif "." in str(msg.get("type")):
                    unprocessed.append(msg)
        except ConnectionClosed as e:
            self.closes.append(e.reason)

    # -- views -----------------------------------------------------------
    def events(self, inc: int | None = None) -> list[dict[str, Any]]:
        groups = self.frames if inc is None else [self.frames[inc]]
        return [f for g in groups for f in g if "." in str(f.get("type"))]

    def ids(self, inc: int | None = None) -> list[str]:
        return [e["id"] for e in self.events(inc)]


async def wait_for(pred, what: str, timeout: float = WAIT) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.01)


def make_uplink(port: int, commands_send=None, **kw) -> Uplink:
    if commands_send is None:
        commands_send, _ = trio.open_memory_channel(16)
    kw.setdefault("backoff", (0.05, 0.3))
    kw.setdefault("ping_interval", 0.5)
    kw.setdefault("ping_timeout", 3.0)
    return Uplink(f"http://127.0.0.1:{port}", TOKEN, hello(), commands_send, **kw)


# -- tests -------------------------------------------------------------------

def test_socket_url_maps_schemes_and_appends_socket():
    assert socket_url("http://127.0.0.1:8787") == "ws://127.0.0.1:8787/socket"
    assert socket_url("https://relay.example:443/aep/") == "wss://relay.example:443/aep/socket"
    assert socket_url("ws://h:1") == "ws://h:1/socket"
    for bad in ("ftp://h", "127.0.0.1:8787", "http://"):
        with pytest.raises(ValueError):
            socket_url(bad)


async def test_hello_first_with_bearer_token_then_events_in_order(nursery):
    stub = StubRelay()
    await nursery.start(stub.run)
    up = make_uplink(stub.port)
    for i in range(3):
        await up.put(event(i))  # queued before the connection exists
    await nursery.start(up.run)
    await wait_for(lambda: len(stub.events()) == 3, "events")
    assert stub.auth == [f"Bearer {TOKEN}"]
    h = stub.hellos[0]
    assert h["type"] == "hello" and h["role"] == "emitter" and h["versions"] == ["0.1"]
    assert h["identity"] == {"agent": "codex", "instance": "box/4242/otlp_in.codex"}
    assert h["capabilities"]["control"] == {"accepts": ["control.cancel"], "ack_window_ms": 10000}
    assert stub.frames[0][0]["type"] != "hello"  # hello went first, once
    assert stub.ids() == ["EV00000", "EV00001", "EV00002"]
    assert stub.events()[0] == event(0)  # byte-for-byte the envelope handed in
    await wait_for(lambda: up.counters["outbox"] == 0, "confirmed")
    assert up.connected
    await up.close()


async def test_relay_down_at_start_events_held_then_delivered_in_order(nursery):
    port = free_port()
    up = make_uplink(port)
    await nursery.start(up.run)  # returns at once though nothing listens
    sevs = ["notice", "info", "debug", "warning", "error", "info", "critical"]
    for i, s in enumerate(sevs):
        await up.put(event(i, s))
    await wait_for(lambda: up.counters["connect_failures"] >= 2, "retries")
    assert not up.connected and up.counters["outbox"] == len(sevs)
    stub = StubRelay(port)
    await nursery.start(stub.run)
    await wait_for(lambda: len(stub.events()) == len(sevs), "delivery")
    assert stub.ids() == [f"EV{i:05d}" for i in range(len(sevs))]
    await up.close()


async def test_killed_mid_stream_and_restarted_loses_nothing_at_notice_plus(nursery):
    """The relay dies while the uplink streams; what it had read but not
    processed dies with it. After the restart on the same port the uplink
    re-sends the unconfirmed tail first, then the rest, in order."""
    stub = StubRelay()
    await nursery.start(stub.run)
    up = make_uplink(stub.port, outbox_size=500)
    await nursery.start(up.run)
    total = 400
    sev = ["notice", "info", "warning", "debug"]
    done = trio.Event()

    async def produce():
        for i in range(total):
            await up.put(event(i, sev[i % 4]))
            if i % 10 == 0:
                await trio.sleep(0.005)
        done.set()

    nursery.start_soon(produce)
    await wait_for(lambda: len(stub.frames[0]) >= 60, "first frames")
    stub.answer_pings = False  # the relay reads but falls behind processing ...
    await wait_for(lambda: len(stub.frames[0]) >= 100, "more frames")
    stub.kill()  # ... and dies mid-stream, no close handshake
    unprocessed = set(stub.ids(0)) - {e["id"] for e in stub.durable[0]}
    assert unprocessed  # the fault really hit events the uplink had written
    await trio.sleep(0.3)
    stub.answer_pings = True
    await nursery.start(stub.run)  # same port
    await done.wait()
    notice_plus = {f"EV{i:05d}" for i in range(total) if sev[i % 4] in ("notice", "warning")}
    processed = lambda: {e["id"] for inc in stub.durable for e in inc}  # noqa: E731
    await wait_for(lambda: notice_plus <= processed(), "every notice+ processed")
    assert up.counters["disconnects"] >= 1 and up.counters["connects"] >= 2
    assert unprocessed <= set(stub.ids(1))  # written once, lost, written again
    assert up.counters["rewound"] >= len(unprocessed)
    # incarnation 2 received the unconfirmed tail first, then the rest: in order
    second = list(dict.fromkeys(stub.ids(1)))
    assert second == sorted(second)
    # nothing shed (the outbox never filled), so everything arrived somewhere
    assert up.counters["dropped"] == 0
    assert {f"EV{i:05d}" for i in range(total)} <= set(stub.ids())
    await up.close()


async def test_commands_reach_the_bridge_inbox_and_pings_get_pongs(nursery):
    stub = StubRelay()
    await nursery.start(stub.run)
    send, recv = trio.open_memory_channel(16)
    up = make_uplink(stub.port, send)
    await nursery.start(up.run)
    await wait_for(lambda: up.connected, "connected")
    cmd = {"aep": "0.1", "id": "01CMD", "type": "control.cancel", "time": "2026-11-30T12:00:00Z",
           "source": "aep://phone/agent/telegram-sink", "agent": "telegram-sink",
           "session": "ses-1", "data": {"scope": "run"}}
    vendor = {**cmd, "id": "01CMD2", "type": "x.codex.control.instruct", "data": {"text": "hi"}}
    await stub.send(cmd)
    await stub.send({**cmd, "id": "01ACK", "type": "control.accepted"})  # not a command
    await stub.send("{not json")
    await stub.send(b"\x00binary")
    await stub.send([1, 2])
    await stub.send({"type": "some-future-frame"})
    await stub.send(vendor)
    await stub.send({"type": "ping", "t": 42})
    with trio.fail_after(WAIT):
        assert await recv.receive() == cmd
        assert await recv.receive() == vendor
    await wait_for(lambda: any(f == {"type": "pong", "t": 42} for f in stub.frames[0]), "pong")
    assert up.counters["commands"] == 2
    assert up.counters["malformed_frames"] == 4  # the ack, junk, binary, non-object
    assert up.connected and up.counters["disconnects"] == 0  # bad frames never kill it
    await up.close()


async def test_a_full_control_inbox_drops_the_command_and_counts_it(nursery):
    stub = StubRelay()
    await nursery.start(stub.run)
    send, recv = trio.open_memory_channel(1)
    up = make_uplink(stub.port, send)
    await nursery.start(up.run)
    await wait_for(lambda: up.connected, "connected")
    for i in range(3):
        await stub.send({"aep": "0.1", "id": f"C{i}", "type": "control.pause",
                         "source": "aep://x/agent/y", "agent": "y", "session": "s"})
    await wait_for(lambda: up.counters["commands"] == 3, "commands")
    assert up.counters["commands_dropped"] == 2
    assert recv.receive_nowait()["id"] == "C0"
    await up.close()


async def test_a_dead_peer_is_detected_by_ping_timeout_and_reconnected(nursery):
    stub = StubRelay()
    await nursery.start(stub.run)
    up = make_uplink(stub.port, ping_interval=0.2, ping_timeout=1.0)
    await nursery.start(up.run)
    await wait_for(lambda: up.connected, "connected")
    stub.answer_pings = False  # the relay stops answering: a half-dead peer
    await up.put(event(1))
    await wait_for(lambda: up.counters["dead_peer"] >= 1, "dead peer")
    stub.answer_pings = True
    await wait_for(lambda: up.counters["connects"] >= 2 and up.counters["outbox"] == 0,
                   "reconnected and confirmed")
    assert "EV00001" in {e["id"] for inc in stub.durable for e in inc}
    await up.close()


@pytest.mark.parametrize("mode", ["version-unsupported", "bad-version"])
async def test_version_refusal_backs_off_and_recovers(nursery, mode):
    stub = StubRelay()
    stub.mode = mode
    await nursery.start(stub.run)
    up = make_uplink(stub.port)
    await up.put(event(0))
    await nursery.start(up.run)
    await wait_for(lambda: len(stub.hellos) >= 2, "retried")
    assert not up.connected and up.counters["connects"] == 0
    assert stub.events() == []  # nothing before a completed hello
    stub.mode = "ok"
    await wait_for(lambda: stub.ids() == ["EV00000"], "delivered after recovery")
    await up.close()


async def test_bad_token_is_refused_counted_and_never_logged(nursery, caplog):
    caplog.set_level(logging.DEBUG)
    stub = StubRelay(token="another-token")
    await nursery.start(stub.run)
    up = make_uplink(stub.port)
    await nursery.start(up.run)
    await wait_for(lambda: up.counters["connect_failures"] >= 2, "refused")
    assert not up.connected
    assert TOKEN not in caplog.text
    assert "401" in caplog.text
    await up.close()


async def test_redelivery_is_forwarded_byte_identically(nursery):
    stub = StubRelay()
    await nursery.start(stub.run)
    up = make_uplink(stub.port)
    await nursery.start(up.run)
    ack = {**event(5), "type": "control.accepted", "cause": "01CMD"}
    await up.put(ack)
    await up.put(ack, redelivery=True)
    await wait_for(lambda: len(stub.events()) == 2, "both")
    raws = [r for r in stub.raw[0] if '"control.accepted"' in r]
    assert len(raws) == 2 and raws[0] == raws[1]
    await up.close()


async def test_close_flushes_then_closing_frame_then_1001(nursery):
    stub = StubRelay()
    await nursery.start(stub.run)
    up = make_uplink(stub.port)
    await nursery.start(up.run)
    await wait_for(lambda: up.connected, "connected")
    stub.answer_pings = False  # hold confirmations: close must wait for them
    for i in range(20):
        await up.put(event(i))
    await trio.sleep(0.1)
    stub.answer_pings = True
    await up.close("maintenance")
    assert not up.connected
    await wait_for(lambda: stub.closes, "server saw the close")
    assert stub.ids() == [f"EV{i:05d}" for i in range(20)]
    types = [f.get("type") for f in stub.frames[0]]
    assert types[-1] == "closing"
    closing = stub.frames[0][-1]
    assert closing["reason"] == "maintenance" and closing["delivered"] == []
    assert stub.closes[0].code == 1001
    assert up.counters["undelivered_at_close"] == 0


async def test_close_while_the_relay_is_down_is_bounded_and_counts_the_rest(nursery):
    up = make_uplink(free_port(), flush_deadline=0.5)
    await nursery.start(up.run)
    for i in range(5):
        await up.put(event(i))
    with trio.fail_after(WAIT):
        await up.close()
    assert up.counters["undelivered_at_close"] == 5
    await up.put(event(6))  # after close: never blocks
    assert up.counters["undelivered_at_close"] >= 5


async def test_backpressure_sheds_debug_info_and_blocks_on_notice(nursery):
    port = free_port()
    up = make_uplink(port, outbox_size=4)
    await nursery.start(up.run)
    for i in range(4):
        await up.put(event(i, "notice"))
    # full of notice+: debug/info are shed at once and counted ...
    with trio.fail_after(WAIT):
        await up.put(event(10, "debug"))
        await up.put(event(11, None))
    assert up.counters["dropped_debug"] == 1 and up.counters["dropped_info"] == 1
    # ... a notice waits (backpressure) until the relay takes the backlog
    blocked = trio.Event()
    delivered = trio.Event()

    async def put_notice():
        blocked.set()
        await up.put(event(4, "warning"))
        delivered.set()

    nursery.start_soon(put_notice)
    await blocked.wait()
    await trio.sleep(0.3)
    assert not delivered.is_set() and up.counters["put_waits"] == 1
    stub = StubRelay(port)
    await nursery.start(stub.run)
    with trio.fail_after(WAIT):
        await delivered.wait()
    await wait_for(lambda: len(stub.events()) == 5, "all notice+ delivered")
    assert stub.ids() == [f"EV{i:05d}" for i in range(5)]
    await up.close()


async def test_an_oversized_event_is_refused_counted_and_does_not_wedge_the_outbox(nursery):
    stub = StubRelay()
    await nursery.start(stub.run)
    up = make_uplink(stub.port, max_frame=2000)
    await nursery.start(up.run)
    big = {**event(0), "data": {"blob": "x" * 5000}}
    await up.put(big)
    await up.put(event(1))
    await wait_for(lambda: stub.ids() == ["EV00001"], "the next event flows")
    assert up.counters["oversize"] == 1
    await up.close()
