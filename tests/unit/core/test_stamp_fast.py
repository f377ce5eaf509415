"""The stamper's fast path (issue 11) held equal to the slow path it
replaced: :meth:`Stamper.stamp` (one clock read per event, the time text
spelled once per millisecond, a per-type plan, the gate's compiled plans,
ULIDs sliced from one translated block) against :class:`RefStamper`, the
stamper as it was (a ``datetime`` per event, ``rfc3339``, per-call
lookups, the full gating pass, a ``translate`` per id), on the same clock
and the same random bytes: every envelope equal, key order included.
Also :func:`ms_text` against :func:`rfc3339` and :meth:`Stamper.unstamp`
against a stamper that never stamped the event taken back."""
from __future__ import annotations

import itertools
import json
import os
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core import envelope
from bridges.core.capture import LEVELS, CapturePolicy
from bridges.core.envelope import _BYTE_TO_CHAR, Stamper, ms_text, rfc3339
from tests.unit.core.test_capture_gating import _json_for
from tests.unit.core.test_capture_plan import _full_pass

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


SAFE = "!$&'()*+,;=:@"


class RefStamper:
    """``Stamper.stamp`` before issue 11's work, verbatim in what it does
    (its clock read as ``datetime.now`` would, from the same nanoseconds)."""

    def __init__(self, agent, *, epoch, host, policy, clock, urandom):
        self.agent, self.host, self.epoch, self.policy = agent, host, epoch, policy
        self.clock, self.urandom = clock, urandom
        self._seq: dict[str, int] = {}
        self._pool, self._pos = b"", 0

    def _ulid(self, ms):
        if self._pos + 16 > len(self._pool):
            self._pool, self._pos = self.urandom(16 * envelope._POOL_IDS), 0
        pos = self._pos
        self._pos += 16
        return envelope._time_part(ms) + \
            self._pool[pos:pos + 16].translate(_BYTE_TO_CHAR).decode("ascii")

    def source(self, session):
        base = f"aep://{self.host}/agent/{self.agent}"
        # issue 11 follow-up: the session is percent-encoded (test_stamp_source)
        return f"{base}/session/{quote(session, safe=SAFE)}" if session else base

    def stamp(self, session, emission, *, run=None, cause=None, time=None, severity=None,
              extensions=None):
        ns = self.clock()
        type_ = emission["type"]
        agent_scoped = type_.startswith("agent.")
        if not agent_scoped and not session:
            raise ValueError(f"{type_} is session-scoped and needs a session")
        source = self.source(None if agent_scoped else session)
        now = _EPOCH + timedelta(microseconds=ns // 1000)  # datetime.now(): floored to us
        ev = {"aep": "0.1", "id": self._ulid(ns // 1_000_000), "type": type_,
              "time": time if isinstance(time, str) else rfc3339(time or now),
              "source": source, "agent": self.agent}
        if extensions:
            from aep_sdk.emit import _check_extensions
            ev.update(_check_extensions(dict(extensions)))
        if emission.get("subject") is not None:
            ev["subject"] = emission["subject"]
        if not agent_scoped:
            ev["session"] = session
            if run is not None:
                ev["run"] = run
            if emission.get("step") is not None:
                ev["step"] = emission["step"]
            ev["seq"] = self._seq.get(session, 0)
            self._seq[session] = ev["seq"] + 1
            ev["epoch"] = self.epoch
        if cause is not None:
            ev["cause"] = cause
        sev = severity or emission.get("severity") or envelope._DEFAULT_SEVERITY.get(type_)
        if sev and sev != "info":
            ev["severity"] = sev
        hints = emission.get("gating") or {}
        data, level = _full_pass(type_, emission.get("data"), self.policy.ceiling_for(type_),
                                 self.policy, self.agent, emission.get("subject"),
                                 hints.get("form_fields"), hints.get("levels"),
                                 hints.get("structural") or ())
        ev["capture"] = level
        if data:
            ev["data"] = data
        return ev


def _bytes_from(seed: int):
    counter = itertools.count(seed)

    def urandom(n):
        return bytes((next(counter) * 131 + 7) % 256 for _ in range(n))
    return urandom


_TYPES = ["progress.status", "tool.requested", "tool.completed", "attention.requested",
          "attention.answered", "run.started", "run.failed", "session.started", "state.delta",
          "error.raised", "agent.presence", "agent.heartbeat", "control.rejected",
          "x.openhands.message.event", "x.codex.otel.sse_event", "message.note"]


@st.composite
def _emission(draw):
    type_ = draw(st.sampled_from(_TYPES))
    em = {"type": type_}
    if draw(st.booleans()):
        em["data"] = draw(st.dictionaries(st.text(max_size=8) | st.sampled_from(
            ["tool", "args", "prompt", "kind", "options", "error", "result", "message",
             "state", "delta", "label"]), _json_for(type_) if type_ in _TYPES[:11]
            else _json_for("progress.status"), max_size=5))
    for key, strat in (("subject", st.text(max_size=6)), ("step", st.text(max_size=4)),
                       ("severity", st.sampled_from(["info", "debug", "warning", "error"]))):
        if draw(st.integers(0, 3)) == 0:
            em[key] = draw(strat)
    if draw(st.integers(0, 3)) == 0:
        em["gating"] = draw(st.fixed_dictionaries({}, optional={
            "levels": st.dictionaries(st.sampled_from(["error", "message", "args", "x.y"]),
                                      st.sampled_from(LEVELS), max_size=2),
            "structural": st.lists(st.sampled_from(["prompt", "options[].label"]), max_size=2),
            "form_fields": st.just([{"id": "n", "type": "number"}])}))
    return em


_call = st.tuples(
    st.sampled_from(["s1", "s2", "ses_3", None, ""]), _emission(),
    st.fixed_dictionaries({}, optional={
        "run": st.text(max_size=5), "cause": st.text(max_size=5),
        "time": st.one_of(st.just("2026-11-30T12:00:00.123Z"), st.datetimes(
            min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
            timezones=st.just(timezone.utc))),
        "severity": st.sampled_from(["notice", "info", ""]),
        "extensions": st.sampled_from([{"acmetrace": "t1"}, {"Bad_Name": 1}, {}])}),
    st.integers(0, 2_500_000),  # ns the clock moves before this call (a ms now and then)
)
_policies = st.builds(CapturePolicy, ceiling=st.sampled_from(LEVELS[1:]),
                      attention=st.sampled_from([None, *LEVELS[1:]]),
                      home=st.sampled_from([None, "/home/alice"]),
                      overrides=st.sampled_from([{}, {"tool": "full"}, {"x.codex": "redacted"}]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_call, min_size=1, max_size=40), policy=_policies,
       policy2=_policies, seed=st.integers(0, 255),
       start=st.integers(1_700_000_000_000_000_000, 1_900_000_000_000_000_000))
def test_stamp_equals_the_stamper_it_replaced(calls, policy, policy2, seed, start):
    now = [start]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(envelope._time, "time_ns", lambda: now[0])
        mp.setattr(envelope.os, "urandom", _bytes_from(seed))
        _compare(calls, policy, policy2, seed, now)


def _compare(calls, policy, policy2, seed, now):
    fast = Stamper("agent-x", epoch=4, host="h1", policy=policy)
    ref = RefStamper("agent-x", epoch=4, host="h1", policy=policy, clock=lambda: now[0],
                     urandom=_bytes_from(seed))
    for i, (session, em, kw, step) in enumerate(calls):
        now[0] += step
        if i == len(calls) // 3:  # a replaced policy takes effect at once...
            fast.policy = ref.policy = policy2
        if i == 2 * len(calls) // 3:  # ...and so does a replaced host
            fast.host = ref.host = "h2"
        try:
            want = ref.stamp(session, em, **kw)
        except ValueError:
            with pytest.raises(ValueError):
                fast.stamp(session, em, **kw)
            continue
        got = fast.stamp(session, em, **kw)
        assert got == want and json.dumps(got) == json.dumps(want), (got, want)
        assert "gating" not in got
    assert {s: fast.knows(s) for s in ("s1", "s2", "ses_3")} == \
        {s: s in ref._seq for s in ("s1", "s2", "ses_3")}


@given(ms=st.integers(0, 253_402_300_799_999))  # through 9999-12-31T23:59:59.999Z
def test_ms_text_is_rfc3339_of_that_millisecond(ms):
    assert ms_text(ms) == rfc3339(_EPOCH + timedelta(milliseconds=ms))


def test_now_is_the_milliseconds_of_the_ulid_and_follows_the_clock(monkeypatch):
    ns = [1_796_043_916_466_999_999]
    monkeypatch.setattr(envelope._time, "time_ns", lambda: ns[0])
    s = Stamper("a", host="h")
    ev = s.stamp("x", {"type": "progress.status"})
    assert ev["time"] == "2026-11-30T13:05:16.466Z"
    assert ev["id"][:10] == envelope._time_part(1_796_043_916_466)
    ns[0] += 1  # the next millisecond: a new text, not the cached one
    assert s.stamp("x", {"type": "progress.status"})["time"] == "2026-11-30T13:05:16.467Z"


def test_ulid_block_slices_equal_one_translate_per_id(monkeypatch):
    monkeypatch.setattr(envelope.os, "urandom", _bytes_from(3))
    fast = envelope.Ulids()
    ref = RefStamper("a", epoch=0, host="h", policy=None, clock=None, urandom=_bytes_from(3))
    ms = 1_796_043_916_466
    assert [fast(ms) for _ in range(700)] == [ref._ulid(ms) for _ in range(700)]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans()), max_size=40))
