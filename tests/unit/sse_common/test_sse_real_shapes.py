"""What the CURRENT real servers send (opencode 1.18.33, kilo 7.7.7; the
captures in ``tests/fixtures/*_real/``) maps correctly: one test per shape
the pins do not cover (the drift list in the captures' README). Inputs are
the captured frames themselves; expected outputs follow the pins' rules and
AEP-0002 §5.3 / AEP-0006."""
from __future__ import annotations

import pytest

from bridges.core import capture
from bridges.core.posture import Posture
from bridges.sse_common.mapping import diff_todos, map_bus, map_tool_part
from tests.support.opencode_fixtures import meta, real_event, rest

VENDORS = ["opencode", "kilocode"]
OPTIONS = [{"id": "once", "label": "Allow once"}, {"id": "always", "label": "Always allow"},
           {"id": "reject", "label": "Reject"}]


def shape(e):
    out = {"type": e["type"], "data": e.get("data", {})}
    if "subject" in e:
        out["subject"] = e["subject"]
    return out


def primary(vendor, **kw):
    return Posture(agent=vendor, mode="primary", **kw)


def reject_ask(vendor):
    return real_event(vendor, "permission.asked",
                      lambda e: e.properties["patterns"] == ["rm -rf build"])


@pytest.mark.parametrize("vendor", VENDORS)
def test_permission_asked_current_shape_primary_read_only(vendor):
    """Current ask: {id, permission, patterns, metadata, always, tool} (no
    type/title). Primary, gate off: no options, no respond_via; the command
    pattern is the human line at the redacted attention ceiling."""
    ev = reject_ask(vendor)
    assert "title" not in ev.properties and ev.properties["permission"] == "bash"
    out = map_bus(ev.type, ev.properties, primary(vendor))
    assert [shape(e) for e in out] == [{
        "type": "attention.requested", "subject": "bash",
        "data": {"kind": "permission", "prompt": "Permission requested: bash \u2014 rm -rf build"}}]


@pytest.mark.parametrize("vendor", VENDORS)
def test_permission_asked_answerable_offers_the_vendor_reply_enum(vendor):
    ev = reject_ask(vendor)
    out = map_bus(ev.type, ev.properties, primary(vendor, answerable=True))
    assert out[0]["data"]["options"] == OPTIONS
    assert out[0]["data"]["respond_via"] == ["control"]
    # the enum is the server's own: the reply route's schema (GET /doc) and
    # what the recorded replies used
    assert rest(vendor, "reply once")["body"] == {"reply": "once"}


@pytest.mark.parametrize("vendor", VENDORS)
def test_permission_prompt_synthesized_at_metadata_attention_ceiling(vendor):
    ev = reject_ask(vendor)
    pol = capture.CapturePolicy(attention="metadata")
    out = map_bus(ev.type, ev.properties, primary(vendor, policy=pol, answerable=True))
    assert out[0]["data"]["prompt"] == f"{vendor} requests permission: bash"
    assert [o["label"] for o in out[0]["data"]["options"]] == ["once", "always", "reject"]
    # and the stamper's gate agrees with the mapper's structural forms
    data, level = capture.gate("attention.requested", out[0]["data"], "metadata", pol,
                               agent=vendor, subject="bash")
    assert data == out[0]["data"] and level == "metadata"


@pytest.mark.parametrize("vendor", VENDORS)
def test_permission_replied_current_fields(vendor):
    """Settle: {sessionID, requestID, reply} (pins: permissionID, response)."""
    ev = real_event(vendor, "permission.replied", lambda e: e.properties["reply"] == "reject")
    assert set(ev.properties) == {"sessionID", "requestID", "reply"}
    out = map_bus(ev.type, ev.properties, primary(vendor))
    assert [shape(e) for e in out] == [{"type": "attention.resolved",
                                        "data": {"resolution": "answered"},
                                        "subject": ev.properties["requestID"]}]


