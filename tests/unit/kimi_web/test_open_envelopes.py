"""The tracker keeps the stamped envelope of each open run and open ask
through the state file, for the receiver to re-announce after a daemon
restart (review of issue 8, finding 1); closed ones are not kept."""
from __future__ import annotations

import json

from bridges.core import bridge as B
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.kimi_web.mapping import AGENT
from bridges.kimi_web.tracker import Tracker


def frame(t, seq, **payload):
    return {"type": t, "session_id": "s1", "epoch": "e1", "seq": seq, "payload": payload}


def drive(tr, stamper, f):
    assert tr.accept(f)
    evs = []
    for o in tr.frame(f):
        ev = stamper.stamp(o.session, o.emission, run=o.run)
        if o.ask_key is not None:
            tr.bind(o.ask_key, ev)
        elif ev["type"] == "run.started":
            tr.bind_run(o.session, ev)
        evs.append(ev)
    return evs


def test_open_run_and_ask_envelopes_survive_the_state_file_and_go_when_closed():
    stamper = Stamper(AGENT, epoch=1, host="h")
    tr = Tracker(Posture(agent=AGENT, mode="primary"), answerable=True)
    [started] = drive(tr, stamper, frame("turn.started", 1, promptId="p1", turnId=1))
    [asked] = drive(tr, stamper, frame("event.approval.requested", 2, approval_id="a1",
                                       tool_name="Bash", action="run", description="echo"))
    assert asked["type"] == "attention.requested"
    back = Tracker(Posture(agent=AGENT, mode="primary"))
    back.load(json.loads(json.dumps(tr.dump())))
    assert back.open_envelopes() == [started, asked]
    drive(back, stamper, frame("turn.ended", 3, reason="completed"))
    assert back.open_envelopes() == []
    again = Tracker(Posture(agent=AGENT, mode="primary"))
    again.load(json.loads(json.dumps(back.dump())))
    assert again.open_envelopes() == []


def test_an_oversized_envelope_is_not_kept_but_its_id_is(monkeypatch):
    monkeypatch.setattr(B, "REANNOUNCE_MAX", 10)
    stamper = Stamper(AGENT, epoch=1, host="h")
    tr = Tracker(Posture(agent=AGENT, mode="primary"))
    drive(tr, stamper, frame("turn.started", 1, promptId="p1", turnId=1))
    [asked] = drive(tr, stamper, frame("event.approval.requested", 2, approval_id="a1",
                                       tool_name="Bash", action="run", description="echo"))
    assert tr.open_envelopes() == []
    assert tr.find_ask("s1", asked["id"]) is not None
