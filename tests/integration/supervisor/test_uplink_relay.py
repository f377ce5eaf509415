"""The uplink against the real relay (supervisor/relay/) standing in as the
remote relay, with the protocol's SDK as the consumer and the control
sender (issue 2 §4 "a second daemon instance as a remote relay", §7 "The
uplink: the remote relay down at start, killed mid-stream, restarted:
nothing at notice+ is lost, and resume by (epoch, seq) works for its
consumers").

The relay is served by ``serve_relay`` (hypercorn, trio worker) on a
loopback port; "killed" is a cancellation of everything it runs (no
``closing``, no close handshake: the in-memory buffer dies with it), and
"restarted" is a fresh Relay on the same port, as after a process restart.
The SDK's sync consumer and control client run their own threads (the SDK
demands it); the test polls what they collected. Real clock, generous
``fail_after`` waits, no duration asserted."""
from __future__ import annotations

import logging
import threading
from typing import Any

import aep_sdk
import trio

from bridges.core.asgi import refuse_upgrade
from bridges.core.bridge import BridgeContext, BridgeHealth, Outbound
from bridges.core.envelope import Stamper
from bridges.core.http import bind_socket, hyper_config, serve_app
from bridges.core.ledger import CommandLedger, Refuse, WriteResult
from supervisor.delivery.uplink import Uplink
from supervisor.relay.app import make_app
from supervisor.relay.core import Relay
from supervisor.relay.serve import serve_relay
from tests.support.net import free_port

TOKEN = "relay-token-for-tests"
WAIT = 30
SESSION = "ses-uplink"
EPOCH = 4


def event(i: int, severity: str) -> dict[str, Any]:
    ev: dict[str, Any] = {"aep": "0.1", "id": f"01UPLINK{i:06d}", "type": "x.codex.uplink.tick",
                          "time": "2026-11-30T12:00:00.000Z",
                          "source": f"aep://box/agent/codex/session/{SESSION}",
                          "agent": "codex", "session": SESSION, "seq": i, "epoch": EPOCH,
                          "capture": "metadata", "data": {"i": i}}
    if severity != "info":
        ev["severity"] = severity
    return ev


def hello(accepts: list[str] | None = None) -> dict[str, Any]:
    return {"type": "hello", "versions": ["0.1"], "role": "emitter",
            "identity": {"agent": "codex", "instance": "box/4242/otlp_in.codex"},
            "capabilities": {"emits": ["x"], "control": {"accepts": accepts or [],
                                                         "ack_window_ms": 10000}}}


