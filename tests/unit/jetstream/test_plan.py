"""Planning a subscription over the stream (supervisor.jetstream.plan):
attr-match filters become subject filters that cover exactly their
agent/session part, and a resume position resolves to the right stream
sequence (with the replay-exhausted verdict) through a fake next_by_subj
lookup."""
from __future__ import annotations

import math
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.jetstream import plan as P
from supervisor.jetstream import subjects as S
from supervisor.relay.attrmatch import Filter


def _subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching (``*`` one token, ``>`` the rest)."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def test_no_agent_or_session_term_takes_every_event_subject() -> None:
    assert P.subject_plan("AEP", {}) == ["AEP.ev.>"]
    assert P.subject_plan("AEP", {"type": "tool.*", "severity": {"gte": "notice"}}) == ["AEP.ev.>"]


def test_agent_and_session_terms_become_subjects() -> None:
    assert P.subject_plan("AEP", {"agent": "codex"}) == ["AEP.ev.codex.*"]
    assert P.subject_plan("AEP", {"session": ["b", "a"]}) == ["AEP.ev.*.a", "AEP.ev.*.b"]
    assert P.subject_plan("AEP", {"agent": ["opencode", "codex"], "session": "s.1"}) == [
        "AEP.ev.codex." + S.token("s.1"), "AEP.ev.opencode." + S.token("s.1")]


def test_non_string_terms_match_no_subject() -> None:
    # an integer agent never equals the string attribute: nothing to consume
    assert P.subject_plan("AEP", {"agent": 3}) == []
    assert P.subject_plan("AEP", {"agent": ["codex", True]}) == ["AEP.ev.codex.*"]


def test_named_sessions_narrow_the_plan() -> None:
    assert P.subject_plan("AEP", {}, ["s2", "s1"]) == ["AEP.ev.*.s1", "AEP.ev.*.s2"]
    assert P.subject_plan("AEP", {"session": ["s1", "s3"]}, ["s1", "s2"]) == ["AEP.ev.*.s1"]
    assert P.subject_plan("AEP", {"session": "s3"}, ["s1"]) == []
    assert P.subject_plan("AEP", {"agent": "codex"}, ["s1"]) == ["AEP.ev.codex.s1"]


def test_too_many_alternatives_fall_back_to_the_wildcard() -> None:
    agents = [f"a{i}" for i in range(20)]
    sessions = [f"s{i}" for i in range(20)]
    assert P.subject_plan("AEP", {"agent": agents, "session": sessions}) == ["AEP.ev.>"]
    # with named sessions the session subjects still fit
    got = P.subject_plan("AEP", {"agent": agents}, sessions)
    assert got == [f"AEP.ev.*.s{i}" for i in sorted(range(20), key=lambda i: f"s{i}")]


names = st.text(st.characters(blacklist_characters="*"), min_size=1, max_size=6)  # globs: type only
pins = st.one_of(st.none(), names, st.lists(st.one_of(names, st.integers()), min_size=1, max_size=4))


@given(agent_pin=pins, session_pin=pins, agent=names, session=names)
def test_plan_covers_every_event_the_filter_matches(agent_pin: Any, session_pin: Any,
                                                    agent: str, session: str) -> None:
    """Soundness: an event the filter matches lies on one of the planned
    subjects; exactness: with agent/session pinned, an event on a planned
    subject matches those terms."""
    flt: dict[str, Any] = {}
    if agent_pin is not None:
        flt["agent"] = agent_pin
    if session_pin is not None:
        flt["session"] = session_pin
    f = Filter(flt)
    subjects = P.subject_plan("AEP", flt)
    subject = S.event_subject("AEP", agent, session)
    on_plan = any(_subject_matches(p, subject) for p in subjects)
    attrs = {"agent": agent, "session": session, "type": "tool.completed", "id": "x",
             "source": "aep://x"}
    if f.matches(attrs):
        assert on_plan
    if on_plan and subjects != ["AEP.ev.>"]:
        assert f.matches(attrs)


# -- position resolution against a fake next_by_subj -------------------------

