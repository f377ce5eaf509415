"""The pure AG-UI mapping against the shared pins and the AG-UI 1.0 event union.

Expected values come from ``shared/aep/conformance/fixtures/mappings/agui.json``
(read at test time), from the design record ``bridge-agui-design.md``, or from
the real ``ag-ui-protocol`` 1.0.0 package (the list of event types and the
shape of each: every sample below is validated by the package's own models
and dumped the way its encoder does).
"""
from __future__ import annotations

import copy

import pytest

from bridges.agui.mapping import DEPRECATED_ALIASES, EVENT_TYPES, MALFORMED_TYPE, Posture, map_event, pin_view
from bridges.core.capture import CapturePolicy, digest
from bridges.core.envelope import Stamper
from tests.support.schema import validate_event
from tests.support.shared import fixture

ag_core = pytest.importorskip("ag_ui.core", reason="ag-ui-protocol (test dependency) missing")

PINS = fixture("mappings/agui.json")


def one(emissions: list) -> dict:
    assert len(emissions) == 1, emissions
    return emissions[0]


# --------------------------------------------------------------------------- the pins

@pytest.mark.parametrize("name", sorted(PINS["events"]))
def test_event_pin(name):
    pin = PINS["events"][name]
    got = [pin_view(e) for e in map_event(copy.deepcopy(pin["input"]))]
    assert got == ([] if pin["expected"] is None else [pin["expected"]])


@pytest.mark.parametrize("name", sorted(n for n in PINS["events"]
                                        if "deltas_expected" in PINS["events"][n]))
def test_event_pin_delta_opt_in(name):
    pin = PINS["events"][name]
    got = [pin_view(e) for e in map_event(copy.deepcopy(pin["input"]), Posture(deltas=True))]
    assert got == ([] if pin["deltas_expected"] is None else [pin["deltas_expected"]])


@pytest.mark.parametrize("name", sorted(n for n in PINS["events"]
                                        if "deltas_expected" not in PINS["events"][n]))
def test_pins_without_a_delta_fork_do_not_fork(name):
    pin = PINS["events"][name]
    got = [pin_view(e) for e in map_event(copy.deepcopy(pin["input"]), Posture(deltas=True))]
    assert got == ([] if pin["expected"] is None else [pin["expected"]])


def test_fallback_pin():
    pin = PINS["fallback"]
    assert [pin_view(e) for e in map_event(copy.deepcopy(pin["input"]))] == [pin["expected"]]


def test_result_digests_are_the_digest_of_the_content():
    for name in ("tool_call_result_joined", "tool_call_result_unjoined"):
        pin = PINS["events"][name]
        assert pin["expected"]["data"]["result_digest"] == digest(pin["input"]["content"])


# --------------------------------------------------------------------------- AG-UI 1.0

