"""Hypothesis: any JSON-shaped frame through the frame parser, the pure
mapping and the tracker (both modes, gate on and off) raises nothing, and
every stamped envelope is schema-valid (``tests/support/schema.py``)."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.sse_common.frames import FrameError, parse_frame
from bridges.sse_common.mapping import map_bus, map_moment
from bridges.sse_common.tracker import Tracker
from tests.support.schema import validate_event

TYPES = ["session.created", "session.deleted", "session.idle", "session.status",
         "session.error", "session.compacted", "message.updated", "message.part.updated",
         "message.part.delta", "permission.updated", "permission.asked", "permission.replied",
         "question.asked", "question.replied", "question.rejected", "todo.updated",
         "file.edited", "command.executed", "server.connected", "server.heartbeat",
         "sync", "weird.new.thing", "", "UPPER Case!"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
                    st.sampled_from(["ses_1", "msg_1", "per_1", "que_1", "user", "assistant",
                                     "busy", "idle", "retry", "completed", "error", "pending",
                                     "tool", "bash", "once", "reject"]))
json_values = st.recursive(scalars, lambda c: st.one_of(
    st.lists(c, max_size=4), st.dictionaries(st.sampled_from(
        ["sessionID", "info", "id", "role", "status", "type", "part", "state", "callID", "tool",
         "input", "output", "error", "name", "questions", "options", "label", "todos",
         "content", "requestID", "reply", "permissionID", "response", "time", "tokens",
         "parentID", "patterns", "title", "permission", "syncEvent", "data", "payload",
         "directory", "properties", "header", "question", "custom", "multiple"]) | st.text(
        max_size=8), c, max_size=6)), max_leaves=25)
frames = st.builds(lambda t, props, ident, wrap, extra: {
    **({"type": t} if t is not None else {}), "properties": props,
    **({"id": ident} if ident else {}), **extra} if not wrap else {
    "directory": "/p", "payload": {**({"type": t} if t is not None else {}),
                                   "properties": props, **({"id": ident} if ident else {})}},
    st.one_of(st.none(), st.sampled_from(TYPES)), json_values,
    st.one_of(st.none(), st.text(max_size=6)), st.booleans(),
    st.dictionaries(st.sampled_from(["syncEvent", "payload"]), json_values, max_size=1))

# plausible frames: a session id and the keys each type reads, with fuzzed values
role_info = st.fixed_dictionaries({"id": st.sampled_from(["msg_1", "msg_2", 7]),
                                   "role": st.sampled_from(["user", "assistant", None, 3])},
                                  optional={"time": json_values, "tokens": json_values,
                                            "error": json_values, "parentID": json_values,
                                            "version": json_values, "title": json_values})
tool_part = st.fixed_dictionaries({"type": st.just("tool"), "callID": st.sampled_from(
    ["c1", "c2", None]), "tool": json_values, "state": st.fixed_dictionaries(
    {"status": st.sampled_from(["pending", "running", "completed", "error", "x"])},
    optional={"input": json_values, "output": json_values, "error": json_values,
              "time": json_values})})
plausible = st.builds(
    lambda t, extra, ident: {"directory": "/p", "payload": {
        "type": t, "id": ident, "properties": {"sessionID": "ses_1", **extra}}},
    st.sampled_from(TYPES[:-3]),
    st.fixed_dictionaries({}, optional={
        "info": role_info, "part": tool_part, "status": json_values, "error": json_values,
        "id": st.sampled_from(["per_1", "que_1", 5]), "requestID": st.sampled_from(
            ["per_1", "que_1", None]), "permissionID": json_values,
        "reply": st.sampled_from(["once", "reject", 1]), "response": json_values,
        "questions": json_values, "todos": json_values, "patterns": json_values,
        "permission": json_values, "tool": json_values, "name": json_values}),
    st.one_of(st.none(), st.sampled_from(["evt_1", "evt_2", "evt_3"])))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames | plausible, min_size=1, max_size=12), st.sampled_from(["companion", "primary"]),
       st.booleans(), st.sampled_from(["metadata", "redacted", "full"]))
def test_any_frames_map_without_error_to_valid_events(seq, mode, answerable, ceiling):
    policy = CapturePolicy(ceiling=ceiling)
    posture = Posture(agent="opencode", mode=mode, policy=policy, answerable=answerable)
    tr = Tracker(posture)
    stamper = Stamper("opencode", epoch=1, host="fuzz", policy=policy)
    for frame in seq:
        try:
            ev = parse_frame(json.dumps(frame), wrapped=True)
        except FrameError:
            continue
        map_bus(ev.type, ev.properties, posture)  # the stateless path too
        for out in tr.feed(ev):
            env = stamper.stamp(out.session, out.emission, run=out.run,
                                cause=out.resolved_cause())
            out.envelope = env
            validate_event(env)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["adapter", "companion", "primary"]))
def test_any_moment_maps_to_a_list(moment, mode):
    for kind in ("bus", "tool.before", "tool.after", "permission.ask", None):
        m = dict(moment) if isinstance(moment, dict) else {"event": moment}
        m["kind"] = kind
        out = map_moment(m, Posture(agent="kilocode", mode=mode))
        assert isinstance(out, list)
        for e in out:
            env = Stamper("kilocode", epoch=1, host="fuzz").stamp("ses_f", e)
            validate_event(env)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_frame_or_a_defined_error(data):
    try:
        parse_frame(data, wrapped=True)
    except FrameError as e:
        assert e.reason in ("oversize", "not_json", "not_object", "no_type")
