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

import time

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event
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
