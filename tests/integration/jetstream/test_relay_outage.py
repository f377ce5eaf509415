"""A JetStream relay while its NATS is down (issue 14's leftovers): a
command the SDK's ``ControlClient`` sends gets the defined refusal promptly
(AEP-0004 §4.2: the relay cannot route it now, ``no-route``, a
connection-scoped ``error`` frame with ``cause`` = the command id), and the
connection survives; the relay logs the outage once, not one "consumer
lost" line per retry."""
from __future__ import annotations

import json
import logging
import time
from typing import Any

import trio

from tests.support.js_relay_harness import TOKEN, running_js_relay
from tests.support.nats import NatsCluster


def _send(url: str, session: str) -> tuple[str, Any, float]:
    """``(reason or "accepted", detail or ack, seconds)`` of one command."""
    import aep_sdk
    client = aep_sdk.ControlClient(url, agent="tester", host="laptop", token=TOKEN)
    client.connect(connect_timeout_ms=10_000)
    t0 = time.monotonic()
    try:
        ack = client.send("control.cancel", session, ack_window_ms=5_000, retries=0)
        return "accepted", ack, time.monotonic() - t0
    except aep_sdk.NackError as e:
        return e.reason, e.detail, time.monotonic() - t0
    finally:
        client.close()


async def test_a_command_while_nats_is_down_is_refused_no_route_not_left_hanging(
        tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base):
            await trio.to_thread.run_sync(c.kill, 0)
            with trio.fail_after(10):
                while relay.link.connected:
                    await trio.sleep(0.05)
            # the SDK waits for "subscribed" without a timeout, then for the
            # ack: a relay that answers neither leaves send() blocked forever
            # (abandon the thread then: the assertion below fails instead)
            with trio.move_on_after(40) as waited:
                reason, detail, _ = await trio.to_thread.run_sync(
                    _send, base, "s1", abandon_on_cancel=True)
            assert not waited.cancelled_caught, "ControlClient.send() never returned"
            # a synthesized "timeout" would mean the relay said nothing
            assert reason == "invalid" and detail.startswith("no-route: "), (reason, detail)
            assert "retry" in detail
            assert relay.counters["commands_refused"] >= 1
            await trio.to_thread.run_sync(c.start, 0)


def _lines(caplog, text: str, level: int | None = None) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()
            and (level is None or r.levelno == level)]


async def test_an_outage_is_logged_once_and_live_subscriptions_resume_after_it(
        tmp_path, caplog) -> None:
    """Two live SSE subscriptions through a 6 s outage: one warning for the
    consumers (not one "consumer lost ... remade" per retry, every 0.2-5 s
    per subscription), one line for the recovery, and both subscriptions
    get what is published after NATS is back, nothing twice."""
    import httpx

    from tests.integration.jetstream.test_js_relay import AUTH, POST, ndjson
    from tests.support.relay_harness import SSE, event, wait_until
    caplog.set_level(logging.DEBUG, logger="aep.relay.jetstream")
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (relay, base), \
                httpx.AsyncClient(timeout=60) as client, trio.open_nursery() as n:
            subs = [SSE(), SSE()]
            for s, flt in zip(subs, ('{"session": "s1"}', '{}'), strict=True):
                await n.start(lambda task_status, s=s, flt=flt: s.run(
                    client, base + "/stream", headers=AUTH, params={"filter": flt},
                    task_status=task_status))
            # an SSE response starts before its consumer's live start is fixed
            await wait_until(lambda: len(relay.consumers) == 2, timeout=30)
            assert (await client.post(base + "/events", headers=POST,
                                      content=ndjson([event(0)]))).status_code == 202
            await wait_until(lambda: all(len(s.messages) == 1 for s in subs), timeout=30)
            await trio.to_thread.run_sync(c.kill, 0)
            await trio.sleep(6.0)  # many retry periods of every consumer loop
            await trio.to_thread.run_sync(c.start, 0)
            await wait_until(lambda: relay.link.connected, timeout=30)
            with trio.fail_after(60):
                while True:  # the stream's leader may take a moment after the restart
                    r = await client.post(base + "/events", headers=POST,
                                          content=ndjson([event(1), event(2)]))
                    if r.status_code == 202:
                        break
                    await trio.sleep(0.5)
            await wait_until(lambda: all(len(s.messages) == 3 for s in subs), timeout=60)
            for s in subs:
                seqs = [json.loads(m["data"])["seq"] for m in s.messages]
                assert seqs == [0, 1, 2]
            n.cancel_scope.cancel()
    lost = _lines(caplog, "consumer lost")
    assert lost == [], [r.getMessage() for r in lost]
    warned = _lines(caplog, "NATS unreachable", logging.WARNING)
    assert len(warned) == 1, [r.getMessage() for r in warned]
    back = _lines(caplog, "NATS is back", logging.INFO)
    assert len(back) == 1, [r.getMessage() for r in back]
    assert relay.outage.spells == {"consumers": 1}