@pytest.mark.parametrize("vendor", VENDORS)
def test_question_asked_real_shape_is_a_form(vendor):
    """Both current servers ask questions (kilo pin's shape; options carry a
    description, no ``custom`` -> the vendor default true -> ``other``)."""
    ev = real_event(vendor, "question.asked")
    out = map_bus(ev.type, ev.properties, primary(vendor))
    assert [shape(e) for e in out] == [{
        "type": "attention.requested", "subject": ev.properties["id"],
        "data": {"kind": "form", "prompt": f"{vendor} asks 1 question", "fields": [{
            "id": "1", "type": "select", "required": True, "other": True,
            "label": "Database: Which database should the new service use?",
            "choices": [{"id": "1", "label": "PostgreSQL"}, {"id": "2", "label": "SQLite"}]}]}}]
    answerable = map_bus(ev.type, ev.properties, primary(vendor, answerable=True))
    assert answerable[0]["data"]["respond_via"] == ["control"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_question_labels_are_placeholders_at_metadata(vendor):
    ev = real_event(vendor, "question.asked")
    pol = capture.CapturePolicy(attention="metadata")
    f = map_bus(ev.type, ev.properties, primary(vendor, policy=pol))[0]["data"]["fields"][0]
    assert f["label"] == "1" and [c["label"] for c in f["choices"]] == ["1", "2"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_question_replied_and_rejected(vendor):
    ev = real_event(vendor, "question.replied")
    assert ev.properties["answers"] == [["SQLite"]]
    assert shape(map_bus(ev.type, ev.properties, primary(vendor))[0]) == {
        "type": "attention.resolved", "data": {"resolution": "answered"},
        "subject": ev.properties["requestID"]}
    rej = {"sessionID": "ses_1", "requestID": "que_1"}  # schema EventQuestionRejected
    assert shape(map_bus("question.rejected", rej, primary(vendor))[0]) == {
        "type": "attention.resolved", "data": {"resolution": "dismissed"}, "subject": "que_1"}


def _tool_part(vendor, status, pred=None):
    return real_event(vendor, "message.part.updated",
                      lambda e: e.properties["part"].get("type") == "tool"
                      and e.properties["part"]["state"]["status"] == status
                      and (pred is None or pred(e.properties["part"]))).properties["part"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_tool_part_lifecycle(vendor):
    """Tool calls ride message.part.updated tool parts: pending (input {})
    -> running -> completed (output) | error."""
    pending = _tool_part(vendor, "pending")
    assert pending["state"]["input"] == {}
    assert [shape(e) for e in map_tool_part(pending, primary(vendor))] == [{
        "type": "tool.requested", "subject": "bash",
        "data": {"tool": {"name": "bash", "call_id": pending["callID"]}}}]
    running = _tool_part(vendor, "running", lambda p: p["state"]["input"])
    req = map_tool_part(running, primary(vendor))[0]
    assert req["data"]["args_digest"] == capture.digest(running["state"]["input"])
    done = _tool_part(vendor, "completed", lambda p: p["tool"] == "bash")
    out = map_tool_part(done, primary(vendor))[0]
    t = done["state"]["time"]
    assert shape(out) == {"type": "tool.completed", "subject": "bash", "data": {
        "tool": {"name": "bash", "call_id": done["callID"]},
        "result_digest": capture.digest(done["state"]["output"]),
        "duration_ms": t["end"] - t["start"]}}


@pytest.mark.parametrize("vendor", VENDORS)
def test_rejected_tool_part_is_failed_or_denied(vendor):
    part = _tool_part(vendor, "error")
    assert "rejected permission" in part["state"]["error"]
    failed = map_tool_part(part, primary(vendor))[0]
    assert failed["type"] == "tool.failed"
    assert failed["data"]["error"] == {"type": "tool_error"}  # message is redacted-gated
    denied = map_tool_part(part, primary(vendor), denied_by="runtime")[0]
    assert shape(denied) == {"type": "tool.denied", "subject": "bash", "data": {
        "tool": {"name": "bash", "call_id": part["callID"]}, "by": "runtime"}}


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_reject_message_reached_the_model(vendor):
    """The current reply route's ``message`` is delivered: the model saw it."""
    assert rest(vendor, "reject with message")["status"] == 200
    assert any("not on this branch, use make clean" in t
               for t in meta(vendor)["tool_results_seen_by_model"])


@pytest.mark.parametrize("vendor", VENDORS)
def test_abort_error_stays_vendor_namespaced(vendor):
    ev = real_event(vendor, "session.error")
    assert ev.properties["error"]["name"] == "MessageAbortedError"
    out = map_bus(ev.type, ev.properties, primary(vendor))
    assert [shape(e) for e in out] == [{"type": f"x.{vendor}.session.error",
                                        "data": {"type": "MessageAbortedError"}}]
    assert out[0]["severity"] == "error"


@pytest.mark.parametrize("vendor", VENDORS)
def test_busy_status_is_progress_status(vendor):
    ev = real_event(vendor, "session.status", lambda e: e.properties["status"]["type"] == "busy")
    assert [shape(e) for e in map_bus(ev.type, ev.properties, primary(vendor))] == [
        {"type": "progress.status", "data": {}, "subject": "busy"}]


def test_kilo_turn_events_ride_the_fallback():
    for t in ("session.turn.open", "session.turn.close", "session.drain.interrupted"):
        ev = real_event("kilocode", t)
        out = map_bus(ev.type, ev.properties, primary("kilocode"))
        assert [shape(e) for e in out] == [{"type": f"x.kilocode.{t}", "data": {}}]


@pytest.mark.parametrize("vendor", VENDORS)
def test_streaming_and_heartbeats_are_not_emitted(vendor):
    for t, pred in (("message.part.delta", None), ("server.heartbeat", None),
                    ("message.part.updated", lambda e: e.properties["part"]["type"] == "text")):
        ev = real_event(vendor, t, pred)
        for mode in ("companion", "primary"):
            assert map_bus(ev.type, ev.properties, Posture(agent=vendor, mode=mode)) == []


@pytest.mark.parametrize("vendor", VENDORS)
def test_session_created_real_info(vendor):
    ev = real_event(vendor, "session.created")
    out = map_bus(ev.type, ev.properties, primary(vendor))
    assert [shape(e) for e in out] == [{"type": "session.started", "data": {
        "client": {"name": vendor, "version": meta(vendor)["version"]}}}]
    # title and directory ride only at redacted+ (AEP-0002 §5.3 label/cwd)
    red = map_bus(ev.type, ev.properties, primary(vendor, policy=capture.CapturePolicy(
        ceiling="redacted")))[0]["data"]
    assert red["label"] == ev.properties["info"]["title"]
    assert red["cwd"] == ev.properties["info"]["directory"]


def test_current_todo_shape_has_no_id_and_diffs_by_content():
    """The current ``Todo`` is {content, status, priority} (GET /doc of both
    servers): the diff keys on the content and the subject is a digest of it
    (content is redacted-gated; a subject is metadata)."""
    prev = [{"content": "write the fix", "status": "pending", "priority": "high"}]
    nxt = [{"content": "write the fix", "status": "completed", "priority": "high"},
           {"content": "ship it", "status": "pending", "priority": "low"}]
    out = diff_todos(prev, nxt, primary("opencode"))
    sub = lambda c: "todo-" + capture.digest(c)[:16]  # noqa: E731
    assert [shape(e) for e in out] == [
        {"type": "progress.task.completed", "data": {}, "subject": sub("write the fix")},
        {"type": "progress.task.planned", "data": {}, "subject": sub("ship it")}]
