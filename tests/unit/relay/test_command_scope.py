"""Per-sender scoping of commands (issue 25; AEP-0004 §4.3 item 3, "who may
command whom is deployment-owned authorization ... per-sender scoping at
the relay", surfaced as ``unauthorized``): a per-emitter credential
commands only the sessions bound to it; the shared ``AEP_TOKEN`` (the
operator, the console) and the fleet command every session.

The rule as a table (``supervisor/relay/bindings.py`` ``command_refusal``)
and the embedded relay in process (``supervisor/relay/routing.py``): the
refusal is the §4.2 ``error`` frame, ``cause`` the command's id, counted
``refused_command_scope`` and ``commands_refused``, and the session's
owner never receives the command. Before the scoping, bob's command into
alice's session, the fleet's session or an unbound one was routed (or
refused ``no-route``, telling bob who is connected)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from bridges.core.aep import dumps
from supervisor.relay.bindings import (
    ANONYMOUS,
    COMMAND_SCOPE,
    FLEET,
    SHARED,
    command_refusal,
    named,
)
from supervisor.relay.core import Relay
from tests.unit.relay.test_relay_core import cmd, ev, hello, take

ALICE, BOB = named("alice"), named("bob")


@pytest.mark.parametrize(("sender", "bound", "refused"), [
    (ALICE, ALICE, False),      # a credential's own session
    (BOB, ALICE, True),         # another credential's
    (BOB, FLEET, True),         # the fleet's
    (BOB, SHARED, True),        # a shared-token emitter's
    (BOB, ANONYMOUS, True),
    (BOB, None, True),          # unbound: a credential has no claim to it
    (SHARED, ALICE, False),     # the shared token (the operator, the console): every session
    (SHARED, FLEET, False),
    (SHARED, None, False),
    (FLEET, ALICE, False),      # the daemon's own code
])
def test_the_rule(sender, bound, refused):
    why = command_refusal(sender, bound)
    assert (why is not None) is refused
    if refused:
        assert why == COMMAND_SCOPE and "commands only its own sessions" in why


async def _noop(c: Any) -> None:
    return None


async def _socket(relay: Relay, principal: str, role: str, agent: str) -> Any:
    conn = relay.open_socket(True, principal)
    await conn.handle_text(json.dumps(hello(role=role, agent=agent)))
    assert (await take(conn.outlet))[0]["type"] == "hello"
    return conn


def _relay() -> Relay:
    return Relay(token="shared", emitter_tokens={"alice": "alice-tok", "bob": "bob-tok"})


async def _send(sender: Any, c: dict[str, Any]) -> list[dict[str, Any]]:
    await sender.handle_text(json.dumps(c))
    return await take(sender.outlet)


def _commands(frames: list[Any]) -> list[str]:
    return [f["id"] for f in frames if isinstance(f, dict) and f.get("type") == "control.cancel"]


async def test_a_credential_commands_only_its_own_sessions():
    relay = _relay()
    alice = await _socket(relay, ALICE, "emitter", "al")
    await alice.handle_text(json.dumps(ev(1, session="as", agent="al")))
    assert await take(alice.outlet) == []
    assert relay.bindings.get("as").principal == ALICE
    bob = await _socket(relay, BOB, "both", "bo")
    got = await _send(bob, cmd(session="as", id="B1"))
    assert got == [{"type": "error", "cause": "B1", "code": "unauthorized",
                    "detail": COMMAND_SCOPE}], got
    assert _commands(await take(alice.outlet)) == []  # alice never received it
    assert relay.counters["refused_command_scope"] == 1
    assert relay.counters["commands_refused"] == 1 and relay.counters["commands_routed"] == 0
    # alice's own command (from another of her connections) and the shared token's route
    alice_ctl = await _socket(relay, ALICE, "consumer", "al")
    assert await _send(alice_ctl, cmd(session="as", id="A1")) == []
    operator = await _socket(relay, SHARED, "consumer", "op")
    assert await _send(operator, cmd(session="as", id="O1")) == []
    assert _commands(await take(alice.outlet)) == ["A1", "O1"]
    assert relay.counters["commands_routed"] == 2
    assert relay.counters["refused_command_scope"] == 1


async def test_a_credential_cannot_command_the_fleets_or_an_unbound_session():
    relay = _relay()
    got: list[dict[str, Any]] = []

    async def deliver(c: dict[str, Any]) -> None:
        got.append(c)

    fleet = relay.attach_emitter(hello(agent="f"), deliver)
    fleet.ingest_stamped(ev(1, session="fs"), dumps(ev(1, session="fs")))
    assert relay.bindings.get("fs").principal == FLEET
    bob = await _socket(relay, BOB, "consumer", "bo")
    for c in (cmd(session="fs", id="F1"),          # the fleet's session
              cmd(session="nobody", id="N1")):     # unbound: unauthorized, not no-route
        answer = await _send(bob, c)
        assert [(a["code"], a["cause"]) for a in answer] == [("unauthorized", c["id"])], answer
    assert got == [] and relay.counters["refused_command_scope"] == 2
    # the operator commands the fleet's session as before
    operator = await _socket(relay, SHARED, "consumer", "op")
    assert await _send(operator, cmd(session="fs", id="O1")) == []
    assert [c["id"] for c in got] == ["O1"]
    # and for the operator an unbound session is still just no-route
    assert [a["code"] for a in await _send(operator, cmd(session="nobody", id="O2"))] \
        == ["no-route"]


async def test_a_credential_cannot_command_a_shared_token_emitters_session():
    relay = _relay()
    plain = await _socket(relay, SHARED, "emitter", "pl")
    await plain.handle_text(json.dumps(ev(1, session="ps", agent="pl")))
    assert await take(plain.outlet) == []
    bob = await _socket(relay, BOB, "consumer", "bo")
    answer = await _send(bob, cmd(session="ps", id="B1"))
    assert [a["code"] for a in answer] == ["unauthorized"], answer
    assert _commands(await take(plain.outlet)) == []
