"""The pure joiner and per-tee story (``bridges/acp/join.py``): request <->
response per (direction, id), run identity, follow-ups, close-out, bounds,
and the fuzz (never raises on garbage lines)."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.acp.join import AGENT, CLIENT, Joiner, Story, parse_line
from bridges.acp.mapping import Posture
from bridges.core import capture
from bridges.core.envelope import Stamper
from tests.support.acp import golden_frames
from tests.support.schema import validate_event, validate_stream


def line(obj) -> bytes:
    return json.dumps(obj).encode()


def req(i, method, params=None):
    return {"jsonrpc": "2.0", "id": i, "method": method, "params": params or {}}


def res(i, result):
    return {"jsonrpc": "2.0", "id": i, "result": result}


def types(outs):
    return [o.emission["type"] for o in outs]


def stamp_all(story: Story, stamper: Stamper, outs) -> list[dict]:
    """What the bridge does with a story's output: envelope, stamp, record."""
    events = []
    for o in outs:
        em, env = story.envelope(o)
        ev = stamper.stamp(o.session, em, **env)
        story.stamped(o, ev)
        events.append(ev)
    return events


# --------------------------------------------------------------------------- joiner

def test_each_direction_has_its_own_id_space():
    """``initialize`` (client id 0) and the first permission request (agent
    id 0) share the id; each response finds its own request."""
    j = Joiner()
    assert j.feed(CLIENT, req(0, "initialize"))["kind"] == "request"
    assert j.feed(AGENT, req(0, "session/request_permission", {"sessionId": "s"}))["kind"] == "request"
    # the client answers the agent's id 0
    m = j.feed(CLIENT, res(0, {"outcome": {"outcome": "cancelled"}}))
    assert m["method"] == "session/request_permission" and m["request"] == {"sessionId": "s"}
    # the agent answers the client's id 0
    m = j.feed(AGENT, res(0, {"protocolVersion": 1}))
    assert m["method"] == "initialize"
    assert not j.pending


def test_a_response_in_the_requests_own_direction_is_unmatched():
    j = Joiner()
    j.feed(CLIENT, req(1, "session/new"))
    m = j.feed(CLIENT, res(1, {"sessionId": "s"}))
    assert m["unmatched"] and m["method"] is None
    assert j.feed(AGENT, res(1, {"sessionId": "s"}))["method"] == "session/new"


def test_ids_keep_their_type():
    j = Joiner()
    j.feed(CLIENT, req(1, "session/new"))
    assert j.feed(AGENT, res("1", {}))["unmatched"]
    assert j.feed(AGENT, res(1, {}))["method"] == "session/new"


def test_pending_requests_are_bounded():
    j = Joiner(max_pending=3)
    for i in range(5):
        j.feed(CLIENT, req(i, "fs/x"))
    assert len(j.pending) == 3 and j.evicted == 2
    assert j.feed(AGENT, res(0, {}))["unmatched"]
    assert j.feed(AGENT, res(4, {}))["method"] == "fs/x"


def test_error_response_joins():
    j = Joiner()
    j.feed(CLIENT, req(7, "session/prompt", {"sessionId": "s"}))
    m = j.feed(AGENT, {"jsonrpc": "2.0", "id": 7, "error": {"code": -32603, "message": "boom"}})
    assert m["method"] == "session/prompt" and m["error"]["code"] == -32603


# --------------------------------------------------------------------------- parse_line

def test_parse_line_tolerates_an_escape_sequence_before_the_frame():
    assert parse_line(b"\x1b[?25l\x1b[2K" + line(req(1, "x"))) == [req(1, "x")]


def test_parse_line_keeps_u2028_inside_strings():
    frame = req(1, "x", {"t": "a\u2028b\u2029c"})
    raw = json.dumps(frame, ensure_ascii=False).encode()
    assert "\u2028".encode() in raw
    assert parse_line(raw) == [frame]


def test_parse_line_invalid_utf8_and_batches():
    assert parse_line(b'{"jsonrpc":"2.0","method":"m","params":{"t":"\xff"}}')[0]["method"] == "m"
    assert len(parse_line(line([req(1, "a"), req(2, "b"), 3]))) == 2
    for bad in (b"", b"not json", b"42", b"[]", b"[1,2]", b"\xff\xfe", b"{" * 100000):
        assert parse_line(bad) is None


