"""Issue 25 attacked again: session squatting on the embedded relay.

The fix for the degraded item "one event posted into another agent's
session makes every command to that session ``ambiguous``" made the first
live claimant keep a session: a second remote emitter's sequenced events
there were refused while the first was connected. The claim lived only as
long as its connection, so an emitter that reconnects (a network blip, a
relay restart: every connection drops at once) left its session free for
whoever sent an event there first. Session ids are on ``/stream`` for
anyone who reads it. The attacker, a token holder (the token is what every
party of one deployment shares), waited for the victim's connection to
drop and sent one event in the victim's session: then the victim's own
events were refused and the victim's commands went to the attacker, who
decided them (a *diversion*, which AEP-0004 §8 says a claimed name must
never achieve).

Now a session is bound to the principal that first claimed it
(``supervisor/relay/bindings.py``, README "Security"):

- with the shared token alone nobody can be told apart, so the session is
  held for its first claimant's ``source`` while it is connected and for
  ``AEP_CLAIM_GRACE`` seconds after it left: the attacker *under another
  source* is refused and counted (first test; the stated limit is an
  attacker who copies the victim's source: per-emitter credentials lift it);
- with per-emitter credentials (``AEP_EMITTER_TOKENS``) the session is the
  credential's: an attacker who holds a valid token (the shared one) but
  not the victim's credential is refused even under the victim's own
  ``source`` and agent, before and after a relay restart, on ``/socket``
  and ``POST /events`` (second and third tests).

The real ``aep-bridges relay`` subprocess with a token; the real SDK
``open_duplex`` is the victim and the attacker; the real SDK
``ControlClient`` is the operator.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, post_events

from .test_control_forgery import (  # noqa: F401
    TOKEN,
    _ack,
    _answers,
    _connections,
    _emitter,
    _relay_counters,
    _send_in_thread,
    _wait_connections,
    relay,
)

VICTIM_CRED = "victim-credential-7f3a"


def _codes(answers: list[dict]) -> list[str | None]:
    return [a.get("code") for a in answers]


def _victim_decides(url: str, victim, session: str, seq: int) -> None:
    """The operator's command for ``session`` reaches ``victim``, who decides
    it; the sender settles on the victim's ack."""
    sender, out = _send_in_thread(url, session)
    cmd = victim.recv_json()  # bounded: the duplex's socket timeout
    assert cmd is not None and cmd["type"] == "control.cancel", (cmd, out)
    victim.send_json(_ack(cmd, "victim", seq, "control.accepted"))
    sender.join(30)
    assert out.get("ack", {}).get("agent") == "victim", out


def test_a_reconnecting_emitter_keeps_its_session_against_a_squatter(relay):  # noqa: F811
    session = "squat-victim-1"
    victim = _emitter(relay.url, "victim")
    attacker = None
    try:
        assert _answers(victim, event(1, session, agent="victim")) == []
        gone = _connections(relay.url) - 1
        victim.close()  # a blip: the victim reconnects at once
        _wait_connections(relay.url, gone)  # the relay saw it go: the session has no claimant
        before = _relay_counters(relay.url)["refused_owned_session"]
        attacker = _emitter(relay.url, "attacker")
        # the attacker read the session id on /stream and sends one event in it
        taken = _answers(attacker, event(1, session, agent="attacker"))
        assert _codes(taken) == ["invalid-event"], taken
        assert _relay_counters(relay.url)["refused_owned_session"] == before + 1
        victim = _emitter(relay.url, "victim")
        # the victim's own next event (same source, next position) is its own
        assert _answers(victim, event(2, session, agent="victim")) == []
        _victim_decides(relay.url, victim, session, 3)
    finally:
        victim.close()
        if attacker is not None:
            attacker.close()


@pytest.fixture()
def named_relay(tmp_path: Path):
    creds = tmp_path / "emitters"
    creds.write_text(f"# per-emitter credentials\nvictim={VICTIM_CRED}\n")
    os.chmod(creds, 0o600)
    d = DaemonProcess(tmp_path / "state", {"AEP_EMITTER_TOKENS": str(creds)},
                      args=("relay",), token=TOKEN)
    d.start()
    yield d
    d.stop(timeout=20)


def _attack(url: str, session: str, seq: int) -> None:
    """A holder of the shared token, not of the victim's credential, tries
    to take the victim's session under the victim's own source and agent,
    on ``/socket`` and with ``POST /events``: refused both ways."""
    attacker = _emitter(url, "victim")  # the victim's own hello identity, too
    try:
        taken = _answers(attacker, event(seq, session, agent="victim"))
        assert _codes(taken) == ["invalid-event"], taken
        assert "another emitter credential" in taken[0]["detail"], taken
    finally:
        attacker.close()
    r = post_events(url, [event(seq, session, agent="victim")], token=TOKEN)
    assert r.status_code == 400 and r.json()["error"] == "invalid-event", r.text


def test_a_named_emitter_keeps_its_session_against_a_token_holder(named_relay):
    session = "squat-named-1"
    url = named_relay.url
    victim = _emitter(url, "victim", token=VICTIM_CRED)
    try:
        assert _answers(victim, event(1, session, agent="victim")) == []
        gone = _connections(url) - 1
        victim.close()
        _wait_connections(url, gone)
        before = _relay_counters(url)["refused_owned_session"]
        _attack(url, session, 2)
        assert _relay_counters(url)["refused_owned_session"] == before + 2
        victim = _emitter(url, "victim", token=VICTIM_CRED)
        assert _answers(victim, event(2, session, agent="victim")) == []
        _victim_decides(url, victim, session, 3)
    finally:
        victim.close()


def test_a_relay_restart_forgets_no_binding(named_relay):
    """Every connection drops at once: the named session stays the
    victim's credential's, and a shared-token session stays held for its
    source through the grace (which counts from the restart)."""
    named_session, shared_session = "squat-restart-named", "squat-restart-shared"
    url = named_relay.url
    victim = _emitter(url, "victim", token=VICTIM_CRED)
    plain = _emitter(url, "plain")
    try:
        assert _answers(victim, event(1, named_session, agent="victim")) == []
        assert _answers(plain, event(1, shared_session, agent="plain")) == []
    finally:
        victim.close()
        plain.close()
    named_relay.stop(timeout=20)
    named_relay.start()
    url = named_relay.url
    _attack(url, named_session, 2)
    squatter = _emitter(url, "squatter")
    try:
        taken = _answers(squatter, event(1, shared_session, agent="squatter"))
        assert _codes(taken) == ["invalid-event"], taken
    finally:
        squatter.close()
    victim = _emitter(url, "victim", token=VICTIM_CRED)
    try:
        assert _answers(victim, event(2, named_session, agent="victim")) == []
        _victim_decides(url, victim, named_session, 3)
    finally:
        victim.close()
