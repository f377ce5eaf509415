"""Capture ceilings at fan-out (AEP-0003 §6.4, AEP-0001 §8.2): every case of
``conformance/fixtures/downlevel/cases.json`` delivered through the relay to
a subscriber holding the case's ceiling, including the command copy
observers see (DL2: routed, then fanned out for audit)."""
from __future__ import annotations

import json

import pytest

from supervisor.relay.attrmatch import Filter
from supervisor.relay.core import Relay
from tests.support.shared import fixture

CASES = fixture("downlevel/cases.json")["cases"]


async def delivered(outlet):
    out = []
    while outlet.queued:
        payloads, _ = await outlet.next_batch()
        out.extend(payloads)
    data = [ln[6:] for ln in b"".join(out).decode().split("\n") if ln.startswith("data: ")]
    return [json.loads(d) for d in data]


async def _noop(_):
    return None


@pytest.mark.parametrize("case", CASES, ids=[c["event"]["id"] for c in CASES])
async def test_downlevel_corpus_through_fanout(case):
    ev = case["event"]
    relay = Relay(token="t")
    command = ev["type"].startswith("control.")
    if command:  # a live claimant that accepts it, so the command is routed
        target = relay.attach_emitter(
            {"type": "hello", "versions": ["0.1"], "role": "emitter",
             "identity": {"agent": "target"},
             "capabilities": {"control": {"accepts": [ev["type"]], "ack_window_ms": 10000}}},
            _noop)
        await target.ingest({"aep": "0.1", "id": "T0", "type": "session.started",
                             "time": "2026-07-03T09:00:00Z", "source": "aep://h/agent/target",
                             "agent": "target", "session": ev["session"], "seq": 0, "data": {}})
    ceiling_sub = relay.open_stream(Filter({}), case["ceiling"], plan_all=False,
                                    positions=None, live=True)
    as_stored = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    if command:
        sender = relay.open_socket(True)
        await sender.handle_text(json.dumps({"type": "hello", "versions": ["0.1"],
                                             "role": "consumer", "identity": {"agent": "mc"}}))
        await sender.handle_text(json.dumps(ev))
        assert relay.counters["commands_routed"] == 1
    else:
        relay.ingest_http([relay.entry(ev)])
    (got,) = await delivered(ceiling_sub)
    assert got["capture"] == case["expect_capture"]
    assert got.get("data") == case.get("expect_data"), case["name"]
    for k in ("id", "type", "session", "source", "agent"):
        assert got.get(k) == ev.get(k)  # core attributes untouched (AEP-0001 §4.2)
    # a subscriber without a ceiling gets the event as stored
    assert (await delivered(as_stored)) == [ev]


async def test_replay_is_down_leveled_too():
    case = next(c for c in CASES if c["event"]["id"] == "DL1")
    relay = Relay()
    relay.ingest_http([relay.entry(case["event"])])
    outlet = relay.open_stream(Filter({}), case["ceiling"], plan_all=True, positions=None, live=False)
    (got,) = await delivered(outlet)
    assert got["capture"] == case["expect_capture"] and got["data"] == case["expect_data"]


# -- declared capture is checked at ingest (AEP-0001 §8.2(a)) ----------------------------

from supervisor.relay.envelope import InvalidEvent  # noqa: E402


def _ev(type_="tool.completed", data=None, capture=None, seq=0, **kw):
    e = {"aep": "0.1", "id": f"C{seq}", "type": type_, "time": "2026-07-03T10:00:00Z",
         "source": "aep://h/agent/a/session/s1", "agent": "a", "session": "s1", "seq": seq}
    if capture is not None:
        e["capture"] = capture
    if data is not None:
        e["data"] = data
    e.update(kw)
    return e


LIES = [  # (declared, type, data): data above what the envelope declares
    ("metadata", "tool.completed", {"tool": {"name": "B"}, "result": "SECRET"}),
    (None, "tool.completed", {"tool": {"name": "B"}, "result": "SECRET"}),  # default metadata
    ("none", "tool.completed", {"tool": {"name": "B"}}),
    ("none", "x.acme.tool.ran", {"n": 1}),
    ("redacted", "tool.completed", {"result": "SECRET"}),
    ("metadata", "tool.completed", {"result_redacted": "s***"}),
    ("metadata", "error.raised", {"error": {"type": "X", "message": "SECRET"}}),
    ("metadata", "tool.failed", {"tool": {"name": "B"}, "error": {"message": "SECRET"}}),
    ("metadata", "session.started", {"cwd": "/home/me"}),
    ("redacted", "attention.requested", {"kind": "permission", "context": {"diff": "SECRET"}}),
    ("metadata", "resource.retrieval.returned", {"documents": [{"id": "d", "content": "SECRET"}]}),
    ("redacted", "resource.citation.recorded", {"citations": [{"cited_text": "SECRET"}]}),
    ("metadata", "progress.task.planned", {"task": {"id": "t1", "title": "SECRET"}}),
]

