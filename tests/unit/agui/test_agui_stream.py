"""The per-stream joins (:class:`bridges.agui.stream.TeeStream`) on the real
pydantic-ai capture and on hand-made 1.0 streams; expected values from the
design record and the pins' top comment (identity, tool-name join, role
enrichment, text assembly)."""
from __future__ import annotations

import json
from pathlib import Path

from bridges.agui import stream as stream_mod
from bridges.agui.mapping import Posture, pin_view
from bridges.agui.sse import SseParser
from bridges.agui.stream import TeeStream
from bridges.core.capture import CapturePolicy, digest
from bridges.core.envelope import Stamper
from tests.support.agui import STORY
from tests.support.schema import validate_stream
from tests.support.shared import fixture

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "agui_real"
PINS = fixture("mappings/agui.json")


def real_events() -> list[dict]:
    return [json.loads(e.data) for e in SseParser().feed((REAL / "pydantic_ai_tool_run.sse")
                                                         .read_bytes())]


def feed_all(st: TeeStream, events: list) -> list:
    out = []
    for e in events:
        out += st.feed(e)
    return out


def test_real_pydantic_ai_run_tells_the_mapped_story():
    events = real_events()
    assert [e["type"] for e in events][:3] == ["RUN_STARTED", "TEXT_MESSAGE_START",
                                               "TEXT_MESSAGE_END"]
    moments = feed_all(TeeStream(), events) + TeeStream().close("upstream_ended")
    types = [m.emission["type"] for m in moments]
    assert tuple(types) == STORY
    assert {(m.session, m.run) for m in moments} == {("thread-capture-1", "run-capture-1")}
    completed = [m.emission for m in moments if m.emission["type"] == "tool.completed"]
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert [c["data"]["tool"] for c in completed] == [
        {"name": "lookup", "call_id": results[0]["toolCallId"]},
        {"name": "plan", "call_id": results[1]["toolCallId"]}]
    assert [c["data"]["result_digest"] for c in completed] == [digest(r["content"]) for r in results]
    inside = [m.emission for m in moments if m.emission["type"] in (
        "state.snapshot", "state.delta", "x.agui.activity.snapshot", "x.agui.custom.event")]
    assert {e.get("step") for e in inside} == {"planning"}
    assert [e["data"] for e in inside] == [{}, {"ops": 1}, {"activity_type": "PLAN"},
                                           {"name": "demo.checkpoint"}]
    # every moment carries the event's own timestamp as its time
    assert all(m.time is not None for m in moments)


def test_real_run_stamps_a_valid_aep_stream_at_every_ceiling():
    for ceiling in ("none", "metadata", "redacted", "full"):
        policy = CapturePolicy(ceiling=ceiling)
        st_ = Stamper("agui", epoch=1, host="h", policy=policy)
        moments = feed_all(TeeStream(Posture(policy=policy, deltas=True)), real_events())
        validate_stream([st_.stamp(m.session, m.emission, run=m.run, time=m.time)
                         for m in moments])


