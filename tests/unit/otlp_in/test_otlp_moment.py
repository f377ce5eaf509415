"""``record_moment``'s shortcut for an ``event.timestamp`` already in the
stamper's form: the text is recognised by one ``bytes.translate`` instead
of the ``_CANONICAL_TIME`` regex. Held equal to the function as it was
(the regex, kept below as the reference) on generated times: every digit
layout, non-ASCII digits, lone surrogates, out-of-range instants, with and
without a receive time."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridges.otlp_in import common
from bridges.otlp_in.common import EARLIEST, FUTURE_SLACK, Moments, _from_nanos, record_moment

_REGEX = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def reference(rec: dict[str, Any], now: datetime | None = None,
              notes: list[str] | None = None) -> datetime | str | None:
    """``record_moment`` before the shortcut (the regex decides the form)."""
    latest = None if now is None else now + FUTURE_SLACK
    out_of_range = False
    t = _from_nanos(rec.get("time_unix_nano"))
    if t is not None:
        if latest is None or EARLIEST <= t <= latest:
            return t
        out_of_range = True
    a = rec.get("attributes")
    ts = a.get("event.timestamp") if isinstance(a, dict) else None
    if isinstance(ts, str) and 10 <= len(ts) <= 40:
        try:
            t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            t = None
        if t is not None:
            if t.tzinfo is None:
                t = t.replace(tzinfo=timezone.utc)
            if 1971 <= t.year <= 9998:
                if latest is None or EARLIEST <= t <= latest:
                    if out_of_range and notes is not None:
                        notes.append("otlp.time_out_of_range")
                    return ts if _REGEX.fullmatch(ts) else t
                out_of_range = True
    t = _from_nanos(rec.get("observed_time_unix_nano"))
    if t is not None and latest is not None and not EARLIEST <= t <= latest:
        t, out_of_range = None, True
    if out_of_range and notes is not None:
        notes.append("otlp.time_out_of_range")
    return t


_SHAPE = "0000-00-00T00:00:00.000Z"
_CHARS = st.sampled_from("0123456789-T:.Z+ z,W٣１\ud800")


def _perturbed(base: str) -> st.SearchStrategy[str]:
    """``base`` with a few characters replaced, dropped or added."""
    return st.lists(st.tuples(st.integers(0, 23), _CHARS, st.sampled_from("rdi")),
                    max_size=3).map(lambda edits: _edit(base, edits))


def _edit(s: str, edits: list[tuple[int, str, str]]) -> str:
    for i, ch, how in edits:
        i = min(i, len(s))
        s = s[:i] + ch + s[i + 1:] if how == "r" else s[:i] + s[i + 1:] if how == "d" \
            else s[:i] + ch + s[i:]
    return s


_canonical = st.datetimes(min_value=datetime(1960, 1, 1), max_value=datetime(9999, 12, 31)).map(
    lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z")
_times = st.one_of(_canonical, _canonical.flatmap(_perturbed),
                   st.text(_CHARS, min_size=10, max_size=30),
                   st.builds(lambda d: d.isoformat(), st.datetimes(timezones=st.just(timezone.utc))))
_nows = st.one_of(st.none(), st.datetimes(min_value=datetime(1990, 1, 1),
                                          max_value=datetime(9000, 1, 1),
                                          timezones=st.sampled_from(
                                              [timezone.utc, timezone(timedelta(hours=-7))])))


def _same_as_reference(ts: str, now: datetime | None, observed: int | None,
                       time_nano: int | None) -> None:
    """``record_moment`` and the reference agree on a record of ``ts``: the
    moment (value and type) and the notes."""
    rec: dict[str, Any] = {"attributes": {"event.timestamp": ts}}
    if observed is not None:
        rec["observed_time_unix_nano"] = observed
    if time_nano is not None:
        rec["time_unix_nano"] = time_nano
    got_notes: list[str] = []
    want_notes: list[str] = []
    got = record_moment(rec, now, got_notes)
    want = reference(rec, now, want_notes)
    assert got == want and type(got) is type(want)
    assert got_notes == want_notes
    # the per-request shortcut (text comparison, no date parsing) is the same
    fast_notes: list[str] = []
    fast = Moments(now)(rec, fast_notes)
    assert fast == want and type(fast) is type(want)
    assert fast_notes == want_notes


@settings(max_examples=1500, deadline=None)
@given(ts=_times, now=_nows, observed=st.one_of(st.none(), st.integers(-1, 2**64 - 1)),
       time_nano=st.one_of(st.none(), st.just(2**64 - 1)))
@example(ts="2026-11-30T13:05:16.576Z", now=datetime(2026, 11, 30, tzinfo=timezone.utc),
         observed=None, time_nano=None)
@example(ts="2026-11-30T13:05:16.576Z", now=None, observed=None, time_nano=None)
@example(ts="2026-11-30T13:05:16,576Z", now=None, observed=None, time_nano=None)
@example(ts="2026-11-30T13:05:16.5760", now=None, observed=None, time_nano=None)
@example(ts="٢٠٢٦-11-30T13:05:16.576Z", now=None, observed=None, time_nano=None)
def test_record_moment_equals_the_regex_form(ts: str, now: datetime | None,
                                             observed: int | None, time_nano: int | None) -> None:
    _same_as_reference(ts, now, observed, time_nano)


def test_the_shape_is_the_regex_on_the_exporters_form() -> None:
    ts = "2026-11-30T13:05:16.576Z"
    assert ts.encode("ascii").translate(common._DIGITS_AS_0) == common._CANONICAL_SHAPE \
        == _SHAPE.encode("ascii")
    moment = record_moment({"attributes": {"event.timestamp": ts}},
                           datetime(2026, 11, 30, 14, tzinfo=timezone.utc), [])
    assert moment == ts and isinstance(moment, str)


def _text(d: datetime) -> str:
    d = d.astimezone(timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


_aware_nows = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(9998, 12, 29),
                           timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=5)),
                                                      timezone(timedelta(hours=-7))]))


@st.composite
def _edge_case(draw: st.DrawFn) -> tuple[str, datetime | None]:
    """A canonical text at a bound of the range (``now`` + the slack, cut
    to its millisecond, or EARLIEST, a few ms either side), or with a
    field the calendar refuses (Feb 29/30, day 31, hour 24, minute or
    second 60), with or without a receive time."""
    now = draw(st.one_of(st.none(), _aware_nows))
    kind = draw(st.sampled_from(["latest", "earliest", "field"]))
    if kind == "latest" and now is not None:
        ts = _text(now + FUTURE_SLACK + timedelta(milliseconds=draw(st.integers(-3, 3))))
    elif kind in ("latest", "earliest"):
        ts = _text(EARLIEST + timedelta(milliseconds=draw(st.integers(-3, 3))))
    else:
        year = draw(st.sampled_from(["1970", "1971", "2000", "2023", "2024", "2100", "9998",
                                     "9999"]))
        month = draw(st.sampled_from(["00", "01", "02", "04", "12", "13"]))
        day = draw(st.sampled_from(["00", "01", "28", "29", "30", "31", "32"]))
        hms = draw(st.sampled_from(["00:00:00", "23:59:59", "24:00:00", "12:60:00",
                                    "12:00:60", "99:99:99"]))
        ts = f"{year}-{month}-{day}T{hms}.{draw(st.integers(0, 999)):03d}Z"
    return ts, now


@settings(max_examples=1500, deadline=None)
@given(case=_edge_case(), observed=st.one_of(st.none(), st.integers(-1, 2**64 - 1)),
       time_nano=st.one_of(st.none(), st.just(2**64 - 1)))
@example(case=("2024-02-29T00:00:00.000Z", None), observed=None, time_nano=None)
@example(case=("2023-02-29T00:00:00.000Z", None), observed=None, time_nano=None)
@example(case=("2026-11-30T24:00:00.000Z", None), observed=None, time_nano=None)
@example(case=("1999-12-31T23:59:59.999Z", datetime(2026, 1, 1, tzinfo=timezone.utc)),
         observed=None, time_nano=None)
@example(case=("2026-01-02T00:00:00.000Z", datetime(2026, 1, 1, tzinfo=timezone.utc)),
         observed=None, time_nano=None)
@example(case=("2026-01-02T00:00:00.001Z", datetime(2026, 1, 1, tzinfo=timezone.utc)),
         observed=None, time_nano=None)
@example(case=("2026-01-02T00:00:00.000Z", datetime(2026, 1, 1, 0, 0, 0, 999,
                                                     tzinfo=timezone.utc)),
         observed=None, time_nano=None)
def test_record_moment_at_the_bounds_and_the_calendar(
        case: tuple[str, datetime | None], observed: int | None, time_nano: int | None) -> None:
    """``record_moment`` against the reference at the places a shortcut
    could differ: the range's two ends to the millisecond, dates and times
    the calendar refuses, years at 1971 and 9998."""
    ts, now = case
    _same_as_reference(ts, now, observed, time_nano)


@settings(max_examples=300, deadline=None)
@given(cases=st.lists(st.one_of(_canonical, _edge_case().map(lambda c: c[0]), _times),
                      min_size=1, max_size=12),
       now=st.one_of(_nows, st.just(datetime(9999, 12, 31, 12, tzinfo=timezone.utc)),
                     st.just(datetime(2026, 11, 30))))
@example(cases=["2026-11-30T13:05:16.576Z", "2026-02-30T13:05:16.576Z",
                "2026-11-30T13:05:16.576Z"], now=None)
@example(cases=["2026-11-30T13:05:16.576Z"], now=datetime(2026, 11, 30))  # naive: raises
def test_one_moments_for_a_request_equals_record_moment(cases: list[str],
                                                        now: datetime | None) -> None:
    """One :class:`Moments` over a request's records (its day memo shared
    by them, a receive time at the end of the calendar or naive) answers
    what ``record_moment`` answers for each, raising alike."""
    moments = Moments(now)
    for ts in cases:
        rec: dict[str, Any] = {"attributes": {"event.timestamp": ts}}
        want_notes: list[str] = []
        got_notes: list[str] = []
        try:
            want: object = record_moment(rec, now, want_notes)
        except Exception as e:  # noqa: BLE001 -- the same exception is the point
            want = type(e)
        try:
            got: object = moments(rec, got_notes)
        except Exception as e:  # noqa: BLE001
            got = type(e)
        assert got == want and type(got) is type(want)
        assert got_notes == want_notes


def test_moments_takes_canonical_text_without_parsing(monkeypatch) -> None:
    """The shortcut is taken (record_moment is not called) for the
    exporter's canonical text in range, and not for a day the calendar
    refuses."""
    now = datetime(2026, 11, 30, 14, tzinfo=timezone.utc)
    moments = Moments(now)
    calls: list[object] = []
    real = common.record_moment
    monkeypatch.setattr(common, "record_moment", lambda *a: calls.append(a) or real(*a))
    ts = "2026-11-30T13:05:16.576Z"
    assert moments({"attributes": {"event.timestamp": ts}}, []) == ts and calls == []
    assert moments({"attributes": {"event.timestamp": "2026-02-30T13:05:16.576Z"}}, []) is None
    assert len(calls) == 1