class FakeStream:
    """A stream window ``first..last`` where ``held`` maps stream sequence ->
    the session's position (the other sequences belong to other subjects)."""

    def __init__(self, first: int, last: int, held: dict[int, tuple[int, int]]) -> None:
        self.first, self.last, self.held = first, last, held
        self.calls = 0

    async def lookup(self, n: int) -> P.Found | None:
        self.calls += 1
        for seq in sorted(self.held):
            if seq >= n:
                return P.Found(seq, self.held[seq])
        return None


def resolve(fs: FakeStream, after: tuple[int, int]) -> P.Resolved:
    return trio.run(P.resolve_after, after, fs.first, fs.last, fs.lookup)


def test_resume_mid_session_starts_after_the_position() -> None:
    fs = FakeStream(1, 10, {2: (1, 1), 4: (1, 2), 7: (1, 3), 9: (1, 4)})
    r = resolve(fs, (1, 2))
    assert (r.start, r.exhausted, r.earliest) == (7, False, (1, 1))


def test_resume_at_the_head_waits_for_live() -> None:
    fs = FakeStream(1, 10, {2: (1, 1), 9: (1, 4)})
    assert resolve(fs, (1, 4)).start == 11
    assert resolve(fs, (1, 9)).start == 11


def test_retention_dropped_the_asked_position_is_exhausted() -> None:
    # the stream kept 41..50 of one session; the consumer saw up to seq 5
    fs = FakeStream(41, 50, {n: (1, n) for n in range(41, 51)})
    r = resolve(fs, (1, 5))
    assert (r.start, r.exhausted, r.earliest) == (41, True, (1, 41))


def test_exactly_the_next_position_held_is_not_exhausted() -> None:
    fs = FakeStream(41, 50, {n: (1, n) for n in range(41, 51)})
    assert resolve(fs, (1, 40)) == P.Resolved(41, False, (1, 41))


def test_a_new_epoch_after_the_asked_one_is_exhausted() -> None:
    fs = FakeStream(1, 5, {3: (2, 1), 5: (2, 2)})
    r = resolve(fs, (1, 7))
    assert (r.start, r.exhausted, r.earliest) == (3, True, (2, 1))


def test_unknown_session_or_empty_stream() -> None:
    assert resolve(FakeStream(1, 10, {}), (1, 1)) == P.Resolved(11, False, None)
    assert resolve(FakeStream(1, 0, {}), (1, 1)) == P.Resolved(1, False, None)


@st.composite
def streams(draw: Any) -> tuple[FakeStream, tuple[int, int]]:
    first = draw(st.integers(1, 50))
    length = draw(st.integers(0, 120))
    last = first + length - 1
    seqs = sorted(draw(st.sets(st.integers(first, max(first, last)), max_size=length)))
    if length == 0:
        seqs = []
    positions: list[tuple[int, int]] = []
    epoch, seq = draw(st.integers(0, 2)), draw(st.integers(0, 5))
    for _ in seqs:
        if draw(st.booleans()) and draw(st.booleans()):
            epoch, seq = epoch + 1, draw(st.integers(0, 3))
        else:
            seq += draw(st.integers(1, 3))
        positions.append((epoch, seq))
    after = (draw(st.integers(0, epoch + 1)), draw(st.integers(0, seq + 3)))
    return FakeStream(first, last, dict(zip(seqs, positions, strict=True))), after


@settings(max_examples=300, deadline=None)
@given(streams())
def test_resolution_matches_a_linear_scan(case: tuple[FakeStream, tuple[int, int]]) -> None:
    fs, after = case
    ordered = sorted(fs.held.items())
    expect_start = next((s for s, p in ordered if p > after), fs.last + 1)
    earliest = ordered[0][1] if ordered else None
    expect_exhausted = earliest is not None and earliest > (after[0], after[1] + 1)
    r = resolve(fs, after)
    assert (r.start, r.exhausted, r.earliest) == (expect_start, expect_exhausted, earliest)
    span = max(fs.last - fs.first + 1, 1)
    assert fs.calls <= 3 + 2 * math.ceil(math.log2(span + 1))


@pytest.mark.parametrize("case", [{"agent": "codex", "session": "s1"}])
def test_session_subject_spans_every_agent(case: dict[str, str]) -> None:
    subject = S.event_subject("AEP", case["agent"], case["session"])
    assert _subject_matches(P.session_subject("AEP", case["session"]), subject)
    assert not _subject_matches(P.session_subject("AEP", "s2"), subject)