# --------------------------------------------------------------------------- story

def turn(story: Story, rid: int, *, answer: str | None = "allow", stop="end_turn"):
    outs = []
    outs += story.feed(CLIENT, line(req(rid, "session/prompt", {
        "sessionId": "s1", "prompt": [{"type": "text", "text": "hi"}]})))
    outs += story.feed(AGENT, line({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "s1", "update": {"sessionUpdate": "tool_call", "toolCallId": f"t{rid}",
                                      "title": "run tests", "kind": "execute",
                                      "status": "pending", "rawInput": {"c": 1}}}}))
    outs += story.feed(AGENT, line(req(rid, "session/request_permission", {
        "sessionId": "s1", "toolCall": {"toolCallId": f"t{rid}", "title": "run tests"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "deny", "name": "Deny", "kind": "reject_once"}]})))
    outcome = ({"outcome": "selected", "optionId": answer} if answer else {"outcome": "cancelled"})
    outs += story.feed(CLIENT, line(res(rid, {"outcome": outcome})))
    status = "completed" if answer == "allow" else "failed"
    outs += story.feed(AGENT, line({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "s1", "update": {"sessionUpdate": "tool_call_update", "toolCallId": f"t{rid}",
                                      "status": status, "rawOutput": {"ok": True}}}}))
    outs += story.feed(AGENT, line(res(rid, {"stopReason": stop})))
    return outs


def opened(story: Story):
    outs = story.feed(CLIENT, line(req(0, "initialize", {"protocolVersion": 1})))
    outs += story.feed(AGENT, line(res(0, {"protocolVersion": 1})))
    outs += story.feed(CLIENT, line(req(1, "session/new", {"cwd": "/", "mcpServers": []})))
    outs += story.feed(AGENT, line(res(1, {"sessionId": "s1"})))
    return outs


def test_story_of_a_session():
    story = Story("T1")
    outs = opened(story)
    assert [(o.session, o.emission["type"]) for o in outs] == [
        ("tee-T1", "x.acp.initialize.event"), ("tee-T1", "x.acp.initialize.result"),
        ("tee-T1", "x.acp.session.new"), ("s1", "session.started")]
    t = turn(story, 2)
    assert types(t) == ["run.started", "tool.requested", "attention.requested",
                        "attention.answered", "attention.resolved", "tool.completed",
                        "run.finished"]
    assert {o.run for o in t} == {"T1.2"}
    assert {o.session for o in t} == {"s1"}
    answered = next(o.emission for o in t if o.emission["type"] == "attention.answered")
    assert answered["subject"] == "t2" and answered["data"]["answer"] == {"option": "allow"}
    completed = next(o.emission for o in t if o.emission["type"] == "tool.completed")
    assert completed["data"]["tool"] == {"name": "run tests", "call_id": "t2"}  # title remembered
    # a second turn: a new run id; a rejected permission fails the tool
    t2 = turn(story, 3, answer="deny")
    assert {o.run for o in t2} == {"T1.3"}
    assert "tool.failed" in types(t2)
    t3 = turn(story, 4, answer=None, stop="cancelled")
    assert types(t3)[3] == "attention.resolved"
    assert t3[3].emission["data"] == {"resolution": "dismissed"}
    assert types(t3)[-1] == "run.cancelled"
    assert not story.runs


def test_two_tees_never_mint_the_same_run_id():
    a, b = Story("A"), Story("B")
    opened(a), opened(b)
    ra = {o.run for o in turn(a, 2)}
    rb = {o.run for o in turn(b, 2)}
    assert ra.isdisjoint(rb)