def test_unstamp_leaves_the_stamper_as_if_never_stamped(ops):
    # each op stamps an event for a session and maybe takes it back at once;
    # the stamper must then equal one that only stamped what was kept
    s, kept = Stamper("t", host="h"), Stamper("t", host="h")
    for session, take_back in ops:
        ev = s.stamp(session, {"type": "progress.status"})
        if take_back:
            s.unstamp(ev)
        else:
            assert ev["seq"] == kept.stamp(session, {"type": "progress.status"})["seq"]
    for session in "abc":
        assert s.knows(session) == kept.knows(session)
    assert s._seq == kept._seq
    # an agent-scoped envelope (no session, no seq) takes back nothing
    before = dict(s._seq)
    s.unstamp(s.stamp(None, {"type": "agent.presence", "data": {"state": "online"}}))
    assert s._seq == before


def test_os_urandom_is_what_the_ids_use():
    # guard for the monkeypatching above: the pool is read through envelope.os
    assert envelope.os is os


# -- issue 11's trickle path: one event per millisecond, each a new session

_MS = st.integers(0, (1 << 50) - 1)


@settings(max_examples=300, deadline=None)
@given(start=_MS, steps=st.lists(st.one_of(st.integers(-3, 3), st.integers(-5000, 5000),
                                           st.sampled_from([1024, -1024, 1023, 1025])),
                                 max_size=60))
