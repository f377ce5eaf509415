"""Issue 25 attacked again: a remote emitter pre-claims a session of the
daemon's own fleet right after a daemon restart.

A fleet bridge claims its session on the embedded relay only when it emits
into it; a restart drops every claim, and the bridge's next event may be
minutes away (the vendor's next moment). Before this fix, a token holder
who read the session id on ``/stream`` sent one sequenced event in it over
``/socket`` in that window: the relay let it claim the session (no live
claimant), so the operator's commands for the fleet's session were routed
to the attacker (a diversion), and once the bridge emitted again both held
it and every command was refused ``ambiguous``. ``POST /events`` wrote
sequenced events into the fleet's session the same way.

Now the fleet's sessions are bound to the fleet (``supervisor/relay/bindings.py``)
and the binding is journaled in the state directory: after the restart the
attacker's ``/socket`` event and its ``POST /events`` are refused, a command
in the window is ``no-route`` (no one claims it: never the attacker), and
once the bridge emits again its commands reach its one claimant (the OTLP
bridge accepts none: ``unsupported``, never ``ambiguous``).

The real daemon (``aep-bridges run``: the OTLP bridge and the embedded
relay, restarted on its state directory), real OTLP/JSON exports, the real
SDK duplex and ``ControlClient``.
"""
from __future__ import annotations

from typing import Any

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, first_sequenced, otlp_json, otlp_record, post_events, post_otlp

from .test_control_forgery import TOKEN, _answers, _emitter, _send_in_thread

CONV = "fleet-squat-conv-1"


def _fleet_event(url: str) -> dict[str, Any]:
    """The OTLP bridge's first sequenced event of :data:`CONV` on ``/stream``."""
    return first_sequenced(url, TOKEN, CONV)


def _command(url: str, session: str) -> tuple[str, str]:
    """One ``control.cancel`` for ``session`` (no retry): the relay's
    refusal code and detail (the SDK keeps a code outside its nack reasons,
    ``no-route``, at the head of the detail under the reason ``invalid``)."""
    sender, out = _send_in_thread(url, session)
    sender.join(40)
    assert "nack" in out, out
    reason, detail = out["nack"]
    if reason == "invalid" and detail and ": " in detail:
        return tuple(detail.split(": ", 1))  # type: ignore[return-value]
    return reason, detail or ""


def test_a_remote_emitter_cannot_take_a_fleet_session_after_a_restart(tmp_path):
    d = DaemonProcess(tmp_path / "state", token=TOKEN)
    d.start()
    attacker = None
    try:
        assert post_otlp(d.http_port, otlp_json([otlp_record(CONV)])).status_code == 200
        fleet = _fleet_event(d.url)
        session = fleet["session"]
        d.stop(timeout=20)
        d.start()
        # right after the restart, before the bridge emits into its session again
        attacker = _emitter(d.url, "attacker")  # declares control.cancel
        taken = _answers(attacker, event(1, session, agent="attacker"))
        assert [a.get("code") for a in taken] == ["invalid-event"], taken
        assert "bridge of this daemon" in taken[0]["detail"], taken
        posted = post_events(d.url, [event(2, session, agent="attacker")], token=TOKEN)
        assert posted.status_code == 400 and posted.json()["error"] == "invalid-event", posted.text
        # the window: nobody claims the session, so nobody gets its commands
        code, detail = _command(d.url, session)
        assert code == "no-route", (code, detail)
        # the bridge emits again: its commands reach its one claimant
        assert post_otlp(d.http_port, otlp_json([otlp_record(CONV)])).status_code == 200
        for _ in range(100):  # bounded: until the bridge's event reached the relay
            code, detail = _command(d.url, session)
            if code != "no-route":
                break
        assert code == "unsupported", (code, detail)
    finally:
        if attacker is not None:
            attacker.close()
        d.stop(timeout=20)
