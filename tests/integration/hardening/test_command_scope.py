"""Issue 25: a per-emitter credential sent commands into another
credential's session and into the fleet's.

Per-emitter credentials (``AEP_EMITTER_TOKENS``) bound a session to its
emitter: nobody else could emit into it or receive its commands. Who could
*send* a command into it was not scoped: bob, holding only his own
credential, read alice's session id on ``/stream`` and cancelled her run
(the relay routed his ``control.cancel`` to her), and commanded the fleet's
sessions too. AEP-0004 §4.3 item 3 leaves who may command whom to the
deployment, "per-sender scoping at the relay", surfaced as
``unauthorized``; now a per-emitter credential commands only the sessions
bound to it (``supervisor/relay/bindings.py`` ``command_refusal``): bob's
command is refused with the §4.2 ``error`` frame (``unauthorized``,
``cause`` = its id), counted, and alice never receives it; alice's own
command and the shared token's (the operator's) still route.

The real daemon (``aep-bridges run``: the embedded relay and the OTLP
bridge, whose session is the fleet's) and the real standalone relay
(``aep-bridges relay``, the same code), the real SDK ``ControlClient`` as
every sender and the SDK duplex as alice's emitter.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aep_sdk.control import ControlClient, NackError

from tests.support.daemon import DaemonProcess
from tests.support.hardening import (
    event,
    otlp_json,
    otlp_record,
    post_otlp,
    relay_refused,
    stream_events,
)

from .test_control_forgery import TOKEN, _ack, _answers, _emitter, _relay_counters

ALICE, BOB = "alice-credential-91c2", "bob-credential-4d7e"


@pytest.fixture(params=["run", "relay"])
def daemon(request, tmp_path: Path):
    creds = tmp_path / "emitters"
    creds.write_text(f"alice={ALICE}\nbob={BOB}\n")
    os.chmod(creds, 0o600)
    d = DaemonProcess(tmp_path / "state", {"AEP_EMITTER_TOKENS": str(creds)},
                      args=(request.param,), token=TOKEN)
    d.start()
    yield d
    d.stop(timeout=20)


def _send(url: str, session: str, token: str, agent: str
          ) -> tuple[threading.Thread, dict[str, Any]]:
    """The SDK ``ControlClient`` (``agent``: who the target sees) sending one
    ``control.cancel`` from a thread: ``out`` gets ``ack`` or ``nack``
    (``(reason, detail)``), or ``error`` when it never sent."""
    out: dict[str, Any] = {}

    def run() -> None:
        client = ControlClient(url, agent=agent, host="laptop", token=token)
        try:
            client.connect(connect_timeout_ms=10_000)
        except Exception as e:  # noqa: BLE001 -- reported to the test
            out["error"] = e
            return
        try:
            out["ack"] = client.send("control.cancel", session, ack_window_ms=20_000, retries=0)
        except NackError as e:
            out["nack"] = (e.reason, e.detail)
        finally:
            client.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _refused(url: str, session: str, token: str) -> tuple[str, str]:
    """A command that the relay refuses itself: settled at once (bounded)."""
    t, out = _send(url, session, token, "bob-ops")
    t.join(60)
    assert not t.is_alive() and "nack" in out, out
    return out["nack"]


def _routed(url: str, alice: Any, session: str, token: str, agent: str, seq: int) -> None:
    """``agent``'s command reaches alice, the first command she receives
    since the last one she decided (so nothing refused before it reached
    her); she accepts it and the sender settles on her ack."""
    t, out = _send(url, session, token, agent)
    cmd = alice.recv_json()  # bounded: the duplex's socket timeout
    assert cmd is not None and cmd["type"] == "control.cancel", (cmd, out)
    assert cmd["agent"] == agent, cmd  # not bob's
    alice.send_json(_ack(cmd, "alice", seq, "control.accepted"))
    t.join(60)
    assert out.get("ack", {}).get("agent") == "alice", out


def test_a_credential_commands_only_its_own_sessions(daemon):
    url, session = daemon.url, "scope-alice-1"
    alice = _emitter(url, "alice", token=ALICE)
    bob = _emitter(url, "bob", token=BOB)  # a real emitter with a session of his own
    try:
        assert _answers(alice, event(1, session, agent="alice")) == []
        assert _answers(bob, event(1, "scope-bob-1", agent="bob")) == []
        before = _relay_counters(url)
        # bob read alice's session id on /stream and sends it a command
        reason, detail = _refused(url, session, BOB)
        assert reason == "unauthorized", (reason, detail)
        assert "commands only its own sessions" in detail, detail
        # and an unbound session: a credential has no claim to it either
        assert _refused(url, "scope-nobody", BOB)[0] == "unauthorized"
        after = _relay_counters(url)
        assert after["refused_command_scope"] - before["refused_command_scope"] == 2
        assert after["commands_refused"] - before["commands_refused"] == 2
        assert relay_refused(url, TOKEN, "command_scope") >= 2
        # alice's own command, then the operator's (the shared token): routed,
        # and the first command alice receives is hers: bob's never reached her
        _routed(url, alice, session, ALICE, "alice-ops", 2)
        _routed(url, alice, session, TOKEN, "console", 3)
        in_session = [e for e in stream_events(url, TOKEN) if e.get("session") == session]
        assert "bob-ops" not in {e.get("agent") for e in in_session}, in_session
    finally:
        alice.close()
        bob.close()


def test_a_credential_cannot_command_the_fleets_session(tmp_path):
    """The daemon's OTLP bridge (the fleet) emits into a session; bob's
    command to it is refused ``unauthorized`` before the target's gate; the
    operator's reaches the gate (the OTLP bridge accepts no command:
    ``unsupported``, as before)."""
    creds = tmp_path / "emitters"
    creds.write_text(f"bob={BOB}\n")
    os.chmod(creds, 0o600)
    d = DaemonProcess(tmp_path / "state", {"AEP_EMITTER_TOKENS": str(creds)}, token=TOKEN)
    d.start()
    try:
        session = "scope-fleet-conv-1"
        r = post_otlp(d.http_port, otlp_json([otlp_record(session)]))
        assert r.status_code == 200, r.text
        for _ in range(200):  # the pump handed it to the relay (bounded)
            if any(e.get("session") == session for e in stream_events(d.url, TOKEN)):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the OTLP record never reached the relay")
        reason, detail = _refused(d.url, session, BOB)
        assert (reason, "commands only its own sessions" in detail) == ("unauthorized", True), \
            (reason, detail)
        assert _refused(d.url, session, TOKEN)[0] == "unsupported"
        assert _relay_counters(d.url)["refused_command_scope"] == 1
    finally:
        d.stop(timeout=20)
