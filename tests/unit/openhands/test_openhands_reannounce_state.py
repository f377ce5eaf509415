"""A conversation's open run and pending ask keep their stamped envelopes
through the state file (for the re-announce after a daemon restart, review
of issue 8 finding 1); a mismatched or closed one is not restored."""
from __future__ import annotations

import json

from bridges.openhands.receiver import Conversation


def test_open_envelopes_round_trip_and_only_while_open():
    c = Conversation("c1", run_id="run:c1:1", attention_id="E2")
    c.run_envelope = {"id": "E1", "type": "run.started", "run": "run:c1:1"}
    c.attention_envelope = {"id": "E2", "type": "attention.requested", "run": "run:c1:1"}
    back = Conversation.restore(json.loads(json.dumps(c.persisted())), "c1")
    assert back.open_envelopes() == [c.run_envelope, c.attention_envelope]
    assert back.reannounce_due
    c.attention_id = None  # answered: not kept
    back = Conversation.restore(json.loads(json.dumps(c.persisted())), "c1")
    assert back.open_envelopes() == [c.run_envelope]
    body = c.persisted()
    body["run_envelope"] = {"id": "E9", "type": "run.started", "run": "run:c1:7"}  # another run
    back = Conversation.restore(body, "c1")
    assert back.open_envelopes() == [] and not back.reannounce_due
