"""Claim identity is exact (issue 14's leftover): two bridges of one agent
on one daemon claiming one session are two claimants in the claims bucket
(``<agent>.<session>.<daemon>.<bridge>``), so a JetStream relay answers
``ambiguous`` itself and its roster lists both (AEP-0003 §4.1, AEP-0004
§4.2); the old key shared by them (``<agent>.<session>.<daemon>``) made
one roster entry of two claims. A key of the old shape (a daemon of the
previous release, or one upgraded in place) is still read, and a claim
present in both shapes is one claimant, not an ambiguity."""
from __future__ import annotations

from typing import Any

import trio

from supervisor.jetstream import subjects as S
from supervisor.jetstream.link import aio, open_link
from tests.integration.jetstream.fleet_support import running_fleet
from tests.integration.supervisor.test_fleet_control import ToyBridge
from tests.support.js_relay_harness import TOKEN, roster_of, running_js_relay
from tests.support.nats import NatsCluster


class OtherToy(ToyBridge):
    name = "toy2"


def _command(url: str, session: str) -> tuple[str, Any]:
    import aep_sdk
    client = aep_sdk.ControlClient(url, agent="tester", host="laptop", token=TOKEN)
    client.connect(connect_timeout_ms=10_000)
    try:
        return "accepted", client.send("control.cancel", session, run="r1",
                                       ack_window_ms=10_000, retries=0)
    except aep_sdk.NackError as e:
        return e.reason, e.detail
    finally:
        client.close()


async def _keys(link) -> list[str]:
    kv = await aio(link.js.key_value)("AEP_claims")
    try:
        return sorted(await aio(kv.keys)())
    except Exception:  # noqa: BLE001 -- nats-py: NoKeysError when empty
        return []


async def test_two_bridges_of_one_agent_on_one_daemon_are_two_claimants(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        async with running_fleet(tmp_path, [ToyBridge(), OtherToy()], c.url,
                                 token=TOKEN) as fleet, \
                running_js_relay(c.url, token=TOKEN) as (relay, base), \
                open_link(fleet.cfg.nats) as link:
            d = fleet.jetstream.daemon
            want = sorted(S.claim_key("toy-agent", "toy-1", d, b) for b in ("toy", "toy2"))
            with trio.fail_after(20):
                while await _keys(link) != want:
                    await trio.sleep(0.1)
            roster = await trio.to_thread.run_sync(roster_of, base)
            assert len([r for r in roster if r["session"] == "toy-1"]) == 2, roster
            reason, detail = await trio.to_thread.run_sync(_command, base, "toy-1")
            assert reason == "invalid" and detail.startswith("ambiguous: 2 "), (reason, detail)
            assert relay.counters["commands_forwarded"] == 0  # decided from the claims alone


async def test_an_old_shape_key_of_the_same_claim_is_one_claimant(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        bridge = ToyBridge()
        async with running_fleet(tmp_path, [bridge], c.url, token=TOKEN,
                                 AEP_NATS_CLAIM_TTL="120") as fleet, \
                running_js_relay(c.url, token=TOKEN) as (relay, base), \
                open_link(fleet.cfg.nats) as link:
            d = fleet.jetstream.daemon
            new = S.claim_key("toy-agent", "toy-1", d, "toy")
            with trio.fail_after(20):
                while new not in await _keys(link):
                    await trio.sleep(0.1)
            kv = await aio(link.js.key_value)("AEP_claims")
            value = (await aio(kv.get)(new)).value
            # what the previous release wrote for this very claim
            await aio(kv.put)(S.claim_key("toy-agent", "toy-1", d, None), value)
            roster = await trio.to_thread.run_sync(roster_of, base)
            assert len([r for r in roster if r["session"] == "toy-1"]) == 1, roster
            outcome, ack = await trio.to_thread.run_sync(_command, base, "toy-1")
            assert outcome == "accepted", ack
            assert ack["type"] == "control.accepted"
            with trio.fail_after(10):  # the write follows the accepted ack
                while len(bridge.writes) < 1:
                    await trio.sleep(0.05)
            assert len(bridge.writes) == 1
            # the old shape alone (an old daemon) still routes (the daemon's
            # refresh, every TTL/3 = 40 s, would put the new key back)
            await aio(kv.delete)(new)
            assert new not in await _keys(link)
            outcome, ack = await trio.to_thread.run_sync(_command, base, "toy-1")
            assert outcome == "accepted", ack
            # the ack can reach the client before the relay has read the NATS
            # reply (its counter) or the bridge has made its write
            with trio.fail_after(10):
                while relay.counters["commands_forwarded"] < 2 or len(bridge.writes) < 2:
                    await trio.sleep(0.05)
            assert relay.counters["commands_forwarded"] == 2 and len(bridge.writes) == 2
