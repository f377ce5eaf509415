"""Envelope stamping (bridges/core/envelope.py, AEP-0001 §5/§7, AEP-0003
§9.5): per-session monotonic seq, agent-scoped omission, the epoch store
across restarts, capture stamped with the level the gate honored, gating
hints kept off the wire, and every stamped event valid against the schemas
(single events and the re-stamped golden stream)."""
from __future__ import annotations

import json
import re

import pytest

from bridges.core.capture import CapturePolicy
from bridges.core.envelope import EpochStore, Stamper, rfc3339
from tests.support.schema import validate_event, validate_stream
from tests.support.shared import aep_dir

GOLDEN = [json.loads(line) for line in
          (aep_dir() / "conformance/fixtures/golden/golden.jsonl").read_text().splitlines()
          if line.strip()]
_FOREIGN = re.compile(r"^(control\.(attention\.respond|cancel|pause|resume)|attention\.routed)$")


def _stamper(**kw) -> Stamper:
    return Stamper("test-agent", host="host-a", **kw)


def test_seq_is_monotonic_per_session_and_independent_across_sessions():
    s = _stamper(epoch=3)
    evs = [s.stamp(sess, {"type": "progress.status"}) for sess in ("a", "b", "a", "a", "b")]
    assert [(e["session"], e["seq"]) for e in evs] == [("a", 0), ("b", 0), ("a", 1), ("a", 2),
                                                       ("b", 1)]
    assert {e["epoch"] for e in evs} == {3}
    assert evs[0]["source"] == "aep://host-a/agent/test-agent/session/a"
    for e in evs:
        validate_event(e)
    validate_stream(evs)


