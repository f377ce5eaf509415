"""Issue 25, per-sender command scoping across JetStream relays (AEP-0004
§4.3 item 3, ``supervisor/jetstream/owners.py`` ``Owners.command_scope``):
a per-emitter credential's command is routed only into a session KV
``AEP_bindings`` binds to that credential. Before, bob (his own
credential, on relay B) commanded alice's session (alice on relay A: the
claims bucket routed it to her), a daemon's fleet session and any other.

The real ``nats-server``, two real :class:`JetStreamRelay` served on
loopback with the same two credentials, a real Fleet (its sessions bound
``fleet`` in the bucket), alice as the SDK duplex (a ``ControlTarget``
answering what reaches her), every sender the SDK ``ControlClient``."""
from __future__ import annotations

from typing import Any

import trio
from aep_sdk.control import ControlClient, NackError

from tests.support.js_relay_harness import TOKEN, SocketEmitter, running_js_relay
from tests.support.nats import NatsCluster

from .fleet_support import BurstBridge, running_fleet, wait_published

ALICE, BOB = "alice-credential-js-5b1e", "bob-credential-js-8c02"
CREDS = {"alice": ALICE, "bob": BOB}


async def _wait(pred, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


def _command(url: str, session: str, token: str, agent: str) -> tuple[str, Any]:
    """Blocking: one ``control.cancel`` with the SDK ``ControlClient``
    (``agent``: who the target sees): ``("accepted", ack)`` or the nack's
    ``(reason, detail)``."""
    client = ControlClient(url, agent=agent, host="laptop", token=token)
    client.connect(connect_timeout_ms=10_000)
    try:
        return "accepted", client.send("control.cancel", session, ack_window_ms=20_000, retries=0)
    except NackError as e:
        return e.reason, e.detail
    finally:
        client.close()


async def command(url: str, session: str, token: str, agent: str) -> tuple[str, Any]:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(lambda: _command(url, session, token, agent))


async def test_a_credential_commands_only_its_own_sessions_on_every_relay(tmp_path) -> None:
    with NatsCluster(1, tmp_path / "nats") as c:
        bridge = BurstBridge(1, sessions=1, prefix="fleet")
        async with running_fleet(tmp_path, [bridge], c.url, token=TOKEN) as fleet, \
                running_js_relay(c.url, token=TOKEN, emitter_tokens=CREDS) as (ra, a), \
                running_js_relay(c.url, token=TOKEN, emitter_tokens=CREDS) as (rb, b):
            await wait_published(fleet, 1)
            await _wait(lambda: fleet.jetstream.presence.counters["claims_put"] >= 1)
            fleet_session = bridge.emitted[0]["session"]
            alice = await trio.to_thread.run_sync(lambda: SocketEmitter(
                a, token=ALICE, agent="alice", host="box-a", accepts=["control.cancel"]))
            try:
                session = "js-scope-alice-1"
                alice.session(session).emit("run.started", severity="notice")
                with trio.fail_after(30):  # alice's claim is in the claims bucket
                    while not any(x["session"] == session for x in await rb.roster_async()):
                        await trio.sleep(0.05)
                # bob, on the other relay, into alice's session, the fleet's, an unbound one
                for target in (session, fleet_session, "js-scope-nobody"):
                    reason, detail = await command(b, target, BOB, "bob-ops")
                    assert reason == "unauthorized", (target, reason, detail)
                    assert "commands only its own sessions" in detail, detail
                assert rb.counters["refused_command_scope"] == 3, rb.counters
                assert rb.counters["commands_refused"] == 3, rb.counters
                # alice's own command and the operator's, both through relay B:
                # routed by the claims bucket to alice on relay A
                for token, agent in ((ALICE, "alice-ops"), (TOKEN, "console")):
                    status, ack = await command(b, session, token, agent)
                    assert status == "accepted", (agent, status, ack)
                assert [x["agent"] for x in alice.executed] == ["alice-ops", "console"], \
                    alice.executed  # bob's never reached her
                # the operator still commands the fleet's session (its bridge
                # accepts nothing: refused by the target's gate, not the scope)
                status, detail = await command(b, fleet_session, TOKEN, "console")
                assert status == "unsupported", (status, detail)
                assert rb.counters["refused_command_scope"] == 3
            finally:
                alice.close()


async def test_a_credentials_command_while_nats_is_down_is_no_route_not_guessed(tmp_path) -> None:
    """The scope lives in the bucket: while this relay cannot reach NATS a
    credential's command is refused ``no-route`` with retry advice (counted
    ``commands_unreachable``), neither routed nor refused as unauthorized
    on a guess, and never left hanging."""
    with NatsCluster(1, tmp_path / "nats") as c:
        async with running_js_relay(c.url, token=TOKEN, emitter_tokens=CREDS) as (relay, base):
            await trio.to_thread.run_sync(c.kill, 0)
            with trio.fail_after(10):
                while relay.link.connected:
                    await trio.sleep(0.05)
            with trio.move_on_after(40) as waited:
                reason, detail = await trio.to_thread.run_sync(
                    lambda: _command(base, "js-scope-down", BOB, "bob-ops"),
                    abandon_on_cancel=True)
            assert not waited.cancelled_caught, "ControlClient.send() never returned"
            # (the SDK reports a refusal while its subscribe is unanswered as
            # "invalid" with the relay's code first: test_relay_outage.py)
            assert "no-route" in (reason, str(detail).split(":")[0]), (reason, detail)
            assert "retry" in str(detail), detail
            assert relay.counters["commands_unreachable"] >= 1
            assert relay.counters["refused_command_scope"] == 0
            await trio.to_thread.run_sync(c.start, 0)