# One real 1.0 instance of every event type (required fields at least).
SAMPLES: dict[str, dict] = {
    "TEXT_MESSAGE_START": {"messageId": "m1", "role": "assistant"},
    "TEXT_MESSAGE_CONTENT": {"messageId": "m1", "delta": "Hello"},
    "TEXT_MESSAGE_END": {"messageId": "m1"},
    "TEXT_MESSAGE_CHUNK": {"messageId": "m1", "role": "assistant", "delta": "Hi"},
    "TOOL_CALL_START": {"toolCallId": "c1", "toolCallName": "lookup", "parentMessageId": "m1"},
    "TOOL_CALL_ARGS": {"toolCallId": "c1", "delta": "{\"city\":"},
    "TOOL_CALL_END": {"toolCallId": "c1"},
    "TOOL_CALL_CHUNK": {"toolCallId": "c2", "toolCallName": "lookup", "delta": "{}"},
    "TOOL_CALL_RESULT": {"messageId": "m2", "toolCallId": "c1", "content": "sunny", "role": "tool"},
    "STATE_SNAPSHOT": {"snapshot": {"done": 1}},
    "STATE_DELTA": {"delta": [{"op": "replace", "path": "/done", "value": 2},
                              {"op": "add", "path": "/x", "value": 1}]},
    "MESSAGES_SNAPSHOT": {"messages": [{"id": "u1", "role": "user", "content": "hi"}]},
    "ACTIVITY_SNAPSHOT": {"messageId": "a1", "activityType": "PLAN", "content": {"steps": 3},
                          "replace": True},
    "ACTIVITY_DELTA": {"messageId": "a1", "activityType": "PLAN",
                       "patch": [{"op": "replace", "path": "/steps", "value": 4}]},
    "RAW": {"event": {"provider": "payload"}, "source": "openai"},
    "CUSTOM": {"name": "checkpoint", "value": {"at": "answer"}},
    "RUN_STARTED": {"threadId": "t1", "runId": "r1", "protocolVersion": "1.0"},
    "RUN_FINISHED": {"threadId": "t1", "runId": "r1", "outcome": {"type": "success"},
                     "result": "done"},
    "RUN_ERROR": {"message": "provider throttled", "code": "rate_limit"},
    "STEP_STARTED": {"stepName": "plan"},
    "STEP_FINISHED": {"stepName": "plan"},
    "REASONING_START": {"messageId": "r1"},
    "REASONING_MESSAGE_START": {"messageId": "r1", "role": "reasoning"},
    "REASONING_MESSAGE_CONTENT": {"messageId": "r1", "delta": "hmm"},
    "REASONING_MESSAGE_END": {"messageId": "r1"},
    "REASONING_MESSAGE_CHUNK": {"messageId": "r1", "delta": "hmm"},
    "REASONING_END": {"messageId": "r1"},
    "REASONING_ENCRYPTED_VALUE": {"subtype": "message", "entityId": "r1",
                                  "encryptedValue": "AAAB64"},
    "SUBAGENT_STARTED": {"subagentRunId": "s1", "name": "researcher",
                         "description": "digs", "parentToolCallId": "c1"},
    "SUBAGENT_FINISHED": {"subagentRunId": "s1", "outcome": {"type": "success"},
                          "result": {"found": 3}},
    "SUBAGENT_ERROR": {"subagentRunId": "s1", "message": "gave up", "code": "timeout"},
}

# (default posture, with AEP_AGUI_DELTAS=1): the record's table; None = nothing.
EXPECTED_TYPE: dict[str, tuple[str | None, str | None]] = {
    "TEXT_MESSAGE_START": ("x.agui.text_message.start",) * 2,
    "TEXT_MESSAGE_CONTENT": (None, "x.agui.text_message.content"),
    "TEXT_MESSAGE_END": ("x.agui.text_message.end",) * 2,
    "TEXT_MESSAGE_CHUNK": (None, "x.agui.text_message.chunk"),
    "TOOL_CALL_START": ("tool.requested",) * 2,
    "TOOL_CALL_ARGS": (None, "x.agui.tool_call.args"),
    "TOOL_CALL_END": (None, "x.agui.tool_call.end"),
    "TOOL_CALL_CHUNK": (None, "x.agui.tool_call.chunk"),
    "TOOL_CALL_RESULT": ("tool.completed",) * 2,
    "STATE_SNAPSHOT": ("state.snapshot",) * 2,
    "STATE_DELTA": ("state.delta",) * 2,
    "MESSAGES_SNAPSHOT": ("x.agui.messages.snapshot",) * 2,
    "ACTIVITY_SNAPSHOT": ("x.agui.activity.snapshot",) * 2,
    "ACTIVITY_DELTA": ("x.agui.activity.delta",) * 2,
    "RAW": ("x.agui.raw.event",) * 2,
    "CUSTOM": ("x.agui.custom.event",) * 2,
    "RUN_STARTED": ("run.started",) * 2,
    "RUN_FINISHED": ("run.finished",) * 2,
    "RUN_ERROR": ("run.failed",) * 2,
    "STEP_STARTED": ("run.step.started",) * 2,
    "STEP_FINISHED": ("run.step.finished",) * 2,
    "REASONING_START": ("x.agui.reasoning.start",) * 2,
    "REASONING_MESSAGE_START": ("x.agui.reasoning_message.start",) * 2,
    "REASONING_MESSAGE_CONTENT": (None, "x.agui.reasoning_message.content"),
    "REASONING_MESSAGE_END": ("x.agui.reasoning_message.end",) * 2,
    "REASONING_MESSAGE_CHUNK": (None, "x.agui.reasoning_message.chunk"),
    "REASONING_END": ("x.agui.reasoning.end",) * 2,
    "REASONING_ENCRYPTED_VALUE": (None, None),
    "SUBAGENT_STARTED": ("x.agui.subagent.started",) * 2,
    "SUBAGENT_FINISHED": ("x.agui.subagent.finished",) * 2,
    "SUBAGENT_ERROR": ("x.agui.subagent.error",) * 2,
}

