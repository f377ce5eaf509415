"""The real SDK pairs' wire (``tests/fixtures/acp_real/``, captured through the
real tee) replayed through the story, and every drift the fixtures README
lists as its own test."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridges.acp.join import Story
from bridges.acp.mapping import map_moment, map_update
from bridges.core import capture
from bridges.core.envelope import Stamper
from tests.support.schema import validate_event, validate_stream
from tests.unit.acp.test_acp_join import stamp_all

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "acp_real"


def replay(name: str) -> tuple[Story, list[dict]]:
    story = Story("CAPTURE")
    st = Stamper("acp", epoch=1, host="h", policy=capture.CapturePolicy())
    events = []
    for rec in json.loads((REAL / f"{name}.json").read_text())["lines"]:
        events += stamp_all(story, st, story.feed(rec["dir"], rec["line"].encode()))
    events += stamp_all(story, st, story.close(0))
    return story, events


@pytest.mark.parametrize("name,session", [("python_pair", "sess-1"), ("ts_agent", "ts-sess-1")])
def test_real_pair_replays_to_the_mapped_story(name, session):
    story, events = replay(name)
    assert story.counters.malformed == 0 and story.counters.unmatched == 0
    for ev in events:
        validate_event(ev)
    validate_stream(events)
    core = [e["type"] for e in events if e.get("session") == session and not e["type"].startswith("x.")]
    assert core[0] == "session.started" and core[-1] == "session.ended"
    assert core.count("run.started") == 3
    assert [t for t in core if t in ("run.finished", "run.cancelled", "run.failed")] == [
        "run.finished", "run.finished", "run.cancelled"]
    assert core.count("attention.requested") == 3 and core.count("attention.resolved") == 3
    assert core.count("tool.completed") == 1 and core.count("tool.failed") == 2
    conn = [e["type"] for e in events if e.get("session") == "tee-CAPTURE"]
    assert conn == ["x.acp.initialize.event", "x.acp.initialize.result", "x.acp.session.new"]


def test_real_usage_update():
    """Drift 1: schema-v1.19 ``used``/``size``/``cost``."""
    (e,) = map_update({"sessionUpdate": "usage_update", "used": 1000, "size": 200000,
                       "cost": {"amount": 0.25, "currency": "USD"}})
    assert e["type"] == "x.acp.usage.updated" and e["severity"] == "debug"
    assert e["data"] == {"context_used_tokens": 1000, "context_size_tokens": 200000,
                         "cost": {"total": 0.25, "currency": "USD"}}
    _, events = replay("python_pair")
    usage = [e for e in events if e["type"] == "x.acp.usage.updated"]
    assert [u["data"]["context_used_tokens"] for u in usage] == [1000, 2000, 3000]


def test_prompt_usage_rides_run_finished():
    """Drift 3: the UNSTABLE ``PromptResponse.usage``."""
    (e,) = map_moment({"kind": "response", "method": "session/prompt", "result": {
        "stopReason": "max_turn_requests", "usage": {"totalTokens": 9, "inputTokens": 7,
                                                     "outputTokens": 2}}})
    assert e == {"type": "run.finished", "data": {
        "stop_reason": "max_turn_requests", "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 2}}
    validate_event(Stamper("acp").stamp("s", e))


def test_permission_without_a_title_synthesizes_the_prompt():
    """Drift 6: ``toolCall`` with only its id, even at ``redacted``."""
    (e,) = map_moment({"kind": "request", "method": "session/request_permission", "params": {
        "sessionId": "s", "toolCall": {"toolCallId": "call_001"}, "options": []}})
    assert e["data"]["prompt"] == "acp requests permission: call_001"


def test_session_load_and_resume_bind_from_the_request():
    """Drift 8."""
    for method, result in (("session/load", None), ("session/resume", {})):
        story = Story("T")
        story.feed("client", json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                                         "params": {"sessionId": "old"}}).encode())
        (o,) = story.feed("agent", json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode())
        assert (o.session, o.emission["type"]) == ("old", "session.started")
