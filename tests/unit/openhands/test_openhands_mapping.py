"""The pure OpenHands mapping against the shared pins and the real server's shapes.

Expected values come from ``shared/aep/conformance/fixtures/mappings/openhands.json``
(read at test time), from the spec/record, or from the real
``openhands-agent-server`` frames captured in ``tests/fixtures/openhands_real/``.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core.capture import CapturePolicy, digest
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.openhands.mapping import (
    ATTENTION_PROMPT,
    frame_facts,
    is_ephemeral,
    is_snapshot,
    map_event,
    pin_view,
    status_moments,
    status_of,
)
from tests.support.schema import validate_event
from tests.support.shared import fixture

PINS = fixture("mappings/openhands.json")
REAL = Path(__file__).resolve().parents[2] / "fixtures" / "openhands_real"
DIGEST_DRIFT = {"action_event", "action_event_unknown_risk"}


def real(name: str) -> dict:
    return json.loads((REAL / f"{name}.json").read_text())


def real_frames(name: str, kind: str, **match) -> list[dict]:
    return [f for f in real(name)["frames"] if f.get("kind") == kind
            and all(f.get(k) == v for k, v in match.items())]


def one(events: list) -> dict:
    assert len(events) == 1, events
    return events[0]


def stamp_all(emissions: list[dict], policy: CapturePolicy | None = None) -> list[dict]:
    st_ = Stamper("openhands", epoch=1, host="test-host", policy=policy or CapturePolicy())
    return [st_.stamp("conv-1", {k: v for k, v in e.items() if k in
                                 ("type", "data", "subject", "step", "severity", "gating")}) for e in emissions]


# --------------------------------------------------------------------------- the pins

@pytest.mark.parametrize("name", sorted(n for n in PINS["events"] if n not in DIGEST_DRIFT))
def test_event_pin(name):
    pin = PINS["events"][name]
    got = [pin_view(e) for e in map_event(copy.deepcopy(pin["input"]))]
    assert got == ([] if pin["expected"] is None else [pin["expected"]])


@pytest.mark.parametrize("name", sorted(n for n in PINS["events"] if "deltas_expected" in PINS["events"][n]))
def test_event_pin_delta_opt_in(name):
    pin = PINS["events"][name]
    got = [pin_view(e) for e in map_event(copy.deepcopy(pin["input"]), Posture(deltas=True))]
    assert got == ([] if pin["deltas_expected"] is None else [pin["deltas_expected"]])


@pytest.mark.parametrize("name", sorted(DIGEST_DRIFT))
def test_action_pins_except_the_drifted_digest(name):
    """FIXTURE DRIFT (shared/aep/README.md): the two ``args_digest`` pins of the
    ActionEvent entries do not reproduce from their own input under any
    canonical form. Every other field of the pin reproduces; the digest is
    tested as the RULE: SHA-256/16 over the canonical JSON of the typed
    ``action`` object (AEP-0003 §9.3)."""
    pin = PINS["events"][name]
    got = pin_view(one(map_event(copy.deepcopy(pin["input"]))))
    want = copy.deepcopy(pin["expected"])
    assert got["data"].pop("args_digest") == digest(pin["input"]["action"])
    drifted = want["data"].pop("args_digest")
    assert got == want
    # the drift itself, stated: no canonical form of the input yields the pin
    action = pin["input"]["action"]
    args = pin["input"]["tool_call"]["function"]["arguments"]
    forms = [action, {k: v for k, v in action.items() if k != "kind"}, json.loads(args), args]
    assert drifted not in {digest(f) for f in forms}


def test_fallback_pin():
    pin = PINS["fallback"]
    assert [pin_view(e) for e in map_event(copy.deepcopy(pin["input"]))] == [pin["expected"]]


@pytest.mark.parametrize("name", sorted(PINS["status_transitions"]))
def test_status_transition_pin(name):
    pin = PINS["status_transitions"][name]
    got = [{"type": m["type"], "data": m["data"]} for m in status_moments(pin["prev"], pin["next"])]
    assert got == pin["expected"]


def test_attention_request_is_read_only_in_the_table():
    """Record: gated off (and in the pure table) the ask has NO options and
    NO respond path; its prompt is structural, declared so to the gate."""
    req = one([m for m in status_moments("running", "waiting_for_confirmation")])
    assert req["data"] == {"kind": "permission", "prompt": ATTENTION_PROMPT}
    assert "options" not in req["data"] and "respond_via" not in req["data"]
    assert req["gating"] == {"structural": ["prompt"]}


def test_token_event_maps_to_nothing_ever():
    ev = PINS["events"]["token_event"]["input"]
    for posture in (Posture(), Posture(deltas=True), Posture(policy=CapturePolicy(ceiling="full"), deltas=True)):
        assert map_event(ev, posture) == []


def test_vendor_plane_is_debug():
    for name in ("message_user", "pause", "interrupt", "system_prompt", "condensation_request"):
        e = one(map_event(PINS["events"][name]["input"]))
        assert e["type"].startswith("x.openhands.") and e["severity"] == "debug"
    assert "severity" not in one(map_event(PINS["events"]["observation_ok"]["input"]))


# --------------------------------------------------------------------------- run bookkeeping

def test_receiver_run_bookkeeping_closes_what_the_table_leaves_open():
    """With the receiver's own ``run_open`` the table still holds, and a run
    left open when the status lands on ``idle`` (a denied confirmation:
    waiting -> idle, observed on the real server) closes with reason idle."""
    got = [m["type"] for m in status_moments("waiting_for_confirmation", "idle", run_open=True)]
    assert got == ["attention.resolved", "run.finished"]
    assert status_moments("waiting_for_confirmation", "idle", run_open=True)[1]["data"] == {"reason": "idle"}
    # idle -> paused (pause from idle, real) -> running: no run was open, so one opens
    assert [m["type"] for m in status_moments("paused", "running", run_open=False)] == ["run.started"]
    assert status_moments("paused", "running", run_open=True) == []
    # never a close without an open run
    assert status_moments("running", "finished", run_open=False) == []


def test_an_ask_is_never_without_its_run():
    """The vendor enters waiting_for_confirmation only inside a run: an ask
    with no run open (its opening missed) opens the run first; with one
    open it is the pinned ask alone."""
    for prev in (None, "idle", "finished", "paused"):
        assert [m["type"] for m in status_moments(prev, "waiting_for_confirmation", run_open=False)] == \
            ["run.started", "attention.requested"], prev
    assert [m["type"] for m in status_moments("running", "waiting_for_confirmation", run_open=True)] == \
        ["attention.requested"]
    assert [m["type"] for m in status_moments("paused", "waiting_for_confirmation", run_open=True)] == \
        ["attention.requested"]


def test_unknown_and_none_statuses_are_inert():
    assert status_moments(None, None) == []
    assert status_moments("running", "some_future_status") == []
    assert [m["type"] for m in status_moments("waiting_for_confirmation", "some_future_status")] == \
        ["attention.resolved"]


# --------------------------------------------------------------------------- real server shapes
# One test per difference between what openhands-agent-server 1.58.2 sends and
# the pinned 1.35.0 transport shape (tests/fixtures/openhands_real/README.md).

def test_real_parent_id_is_on_the_wire_and_ignored():
    """Pinned: event_transport_dump strips parent_id. Real 1.58.2: the socket
    sends model_dump(exclude_none=True), parent_id included. No lineage claim
    either way: the mapping is identical without it."""
    act = one(real_frames("approve", "ActionEvent", tool_name="terminal"))
    assert "parent_id" in act
    stripped = {k: v for k, v in act.items() if k != "parent_id"}
    assert map_event(act) == map_event(stripped)
    assert "parent_id" not in json.dumps(map_event(act))


def test_real_tool_call_shape_is_flat():
    """Pinned tool_call: {id, type, function: {name, arguments}}; real:
    {id, name, arguments, origin}. The digest rule reads the typed
    ``action``, never tool_call, so both shapes digest the same action."""
    act = one(real_frames("approve", "ActionEvent", tool_name="terminal"))
    assert set(act["tool_call"]) == {"id", "name", "arguments", "origin"}
    e = pin_view(one(map_event(act)))
    assert e == {"type": "tool.requested", "subject": "terminal", "step": act["llm_response_id"],
                 "data": {"vendor_ts": act["timestamp"], "vendor_event_id": act["id"],
                          "tool": {"name": "terminal", "call_id": act["tool_call_id"]},
                          "args_digest": digest(act["action"])}}


def test_real_action_summary_and_thinking_stay_out_at_metadata():
    act = one(real_frames("approve", "ActionEvent", tool_name="terminal"))
    assert act["summary"] and act["thinking_blocks"] == [] and act["security_risk"] == "UNKNOWN"
    data = one(map_event(act))["data"]
    assert "summary" not in data and "risk" not in data and "args" not in data
    full = one(map_event(act, Posture(policy=CapturePolicy(ceiling="full"))))
    assert full["data"]["args"] == act["action"] and full["data"]["summary"] == act["summary"]


def test_real_observation_extra_fields_do_not_leak():
    """Real TerminalObservation carries command, exit_code, metadata (host,
    user, paths) and content parts with cache_prompt; at metadata only the
    tool ref and the digest of the text leave."""
    obs = one(real_frames("approve", "ObservationEvent", tool_name="terminal"))
    assert obs["observation"]["metadata"]["hostname"] and "cache_prompt" in obs["observation"]["content"][0]
    e = pin_view(one(map_event(obs)))
    assert e == {"type": "tool.completed", "subject": "terminal",
                 "data": {"vendor_ts": obs["timestamp"], "vendor_event_id": obs["id"],
                          "tool": {"name": "terminal", "call_id": obs["tool_call_id"]},
                          "result_digest": digest("aep-mock-ran")}}


def test_real_finish_action_and_observation():
    act = one(real_frames("approve", "ActionEvent", tool_name="finish"))
    obs = one(real_frames("approve", "ObservationEvent", tool_name="finish"))
    assert one(map_event(act))["type"] == "tool.requested"
    o = one(map_event(obs))
    assert o["type"] == "tool.completed" and o["data"]["result_digest"] == digest("Done: the command ran.")


def test_real_user_rejection_from_the_environment_source():
    """Real: UserRejectObservation has source "environment" (pinned input:
    "user"); the split reads rejection_source only."""
    rej = one(real_frames("reject", "UserRejectObservation"))
    assert rej["source"] == "environment" and rej["rejection_source"] == "user"
    e = one(map_event(rej))
    assert pin_view(e) == {"type": "x.openhands.user_reject.observation", "subject": "terminal",
                           "data": {"vendor_ts": rej["timestamp"], "vendor_event_id": rej["id"],
                                    "tool": {"name": "terminal", "call_id": rej["tool_call_id"]}}}
    assert "Not on this machine." not in json.dumps(e)
    red = one(map_event(rej, Posture(policy=CapturePolicy(ceiling="redacted"))))
    assert red["data"]["reason"] == "Not on this machine." and red["gating"] == {"levels": {"reason": "redacted"}}


def test_real_conversation_error_classification():
    """Real ConversationErrorEvent adds ``classification`` (kind, retryable,
    user_action); error.raised keeps the pinned metadata ({code})."""
    err = one(real_frames("model_500", "ConversationErrorEvent"))
    assert err["classification"]["retryable"] is True
    e = pin_view(one(map_event(err)))
    assert e == {"type": "error.raised", "data": {"vendor_ts": err["timestamp"], "vendor_event_id": err["id"],
                                                  "code": "LLMServiceUnavailableError"}}
    unreachable = one(real_frames("model_unreachable", "ConversationErrorEvent"))
    assert one(map_event(unreachable))["data"]["code"] == "LLMServiceUnavailableError"


def test_real_connect_snapshot_is_full_state_first_and_ephemeral():
    """Real: every new subscriber first gets a full_state snapshot (fresh id,
    connect-time timestamp, no parent_id), never persisted (absent from the
    REST event search), so it never anchors a replay."""
    cap = real("approve")
    first = cap["frames"][0]
    assert is_snapshot(first) and status_of(first) == "idle" and "parent_id" not in first
    persisted = {e["id"] for e in cap["rest"]["events_search"]["items"]}
    assert first["id"] not in persisted and is_ephemeral(first)
    assert all(not is_ephemeral(e) for e in cap["rest"]["events_search"]["items"])
    e = pin_view(one(map_event(first)))
    assert e == {"type": "state.snapshot", "data": {"vendor_ts": first["timestamp"], "vendor_event_id": first["id"]}}


def test_real_message_event_shape():
    """Real MessageEvent: activated_skills [] and extended_content [] always
    present, content parts with cache_prompt; an empty skill list is no fact."""
    msg = one(real_frames("chat", "MessageEvent", source="agent"))
    assert msg["activated_skills"] == [] and msg["extended_content"] == []
    e = pin_view(one(map_event(msg)))
    assert e == {"type": "x.openhands.message.event", "step": msg["llm_response_id"],
                 "data": {"vendor_ts": msg["timestamp"], "vendor_event_id": msg["id"], "role": "assistant"}}


def test_real_key_deltas_beyond_execution_status():
    for key in ("stats", "last_user_message_id"):
        ev = real_frames("approve", "ConversationStateUpdateEvent", key=key)[0]
        e = pin_view(one(map_event(ev)))
        assert e == {"type": "state.delta", "data": {"vendor_ts": ev["timestamp"],
                                                     "vendor_event_id": ev["id"], "key": key}}
        assert status_of(ev) is None


def test_real_pause_event_with_root_parent():
    pause = one(real_frames("idle_pause_and_409", "PauseEvent"))
    assert pause["parent_id"] == "__root__"
    assert pin_view(one(map_event(pause))) == {"type": "x.openhands.pause.event",
                                               "data": {"vendor_ts": pause["timestamp"],
                                                        "vendor_event_id": pause["id"]}}


def test_real_system_prompt_tools_stay_out():
    sp = one(real_frames("approve", "SystemPromptEvent"))
    assert sp["tools"] and "dynamic_context" in sp
    assert pin_view(one(map_event(sp)))["data"] == {"vendor_ts": sp["timestamp"], "vendor_event_id": sp["id"]}


def test_real_status_reads_from_both_shapes():
    frames = real("pause_resume")["frames"]
    snaps = [status_of(f) for f in frames if is_snapshot(f)]
    keys = [status_of(f) for f in frames if f.get("key") == "execution_status"]
    assert snaps[0] == "idle" and "paused" in snaps
    assert keys == ["running", "paused", "waiting_for_confirmation", "running", "finished"]


@pytest.mark.parametrize("capture", sorted(p.stem for p in REAL.glob("*.json")))
@pytest.mark.parametrize("ceiling", ["metadata", "redacted", "full"])
def test_every_real_frame_maps_to_valid_events(capture, ceiling):
    policy = CapturePolicy(ceiling=ceiling)
    for frame in real(capture)["frames"]:
        for ev in stamp_all(map_event(frame, Posture(policy=policy, deltas=True)), policy):
            validate_event(ev)


def test_redacted_content_passes_the_pipeline():
    """x.openhands.* content rides only at redacted+, through AEP-0003 §9.4."""
    policy = CapturePolicy(ceiling="redacted", secret_values=("sekrit-value-123",))
    msg = copy.deepcopy(PINS["events"]["message_user"]["input"])
    msg["llm_message"]["content"][0]["text"] = "token sekrit-value-123 here"
    e = one(map_event(msg, Posture(policy=policy)))
    assert "sekrit-value-123" not in json.dumps(e) and "token" in e["data"]["content"]
    assert "content" not in one(map_event(msg))["data"]


def test_capture_claims_are_honest():
    """With the gate hints the stamper claims what it kept: an x.openhands
    event without content is metadata even under a redacted ceiling; with
    content it is redacted; the structural ask prompt survives a metadata
    attention ceiling verbatim."""
    pol = CapturePolicy(ceiling="redacted")
    pause = one(stamp_all(map_event(PINS["events"]["pause"]["input"], Posture(policy=pol)), pol))
    assert pause["capture"] == "metadata"
    msg = one(stamp_all(map_event(PINS["events"]["message_user"]["input"], Posture(policy=pol)), pol))
    assert msg["capture"] == "redacted" and msg["data"]["content"] == "Please fix the failing test."
    meta = CapturePolicy(attention="metadata")
    req = one(stamp_all([m for m in status_moments("running", "waiting_for_confirmation")], meta))
    assert req["data"]["prompt"] == ATTENTION_PROMPT and req["capture"] == "metadata"


def test_deltas_ride_only_with_the_opt_in():
    ev = PINS["events"]["streaming_delta"]["input"]
    assert map_event(ev) == []
    assert one(map_event(ev, Posture(deltas=True)))["type"] == "x.openhands.streaming.delta"


# --------------------------------------------------------------------------- degradation

@pytest.mark.parametrize("kind", ["ActionEvent", "ObservationEvent", "UserRejectObservation", "AgentErrorEvent"])
def test_core_kind_without_its_facts_degrades_to_visibility(kind):
    ev = {"kind": kind, "id": "e1", "timestamp": "2026-01-01T00:00:00", "unexpected": {"x": [1]}}
    e = one(map_event(ev))
    assert e["type"].startswith("x.openhands.") and e["data"] == {"vendor_ts": ev["timestamp"],
                                                                  "vendor_event_id": "e1"}


def test_future_kinds_follow_the_mechanical_rule():
    assert one(map_event({"kind": "SecurityAnalysisEvent"}))["type"] == "x.openhands.security.analysis"
    assert one(map_event({"kind": "ServerErrorEvent"}))["type"] == "x.openhands.server.error"
    assert one(map_event({"kind": "LLMCompletionLogEvent"}))["type"] == "x.openhands.llm_completion.log"
    assert one(map_event({"kind": "Weird Kind!"}))["type"] == "x.openhands.weird.kind"


@pytest.mark.parametrize("bad", [None, 1, "x", [], {}, {"kind": None}, {"kind": ""}, {"kind": 3}])
def test_not_an_event_maps_to_nothing(bad):
    assert map_event(bad) == []


# --------------------------------------------------------------------------- fuzz

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20)
_KINDS = sorted({p["input"]["kind"] for p in PINS["events"].values()}
                | {"ConversationStateUpdateEvent", "ServerErrorEvent", "Condensation"})
_event = st.fixed_dictionaries(
    {"kind": st.sampled_from(_KINDS) | st.text(max_size=30)},
    optional={"id": _json, "timestamp": _json, "source": _json, "tool_name": _json, "tool_call_id": _json,
              "action": _json, "observation": st.fixed_dictionaries({}, optional={"content": _json, "is_error": _json}) | _json,
              "llm_response_id": _json, "security_risk": _json, "key": st.sampled_from(["full_state", "execution_status"]) | _json,
              "value": _json, "llm_message": _json, "rejection_source": _json, "rejection_reason": _json,
              "error": _json, "code": _json, "detail": _json, "forgotten_event_ids": _json, "summary": _json,
              "activated_skills": _json, "sender": _json})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=_event | _json, ceiling=st.sampled_from(["none", "metadata", "redacted", "full"]),
       deltas=st.booleans())
def test_fuzz_any_json_event_maps_to_valid_events(event, ceiling, deltas):
    policy = CapturePolicy(ceiling=ceiling)
    out = map_event(event, Posture(policy=policy, deltas=deltas))
    assert len(out) <= 1
    for ev in stamp_all(out, policy):
        validate_event(ev)
    status_of(event)
    is_ephemeral(event)


@settings(max_examples=500, deadline=None)
@given(event=_event | st.fixed_dictionaries({"kind": _json}, optional={"key": _json, "value": _json})
       | st.dictionaries(st.text(max_size=12), _json, max_size=4))
def test_frame_facts_equals_the_three_questions(event):
    """The receiver's one-look shortcut answers exactly what is_snapshot,
    status_of and is_ephemeral answer, for any JSON object (kinds of every
    JSON type: an unhashable kind is not ephemeral and never raises)."""
    assert frame_facts(event) == (is_snapshot(event), status_of(event), is_ephemeral(event))


def test_frame_facts_on_the_real_frames():
    frames = [f for p in sorted(REAL.glob("*.json")) for f in json.loads(p.read_text()).get("frames", [])]
    assert len(frames) > 50
    assert any(frame_facts(f)[0] for f in frames) and any(frame_facts(f)[1] for f in frames)
    for f in frames:
        assert frame_facts(f) == (is_snapshot(f), status_of(f), is_ephemeral(f))


@settings(max_examples=200, deadline=None)
@given(prev=st.sampled_from(["idle", "running", "paused", "waiting_for_confirmation", "finished",
                             "error", "stuck", "deleting", None]) | st.text(max_size=8),
       nxt=st.sampled_from(["idle", "running", "paused", "waiting_for_confirmation", "finished",
                            "error", "stuck", "deleting", None]) | st.text(max_size=8),
       run_open=st.none() | st.booleans())
def test_fuzz_status_moments_are_valid_and_never_double_close(prev, nxt, run_open):
    out = status_moments(prev, nxt, run_open=run_open)
    types = [m["type"] for m in out]
    assert sum(t in ("run.finished", "run.failed", "run.cancelled") for t in types) <= 1
    assert types.count("run.started") <= 1
    for ev in stamp_all(out):
        validate_event(ev)


def test_real_streaming_delta_is_live_only():
    """Real (llm stream=true): StreamingDeltaEvent {id, timestamp, source,
    content} rides the socket and is absent from the persisted log (REST
    search), as the record says: replay legitimately lacks it."""
    cap = real("streaming")
    delta = one([f for f in cap["frames"] if f["kind"] == "StreamingDeltaEvent"])
    assert delta["id"] not in {e["id"] for e in cap["rest"]["events_search"]["items"]}
    assert is_ephemeral(delta) and map_event(delta) == []
    e = one(map_event(delta, Posture(deltas=True)))
    assert pin_view(e) == {"type": "x.openhands.streaming.delta",
                           "data": {"vendor_ts": delta["timestamp"], "vendor_event_id": delta["id"]}}
    red = one(map_event(delta, Posture(policy=CapturePolicy(ceiling="redacted"), deltas=True)))
    assert red["data"]["content"] == "Hello from the mock model."