HONEST = [
    ("metadata", "tool.completed", {"tool": {"name": "B"}, "status": "ok", "duration_ms": 3,
                                    "result_digest": "sha256:00"}),
    ("redacted", "tool.completed", {"tool": {"name": "B"}, "result_redacted": "s***"}),
    ("full", "tool.completed", {"result": "verbatim", "result_redacted": "v***"}),
    ("metadata", "attention.requested", {"kind": "permission", "prompt": "a requests permission: Bash",
                                         "options": [{"id": "ok", "label": "ok"}]}),  # [metadata*]
    ("metadata", "attention.answered", {"answer": {"option": "ok", "values": {"n": 2}}}),
    ("metadata", "x.acme.tool.ran", {"text": "a vendor type has no table"}),
    ("none", "tool.completed", None),
    ("none", "tool.completed", {}),
    ("metadata", "tool.completed", {"unannotated": {"deep": "fields are metadata"}}),
    ("metadata", "resource.retrieval.returned", {"documents": [{"id": "d", "score": 1}], "count": 1}),
]


@pytest.mark.parametrize("declared,type_,data", LIES)
def test_data_above_its_declared_capture_is_an_invalid_event(declared, type_, data):
    with pytest.raises(InvalidEvent, match="exceeds its declared capture"):
        Relay().entry(_ev(type_, data, declared))


@pytest.mark.parametrize("declared,type_,data", HONEST)
def test_data_within_its_declared_capture_is_accepted(declared, type_, data):
    Relay().entry(_ev(type_, data, declared))


def test_no_false_positive_on_the_golden_and_downlevel_corpora():
    from tests.support.shared import aep_dir

    golden = [json.loads(ln) for ln in
              (aep_dir() / "conformance/fixtures/golden/golden.jsonl").read_text().splitlines() if ln]
    relay = Relay()
    for ev in golden + [c["event"] for c in CASES]:
        relay.entry(ev)
    for c in CASES:  # what a hop delivers is honest too
        out = {**c["event"], "capture": c["expect_capture"]}
        out.pop("data", None)
        if c.get("expect_data") is not None:
            out["data"] = c["expect_data"]
        relay.entry(out)


async def test_a_command_under_declaring_its_capture_is_routed_but_down_leveled_for_audit():
    """A command is forwarded to its target byte-identically (AEP-0004 §4.4)
    and not refused for its capture claim, but the audit copy fanned out to
    observers is rendered at the level the data really has."""
    relay = Relay(token="t")
    got = []

    async def deliver(cmd):
        got.append(cmd)

    target = relay.attach_emitter(
        {"type": "hello", "versions": ["0.1"], "role": "emitter", "identity": {"agent": "target"},
         "capabilities": {"control": {"accepts": ["control.attention.respond"]}}}, deliver)
    await target.ingest({"aep": "0.1", "id": "T0", "type": "session.started", "agent": "target",
                         "time": "2026-07-03T09:00:00Z", "source": "aep://h/agent/target",
                         "session": "s1", "seq": 0})
    meta = relay.open_stream(Filter({}), "metadata", plan_all=False, positions=None, live=True)
    cmd = {"aep": "0.1", "id": "R1", "type": "control.attention.respond", "agent": "mc",
           "time": "2026-07-03T10:00:00Z", "source": "aep://h/agent/mc", "session": "s1",
           "subject": "A1", "capture": "metadata",
           "data": {"answer": {"option": "deny", "text": "SECRET reason"}}}
    sender = relay.open_socket(True)
    await sender.handle_text(json.dumps({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                         "identity": {"agent": "mc"}}))
    await sender.handle_text(json.dumps(cmd))
    assert got == [cmd]
    (audit,) = await delivered(meta)
    assert "SECRET" not in json.dumps(audit) and audit["data"]["answer"] == {"option": "deny"}
