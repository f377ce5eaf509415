"""Hypothesis: any JSON value, and any sequence of AG-UI-shaped events,
through the pure mapping and the per-stream state (every posture) raises
nothing, and every stamped envelope is schema-valid."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.agui.mapping import EVENT_TYPES, Posture, map_event
from bridges.agui.sse import SseParser
from bridges.agui.stream import TeeStream
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.naming import TYPE_GRAMMAR
from tests.support.schema import validate_event

KEYS = ["threadId", "runId", "parentRunId", "messageId", "role", "delta", "toolCallId",
        "toolCallName", "content", "snapshot", "patch", "stepName", "name", "value", "event",
        "outcome", "usage", "result", "message", "code", "subagentRunId", "timestamp",
        "activityType", "messages", "protocolVersion"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**60, 2**60),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
                    st.sampled_from(["t1", "r1", "c1", "m1", "assistant", "user", "success",
                                     "cancelled", "interrupt", "tool"]))
values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                   st.dictionaries(st.sampled_from(KEYS + ["op", "path", "type"]),
                                                                   c, max_size=4)),
                      max_leaves=12)
events = st.builds(lambda t, body: {"type": t, **body},
                   st.one_of(st.sampled_from(EVENT_TYPES + ("THINKING_START", "NOVEL_THING")),
                             st.text(max_size=10)),
                   st.dictionaries(st.sampled_from(KEYS), values, max_size=6))
postures = st.builds(lambda c, d: Posture(policy=CapturePolicy(ceiling=c), deltas=d),
                     st.sampled_from(["none", "metadata", "redacted", "full"]), st.booleans())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(values, events), posture=postures)
def test_map_event_never_raises_and_names_by_the_grammar(value, posture):
    for e in map_event(value, posture):
        assert e["type"].startswith(("run.", "tool.", "state.")) or TYPE_GRAMMAR.match(e["type"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.lists(st.one_of(events, values), max_size=25), posture=postures,
       reason=st.sampled_from(["client_disconnected", "upstream_ended"]))
def test_any_stream_stamps_valid_envelopes(seq, posture, reason):
    st_ = Stamper("agui", epoch=1, host="h", policy=posture.policy)
    stream = TeeStream(posture, session_hint="t-hint")
    moments = []
    for ev in seq:
        moments += stream.feed(ev)
    moments += stream.close(reason)
    for m in moments:
        assert m.session is not None
        validate_event(st_.stamp(m.session, m.emission, run=m.run, time=m.time))


@settings(max_examples=150, deadline=None)
@given(seq=st.lists(events, max_size=15))
def test_sse_framed_events_round_trip_through_the_parser(seq):
    wire = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in seq)
    assert [json.loads(e.data) for e in SseParser().feed(wire)] == seq
