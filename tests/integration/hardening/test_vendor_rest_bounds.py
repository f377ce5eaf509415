"""A hostile (or port-squatting) vendor server against the bridges' REST
reads (round 15 of issue 25, finding 2): the OpenHands bridge's
conversation search and the OpenCode family's reconcile reads, answered
with a body past the 16 MiB cap (40 MB, streamed), an endless body, and
200,000 ``[``. Each answer is refused with the rest unread (the server
counts what it sent and sees the connection closed), counted as that
bridge counts a malformed answer, and the bridge keeps running: it polls
or retries again (before the fix the reads were whole, an endless body grew
memory without end, and the nesting crashed the bridge on every poll with a
``RecursionError``)."""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import pytest
import trio

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.rest import MAX_BODY
from bridges.opencode_sse import PROFILE
from bridges.sse_common.bridge import SseBridge
from bridges.sse_common.config import SseConfig
from bridges.sse_common.receiver import ReceiverSettings
from supervisor.fleet import run_bridge
from tests.support.hostile_vendor import HostileVendor
from tests.support.opencode import sse_frame
from tests.support.openhands import SESSION_KEY, Rig

#: the kernel's socket buffers and one read beyond the cap (sent, never read)
SLACK = 16 << 20
MODES = ["huge", "endless", "deep"]


async def until(pred, what: str, timeout: float = 60) -> None:
    with trio.fail_after(timeout):  # a bound on waiting, not a timing assertion
        while not pred():
            await trio.sleep(0.05)


def bounded(server: HostileVendor) -> None:
    """Every answer the bridge stopped reading was cut near the cap."""
    for a in server.answers:
        if server.mode == "deep":
            assert a.sent == 200_000
        else:
            assert a.cut and a.sent < MAX_BODY + SLACK, (a.path, a.sent)


@pytest.mark.parametrize("mode", MODES)
async def test_openhands_search_answers_past_the_bounds_are_counted_and_polled_again(tmp_path, mode):
    server = HostileVendor(mode)
    async with trio.open_nursery() as n:
        await n.start(server.serve)
        rig = Rig({"AEP_OPENHANDS_URL": server.url, "AEP_OPENHANDS_SESSION_API_KEY": SESSION_KEY,
                   "AEP_OPENHANDS_POLL": "0.2", "AEP_STATE_DIR": str(tmp_path / "state")})
        await n.start(rig.run)
        # a failed search backs off 1 s, then 2 s: a third search is the bridge going on
        await until(lambda: rig.health.counters.get("search_errors", 0) >= 2
                    and len(server.answers) >= 2 and all(a.cut or a.done for a in server.answers),
                    "two refused searches")
        assert rig.health.source == "degraded"
        assert not rig.receiver.conversations  # nothing of the refused answers was taken
        bounded(server)
        n.cancel_scope.cancel()


async def test_openhands_search_pages_of_more_than_asked_are_refused_whole(tmp_path):
    """Round 16: a server answering every search page with 65,000 valid ids
    (2.9 MB, under every byte and JSON cap) and a next page, 100 pages a
    poll, had the daemon walk 6.5 million ids on the event loop, grow to
    1 GB and attach conversations by the thousand; 11-15 of 50 gated hooks
    failed open. A page of more items than asked (100) is refused whole."""
    server = HostileVendor("pages")
    async with trio.open_nursery() as n:
        await n.start(server.serve)
        rig = Rig({"AEP_OPENHANDS_URL": server.url, "AEP_OPENHANDS_SESSION_API_KEY": SESSION_KEY,
                   "AEP_OPENHANDS_POLL": "0.2", "AEP_STATE_DIR": str(tmp_path / "state")})
        await n.start(rig.run)
        await until(lambda: rig.health.counters.get("search_errors", 0) >= 2, "two refused searches")
        assert rig.health.source == "degraded"
        assert not rig.receiver.conversations
        # one page a poll, never the next
        assert len(server.answers) == rig.health.counters["search_errors"]
        n.cancel_scope.cancel()


@asynccontextmanager
async def opencode_on(server: HostileVendor):
    async with trio.open_nursery() as n:
        await n.start(server.serve)
        cfg = SseConfig.defaults(PROFILE, url=server.url, password="stub-pw-123", primary=True)
        settings = ReceiverSettings(heartbeat_timeout=600.0, backoff_initial=0.05, backoff_max=0.2,
                                    degraded_interval=600.0, reconcile_retry=0.2, request_timeout=10.0)
        b = SseBridge(PROFILE, cfg, policy=CapturePolicy(), receiver_settings=settings)
        out_s, out_r = trio.open_memory_channel(100_000)
        _cmd_s, cmd_r = trio.open_memory_channel(16)
        ctx = BridgeContext(b.name, Stamper("opencode", epoch=1, host="stub"), out_s, cmd_r,
                            BridgeHealth(), logging.getLogger("aep.test"))
        run = await n.start(run_bridge, b, ctx)
        yield ctx, run
        n.cancel_scope.cancel()


@pytest.mark.parametrize("mode", MODES)
async def test_opencode_reconcile_answers_past_the_bounds_are_counted_and_retried(mode):
    """Every REST route answers the hostile body (``/session/status`` is the
    one the attack named); the event stream stays up, so the reconcile runs
    at connect and is retried while it cannot read a directory."""
    server = HostileVendor(mode, sse_path="/global/event",
                           sse_first=sse_frame({"type": "server.connected", "properties": {}}))
    async with opencode_on(server) as (ctx, run):
        await until(lambda: ctx.health.counters.get("reconcile_errors", 0) >= 2
                    and all(a.cut or a.done for a in server.answers), "two refused reconciles")
        assert any(a.path.startswith("/session/status") for a in server.answers)
        assert run.receiver.connected and ctx.health.counters.get("reconnects", 0) == 0
        assert run.receiver.reconcile_pending
        bounded(server)


async def test_doctor_reads_a_vendor_servers_status_never_its_body():
    """``aep-bridges doctor``'s reachability check of a vendor URL: the
    status line is the answer, a 40 MB body is left unread."""
    from supervisor.tools.doctor import reachable
    server = HostileVendor("huge")
    async with trio.open_nursery() as n:
        await n.start(server.serve)
        found = await trio.to_thread.run_sync(lambda: reachable(
            "openhands", server.url, start="the agent server", setting="AEP_OPENHANDS_URL"))
        assert found.ok and "HTTP 200" in found.what
        await until(lambda: server.answers and server.answers[0].cut, "the connection closed")
        assert server.answers[0].sent < server.size
        n.cancel_scope.cancel()