def test_stamped_story_is_a_valid_stream():
    story = Story("T1", Posture())
    outs = opened(story) + turn(story, 2) + turn(story, 3, answer=None, stop="refusal")
    outs += story.feed(CLIENT, line(req(4, "session/prompt", {"sessionId": "s1", "prompt": []})))
    outs += story.close(143)
    st_ = Stamper("acp", epoch=1, host="h", policy=capture.CapturePolicy())
    events = stamp_all(story, st_, outs)
    for ev in events:
        validate_event(ev)
    validate_stream(events)
    assert [e["type"] for e in events[-2:]] == ["run.failed", "session.ended"]
    # the lifecycle: subject = the request's event id, cause = the predecessor
    req_ev = next(e for e in events if e["type"] == "attention.requested")
    ans = next(e for e in events if e["type"] == "attention.answered")
    res_ = next(e for e in events if e["type"] == "attention.resolved")
    assert req_ev["subject"] == "t2"
    assert ans["subject"] == req_ev["id"] and ans["cause"] == req_ev["id"]
    assert res_["subject"] == req_ev["id"] and res_["cause"] == ans["id"]
    assert events[-1]["data"] == {"reason": "killed"}
    assert events[-2]["run"] == "T1.4"


def test_close_dismisses_open_asks_before_the_session_ends():
    story = Story("T")
    outs = opened(story)
    outs += story.feed(AGENT, line(req(0, "session/request_permission", {
        "sessionId": "s1", "toolCall": {"toolCallId": "x"}, "options": []})))
    outs += story.close(1)
    st_ = Stamper("acp", epoch=1, host="h")
    events = stamp_all(story, st_, outs)
    assert [e["type"] for e in events[-2:]] == ["attention.resolved", "session.ended"]
    assert events[-2]["data"] == {"resolution": "dismissed"}
    assert events[-1]["data"] == {"reason": "error"}
    validate_stream(events)


def test_close_without_open_runs():
    story = Story("T")
    opened(story)
    out = story.close(0)
    assert [o.emission for o in out] == [{"type": "session.ended", "data": {"reason": "normal"}}]
    assert story.close(0) == []


def test_malformed_lines_are_counted_not_emitted():
    story = Story("T")
    assert story.feed(AGENT, b"hello from a banner") == []
    assert story.feed(AGENT, line({"jsonrpc": "2.0"})) == []
    assert story.counters.malformed == 2


def test_unmatched_response_rides_the_fallback_plane():
    story = Story("T")
    (o,) = story.feed(AGENT, line(res(99, {"sessionId": "zz"})))
    assert o.emission["type"] == "x.acp.rpc.unmatched" and o.session == "zz"
    assert story.counters.unmatched == 1


def test_session_load_binds_from_the_request():
    story = Story("T")
    story.feed(CLIENT, line(req(5, "session/load", {"sessionId": "old", "cwd": "/"})))
    (o,) = story.feed(AGENT, line(res(5, None)))
    assert (o.session, o.emission["type"]) == ("old", "session.started")


def test_tool_titles_are_bounded():
    story = Story("T", max_tools=2)
    for i in range(5):
        story.feed(AGENT, line({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": "s", "update": {"sessionUpdate": "tool_call", "toolCallId": f"c{i}",
                                         "title": "x"}}}))
    assert len(story.titles) == 2


# --------------------------------------------------------------------------- goldens

def test_the_python_sdks_golden_messages_map_to_valid_events():
    """The sdist's ``tests/golden`` wire messages (schema v1.19), fed in
    wire order through one story: every one maps (none is malformed or
    unmatched) and every stamped event is valid AEP."""
    story = Story("G")
    st_ = Stamper("acp", epoch=1, host="h", policy=capture.CapturePolicy())
    seen = {}
    for name, direction, _kind, frame in golden_frames():
        outs = story.feed(direction, line(frame))
        seen[name] = types(outs)
        for ev in stamp_all(story, st_, outs):
            validate_event(ev)
    assert story.counters.malformed == 0 and story.counters.unmatched == 0, seen
    assert seen["new_session_response"] == ["session.started"]
    assert seen["prompt_request"] == ["run.started"]
    assert seen["request_permission_request"] == ["attention.requested"]
    assert seen["request_permission_response_selected"] == ["attention.answered",
                                                            "attention.resolved"]
    assert seen["session_update_tool_call"] == ["tool.requested"]
    assert seen["session_update_plan"] == ["x.acp.plan.updated"]
    assert seen["session_update_agent_message_chunk"] == []
    assert seen["cancel_notification"] == ["x.acp.session.cancel"]
    assert seen["fs_read_text_file_request"] == ["x.acp.fs.read.text.file"]
    assert seen["session_update_config_option_update"] == ["x.acp.config.option.update"]


