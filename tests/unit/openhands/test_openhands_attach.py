"""The attach burst: socket handshakes run at most
:data:`~bridges.openhands.receiver.ATTACH_CONCURRENCY` at once over all
conversations (a thousand at once left ~10 KiB of allocator holes per idle
conversation), every conversation still attaches, a failed or timed-out
handshake gives its slot back, and a conversation waiting for a slot is
detached by its own cancel scope."""
from __future__ import annotations

import logging

import pytest
import trio
import trio_websocket

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.openhands import receiver as R
from bridges.openhands.receiver import ATTACH_CONCURRENCY, Conversation, Receiver, Settings


class Handshakes:
    """A ``connect_websocket_url`` stand-in: counts handshakes in flight,
    each takes ``seconds`` and then fails (``OSError``) or hangs."""

    def __init__(self, seconds: float = 1.0, hang: bool = False) -> None:
        self.seconds, self.hang = seconds, hang
        self.in_flight = self.most = self.started = 0

    async def __call__(self, nursery, url, **kw):
        assert "resend_mode=" in url and kw["message_queue_size"] == 1
        self.started += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await trio.sleep(R.REST_TIMEOUT * 2 if self.hang else self.seconds)
            raise OSError("refused")
        finally:
            self.in_flight -= 1


def receiver(connect) -> Receiver:
    send, _ = trio.open_memory_channel(1000)
    _, crecv = trio.open_memory_channel(1)
    ctx = BridgeContext("openhands", Stamper("openhands", epoch=1, host="h", policy=CapturePolicy()),
                        send, crecv, BridgeHealth(), logging.getLogger("t"))
    return Receiver(Settings(url="http://127.0.0.1:1"), Posture(), ctx, None, ws_connect=connect)


def cid(i: int) -> str:
    return f"c0ffee00-0000-4000-8000-{i:012d}"


async def attempt(rx: Receiver, conv: Conversation, failures: list[type]) -> None:
    async with trio.open_nursery() as nursery:
        try:
            await rx._socket_once(conv, nursery)
        except trio_websocket.HandshakeError as e:
            failures.append(type(e))


@pytest.mark.parametrize("hang", [False, True])
async def test_handshakes_run_in_bounded_waves_and_every_conversation_attaches(autojump_clock, hang):
    hs = Handshakes(hang=hang)
    rx = receiver(hs)
    n = 3 * ATTACH_CONCURRENCY + 1
    failures: list[type] = []
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(attempt, rx, Conversation(cid(i)), failures)
    assert hs.started == n, "every conversation got its handshake"
    assert hs.most == ATTACH_CONCURRENCY, "no more than the bound at once, and the bound is used"
    # a failed or timed-out handshake gives its slot back: the waves follow each other
    per = R.REST_TIMEOUT if hang else 1.0
    assert trio.current_time() - t0 == pytest.approx(per * 4)
    want = trio_websocket.ConnectionTimeout if hang else trio_websocket.HandshakeError
    assert failures == [want] * n
    assert rx._attaching.borrowed_tokens == 0


async def test_a_conversation_waiting_for_a_slot_is_cancelled_by_its_scope(autojump_clock):
    hs = Handshakes(seconds=5.0)
    rx = receiver(hs)
    failures: list[type] = []
    async with trio.open_nursery() as nursery:
        for i in range(ATTACH_CONCURRENCY):
            nursery.start_soon(attempt, rx, Conversation(cid(i)), failures)
        await trio.sleep(0.1)
        waiting = trio.CancelScope()

        async def waiter() -> None:
            with waiting:
                await attempt(rx, Conversation(cid(99)), failures)
        nursery.start_soon(waiter)
        await trio.sleep(1)
        assert rx._attaching.statistics().tasks_waiting == 1
        waiting.cancel()
        await trio.sleep(0.1)
        assert rx._attaching.statistics().tasks_waiting == 0
    assert hs.started == ATTACH_CONCURRENCY, "the cancelled one never connected"
    assert len(failures) == ATTACH_CONCURRENCY
