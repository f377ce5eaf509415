"""The planning step's compiled path (:meth:`Profile.recipes
<bridges.otlp_in.profiles.Profile.recipes>`, the session attribute read
directly, :class:`~bridges.otlp_in.common.Moments` and its inline first
look) against the plain loop it replaces, kept below as the reference:
``session_key``, ``map_record``, ``record_moment`` and the hint called per
record, exactly as ``plan`` was written before. The whole :class:`Plan`
(emissions, refusals, notes in order, failures) is compared, on generated
records of both profiles at every posture, and on the real Codex capture
and the benchmark's requests."""
from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core.capture import CapturePolicy
from bridges.core.posture import Posture
from bridges.otlp_in import codex, vscode
from bridges.otlp_in.common import payload, record_moment, session_id
from bridges.otlp_in.decode import decode_proto
from bridges.otlp_in.export import (
    MAPPING_FAILED,
    NO_SESSION,
    NOT_A_RECORD,
    Plan,
    Planned,
    plan,
)
from bridges.otlp_in.profiles import PROFILES
from tests.support.otlp_in import checked_claim

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real"
NOW = datetime(2026, 11, 30, 14, tzinfo=timezone.utc)


def reference_plan(records, profile, posture, now=None) -> Plan:
    """``plan`` as it was before the compiled path: every record through
    the profile's seams."""
    refused: Counter[str] = Counter()
    notes: list[str] = []
    failures: list[Exception] = []
    planned: list[Planned] = []
    sessions: dict[object, tuple[str | None, list[str]]] = {}
    for idx, rec in enumerate(records):
        if rec is None:
            refused[NOT_A_RECORD] += 1
            continue
        try:
            raw = profile.session_key(rec)
            known = sessions.get(raw) if raw.__class__ is str else None
            if known is None:
                said: list[str] = []
                known = (session_id(raw, said), said)
                if raw.__class__ is str:
                    sessions[raw] = known
            sess = known[0]
            notes.extend(known[1])
            if sess is None:
                notes.append("otlp.no_session")
                refused[NO_SESSION] += 1
                continue
            emissions = profile.map_record(rec, posture, notes)
            when = record_moment(rec, now, notes)
        except Exception as e:  # noqa: BLE001 -- plan's mapping_error
            notes.append("otlp.mapping_error")
            refused[MAPPING_FAILED] += 1
            failures.append(e)
            continue
        for em in emissions:
            planned.append(Planned(idx, sess, profile.hint(em), when))
    return Plan(tuple(planned), dict(refused), tuple(notes), tuple(failures))


def assert_same_plan(got: Plan, want: Plan, posture: Posture | None = None) -> None:
    """``got`` is ``want``, but for the recipes' ``plain`` claims (each checked
    to hold at ``posture``'s policy, :func:`tests.support.otlp_in.checked_claim`)."""
    policy = (posture or Posture()).policy
    got = dataclasses.replace(got, emissions=tuple(
        e._replace(emission=checked_claim(e.emission, policy)) for e in got.emissions))
    assert got.emissions == want.emissions
    for g, w in zip(got.emissions, want.emissions, strict=True):  # types too, not just values
        assert type(g.time) is type(w.time)
        assert list(g.emission) == list(w.emission)  # key order: the stamped bytes
        assert list(g.emission.get("data") or {}) == list(w.emission.get("data") or {})
    assert got.refused == want.refused and list(got.refused) == list(want.refused)
    assert got.notes == want.notes
    assert [type(e) for e in got.failures] == [type(e) for e in want.failures]


# --------------------------------------------------------------------------- generated records

_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**63) | st.floats()
                     | st.text(max_size=8) | st.just("x" * 600),
                     lambda c: st.lists(c, max_size=2) | st.dictionaries(
                         st.text(max_size=4), c, max_size=2), max_leaves=4)
_names = st.sampled_from(sorted(codex.EVENTS) + sorted(vscode.EVENTS)
                         + ["codex.unknown_thing", "", "x" * 200, "codex.sse_event "])
_keys = st.sampled_from(sorted({k for spec in (*codex.EVENTS.values(), *vscode.EVENTS.values())
                                for k in spec.grades}) + ["prompt", "user.email", "model",
                                                          "tool_name", "decision", "source",
                                                          "slug", "app.version"])