def test_ids_are_unique_ulids_and_time_is_rfc3339_utc():
    s = _stamper()
    evs = [s.stamp("a", {"type": "progress.status"}) for _ in range(200)]
    assert len({e["id"] for e in evs}) == 200
    assert all(re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", e["id"]) for e in evs)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["time"]) for e in evs)
    assert rfc3339(__import__("datetime").datetime(2026, 11, 30, 12, tzinfo=__import__(
        "datetime").timezone.utc)) == "2026-11-30T12:00:00.000Z"


def test_agent_scoped_events_omit_session_run_step_seq():
    s = _stamper(epoch=1)
    ev = s.stamp("ignored", {"type": "agent.presence", "data": {"state": "online"},
                             "step": "st"}, run="r")
    for attr in ("session", "run", "step", "seq", "epoch"):
        assert attr not in ev
    assert ev["source"] == "aep://host-a/agent/test-agent"
    validate_event(ev)
    # ...and do not consume a session's sequence.
    assert s.stamp("ignored", {"type": "progress.status"})["seq"] == 0


def test_session_scoped_without_session_is_refused():
    with pytest.raises(ValueError):
        _stamper().stamp(None, {"type": "run.started"})


def test_envelope_attributes_and_defaults():
    s = _stamper()
    ev = s.stamp("a", {"type": "attention.requested", "subject": "Bash", "step": "s1",
                       "data": {"kind": "permission", "prompt": "ok?"}},
                 run="r1", cause="C1", extensions={"acmetrace": "t1"})
    assert ev["run"] == "r1" and ev["step"] == "s1" and ev["cause"] == "C1"
    assert ev["severity"] == "notice"  # AEP-0002 §4.1 recommendation
    assert ev["acmetrace"] == "t1"
    validate_event(ev)
    info = s.stamp("a", {"type": "progress.status"}, severity="info")
    assert "severity" not in info  # the default is omitted
    with pytest.raises(ValueError):
        s.stamp("a", {"type": "progress.status"}, extensions={"seq": 5})
    with pytest.raises(ValueError):
        s.stamp("a", {"type": "progress.status"}, extensions={"Bad_Name": 1})


# ---------------------------------------------------------------- capture


def test_capture_is_the_level_honored_not_the_ceiling():
    s = _stamper(policy=CapturePolicy(ceiling="full"))
    ev = s.stamp("a", {"type": "tool.completed", "data": {"tool": {"name": "x"},
                                                          "status": "success"}})
    assert ev["capture"] == "metadata"
    ev = s.stamp("a", {"type": "tool.completed", "data": {"tool": {"name": "x"},
                                                          "result": "out"}})
    assert ev["capture"] == "full" and ev["data"]["result"] == "out"
    validate_event(ev)


def test_default_posture_prunes_and_digests():
    s = _stamper()
    ev = s.stamp("a", {"type": "tool.requested", "subject": "Bash",
                       "data": {"tool": {"name": "Bash", "call_id": "t1"},
                                "args": {"command": "cat ~/.aws/credentials"}}})
    assert ev["capture"] == "metadata"
    assert set(ev["data"]) == {"tool", "args_digest"}
    validate_event(ev)


def test_attention_rides_at_redacted_by_default_through_the_pipeline():
    s = _stamper(policy=CapturePolicy(home="/home/op"))
    ev = s.stamp("a", {"type": "attention.requested", "subject": "Bash",
                       "data": {"kind": "permission",
                                "prompt": "run cat /home/op/.env with token=abc123 now",
                                "options": [{"id": "allow", "label": "Allow"}]}})
    assert ev["capture"] == "redacted"
    assert ev["data"]["prompt"] == "run cat ~/.env with token=[REDACTED:secret] now"
    validate_event(ev)


def test_attention_at_a_metadata_ceiling_is_synthesized():
    s = _stamper(policy=CapturePolicy(attention="metadata"))
    ev = s.stamp("a", {"type": "attention.requested", "subject": "Bash",
                       "data": {"kind": "permission", "prompt": "secret prose",
                                "options": [{"id": "allow", "label": "Allow it"}]}})
    assert ev["data"]["prompt"] == "test-agent requests permission: Bash"
    assert ev["data"]["options"] == [{"id": "allow", "label": "allow"}]
    assert ev["capture"] == "metadata"


def test_none_ceiling_stamps_envelope_only():
    s = _stamper(policy=CapturePolicy(ceiling="none"))
    ev = s.stamp("a", {"type": "attention.requested", "data": {"kind": "input", "prompt": "x"}})
    assert ev["capture"] == "none" and "data" not in ev
    validate_event(ev)


def test_gating_hints_reach_the_gate_and_never_the_wire():
    s = _stamper()
    fields = [{"id": "n", "type": "string", "label": "Name"},
              {"id": "k", "type": "select", "label": "Kind", "choices": [{"id": "1", "label": "A"}]}]
    ev = s.stamp("a", {"type": "attention.answered", "subject": "R1",
                       "data": {"answer": {"values": {"n": "free text", "k": "1"}}},
                       "gating": {"form_fields": fields}})
    # attention.* default ceiling is redacted: free text through the pipeline.
    assert ev["data"]["answer"]["values"] == {"n": "free text", "k": "1"}
    assert ev["capture"] == "redacted" and "gating" not in json.dumps(ev)
    ev = _stamper(policy=CapturePolicy(attention="metadata")).stamp(
        "a", {"type": "attention.answered", "subject": "R1",
              "data": {"answer": {"values": {"n": "free text", "k": "1"}}},
              "gating": {"form_fields": fields}})
    assert ev["data"]["answer"]["values"] == {"k": "1"} and ev["capture"] == "metadata"
    ev = s.stamp("a", {"type": "x.opencode.file.edited", "data": {"file": "/x", "n": 1},
                       "gating": {"levels": {"file": "redacted"}}})
    assert ev["data"] == {"n": 1} and ev["capture"] == "metadata"
    ev = s.stamp("a", {"type": "attention.requested", "subject": "q",
                       "data": {"kind": "form", "prompt": "a asks 1 question", "fields": []},
                       "gating": {"structural": ["prompt"]}})
    assert ev["data"]["prompt"] == "a asks 1 question" and ev["capture"] == "metadata"


# ---------------------------------------------------------------- epochs across restarts


def test_epoch_store_counts_restarts_and_never_repeats(tmp_path):
    epochs = [EpochStore(tmp_path).next_epoch() for _ in range(5)]
    assert epochs == sorted(set(epochs)) and len(epochs) == 5
    assert json.loads((tmp_path / "epoch").read_text()) == {"epoch": epochs[-1]}


def test_restarts_resume_a_session_in_a_new_epoch(tmp_path):
    # Three daemon runs stamping the same session: every (epoch, seq) is new
    # and the concatenated stream passes the §7.2 regression rules.
    stream = []
    for _ in range(3):
        s = Stamper("test-agent", host="h", epoch=EpochStore(tmp_path / "state").next_epoch())
        stream += [s.stamp("sess", {"type": "progress.status"}) for _ in range(3)]
    positions = [(e["epoch"], e["seq"]) for e in stream]
    assert positions == sorted(set(positions))
    assert [p[1] for p in positions] == [0, 1, 2] * 3
    validate_stream(stream)


def test_unreadable_epoch_file_seeds_from_the_clock(tmp_path):
    import time
    (tmp_path / "epoch").write_text("not json")
    before = int(time.time())
    epoch = EpochStore(tmp_path).next_epoch()
    assert epoch >= before
    assert EpochStore(tmp_path).next_epoch() == epoch + 1  # and persists from there


def test_unwritable_state_dir_still_hands_out_a_fresh_epoch(tmp_path):
    import time
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    before = int(time.time())
    assert EpochStore(blocker).next_epoch() >= before


# ---------------------------------------------------------------- the golden stream, re-stamped


def test_restamped_golden_events_validate_one_by_one_and_as_a_stream():
    # Every golden event an emitter (not a consumer or a command sender)
    # produces, re-stamped from its {type, data, subject, step}: the stamper's
    # output must validate at the default posture and at full capture.
    for policy in (CapturePolicy(), CapturePolicy(ceiling="full")):
        stamper = {}
        ids: dict[str, str] = {}
        out = []
        for g in GOLDEN:
            if _FOREIGN.match(g["type"]):
                continue
            key = (g["agent"], g.get("epoch", 0))
            s = stamper.setdefault(key, Stamper(g["agent"], host="h", epoch=key[1],
                                                policy=policy))
            emission = {k: g[k] for k in ("type", "data", "subject", "step") if k in g}
            if g["type"].startswith("attention.") and g["type"] != "attention.requested":
                emission["subject"] = ids.get(g.get("subject"), g.get("subject"))
            ev = s.stamp(g.get("session"), emission, run=g.get("run"),
                         cause=ids.get(g.get("cause"), g.get("cause")))
            ids[g["id"]] = ev["id"]
            validate_event(ev)
            out.append(ev)
        assert len(out) >= 50
        validate_stream(out)


def test_epoch_never_regresses_below_a_clock_seeded_start(tmp_path, monkeypatch):
    # A start whose state dir is unwritable hands out a clock-seeded epoch;
    # the next, writable start (whose file still holds a small counter) must
    # land above it, never back on the old counter.
    from bridges.core import envelope
    clock = [1_800_000_000.0]
    monkeypatch.setattr(envelope._time, "time", lambda: clock[0])
    state = tmp_path / "state"
    state.write_text("a file where the directory should be")
    clocked = EpochStore(state).next_epoch()
    assert clocked == 1_800_000_000
    state.unlink()
    state.mkdir()
    (state / "epoch").write_text('{"epoch": 5}')
    clock[0] += 2
    assert EpochStore(state).next_epoch() > clocked


def test_an_epoch_file_holding_infinity_seeds_from_the_clock(tmp_path):
    (tmp_path / "epoch").write_text('{"epoch": Infinity}')
    assert EpochStore(tmp_path).next_epoch() >= 1_700_000_000


def test_ulids_are_the_sdk_form_time_first_and_random_after():
    from aep_sdk import ulid as sdk_ulid

    from bridges.core.envelope import Ulids

    make = Ulids()
    ms = 1_796_043_916_466
    ids = [make(ms) for _ in range(1000)]  # spans several random blocks
    assert len(set(ids)) == 1000
    assert all(re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", i) for i in ids)
    # the first 10 characters are the millisecond time, exactly as the SDK spells it
    assert {i[:10] for i in ids} == {sdk_ulid(ms)[:10]}
    assert make(0)[:10] == "0000000000" and make(2 ** 48 - 1)[:10] == "7ZZZZZZZZZ"
    # ...and sort by time
    assert make(ms + 1) > max(ids) and make(ms - 1) < min(ids)
    # every character of the random part occurs (no stuck bits)
    assert set("".join(i[10:] for i in ids)) == set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def test_source_follows_a_changed_host_or_agent():
    s = _stamper()
    assert s.stamp("a", {"type": "progress.status"})["source"] == \
        "aep://host-a/agent/test-agent/session/a"
    s.host = "host-b"
    assert s.stamp("a", {"type": "progress.status"})["source"] == \
        "aep://host-b/agent/test-agent/session/a"


def test_ceiling_follows_a_replaced_policy():
    s = _stamper()
    data = {"tool": {"name": "bash"}, "result": "secret output"}
    assert "result" not in s.stamp("a", {"type": "tool.completed", "data": data})["data"]
    s.policy = CapturePolicy(ceiling="full")
    ev = s.stamp("a", {"type": "tool.completed", "data": data})
    assert ev["data"]["result"] == "secret output" and ev["capture"] == "full"


@pytest.mark.parametrize("bad", ["loud", "Warning", "INFO ", 3, ["error"]])
def test_a_severity_outside_the_registry_is_refused_before_a_seq_is_taken(bad):
    """AEP-0001 §8.1 is a closed set: a bridge's unknown severity is a
    ``ValueError`` at stamping (before, the envelope went out and the relay
    dropped it, counted as a sink error), and the refused emission takes no
    ``seq``: the session's next event follows without a gap."""
    s = Stamper("opencode", host="h")
    first = s.stamp("ses_1", {"type": "tool.started", "data": {"tool": {"name": "bash"}}})
    with pytest.raises(ValueError, match="unknown severity"):
        s.stamp("ses_1", {"type": "tool.completed", "severity": bad,
                          "data": {"tool": {"name": "bash"}}})
    with pytest.raises(ValueError, match="unknown severity"):
        s.stamp("ses_1", {"type": "tool.completed"}, severity=bad)
    after = s.stamp("ses_1", {"type": "tool.completed", "severity": "warning",
                              "data": {"tool": {"name": "bash"}}})
    assert after["seq"] == first["seq"] + 1 and after["severity"] == "warning"
    validate_event(after)
