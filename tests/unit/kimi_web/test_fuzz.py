"""Hypothesis: the pure mapping and the tracker never raise on garbage and
always return emissions of a legal AEP type."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.ledger import Refuse
from bridges.core.posture import Posture
from bridges.kimi_web import mapping as M
from bridges.kimi_web.control import decide
from bridges.kimi_web.mapping import AGENT
from bridges.kimi_web.tracker import Tracker

TYPE = re.compile(r"^(x\.[a-z0-9_-]+(\.[a-z0-9_]+)+|[a-z]+(\.[a-z_]+)+)$")
KNOWN = ["turn.started", "turn.ended", "tool.call.started", "tool.result", "event.approval.requested",
         "event.approval.resolved", "event.question.requested", "event.question.answered",
         "event.question.dismissed", "event.session.work_changed", "event.session.created",
         "permission.approval.requested", "agent.status.updated", "ping", "ack", "resync_required"]

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                         st.dictionaries(st.text(max_size=10), c, max_size=4)),
                          max_leaves=20)
payload = st.one_of(json_value, st.fixed_dictionaries({}, optional={
    "promptId": json_value, "turnId": json_value, "reason": json_value, "toolCallId": json_value,
    "name": json_value, "args": json_value, "output": json_value, "isError": json_value,
    "approval_id": json_value, "action": json_value, "decision": json_value, "feedback": json_value,
    "question_id": json_value, "questions": json_value, "answers": json_value, "origin": json_value,
    "busy": json_value, "pending_interaction": json_value, "scope": json_value}))
frame = st.fixed_dictionaries({"type": st.one_of(st.sampled_from(KNOWN), st.text(max_size=30), json_value)},
                              optional={"seq": json_value, "epoch": json_value, "volatile": json_value,
                                        "session_id": st.one_of(st.just("s1"), json_value),
                                        "timestamp": json_value, "payload": payload})


@settings(max_examples=400, deadline=None)
@given(frame, st.booleans())
def test_map_frame_never_raises(f, primary):
    for e in M.map_frame(f, Posture(agent=AGENT, mode="primary" if primary else "companion")):
        assert TYPE.match(e["type"]), e["type"]
        assert isinstance(e.get("data", {}), dict)


@settings(max_examples=200, deadline=None)
@given(st.lists(frame, max_size=12), st.booleans())
def test_tracker_never_raises(frames, primary):
    tr = Tracker(Posture(agent=AGENT, mode="primary" if primary else "companion"), answerable=True)
    for f in frames:
        if tr.accept(f):
            for o in tr.frame(f):
                assert TYPE.match(o.emission["type"])
    tr.resync("s1", {"session": {}, "prompts": {"active": None}, "approvals": [], "questions": []})
    tr.load(tr.dump())


@settings(max_examples=200, deadline=None)
@given(json_value)
def test_decide_refuses_or_decides(answer):
    try:
        d = decide(answer)
    except Refuse as r:
        assert r.reason == "invalid"
    else:
        assert d["body"]["decision"] in ("approved", "rejected")


@given(json_value, json_value)
def test_aep_values_never_raises(answers, fields):
    M.aep_values(answers, fields if isinstance(fields, list) else None)