_stamp = st.one_of(
    # a burst: records of one millisecond (the moment's memo of texts taken)
    st.sampled_from(["2026-11-30T13:05:16.576Z", "2026-11-30T13:05:16.577Z"]),
    st.datetimes(min_value=datetime(1999, 12, 30), max_value=datetime(2026, 12, 2)).map(
        lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"),
    st.sampled_from(["2026-11-30T13:05:16.576Z", "2026-02-30T13:05:16.576Z",
                     "2026-11-30T24:05:16.576Z", "2026-11-30T13:05:16Z",
                     "2026-11-30T13:60:16.576Z", "2026-11-30T13:05:60.576Z",
                     "2026-12-01T14:00:00.000Z", "2026-12-01T14:00:00.001Z",
                     "2026-11-30T13:05:16.576+00:00"]),
    _json)


@st.composite
def records(draw) -> Any:
    kind = draw(st.sampled_from(["codex"] * 6 + ["none", "garbage", "odd"]))
    if kind == "none":
        return None
    if kind == "garbage":
        return draw(st.sampled_from([[], "rec", 3, {"attributes": [1]},
                                     {"attributes": "x"}, {}]))
    attrs: dict[Any, Any] = {}
    if draw(st.booleans()) or kind == "odd":
        attrs["event.name"] = draw(_names | _json) if kind == "odd" else draw(_names)
    for k, v in draw(st.lists(st.tuples(_keys, _json), max_size=5)):
        attrs[k] = v
    if draw(st.integers(0, 4)):
        attrs["conversation.id"] = draw(st.sampled_from(["c1", "c1", "c 2", "", "c3"])
                                        | (_json if kind == "odd" else st.just("c4")))
    if draw(st.integers(0, 3)):
        attrs["event.timestamp"] = draw(_stamp)
    if draw(st.booleans()):  # the key order of the record is the exporter's
        attrs = dict(reversed(list(attrs.items())))
    rec: dict[str, Any] = {"resource": draw(st.dictionaries(
        st.sampled_from(["host.name", "user.email", "session.id"]), _json, max_size=2)),
        "attributes": attrs}
    for field, values in (("time_unix_nano", st.sampled_from([0, 1_764_500_000_000_000_000,
                                                              1_764_500_000_000_000_000,
                                                              2**64 - 1, None])),
                          ("observed_time_unix_nano", st.sampled_from(
                              [1_764_500_000_000_000_000, -1, True])),
                          ("event_name", st.sampled_from(["codex.tool_result", "event x"])),
                          ("body", st.sampled_from(["codex.sse_event", 3]))):
        if draw(st.integers(0, 3)) == 0:
            rec[field] = draw(values)
    return rec


_policies = st.builds(
    CapturePolicy, ceiling=st.sampled_from(["none", "metadata", "redacted", "full"]),
    overrides=st.sampled_from([{}, {"x.codex.otel.tool_result": "full"},
                               {"x.codex.otel": "redacted", "x.vscode.otel": "full"},
                               {"x.codex.otel.sse_event": "none"}]),
    secret_values=st.sampled_from([(), ("response.created",)]))
_postures = st.builds(Posture, mode=st.sampled_from(["companion", "primary", "adapter"]),
                      policy=_policies)
_nows = st.one_of(st.none(), st.just(NOW), st.just(datetime(2026, 11, 30, 14)),
                  st.just(datetime(9999, 12, 31, 12, tzinfo=timezone.utc)),
                  st.builds(lambda h: NOW + timedelta(hours=h), st.integers(-48, 48)),
                  st.just(NOW.astimezone(timezone(timedelta(hours=-7)))))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(records(), max_size=10), vendor=st.sampled_from(sorted(PROFILES)),
       posture=_postures, now=_nows)
def test_plan_equals_the_plain_loop(recs, vendor, posture, now):
    profile = PROFILES[vendor]
    assert_same_plan(plan(recs, profile, posture, now),
                     reference_plan(recs, profile, posture, now), posture)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(codex.EVENTS) + sorted(vscode.EVENTS)),
       attrs=st.lists(st.tuples(_keys, _json), max_size=6), posture=_postures)
