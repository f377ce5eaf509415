"""The test-side validator every other test relies on
(tests/support/schema.py): it accepts the whole golden corpus, rejects
every invalid case (single events and streams), and catches the capture
honesty and format problems the corpora do not pin."""
from __future__ import annotations

import copy
import json

import pytest

from tests.support import schema
from tests.support.schema import event_problems, stream_problems, validate_event, validate_stream
from tests.support.shared import aep_dir, fixture

GOLDEN = [json.loads(line) for line in
          (aep_dir() / "conformance/fixtures/golden/golden.jsonl").read_text().splitlines()
          if line.strip()]
INVALID = fixture("invalid/cases.json")["cases"]


@pytest.mark.parametrize("ev", GOLDEN, ids=lambda e: f"{e['type']}:{e['id']}")
def test_golden_event_is_valid(ev):
    validate_event(ev)


def test_golden_corpus_is_a_valid_stream():
    assert len(GOLDEN) >= 60
    validate_stream(GOLDEN)


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c["name"])
def test_invalid_case_is_rejected(case):
    with pytest.raises(AssertionError):
        if "events" in case:
            validate_stream(case["events"])
        else:
            validate_event(case["event"])


@pytest.mark.parametrize("case", [c for c in INVALID if "events" in c], ids=lambda c: c["name"])
def test_stream_cases_fail_only_together(case):
    # Each event of a stream case is individually valid: the cross-event rule
    # is what the validator must catch.
    for ev in case["events"]:
        assert event_problems(ev) == [], ev
    assert stream_problems(case["events"])


def test_message_names_the_event_and_the_path():
    ev = copy.deepcopy(GOLDEN[0])
    ev["severity"] = "fatal"
    with pytest.raises(AssertionError, match=r"session\.started id=.*\n.*envelope\.severity"):
        validate_event(ev)


def _tool_completed(**over):
    ev = {"aep": "0.1", "id": "E1", "type": "tool.completed", "time": "2026-07-03T10:00:00.000Z",
          "source": "aep://h/agent/a/session/s", "agent": "a", "session": "s", "seq": 0,
          "capture": "metadata", "data": {"tool": {"name": "Bash"}}}
    ev.update(over)
    return ev


def test_capture_honesty_from_the_schema_annotations():
    validate_event(_tool_completed())
    bad = _tool_completed(data={"tool": {"name": "Bash"}, "result": "verbatim"})
    assert any("data.result is gated full" in p for p in event_problems(bad))
    assert event_problems(_tool_completed(capture="full",
                                          data={"tool": {"name": "Bash"}, "result": "v"})) == []
    nested = _tool_completed(type="tool.failed", data={"tool": {"name": "B"},
                                                       "error": {"message": "m"}})
    assert any("data.error.message is gated redacted" in p for p in event_problems(nested))
    items = _tool_completed(type="resource.retrieval.returned",
                            data={"documents": [{"id": "d", "content": "text"}]})
    assert any("documents[0].content" in p for p in event_problems(items))
    # Absent capture is metadata (AEP-0001 §5.1 #16).
    absent = _tool_completed(data={"tool": {"name": "B"}, "result_redacted": "x"})
    del absent["capture"]
    assert event_problems(absent)


def test_capture_none_means_envelope_only():
    assert event_problems(_tool_completed(capture="none"))
    no_data = _tool_completed(capture="none")
    del no_data["data"]
    assert event_problems(no_data) == []
    vendor = _tool_completed(type="x.acme.session.blob", capture="none", data={"a": 1})
    assert event_problems(vendor)


def test_required_payload_fields_are_checked_even_without_data():
    ev = _tool_completed()
    del ev["data"]
    assert any("'tool' is a required property" in p for p in event_problems(ev))


def test_vendor_payloads_are_not_schema_checked():
    assert event_problems(_tool_completed(type="x.acme.session.blob", data={"any": [1, {}]})) == []


@pytest.mark.parametrize("field, value", [
    ("time", "2026-07-03 10:00:00"),
    ("time", "2026-13-40T10:00:00Z"),
    ("source", "not a uri"),
])
def test_formats_are_checked(field, value):
    assert event_problems(_tool_completed(**{field: value}))


def test_non_json_values_are_rejected():
    assert event_problems(_tool_completed(data={"tool": {"name": "B"}, "duration_ms": float("nan")}))
    assert event_problems(_tool_completed(data={"tool": {"name": b"bytes"}}))


def test_redelivery_is_not_a_collision_but_different_content_is():
    ev = _tool_completed()
    validate_stream([ev, copy.deepcopy(ev)])
    other = _tool_completed(data={"tool": {"name": "Other"}}, seq=1)
    assert stream_problems([ev, other])


def test_free_text_form_values_above_capture_are_caught_in_a_stream():
    req = {"aep": "0.1", "id": "Q1", "type": "attention.requested",
           "time": "2026-07-03T10:00:00Z", "source": "aep://h/agent/a/session/s", "agent": "a",
           "session": "s", "seq": 0, "capture": "metadata",
           "data": {"kind": "form", "prompt": "a requests form: x",
                    "fields": [{"id": "n", "type": "string", "label": "n"},
                               {"id": "k", "type": "select", "label": "k", "other": True,
                                "choices": [{"id": "1", "label": "1"}]}]}}
    ans = {"aep": "0.1", "id": "A1", "type": "attention.answered", "subject": "Q1",
           "time": "2026-07-03T10:00:01Z", "source": "aep://h/agent/a/session/s", "agent": "a",
           "session": "s", "seq": 1, "capture": "metadata",
           "data": {"answer": {"values": {"k": "1"}}}}
    validate_stream([req, ans])
    for values in ({"n": "typed text"}, {"k": "free other"}, {"zz": 1}):
        bad = copy.deepcopy(ans)
        bad["data"]["answer"]["values"] = values
        assert stream_problems([req, bad]), values
    ok = copy.deepcopy(ans)
    ok["capture"] = "redacted"
    ok["data"]["answer"]["values"] = {"n": "typed", "k": "free other"}
    validate_stream([req, ok])


def test_validators_are_compiled_once():
    assert schema._validator("tool.completed") is schema._validator("tool.completed")
    assert schema._validator("") is schema._validator("")
