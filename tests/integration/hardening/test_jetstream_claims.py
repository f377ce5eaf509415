"""Issue 25 attacked again: the JetStream relay (``aep-bridges relay`` with
``AEP_NATS_URL``), two of them on one NATS (the documented way to run
more than one relay: the claims bucket routes a command to the relay its
session's emitter is on).

The embedded relay refuses a remote emitter's event in a session another
live connection claims (the degraded item "one event posted into another
agent's session makes every command to that session ``ambiguous``"); the
JetStream relay made that check against its own connections only. A
token holder on the other relay sent one event in the victim's session
(its id is on ``/stream``): both claims landed in the bucket and every
command to the victim's session was refused ``ambiguous``.

Now the session's binding is in KV ``S_bindings`` (create-only,
``supervisor/jetstream/owners.py``): the intruder on the other relay is
refused (counted), the owner's commands reach the owner, and once the
owner has left, its session stays held for it through the grace on every
relay.

The real ``nats-server`` (``tests/support/nats.py``), two real
``aep-bridges relay`` subprocesses, the real SDK duplex and ``ControlClient``.
"""
from __future__ import annotations

import os
import time

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, post_events
from tests.support.nats import NatsCluster

from .test_control_forgery import TOKEN, _ack, _answers, _emitter, _healthz, _send_in_thread


def test_an_event_on_another_relay_does_not_make_the_owners_commands_ambiguous(tmp_path):
    with NatsCluster(1, tmp_path / "nats") as c:
        relays = [DaemonProcess(tmp_path / f"state{i}", {"AEP_NATS_URL": c.url},
                                args=("relay",), token=TOKEN) for i in (1, 2)]
        for r in relays:
            r.start()
        owner = intruder = None
        try:
            session = "js-owned-1"
            owner = _emitter(relays[0].url, "owner")
            assert _answers(owner, event(1, session, agent="owner")) == []
            intruder = _emitter(relays[1].url, "intruder", control=None)
            refused = _answers(intruder, event(1, session, agent="intruder"))
            assert [a.get("code") for a in refused] == ["invalid-event"], refused
            time.sleep(1.0)  # not a timing assertion: a wrongly made claim would land
            sender, out = _send_in_thread(relays[0].url, session)
            sender.join(10)  # a refusal settles the sender at once; a routed command waits
            assert sender.is_alive(), f"the command was refused: {out}"
            cmd = owner.recv_json()  # bounded: the duplex's socket timeout
            assert cmd is not None and cmd["type"] == "control.cancel", (cmd, out)
            owner.send_json(_ack(cmd, "owner", 2, "control.accepted"))
            sender.join(30)
            assert "ack" in out, out
            # the owner leaves: its session stays held for it on the other relay too
            owner.close()
            again = _answers(intruder, event(2, session, agent="intruder"))
            assert [a.get("code") for a in again] == ["invalid-event"], again
            counters = _healthz(relays[1].url)["relay_counts"]["counters"]
            assert counters["refused_owned_session"] == 2, counters
        finally:
            for x in (owner, intruder):
                if x is not None:
                    x.close()
            for r in relays:
                r.stop(timeout=20)


def test_a_named_emitters_session_is_its_own_on_every_relay_and_after_a_restart(tmp_path):
    """Per-emitter credentials across relays: a holder of the shared token
    (not of the victim's credential) on the other relay is refused under
    the victim's own source and agent, on ``/socket`` and ``POST /events``,
    while the victim is away and after that relay restarts (the binding is
    in KV ``AEP_bindings``); the victim, back on the other relay, gets its
    commands."""
    creds = tmp_path / "emitters"
    creds.write_text("victim=victim-credential-js\n")
    os.chmod(creds, 0o600)
    with NatsCluster(1, tmp_path / "nats") as c:
        env = {"AEP_NATS_URL": c.url, "AEP_EMITTER_TOKENS": str(creds)}
        relays = [DaemonProcess(tmp_path / f"state{i}", env, args=("relay",), token=TOKEN)
                  for i in (1, 2)]
        for r in relays:
            r.start()
        try:
            session = "js-named-1"
            victim = _emitter(relays[0].url, "victim", token="victim-credential-js")
            assert _answers(victim, event(1, session, agent="victim")) == []
            victim.close()
            relays[1].stop(timeout=20)
            relays[1].start()
            b = relays[1].url
            attacker = _emitter(b, "victim")
            try:
                taken = _answers(attacker, event(2, session, agent="victim"))
                assert [a.get("code") for a in taken] == ["invalid-event"], taken
                assert "another emitter credential" in taken[0]["detail"], taken
            finally:
                attacker.close()
            r = post_events(b, [event(2, session, agent="victim")], token=TOKEN)
            assert r.status_code == 400 and r.json()["error"] == "invalid-event", r.text
            victim = _emitter(b, "victim", token="victim-credential-js")
            try:
                assert _answers(victim, event(2, session, agent="victim")) == []
                time.sleep(1.0)  # not a timing assertion: the claim's put lands
                sender, out = _send_in_thread(relays[0].url, session)
                cmd = victim.recv_json()  # bounded: the duplex's socket timeout
                assert cmd is not None and cmd["type"] == "control.cancel", (cmd, out)
                victim.send_json(_ack(cmd, "victim", 3, "control.accepted"))
                sender.join(30)
                assert out.get("ack", {}).get("agent") == "victim", out
            finally:
                victim.close()
        finally:
            for r in relays:
                r.stop(timeout=20)