def test_each_recipe_is_the_mapper_and_the_hint(name, attrs, posture):
    """Per recipe, on any attributes: the mapper's one emission with the
    profile's hint, the same notes."""
    for profile in PROFILES.values():
        recipe = profile.recipes(posture).get(name)
        if recipe is None:
            continue
        a = {"event.name": name, **dict(attrs)}
        rec = {"resource": {"host.name": "h", "user.email": "e@x.org"}, "attributes": a}
        want_notes: list[str] = []
        want = [profile.hint(em) for em in profile.map_record(rec, posture, want_notes)]
        notes: list[str] = []
        got = {"type": recipe.type, "data": payload(recipe.grades, a, notes, recipe.red_ok,
                                                    recipe.full_ok, recipe.policy),
               "gating": recipe.gating}
        assert [checked_claim(got, posture.policy)] == want and notes == want_notes


def test_recipes_leave_the_special_and_core_events_to_the_mapper():
    codex_profile = PROFILES["codex"]
    companion = codex_profile.recipes(Posture())
    primary = codex_profile.recipes(Posture(mode="primary"))
    assert "codex.sse_event" in companion and "codex.sse_event" in primary
    assert not codex.SPECIAL & set(companion)
    assert not (codex.SPECIAL | codex.CORE) & set(primary)
    assert "codex.tool_result" in companion
    assert set(PROFILES["vscode"].recipes(Posture())) == set(vscode.EVENTS)


def test_a_profile_with_other_seams_takes_the_plain_loop():
    """A profile whose mapper or session key was swapped (a test's, a
    future vendor's) gets no recipes: they describe the mapper they were
    written for."""
    calls = []

    def counting(rec, posture, notes):
        calls.append(rec)
        return codex.map_record(rec, posture, notes)

    swapped = dataclasses.replace(PROFILES["codex"], map_record=counting)
    assert swapped.recipes(Posture()) == {}
    recs = decode_proto((REAL / "otlp-http-protobuf" / "export-000.pb").read_bytes(), [])
    plan(recs, swapped, Posture(), NOW)
    assert len(calls) == len(recs)
    other_key = dataclasses.replace(PROFILES["codex"], session_key=lambda rec: "s")
    assert other_key.session_attribute is None
    assert_same_plan(plan(recs, other_key, Posture(), NOW),
                     reference_plan(recs, other_key, Posture(), NOW))


def test_a_burst_of_one_millisecond_keeps_each_records_own_time():
    """Records sharing an ``event.timestamp`` text: the text taken for the
    first does not stand in for a later one's ``time_unix_nano``, nor
    does a refused text stand in for an accepted one."""
    ts = "2026-11-30T13:05:16.576Z"

    def rec(**extra: Any) -> dict[str, Any]:
        return {"resource": {}, "attributes": {"event.name": "codex.sse_event",
                                               "conversation.id": "c1",
                                               "event.timestamp": ts}, **extra}

    recs = [rec(), rec(time_unix_nano=1_764_500_000_000_000_000), rec(),
            rec(time_unix_nano=2**64 - 1), rec(observed_time_unix_nano=5)]
    for now in (NOW, None, datetime(2026, 11, 29, tzinfo=timezone.utc)):
        got = plan(recs, PROFILES["codex"], Posture(), now)
        assert_same_plan(got, reference_plan(recs, PROFILES["codex"], Posture(), now))
    times = [e.time for e in plan(recs, PROFILES["codex"], Posture(), NOW).emissions]
    assert times[0] == times[2] == ts and isinstance(times[1], datetime)


# --------------------------------------------------------------------------- real records

def test_real_captures_and_the_benchmark_plan_the_same():
    from benchmarks.otlp_bench import build_requests
    from bridges.otlp_in.flatten import records_from_proto

    batches = [decode_proto(p.read_bytes(), []) for p in sorted(REAL.glob("*/export-*.pb"))]
    batches += [list(records_from_proto(r, [])) for r in build_requests(3)]
    for recs in batches:
        for posture in (Posture(), Posture(mode="primary"),
                        Posture(policy=CapturePolicy(ceiling="full"))):
            for now in (NOW, None, datetime(2026, 12, 1, 13, 5, 16, 576000, timezone.utc)):
                for profile in PROFILES.values():
                    assert_same_plan(plan(recs, profile, posture, now),
                                     reference_plan(recs, profile, posture, now), posture)