def test_the_ulid_time_part_equals_the_spelled_one_however_the_clock_moves(start, steps):
    """The first 8 characters cached per 1,024 ms and the last two looked
    up spell exactly what :func:`_time_part` spells for every millisecond."""
    ids = envelope.Ulids()
    ms = start
    for step in [0, *steps]:
        ms = max(0, ms + step)
        assert ids.at(ms)[:10] == envelope._time_part(ms)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 253_402_300_000_000),
       steps=st.lists(st.one_of(st.integers(-3, 3), st.integers(-2500, 2500),
                                st.sampled_from([1000, -1000, 999, 1001])), max_size=60))
def test_the_time_text_cached_per_second_equals_ms_text(start, steps):
    s = Stamper("a", host="h")
    ms = start
    for step in [0, *steps]:
        ms = min(253_402_300_799_999, max(0, ms + step))
        assert s._now(ms) == ms_text(ms)


_SEGMENT_CHARS = st.characters(codec="utf-8") | st.sampled_from(list(SAFE + "_.-~/%? #\x00\ud800"))


@settings(max_examples=500, deadline=None)
@given(session=st.text(_SEGMENT_CHARS, max_size=12) | st.from_regex(r"[A-Za-z0-9_.~-]{1,12}",
                                                                    fullmatch=True))
def test_a_plain_session_id_is_its_own_segment_and_the_rest_is_quoted(session):
    """The regex shortcut (no ``quote`` for an id made of URI path
    characters) gives what ``quote`` gives, for any session, and the
    stamper's ``(source, session)`` is the scrubbed session's."""
    from bridges.core.aep import scrub_surrogates
    clean = scrub_surrogates(session)
    assert envelope.session_segment(session) == quote(clean, safe=SAFE)
    if session:
        s = Stamper("a", host="h")
        assert s._session_of(session) == (f"aep://h/agent/a/session/{quote(clean, safe=SAFE)}",
                                          clean)
