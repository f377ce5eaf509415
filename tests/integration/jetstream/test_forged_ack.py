"""Issue 25 row 6 on the JetStream relay: an ack is admitted only from the
connection the command was routed to. Two JetStream relays on a real
nats-server; the target is a ``/socket`` emitter on relay A, the command
comes through relay B (the SDK ``ControlClient``), the forger is a token
holder posting to relay B and sending on relay A."""
from __future__ import annotations

from typing import Any

import httpx
import trio
from aep_sdk.control import open_duplex

from tests.integration.hardening.test_control_forgery import _ack, _answers, _send_in_thread
from tests.support.hardening import event
from tests.support.js_relay_harness import TOKEN, running_js_relay
from tests.support.nats import NatsCluster
from tests.support.relay_harness import wait_until

VERB = "control.cancel"


def _duplex(url: str, role: str, agent: str, accepts: list[str] | None = None) -> Any:
    d = open_duplex(url, token=TOKEN, connect_timeout_ms=10_000)
    caps: dict[str, Any] = {"emits": ["tool", "control"]}
    if accepts is not None:
        caps["control"] = {"accepts": accepts, "ack_window_ms": 10_000}
    d.send_json({"type": "hello", "versions": ["0.1"], "role": role,
                 "identity": {"agent": agent, "instance": f"{agent}/1"}, "capabilities": caps})
    assert d.recv_json()["type"] == "hello"
    return d


async def test_a_forged_ack_is_refused_by_the_jetstream_relay(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        async with running_js_relay(c.url, token=TOKEN) as (ra, base_a), \
                running_js_relay(c.url, token=TOKEN) as (rb, base_b):
            target = await trio.to_thread.run_sync(lambda: _duplex(base_a, "emitter", "victim",
                                                                   [VERB]))
            forger = await trio.to_thread.run_sync(lambda: _duplex(base_a, "consumer", "x"))
            try:
                got = await trio.to_thread.run_sync(
                    lambda: _answers(target, event(1, "js-forged", agent="victim")))
                assert got == []
                await wait_until(lambda: "js-forged" in ra.claims._holders)
                sender, out = await trio.to_thread.run_sync(
                    lambda: _send_in_thread(base_b, "js-forged", TOKEN))
                with trio.fail_after(30):
                    cmd = await trio.to_thread.run_sync(target.recv_json, abandon_on_cancel=True)
                assert cmd is not None and cmd["type"] == VERB, cmd
                forged = _ack(cmd, "x", 1, "control.rejected", reason="refused")
                r = await trio.to_thread.run_sync(lambda: httpx.post(
                    base_b + "/events", json=forged, trust_env=False, timeout=10,
                    headers={"authorization": f"Bearer {TOKEN}", "aep-version": "0.1"}))
                assert r.status_code == 403 and r.json()["error"] == "unauthorized", r.text
                answers = await trio.to_thread.run_sync(lambda: _answers(forger, forged))
                assert [a.get("code") for a in answers] == ["unauthorized"], answers
                ok = await trio.to_thread.run_sync(
                    lambda: _answers(target, _ack(cmd, "victim", 2, "control.accepted")))
                assert ok == []
                await trio.to_thread.run_sync(lambda: sender.join(30))
                assert "ack" in out, out
                assert ra.counters["refused_acks"] == 1 and rb.counters["refused_acks"] == 1
            finally:
                target.close()
                forger.close()
