"""Issue 25 attacked again: session squatting on the embedded relay.

The fix for the degraded item "one event posted into another agent's
session makes every command to that session ``ambiguous``" made the first
live claimant keep a session: a second remote emitter's sequenced events
there are refused while the first is connected. A session's claim lives
only as long as its connection, so an emitter that reconnects (a network
blip, a relay restart: every connection drops at once) leaves its session
free for whoever sends an event there first. Session ids are on ``/stream``
for anyone who reads it.

The attacker, a token holder (the token is what every party of one
deployment shares), waits for the victim's connection to drop and sends one
event in the victim's session. Then the victim's own events are refused
and the victim's commands go to the attacker, who decides them.

The real ``aep-bridges relay`` subprocess with a token; the real SDK
``open_duplex`` is the victim and the attacker; the real SDK
``ControlClient`` is the operator.
"""
from __future__ import annotations

import pytest

from tests.support.hardening import event

from .test_control_forgery import TOKEN, _ack, _answers, _emitter, _send_in_thread, relay  # noqa: F401


@pytest.mark.xfail(strict=True, reason=(
    "issue 25 re-attack: a session's claim dies with its connection, so a token holder "
    "that sends one event in it while its emitter reconnects keeps it: the real emitter's "
    "events are refused and its commands are routed to (and decided by) the attacker"))
def test_a_reconnecting_emitter_keeps_its_session_against_a_squatter(relay):  # noqa: F811
    session = "squat-victim-1"
    victim = _emitter(relay.url, "victim")
    assert _answers(victim, event(1, session, agent="victim")) == []
    victim.close()  # a blip: the victim reconnects at once
    attacker = _emitter(relay.url, "attacker")
    try:
        # the attacker read the session id on /stream and sends one event in it
        assert _answers(attacker, event(1, session, agent="attacker")) == []
        victim = _emitter(relay.url, "victim")
        # the victim's own next event (same source, next position) is taken
        assert _answers(victim, event(2, session, agent="victim")) == []
        sender, out = _send_in_thread(relay.url, session)
        # the operator's command for the session reaches the victim, who decides it
        cmd = victim.recv_json()  # bounded: the duplex's socket timeout
        assert cmd is not None and cmd["type"] == "control.cancel", cmd
        victim.send_json(_ack(cmd, "victim", 3, "control.accepted"))
        sender.join(30)
        assert out.get("ack", {}).get("agent") == "victim", out
    finally:
        victim.close()
        attacker.close()