CEILINGS = ("none", "metadata", "redacted", "full")


def real_event(type_: str) -> dict:
    """The sample validated by ``ag_ui.core``'s own model for ``type_`` and
    dumped as its SSE encoder does (``by_alias``, ``exclude_none``)."""
    from pydantic import TypeAdapter
    model = TypeAdapter(ag_core.Event).validate_python({"type": type_, **SAMPLES[type_]})
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def test_the_event_union_is_the_installed_protocols():
    installed = [e.value for e in ag_core.EventType]
    assert len(installed) == 31
    assert sorted(EVENT_TYPES) == sorted(installed)
    assert set(SAMPLES) == set(installed) == set(EXPECTED_TYPE)


def test_thinking_is_gone_from_1_0_and_still_mapped_like_reasoning():
    installed = {e.value for e in ag_core.EventType}
    assert not any(t.startswith("THINKING_") for t in installed)
    for old, new in DEPRECATED_ALIASES.items():
        assert new in installed
        body = SAMPLES[new]
        for posture in (Posture(), Posture(deltas=True)):
            assert ([pin_view(e) for e in map_event({"type": old, **body}, posture)]
                    == [pin_view(e) for e in map_event({"type": new, **body}, posture)])


@pytest.mark.parametrize("type_", sorted(SAMPLES))
@pytest.mark.parametrize("deltas", [False, True])
def test_every_1_0_event_type_maps_per_the_record(type_, deltas):
    want = EXPECTED_TYPE[type_][1 if deltas else 0]
    got = map_event(real_event(type_), Posture(deltas=deltas))
    assert [e["type"] for e in got] == ([] if want is None else [want])
    for e in got:
        if e["type"].startswith("x.agui."):
            assert e["severity"] == "debug"  # the record: the vendor plane rides at debug


@pytest.mark.parametrize("type_", sorted(SAMPLES))
@pytest.mark.parametrize("ceiling", CEILINGS)
def test_every_1_0_event_stamps_schema_valid_at_every_ceiling(type_, ceiling):
    policy = CapturePolicy(ceiling=ceiling)
    st = Stamper("agui", epoch=1, host="test-host", policy=policy)
    for e in map_event(real_event(type_), Posture(policy=policy, deltas=True)):
        validate_event(st.stamp("t1", e, run="r1"))


def test_metadata_carries_no_content_at_all():
    """At the default ceiling no string of the samples' free text appears."""
    st = Stamper("agui", epoch=1, host="h", policy=CapturePolicy())
    words = ["Hello", "sunny", "provider throttled", "gave up", "digs", "hmm", "payload",
             "answer", "done\"", "AAAB64"]
    for type_ in SAMPLES:
        for e in map_event(real_event(type_), Posture(deltas=True)):
            ev = st.stamp("t1", e, run="r1")
            text = repr(ev.get("data", {}))
            assert not [w for w in words if w in text], (type_, ev)