class RemoteRelay:
    """A Relay served on a fixed loopback port that can be killed and
    restarted (each start is a fresh Relay: empty buffer)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.relays: list[Relay] = []
        self._scope: trio.CancelScope | None = None

    async def start(self, nursery: trio.Nursery, sockets_after: trio.Event | None = None) -> Relay:
        """A fresh relay on the port; with ``sockets_after``, WebSocket
        upgrades (the uplink) are refused 503 until it is set, while SSE
        consumers are served: the test orders who reaches the relay first."""
        relay = Relay(token=TOKEN)
        self.relays.append(relay)

        async def serve(task_status=trio.TASK_STATUS_IGNORED):
            with trio.CancelScope() as self._scope:
                if sockets_after is None:
                    await serve_relay(relay, ("127.0.0.1", self.port), task_status=task_status)
                    return
                app = make_app(relay)

                async def gated(scope, receive, send):
                    if scope["type"] == "websocket" and not sockets_after.is_set():
                        await receive()  # websocket.connect
                        return await refuse_upgrade(scope, send, 503, {"error": "held by the test"})
                    await app(scope, receive, send)

                await serve_app(gated, bind_socket("127.0.0.1", self.port), trio.Event(),
                                config=hyper_config(), before_drain=relay.close,
                                task_status=task_status)

        await nursery.start(serve)
        return relay

    def kill(self) -> None:
        assert self._scope is not None
        self._scope.cancel()

    def admitted(self, relay: Relay) -> list[dict[str, Any]]:
        return [e.attrs for e in relay.buffers.iter_entries(SESSION)] \
            if SESSION in relay.buffers else []


class Consumer:
    """``aep_sdk.subscribe`` (SSE, resume by (session, epoch, seq), (source,
    id) dedupe, reconnect with backoff), collecting into thread-safe lists."""

    def __init__(self, url: str, from_: Any = "all") -> None:
        self.events: list[dict[str, Any]] = []
        self.comments: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.sub = aep_sdk.subscribe(url, self._on_event, token=TOKEN, from_=from_,
                                     filter={"session": SESSION},
                                     on_comment=self._on_comment, on_error=self._on_error,
                                     backoff_initial_ms=100, backoff_max_ms=400,
                                     timeout_ms=5000)

    def _on_event(self, ev: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(ev)

    def _on_comment(self, c: str) -> None:
        with self._lock:
            self.comments.append(c)

    def _on_error(self, e: Exception) -> None:
        with self._lock:
            self.errors.append(type(e).__name__)

    def seqs(self) -> list[int]:
        with self._lock:
            return [e["seq"] for e in self.events]

    def close(self) -> None:
        self.sub.close()


async def wait_for(pred, what: str, timeout: float = WAIT) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.02)


async def test_relay_down_at_start_killed_mid_stream_restarted(nursery, caplog):
    caplog.set_level(logging.INFO)
    port = free_port()
    remote = RemoteRelay(port)
    cmds_send, _ = trio.open_memory_channel(16)
    up = Uplink(remote.url, TOKEN, hello(), cmds_send, outbox_size=2000,
                backoff=(0.05, 0.4), ping_interval=0.5, ping_timeout=5.0)
    sev = ["notice", "info", "warning", "debug", "error"]
    total = 600

    # 1. the remote relay is down at start: the uplink holds what it is given
    await nursery.start(up.run)
    for i in range(50):
        await up.put(event(i, sev[i % 5]))
    await wait_for(lambda: up.counters["connect_failures"] >= 1, "first refusal")
    assert not up.connected

    # 2. the relay comes up; a consumer attaches with replay-all
    relay1 = await remote.start(nursery)
    await wait_for(lambda: len(remote.admitted(relay1)) == 50, "backlog flushed")
    consumer = Consumer(remote.url)
    try:
        await wait_for(lambda: len(consumer.seqs()) == 50, "consumer caught up")

        # 3. stream, and kill the relay mid-stream: the second half is only
        # produced once the relay is dead (by construction, not by timing: on
        # a loaded machine the whole stream could otherwise be produced and
        # drained before the kill)
        half = 300
        killed, produced = trio.Event(), trio.Event()

        async def produce():
            for i in range(50, total):
                if i == half:
                    await killed.wait()
                await up.put(event(i, sev[i % 5]))
                if i % 20 == 0:
                    await trio.sleep(0.01)
            produced.set()

        nursery.start_soon(produce)
        await wait_for(lambda: len(remote.admitted(relay1)) >= 200, "streaming")
        remote.kill()
        killed.set()
        seen_before_kill = len(consumer.seqs())
        await produced.wait()
        assert up.counters["outbox"] >= total - half  # really mid-stream: held while down

        # 4. restarted on the same port (fresh buffer, as after a process
        # restart); the consumer resumes into it before the uplink may re-send
        # anything (the order that once lost events silently: the relay held
        # nothing of the session, so replay could not say the position
        # predates what it would hold)
        uplink_in = trio.Event()
        relay2 = await remote.start(nursery, sockets_after=uplink_in)
        await wait_for(lambda: relay2.stats()["subscribers"] == 1, "consumer resumed")
        resumed_after = consumer.seqs()[-1]  # its position: nothing of relay2 yet
        assert SESSION not in relay2.buffers
        uplink_in.set()
        await wait_for(lambda: up.counters["outbox"] == 0, "outbox drained")

        # nothing at notice+ lost: every notice+ event reached a relay that admitted it
        admitted = {e["id"] for r in remote.relays for e in remote.admitted(r)}
        notice_plus = {event(i, sev[i % 5])["id"] for i in range(total)
                       if sev[i % 5] not in ("info", "debug")}
        assert notice_plus <= admitted
        assert up.counters["dropped"] == 0  # (and, unpressured, nothing else was shed)
        assert up.counters["connects"] >= 2 and up.counters["disconnects"] >= 1

        # resume by (epoch, seq): the consumer reconnects to the new relay with
        # its last position and gets everything after it, in order, once
        await wait_for(lambda: consumer.seqs() and consumer.seqs()[-1] == total - 1,
                       "consumer resumed to the end")
        seqs = consumer.seqs()
        assert seqs == sorted(set(seqs)), "duplicates or reordering across the resume"
        assert len(seqs) > seen_before_kill
        missing = set(range(total)) - set(seqs)
        # the uplink re-sends in order (unconfirmed first): the first event
        # past the consumer's position decides. The only legal gap is the one
        # before it, and the relay says so exactly once (AEP-0003 §3.3 item 3)
        first = min(e["seq"] for e in remote.admitted(relay2) if e["seq"] > resumed_after)
        assert missing == set(range(resumed_after + 1, first))
        markers = [c for c in consumer.comments if c.startswith("replay-exhausted")]
        assert markers == ([f"replay-exhausted {SESSION} {EPOCH}:{first}"] if missing else []), \
            (sorted(missing)[:10], consumer.comments)
    finally:
        consumer.close()
    await up.close()


async def test_a_consumer_resuming_into_the_restarted_relay_hears_the_gap(nursery):
    """The relay restarted empty; a consumer resumes from a position it
    reached on the old relay before the uplink re-sends (what the old relay
    confirmed is gone with it): the relay holds nothing of the session, and
    the first event it then gets is past a gap, so ``replay-exhausted``
    (earliest = that event) precedes it, once (AEP-0003 §3.3 item 3)."""
    remote = RemoteRelay(free_port())
    cmds_send, _ = trio.open_memory_channel(16)
    up = Uplink(remote.url, TOKEN, hello(), cmds_send, backoff=(0.05, 0.4), ping_interval=0.5)
    relay1 = await remote.start(nursery)
    await nursery.start(up.run)
    for i in range(100):
        await up.put(event(i, "notice"))
    # all confirmed by the old relay: nothing of 0..99 will be sent again
    await wait_for(lambda: len(remote.admitted(relay1)) == 100 and up.counters["outbox"] == 0,
                   "confirmed")
    remote.kill()
    await wait_for(lambda: not up.connected, "uplink saw the kill")
    for i in range(100, 150):
        await up.put(event(i, "notice"))
    uplink_in = trio.Event()
    relay2 = await remote.start(nursery, sockets_after=uplink_in)
    consumer = Consumer(remote.url, from_=[{"session": SESSION, "epoch": EPOCH, "seq": 49}])
    try:
        await wait_for(lambda: relay2.stats()["subscribers"] == 1, "consumer resumed")
        assert SESSION not in relay2.buffers
        uplink_in.set()
        await wait_for(lambda: consumer.seqs() and consumer.seqs()[-1] == 149, "consumer at the end")
        assert consumer.seqs() == list(range(100, 150))
        assert [c for c in consumer.comments if c.startswith("replay-exhausted")] == \
            [f"replay-exhausted {SESSION} {EPOCH}:100"]
    finally:
        consumer.close()
    await up.close()


async def test_a_command_round_trips_sdk_client_relay_uplink_ledger(nursery):
    """ControlClient -> remote relay -> uplink -> bridge inbox -> CommandLedger
    -> ack via the uplink -> relay -> ControlClient. The relay refuses an
    undeclared type on the target's behalf (AEP-0004 §4.2) using the
    ``control.accepts`` the uplink's hello declared."""
    port = free_port()
    remote = RemoteRelay(port)
    await remote.start(nursery)
    cmds_send, cmds_recv = trio.open_memory_channel(16)
    up = Uplink(remote.url, TOKEN, hello(["control.cancel", "control.pause"]), cmds_send,
                backoff=(0.05, 0.4), ping_interval=0.5)
    await nursery.start(up.run)

    # the bridge side: a real BridgeContext + ledger, its channel pumped into the uplink
    chan_send, chan_recv = trio.open_memory_channel[Outbound](64)
    ctx = BridgeContext("otlp_in.codex", Stamper("codex", epoch=EPOCH, host="box"), chan_send,
                        cmds_recv, BridgeHealth(), logging.getLogger("test.bridge"))

    async def pump():
        async for item in chan_recv:
            await up.put(item.event, redelivery=item.redelivery)

    class Controller:
        accepts = ("control.cancel", "control.pause")
        ack_window_ms, guard_ms = 10_000, 8_000

        def check(self, cmd):
            if cmd["type"] == "control.pause":
                raise Refuse("refused", "nothing to pause")
            return cmd

        def note(self, plan):
            return None

        async def perform(self, plan):
            return await _ok(plan)

    nursery.start_soon(pump)
    async with CommandLedger(ctx, Controller()) as ledger:
        async with trio.open_nursery() as bridge:
            bridge.start_soon(ledger.serve, ctx.commands)
            # the session must be claimed on the relay: emit one ordinary event first
            await ctx.emit(SESSION, {"type": "x.codex.uplink.tick", "data": {}})
            await wait_for(lambda: SESSION in remote.relays[0].buffers, "session claimed")
            with trio.fail_after(WAIT):
                accepted, paused, resumed = await trio.to_thread.run_sync(drive_control, remote.url)
            bridge.cancel_scope.cancel()
    assert accepted["type"] == "control.accepted" and accepted["session"] == SESSION
    assert accepted["agent"] == "codex"
    assert paused[0] == "refused"            # the ledger's nack, via the uplink
    assert resumed[0] == "unsupported"       # the relay's behalf refusal (not declared)
    assert up.counters["commands"] == 2      # control.resume never reached the bridge
    await up.close()


def drive_control(url: str) -> list[Any]:
    """The SDK's blocking control client (its own reader thread)."""
    client = aep_sdk.ControlClient(url, agent="tester", host="laptop", token=TOKEN)
    client.connect(connect_timeout_ms=10_000)
    out: list[Any] = []
    try:
        out.append(client.send("control.cancel", SESSION, data={"scope": "session"},
                               ack_window_ms=10_000, retries=0))
        for t in ("control.pause", "control.resume"):
            try:
                client.send(t, SESSION, ack_window_ms=10_000, retries=0)
                out.append("no refusal")
            except aep_sdk.NackError as e:
                out.append((e.reason, e.detail))
    finally:
        client.close()
    return out


async def _ok(cmd: dict[str, Any]) -> WriteResult:
    await trio.lowlevel.checkpoint()
    return WriteResult(202)
