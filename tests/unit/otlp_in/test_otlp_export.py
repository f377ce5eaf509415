"""The export path without sockets: the pure planning step (records ->
emissions, notes, refusals) on the real Codex 0.171 export, and the
admission step on a real ``BridgeContext`` over a memory channel
(backpressure, partial_success, 503 before anything is emitted)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.capture import CapturePolicy
from bridges.core.envelope import rfc3339
from bridges.core.posture import Posture
from bridges.otlp_in.common import record_time
from bridges.otlp_in.decode import decode_proto
from bridges.otlp_in.export import Admission, Plan, plan
from bridges.otlp_in.profiles import PROFILES
from bridges.otlp_in.status import Unavailable
from tests.support.otlp_in import bridge_context, checked_claim, drain

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real"
RECORDS = decode_proto((REAL / "otlp-http-protobuf" / "export-000.pb").read_bytes(), [])
CODEX = PROFILES["codex"]
COMPANION = Posture()


def test_plan_of_a_real_codex_export():
    p = plan(RECORDS, CODEX, COMPANION)
    assert len(RECORDS) > 3 and len(p.emissions) == len(RECORDS)  # one each, in order
    assert [e.record for e in p.emissions] == list(range(len(RECORDS)))
    assert p.refused == {} and p.failures == ()
    sessions = {e.session for e in p.emissions}
    assert len(sessions) == 1 and all(e.emission["type"].startswith("x.codex.otel.")
                                      for e in p.emissions)
    # the profile's gating hint rides along for vendor types (the gate claims what it honored)
    assert all("gating" in e.emission for e in p.emissions)
    # Codex 0.171's event.timestamp is already in the stamper's form: carried as that text
    assert all(isinstance(e.time, str) and rfc3339(record_time(RECORDS[e.record])) == e.time
               for e in p.emissions)


def test_plan_is_pure_same_input_same_plan():
    assert plan(RECORDS, CODEX, COMPANION) == plan(RECORDS, CODEX, COMPANION)


def test_plan_refuses_per_reason_and_notes():
    no_session = {"resource": {}, "attributes": {"event.name": "codex.tool_result"}}
    p = plan([None, no_session, RECORDS[0], None], CODEX, COMPANION)
    assert p.refused == {"not a LogRecord": 2, "no session key": 1}
    assert [e.record for e in p.emissions] == [2]
    assert "otlp.no_session" in p.notes


def test_plan_keeps_a_mapper_failure_and_carries_on():
    boom = RuntimeError("mapper bug")

    def broken(rec, posture, notes):
        if rec is RECORDS[1]:
            raise boom
        return CODEX.map_record(rec, posture, notes)

    p = plan(RECORDS[:3], dataclasses.replace(CODEX, map_record=broken), COMPANION)
    assert p.refused == {"mapping failed": 1} and p.failures == (boom,)
    assert "otlp.mapping_error" in p.notes
    assert [e.record for e in p.emissions] == [0, 2]


def test_primary_posture_maps_to_core_types():
    p = plan(RECORDS, CODEX, Posture(mode="primary", policy=CapturePolicy()))
    assert any(not e.emission["type"].startswith("x.") for e in p.emissions)


_value = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(
                          st.text(max_size=10), c, max_size=3), max_leaves=12)
_record = st.none() | st.fixed_dictionaries(
    {"resource": st.dictionaries(st.sampled_from(["session.id", "service.name"]) |
                                 st.text(max_size=8), _value, max_size=3),
     "attributes": st.dictionaries(st.sampled_from(["event.name", "conversation.id",
                                                    "success", "event.timestamp"]) |
                                   st.text(max_size=8), _value, max_size=5)})


@settings(max_examples=200, deadline=None)
@given(st.lists(_record, max_size=6), st.sampled_from(sorted(PROFILES)), st.booleans())
def test_plan_never_raises_and_accounts_for_every_record(records, vendor, primary):
    p = plan(records, PROFILES[vendor], Posture(mode="primary" if primary else "companion"))
    mapped = {e.record for e in p.emissions}
    assert len(mapped) + sum(p.refused.values()) <= len(records)
    assert all(isinstance(n, str) for n in p.notes)


def _reference_plan(records, profile, posture, now):
    """``plan`` spelled out (the seams called per record, the gating hint
    added by ``Profile.stampable``'s copy): the slow path ``plan``'s
    shortcuts (the profile's seams read once, the hint set in place on the
    mapper's fresh emission, a session's id checked once) are held to."""
    from bridges.otlp_in.common import record_moment, session_id
    out, notes = [], []
    for idx, rec in enumerate(records):
        if rec is None:
            continue
        try:
            sess = session_id(profile.session_key(rec), notes)
            if sess is None:
                notes.append("otlp.no_session")
                continue
            emissions = profile.map_record(rec, posture, notes)
            when = record_moment(rec, now, notes)
        except Exception:  # noqa: BLE001 -- plan's mapping_error
            notes.append("otlp.mapping_error")
            continue
        out += [(idx, sess, profile.stampable(em), when) for em in emissions]
    return out, notes


_codex_record = st.fixed_dictionaries(
    {"resource": st.dictionaries(st.sampled_from(["host.name", "user.email"]), _value,
                                 max_size=2),
     "attributes": st.fixed_dictionaries(
         {"event.name": st.sampled_from(["codex.sse_event", "codex.tool_result",
                                         "codex.user_prompt", "codex.conversation_starts",
                                         "codex.other", "vscode.chat", ""]),
          "conversation.id": st.sampled_from(["c1", "c 2", "", "c3"])},
         optional={"success": st.sampled_from(["true", "false", True]),
                   "tool_name": st.text(max_size=4), "event.kind": _value,
                   "duration_ms": _value, "error": _value,
                   "event.timestamp": st.just("2026-11-30T13:05:16.576Z")})})


@settings(max_examples=300, deadline=None)
@given(st.lists(_record | _codex_record, max_size=8), st.sampled_from(sorted(PROFILES)),
       st.booleans(), st.sampled_from(["metadata", "redacted", "full"]))
def test_plan_equals_the_seams_called_record_by_record(records, vendor, primary, ceiling):
    from datetime import datetime, timezone
    now = datetime(2026, 11, 30, 14, tzinfo=timezone.utc)
    profile = PROFILES[vendor]
    posture = Posture(mode="primary" if primary else "companion",
                      policy=CapturePolicy(ceiling=ceiling))
    p = plan(records, profile, posture, now)
    want, notes = _reference_plan(records, profile, posture, now)
    # the recipes' plain claim holds, and is all that differs
    assert [(i, s, checked_claim(em, posture.policy), t) for i, s, em, t in p.emissions] == want
    assert [n for n in p.notes if n != "otlp.session_id_sanitized"] == \
        [n for n in notes if n != "otlp.session_id_sanitized"]


# --------------------------------------------------------------------------- admission

def _admission(size: int, *, grace: float = 0.05):
    ctx, recv = bridge_context("otlp_in.codex", "codex", channel=size)
    return Admission(ctx, CODEX, COMPANION, emit_grace=grace, retry_after=2), recv


async def test_admission_emits_the_plan_in_order():
    adm, recv = _admission(100)
    result = await adm.export(list(RECORDS), ["otlp.value_unexpected"])
    assert (result.rejected, result.error_message) == (0, "")
    events = drain(recv)
    assert [e["seq"] for e in events] == list(range(len(RECORDS)))
    c = adm.ctx.health.counters
    assert c["otlp.requests"] == 1 and c["otlp.records"] == len(RECORDS)
    assert c["otlp.emitted"] == len(RECORDS) and c["otlp.value_unexpected"] == 1


async def test_admission_refuses_before_anything_when_saturated():
    adm, recv = _admission(1)
    adm.ctx.emit_nowait("filler", {"type": "x.codex.otel.unknown"})
    with pytest.raises(Unavailable) as e:
        await adm.export(list(RECORDS), [])
    assert e.value.retry_after == 2 and "saturated" in e.value.message
    assert adm.ctx.health.counters["otlp.saturated"] == 1
    assert [ev["session"] for ev in drain(recv)] == ["filler"]


async def test_admission_reports_the_rest_in_partial_success_when_stuck_mid_request():
    adm, recv = _admission(2)
    result = await adm.admit(plan(RECORDS, CODEX, COMPANION))
    assert result.rejected == len(RECORDS) - 2
    assert result.error_message == f"{len(RECORDS) - 2} LogRecords rejected: relay channel " \
                                   "saturated"
    assert adm.ctx.health.counters["otlp.rejected_saturated"] == len(RECORDS) - 2
    assert len(drain(recv)) == 2


async def test_admission_closing_answers_at_once_with_stopping():
    adm, _ = _admission(1, grace=30)
    adm.ctx.emit_nowait("filler", {"type": "x.codex.otel.unknown"})
    adm.closing = True
    with trio.fail_after(5), pytest.raises(Unavailable) as e:
        await adm.export(list(RECORDS), [])
    assert "stopping" in e.value.message and "otlp.saturated" not in adm.ctx.health.counters


async def test_a_channel_closed_mid_request_rejects_the_rest_instead_of_a_503():
    """The fleet's drain closes the bridge's send side while an export is
    being admitted: what went out stays acknowledged (the drain logs it),
    the rest is rejected in partial_success (a 503 made the exporter's
    retry repeat what went out); the refused send burns no seq."""
    adm, recv = _admission(2, grace=30)
    got: list[dict] = []

    async def drain_like_the_fleet():
        while adm.ctx.room() > 0:
            await trio.sleep(0.001)
        adm.ctx.close_channel()
        async for item in recv:  # what is queued, to the channel's end
            got.append(item.event)

    with trio.fail_after(5):
        async with trio.open_nursery() as n:
            n.start_soon(drain_like_the_fleet)
            result = await adm.export(list(RECORDS), [])
    assert len(got) == 2 and [e["seq"] for e in got] == [0, 1]
    assert result.rejected == len(RECORDS) - 2
    assert result.error_message == f"{len(RECORDS) - 2} LogRecords rejected: receiver stopping"
    c = adm.ctx.health.counters
    assert c["otlp.emitted"] == 2 and c["otlp.rejected_stopping"] == len(RECORDS) - 2
    session = got[0]["session"]
    assert adm.ctx.stamper.stamp(session, {"type": "x.codex.otel.unknown"})["seq"] == 2


async def test_a_closed_channel_before_anything_is_a_503():
    adm, _ = _admission(10)
    adm.ctx.close_channel()
    with pytest.raises(Unavailable) as e:
        await adm.export(list(RECORDS), [])
    assert "closed" in e.value.message


async def test_emit_on_a_closed_channel_burns_no_seq():
    ctx, _ = bridge_context("otlp_in.codex", "codex", channel=10)
    assert (await ctx.emit("s1", {"type": "x.codex.otel.unknown"}))["seq"] == 0
    ctx.close_channel()
    with pytest.raises(trio.ClosedResourceError):
        await ctx.emit("s1", {"type": "x.codex.otel.unknown"})
    assert ctx.stamper.stamp("s1", {"type": "x.codex.otel.unknown"})["seq"] == 1


async def test_an_emit_cancelled_while_waiting_for_room_burns_no_seq():
    # a bridge's stop (the drain cancels the bridges first) or a crash while
    # its emit waits on a full channel: nothing was sent, no gap is left
    ctx, recv = bridge_context("otlp_in.codex", "codex", channel=1)
    assert (await ctx.emit("s1", {"type": "x.codex.otel.unknown"}))["seq"] == 0
    with trio.move_on_after(0.05) as waited:
        await ctx.emit("s1", {"type": "x.codex.otel.unknown"})
    assert waited.cancelled_caught
    assert [e["seq"] for e in drain(recv)] == [0]
    assert (await ctx.emit("s1", {"type": "x.codex.otel.unknown"}))["seq"] == 1


def test_emit_nowait_on_a_closed_channel_burns_no_seq():
    ctx, _ = bridge_context("otlp_in.codex", "codex", channel=10)
    assert ctx.emit_nowait("s1", {"type": "x.codex.otel.unknown"})["seq"] == 0
    ctx.close_channel()
    with pytest.raises(trio.ClosedResourceError):
        ctx.emit_nowait("s1", {"type": "x.codex.otel.unknown"})
    assert ctx.stamper.stamp("s1", {"type": "x.codex.otel.unknown"})["seq"] == 1


async def test_admission_counts_refusals_of_the_plan():
    adm, recv = _admission(10)
    result = await adm.admit(Plan(refused={"no session key": 3}))
    assert (result.rejected, result.error_message) == (3, "3 LogRecords rejected: no session key")
    assert adm.ctx.health.counters["otlp.rejected"] == 3 and drain(recv) == []
