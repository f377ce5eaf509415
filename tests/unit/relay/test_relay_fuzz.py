"""Bad input never crashes the relay (issue 2 §7 "Relay: malformed envelopes,
bad filters, oversize from, frames before hello, binary frames"): fuzzed
filters either refuse with InvalidFilter or match without raising; fuzzed
WebSocket frames (before and after hello) get defined answers and leave the
connection's state consistent."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.relay.attrmatch import Filter, InvalidFilter
from supervisor.relay.core import Relay

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                    st.sampled_from(["", "*", "x", "a.*", "tool.*", "info", "notice", "s1",
                                     "attention.requested", "gte", "lte", "all", "0.1"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["type", "session", "severity", "gte", "lte", "seq", "epoch",
                                     "id", "from", "filter", "capture", "acme", "Bad", "t"]),
                    inner, max_size=4)), max_leaves=12)
keys = st.sampled_from(["type", "session", "severity", "capture", "epoch", "seq", "data", "time",
                        "agent", "acmeregion", "NotAnAttr", "x_y", "traceparent", "subject"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, json_values, max_size=4), st.dictionaries(keys, scalars, max_size=6))
def test_filters_refuse_or_match_without_raising(flt, attrs):
    try:
        f = Filter(flt)
    except InvalidFilter:
        return
    assert f.matches(attrs) in (True, False)


frame_types = st.sampled_from(["hello", "subscribe", "unsubscribe", "roster", "ping", "pong",
                               "closing", "error", "x", "tool.completed", "control.cancel"])
frames = st.one_of(
    st.text(max_size=30),
    json_values.map(json.dumps),
    st.builds(lambda t, body: json.dumps({**(body if isinstance(body, dict) else {}), "type": t}),
              frame_types, json_values),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames, min_size=1, max_size=8), st.booleans(), st.booleans())
async def test_socket_frames_never_crash(seq, greet, token):
    relay = Relay(token="t" if token else None, max_from=2, max_subscriptions=2)
    conn = relay.open_socket(token)
    if greet:
        await conn.handle_text(json.dumps({"type": "hello", "versions": ["0.1"], "role": "both",
                                           "identity": {"agent": "fuzz"}}))
    for text in seq:
        await conn.handle_text(text)
    # whatever was queued is well-formed JSON frames (or the close marker)
    while conn.outlet.queued:
        payloads, end = await conn.outlet.next_batch()
        for p in payloads:
            frame = json.loads(p)
            assert isinstance(frame, dict) and isinstance(frame.get("type"), str)
        if end is not None:
            break
    conn.close()
    assert relay.stats()["subscribers"] == 0 and relay.stats()["connections"] == 0