# --------------------------------------------------------------------------- fuzz

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20)
keys = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "sessionId",
                        "update", "sessionUpdate", "toolCallId", "status", "outcome", "optionId",
                        "prompt", "stopReason", "toolCall", "options", "entries", "rawInput"])
methods = st.sampled_from(["session/prompt", "session/update", "session/request_permission",
                           "session/new", "session/load", "initialize", "fs/read_text_file",
                           "session/cancel", "session/close", "x/y", ""])
frames = st.recursive(
    st.fixed_dictionaries({}, optional={"id": json_values, "method": methods | json_values,
                                        "params": json_values, "result": json_values,
                                        "error": json_values}),
    lambda kids: st.dictionaries(keys, kids | json_values, max_size=6), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([CLIENT, AGENT]),
                          st.one_of(st.binary(max_size=64), frames.map(line))), max_size=12))
def test_fuzz_story_never_raises(lines):
    story = Story("F", Posture(policy=capture.CapturePolicy(ceiling="full"), deltas=True))
    st_ = Stamper("acp", epoch=1, host="h")
    events = []
    for direction, raw in lines:
        events += stamp_all(story, st_, story.feed(direction, raw))
    events += stamp_all(story, st_, story.close(None))
    assert story.counters.mapping_errors == 0


def test_a_closed_session_never_ends_twice():
    story = Story("T")
    outs = opened(story)
    outs += story.feed(CLIENT, line(req(5, "session/close", {"sessionId": "s1"})))
    outs += story.feed(AGENT, line(res(5, {})))
    outs += story.feed(CLIENT, line(req(6, "session/close", {"sessionId": "s1"})))
    outs += story.close(0)
    events = stamp_all(story, Stamper("acp", epoch=1, host="h"), outs)
    assert [e["type"] for e in events if e.get("session") == "s1"] == [
        "session.started", "session.ended", "x.acp.session.close.result"]
    validate_stream(events)


def test_unanswered_requests_cost_bounded_bytes():
    """Issue 25 row 4: a tee's unanswered requests were held by count only
    (4,096 of them, whatever their size): now also by the bytes of their lines."""
    from bridges.acp.join import Joiner
    j = Joiner(max_pending_bytes=10_000)
    for i in range(100):
        j.feed("client", {"jsonrpc": "2.0", "id": i, "method": "x", "params": {}}, 1_000)
    assert len(j.pending) == 10 and j.pending_bytes == 10_000 and j.evicted == 90
    answered = j.feed("agent", {"jsonrpc": "2.0", "id": 99, "result": {}})
    assert answered is not None and answered["method"] == "x" and j.pending_bytes == 9_000
    j.feed("client", {"jsonrpc": "2.0", "id": "big", "method": "y"}, 50_000)  # one line over it all
    assert list(j.pending) == [("client", '"big"')] and j.pending_bytes == 50_000


def test_long_ids_and_titles_cost_a_story_nothing():
    """Issue 25 row 4: what a story keeps per session, request, run and tool
    was bounded by count only; an id or title as long as a line (MiBs) was
    kept whole. Now a frame with an over-long JSON-RPC id or sessionId is
    malformed, and a remembered title is cut."""
    from bridges.acp.join import MAX_ID, MAX_TITLE, Story
    s = Story("T")
    big = "s" * 100_000
    for i in range(20):
        s.feed("client", json.dumps({"jsonrpc": "2.0", "id": f"{i}{big}", "method": "x"}).encode())
        s.feed("client", json.dumps({"jsonrpc": "2.0", "id": 10**100 + i, "method": "x"}).encode())
        s.feed("agent", json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": f"{i}{big}", "update": {"sessionUpdate": "tool_call"}}}).encode())
    assert not s.joiner.pending and not s.sessions and s.counters.malformed == 60
    s.feed("agent", json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "ok", "update": {"sessionUpdate": "tool_call", "toolCallId": "c1",
                                      "title": big}}}).encode())
    assert len(s.titles["c1"]) == MAX_TITLE and list(s.sessions) == ["ok"]
    assert MAX_ID < 1000
