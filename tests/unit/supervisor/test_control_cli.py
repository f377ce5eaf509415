"""The pure parts of ``aep-bridges respond|cancel|pause|resume``
(:mod:`supervisor.tools.control`): the command each builds, and the exit
statuses for what the real daemon cannot be made to do on demand (no ack:
a stub sender, fault injection) or an endpoint that is not there."""
from __future__ import annotations

import io
import json

import aep_sdk
import pytest

from supervisor.tools import control
from tests.support.net import free_port


def test_respond_builds_the_aep_0004_command():
    c = control.respond("s1", "REQ1", option="once")
    assert (c.type, c.session, c.subject, c.cause) == ("control.attention.respond", "s1", "REQ1", "REQ1")
    assert c.data == {"answer": {"option": "once"}} and c.capture == "metadata"
    c = control.respond("s1", "REQ1", values=json.dumps({"db": "sqlite"}), text="why")
    assert c.data == {"answer": {"text": "why", "values": {"db": "sqlite"}}}
    assert c.capture == "redacted"  # free text rides at redacted, never metadata
    for bad in ("[1]", "not json"):
        with pytest.raises(ValueError):
            control.respond("s1", "REQ1", values=bad)
    with pytest.raises(ValueError, match="--option"):
        control.respond("s1", "REQ1")


def test_cancel_pause_resume():
    c = control.cancel("s1", run="r1", reason="stop")
    assert (c.type, c.run, c.data, c.capture) == ("control.cancel", "r1",
                                                  {"scope": "run", "reason": "stop"}, "redacted")
    assert control.cancel("s1", scope="session").data == {"scope": "session"}
    assert control.pause("s1").type == "control.pause" and control.resume("s1").data == {}


class SilentTarget:
    """A sender whose command is never acknowledged (the SDK's own timeout)."""

    def __init__(self, *a, **kw):
        pass

    def connect(self, **kw):
        pass

    def send(self, *a, **kw):
        raise aep_sdk.NackError("timeout", "no ack within 10 ms x 1", synthesized=True)

    def close(self):
        pass


def test_no_ack_exits_4_and_unreachable_exits_1():
    err = io.StringIO()
    status = control.send("http://127.0.0.1:9", None, control.pause("s1"), out=io.StringIO(),
                          err=err, client_factory=SilentTarget)
    assert status == control.EXIT_NO_ACK == 4 and "no ack" in err.getvalue()
    err = io.StringIO()
    status = control.send(f"http://127.0.0.1:{free_port()}", None, control.pause("s1"),
                          out=io.StringIO(), err=err)
    assert status == control.EXIT_UNREACHABLE == 1 and "cannot reach" in err.getvalue()


def test_the_outcome_is_the_targets_own_not_a_namesakes():
    # issue 25: another emitter, in the same session name, cause-linked to the
    # command (its id is on the stream), does not end the wait; the target's does
    import queue
    import time
    ack = {"id": "ACK", "type": "control.accepted", "cause": "CMD", "session": "s1",
           "source": "aep://box/agent/claude-code/session/s1"}
    forged = {"id": "F", "type": "attention.resolved", "cause": "CMD", "session": "s1",
              "source": "urn:alice:1", "subject": "REQ1", "data": {"resolution": "answered"}}
    real = {**forged, "id": "R", "source": ack["source"]}
    events: queue.Queue = queue.Queue()
    for ev in (forged, real):
        events.put(ev)
    shown: list = []
    got = control._linked("control.attention.respond", "CMD", ack, events,
                          time.monotonic() + 60, shown.append)
    assert got is real and shown == [real]


def test_the_help_summary_of_respond_names_its_forms(capsys):
    """``aep-bridges --help`` says what ``respond`` takes: ``--pending``,
    the no-id form the README leads with, and an id (issue 29's trial)."""
    from supervisor import cli
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    usage = " ".join(capsys.readouterr().out.split())
    summary = usage.split(" respond ", 1)[1].split(" cancel ", 1)[0]
    assert "respond --pending" in summary and "respond --option ID (the one open ask)" in summary
    assert "respond [SESSION] REQUEST_ID --option ID" in summary, summary