def test_content_rides_at_redacted_through_the_gate():
    policy = CapturePolicy(ceiling="redacted")
    st = Stamper("agui", epoch=1, host="h", policy=policy)
    posture = Posture(policy=policy, deltas=True)

    def data(type_, **over):
        return st.stamp("t1", one(map_event({**real_event(type_), **over}, posture))).get("data", {})

    assert data("RUN_ERROR")["error"] == {"message": "provider throttled"}
    assert data("RUN_FINISHED")["summary"] == "done"
    assert data("TOOL_CALL_RESULT", toolCallName="lookup")["result_redacted"] == "sunny"
    assert data("STATE_SNAPSHOT")["state"] == {"done": 1}
    assert data("STATE_DELTA")["delta"][0]["path"] == "/done"
    assert data("CUSTOM")["value"] == {"at": "answer"}
    assert data("TEXT_MESSAGE_CONTENT")["delta"] == "Hello"
    # RAW never rides its payload below full (the record)
    assert "event" not in data("RAW")
    full = CapturePolicy(ceiling="full")
    raw = Stamper("agui", epoch=1, host="h", policy=full).stamp(
        "t1", one(map_event(real_event("RAW"), Posture(policy=full))))
    assert raw["data"]["event"] == {"provider": "payload"} and raw["capture"] == "full"


def test_redacted_content_passes_the_redaction_pipeline():
    policy = CapturePolicy(ceiling="redacted", secret_values=("s3cr3t-value-123",))
    st = Stamper("agui", epoch=1, host="h", policy=policy)
    ev = st.stamp("t1", one(map_event({"type": "CUSTOM", "name": "n",
                                       "value": "token s3cr3t-value-123"}, Posture(policy=policy))))
    assert "s3cr3t-value-123" not in repr(ev)


def test_run_finished_outcomes():
    cancelled = one(map_event({"type": "RUN_FINISHED", "threadId": "t", "runId": "r",
                               "outcome": {"type": "cancelled"}}))
    assert pin_view(cancelled) == {"type": "run.cancelled", "data": {}}
    interrupt = one(map_event({"type": "RUN_FINISHED", "threadId": "t", "runId": "r",
                               "outcome": {"type": "interrupt", "interrupts": [
                                   {"id": "i1", "reason": "approval"}]}}))
    # not attention.*: no respond path on a read-only channel (the record)
    assert pin_view(interrupt) == {"type": "run.finished",
                                   "data": {"outcome": "interrupt", "interrupts": 1}}


def test_usage_sums_into_gen_ai_usage():
    e = one(map_event({"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "usage": [
        {"provider": "a", "inputTokens": 10, "outputTokens": 3},
        {"provider": "b", "inputTokens": 5, "outputTokens": 2, "totalTokens": 7}]}))
    assert e["data"] == {"gen_ai.usage.input_tokens": 15, "gen_ai.usage.output_tokens": 5}


def test_subagent_attribution_rides_at_metadata():
    e = one(map_event({"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "x",
                       "subagentRunId": "s1"}))
    assert e["data"] == {"tool": {"name": "x", "call_id": "c"}, "subagent_run": "s1"}
    started = one(map_event(real_event("SUBAGENT_STARTED")))
    assert pin_view(started) == {"type": "x.agui.subagent.started", "subject": "s1", "data": {
        "subagent_run": "s1", "name": "researcher", "parent_tool_call": "c1"}}


def test_empty_assistant_message_is_no_reply_and_other_roles_are_nothing():
    assert map_event({"type": "TEXT_MESSAGE_END", "messageId": "m", "role": "assistant",
                      "content": ""}) == []
    for role in ("user", "system", "developer"):
        assert map_event({"type": "TEXT_MESSAGE_END", "messageId": "m", "role": role}) == []


def test_core_types_missing_their_identity_degrade_to_the_vendor_type():
    assert one(map_event({"type": "STEP_STARTED"}))["type"] == "x.agui.step.started"
    assert one(map_event({"type": "TOOL_CALL_START", "toolCallId": "c"}))["type"] == \
        "x.agui.tool_call.start"
    assert one(map_event({"type": "TOOL_CALL_RESULT", "content": "x"}))["type"] == \
        "x.agui.tool_call.result"


@pytest.mark.parametrize("value, reason", [
    ([1, 2], "not_object"), ("RUN_STARTED", "not_object"), (None, "not_object"),
    ({"no": "type"}, "no_type"), ({"type": ""}, "no_type"), ({"type": 7}, "no_type")])
def test_malformed_events_degrade_to_the_fallback_type(value, reason):
    e = one(map_event(value))
    assert e["type"] == MALFORMED_TYPE == "x.agui.unknown.event"
    assert e["data"] == {"malformed": reason} and e["severity"] == "debug"