def test_the_reply_terminal_carries_the_assembled_text_at_redacted():
    policy = CapturePolicy(ceiling="redacted")
    moments = feed_all(TeeStream(Posture(policy=policy)), real_events())
    end = [m.emission for m in moments if m.emission["type"] == "x.agui.text_message.end"]
    deltas = [e["delta"] for e in real_events() if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert len(end) == 1 and end[0]["data"]["content"] == "".join(deltas)
    assert end[0]["gating"] == {"levels": {"content": "redacted"}}


def test_tool_result_pairs_by_call_id_and_the_pin_reproduces_through_the_join():
    pin = PINS["events"]["tool_call_result_joined"]
    st = TeeStream(session_hint="t", run_hint="r")
    st.feed(PINS["events"]["tool_call_start"]["input"])
    unjoined = {k: v for k, v in pin["input"].items() if k != "toolCallName"}
    (m,) = st.feed(unjoined)
    assert pin_view(m.emission) == pin["expected"]
    # the pairing is consumed: a second result for the same id is unjoined
    (m2,) = st.feed(unjoined)
    assert m2.emission["data"]["tool"]["name"] == "unknown"


def test_role_of_the_start_is_re_attached_to_the_end():
    st = TeeStream(session_hint="t")
    st.feed({"type": "TEXT_MESSAGE_START", "messageId": "u", "role": "user"})
    st.feed({"type": "TEXT_MESSAGE_CONTENT", "messageId": "u", "delta": "hi"})
    assert st.feed({"type": "TEXT_MESSAGE_END", "messageId": "u"}) == []
    st.feed({"type": "TEXT_MESSAGE_START", "messageId": "a"})  # no role: assistant (1.0 default)
    st.feed({"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": "yo"})
    (end,) = st.feed({"type": "TEXT_MESSAGE_END", "messageId": "a"})
    assert pin_view(end.emission) == {"type": "x.agui.text_message.end", "data": {}, "subject": "a"}


def test_run_input_ids_scope_events_before_run_started_and_run_started_wins():
    st = TeeStream(session_hint="t-input", run_hint="r-input")
    (early,) = st.feed({"type": "CUSTOM", "name": "warmup", "value": 1})
    assert (early.session, early.run) == ("t-input", "r-input")
    (start,) = st.feed({"type": "RUN_STARTED", "threadId": "t-real", "runId": "r-real"})
    assert (start.session, start.run) == ("t-real", "r-real")


def test_steps_stamp_the_envelope_step_of_what_happens_inside():
    st = TeeStream(session_hint="t")
    st.feed({"type": "RUN_STARTED", "threadId": "t", "runId": "r"})
    (s,) = st.feed({"type": "STEP_STARTED", "stepName": "plan"})
    assert s.emission["step"] == "plan"
    (tool,) = st.feed({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "x"})
    assert tool.emission["step"] == "plan"
    (f,) = st.feed({"type": "STEP_FINISHED", "stepName": "plan"})
    assert f.emission["step"] == "plan"
    (after,) = st.feed({"type": "STATE_SNAPSHOT", "snapshot": {}})
    assert "step" not in after.emission


def test_an_open_run_is_closed_failed_with_the_reason_and_only_once():
    st = TeeStream()
    st.feed({"type": "RUN_STARTED", "threadId": "t", "runId": "r"})
    (m,) = st.close("client_disconnected")
    assert (m.session, m.run) == ("t", "r")
    assert pin_view(m.emission) == {"type": "run.failed", "data": {"reason": "client_disconnected"}}
    assert st.close("again") == []


def test_a_finished_run_is_not_failed_on_close():
    st = TeeStream()
    feed_all(st, [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
                  {"type": "RUN_ERROR", "message": "boom"}])
    assert st.close("upstream_ended") == []


def test_a_tool_call_chunk_stands_for_its_start_once():
    st = TeeStream(session_hint="t")
    first = st.feed({"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "toolCallName": "x",
                     "delta": "{"})
    assert [pin_view(m.emission) for m in first] == [
        {"type": "tool.requested", "data": {"tool": {"name": "x", "call_id": "c"}}, "subject": "x"}]
    assert st.feed({"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "delta": "}"}) == []
    (res,) = st.feed({"type": "TOOL_CALL_RESULT", "messageId": "m", "toolCallId": "c",
                      "content": "ok"})
    assert res.emission["data"]["tool"]["name"] == "x"


def test_text_message_chunks_assemble_like_content():
    policy = CapturePolicy(ceiling="redacted")
    st = TeeStream(Posture(policy=policy), session_hint="t")
    st.feed({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m", "delta": "Hel"})
    st.feed({"type": "TEXT_MESSAGE_CHUNK", "delta": "lo"})
    (end,) = st.feed({"type": "TEXT_MESSAGE_END", "messageId": "m"})
    assert end.emission["data"]["content"] == "Hello"


def test_memory_is_bounded_on_an_endless_stream():
    st = TeeStream(Posture(policy=CapturePolicy(ceiling="redacted")), session_hint="t")
    for i in range(stream_mod.MAX_TRACKED + 500):
        st.feed({"type": "TOOL_CALL_START", "toolCallId": f"c{i}", "toolCallName": "x"})
    for i in range(stream_mod.MAX_MESSAGES + 50):
        st.feed({"type": "TEXT_MESSAGE_START", "messageId": f"m{i}"})
    big = "x" * 1000
    for _ in range(200):
        st.feed({"type": "TEXT_MESSAGE_CONTENT", "messageId": f"m{stream_mod.MAX_MESSAGES + 49}",
                 "delta": big})
    assert len(st.tools) == stream_mod.MAX_TRACKED
    assert len(st.messages) == stream_mod.MAX_MESSAGES
    assert max(m.size for m in st.messages.values()) == stream_mod.MAX_TEXT


def test_text_is_not_kept_at_metadata():
    st = TeeStream(session_hint="t")
    st.feed({"type": "TEXT_MESSAGE_START", "messageId": "m"})
    st.feed({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "secret words"})
    assert st.messages["m"].parts == [] and st.messages["m"].had_text


def test_a_run_started_over_an_open_run_closes_the_old_one_first():
    st = TeeStream()
    st.feed({"type": "RUN_STARTED", "threadId": "t", "runId": "r1"})
    got = st.feed({"type": "RUN_STARTED", "threadId": "t", "runId": "r2"})
    assert [(m.run, m.emission["type"], m.emission["data"]) for m in got] == [
        ("r1", "run.failed", {"reason": "superseded"}), ("r2", "run.started", {"trigger": "user"})]
