"""``Stamper.stamp_run`` and ``BridgeContext.emit_run`` (issue 11: a run of
one session stamped and sent in one call, what an OTLP request holds) held
equal to the slow path they skip: one ``emit_nowait`` per emission. Two
contexts on the same clock and the same random bytes, one sending through
runs (the emission a run stops at asked of ``emit_nowait``, as
``Admission.admit`` does), the other event by event: the same envelopes on
the channel (key order included), the same answer for each emission (sent,
``Saturated``, ``ValueError``, a closed channel), the same ``seq`` state and
the same count of sends. The emissions are every shape the stamper takes
(``test_stamp_fast``'s), including agent-scoped types and unknown
severities where a run stops, and channels that fill or close mid-run."""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core import envelope
from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from tests.unit.core.test_stamp_fast import _bytes_from, _emission, _policies


def _ctx(size: int, policy: CapturePolicy) -> tuple[BridgeContext, Any]:
    send, recv = trio.open_memory_channel(size)
    _, commands = trio.open_memory_channel(1)
    ctx = BridgeContext("b", Stamper("agent-x", epoch=3, host="h", policy=policy), send,
                        commands, BridgeHealth(), logging.getLogger("test"))
    return ctx, recv


def _answer(ctx: BridgeContext, session: str, em: Any, time: Any) -> str:
    try:
        ctx.emit_nowait(session, em, time=time, room_seen=True)
    except Exception as e:  # noqa: BLE001 -- the answer is what is compared
        return type(e).__name__
    return "sent"


def _by_runs(ctx: BridgeContext, session: str, ems: list[Any], times: list[Any],
             cut: int) -> list[str]:
    """The emissions through ``emit_run`` in runs of at most ``cut``."""
    answers: list[str] = []
    i, n = 0, len(ems)
    while i < n:
        end = min(n, i + cut)
        j = ctx.emit_run(session, ems, times, i, end)
        answers += ["sent"] * (j - i)
        i = j
        if j < end:
            answers.append(_answer(ctx, session, ems[j], times[j]))
            i += 1
    return answers


_times = st.one_of(st.none(), st.just("2026-11-30T12:00:00.123Z"), st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
    timezones=st.just(timezone.utc)))
_KEYS = st.sampled_from(["kind", "error", "error.message", "prompt", "n", "args"])
_vendor = st.builds(
    lambda type_, data, gating: {"type": type_, **({"data": data} if data is not None else {}),
                                 **({"gating": gating} if gating is not None else {})},
    st.sampled_from(["x.codex.otel.sse_event", "x.codex.otel.unknown", "tool.completed",
                     "attention.requested"]),
    st.one_of(st.none(), st.dictionaries(_KEYS, st.one_of(
        st.text(max_size=4), st.integers(), st.none(), st.lists(st.integers(), max_size=2),
        st.dictionaries(_KEYS, st.text(max_size=3), max_size=2)), max_size=4)),
    st.one_of(st.none(), st.fixed_dictionaries(
        {"levels": st.dictionaries(_KEYS, st.sampled_from(["redacted", "full"]), max_size=2)},
        optional={"structural": st.just(["prompt"])})))
"""The OTLP shape: vendor types with a ``levels`` hint naming keys the
payload may or may not hold (the plain-member copy or the full pass),
now and then a ``structural`` hint beside it."""
_bad = st.sampled_from([{"type": "agent.presence"}, {"type": "x.y.z", "severity": "loud"},
                        {"type": "tool.failed", "severity": 3}])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=st.lists(st.tuples(
    st.sampled_from(["s1", "s2", "ses 3", "", "s\ud800"]),
    st.lists(st.tuples(st.one_of(_emission(), _vendor, _bad), _times), max_size=12),
    st.integers(1, 13), st.integers(0, 4)), min_size=1, max_size=6),
    size=st.integers(1, 40), close_after=st.one_of(st.none(), st.integers(0, 5)),
    policy=_policies, seed=st.integers(0, 255),
    start=st.integers(1_700_000_000_000_000_000, 1_900_000_000_000_000_000))
def test_emit_run_equals_emit_nowait_one_by_one(runs, size, close_after, policy, seed, start):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(envelope._time, "time_ns", lambda: start)
        results = []
        for through_runs in (True, False):
            mp.setattr(envelope.os, "urandom", _bytes_from(seed))
            ctx, recv = _ctx(size, policy)
            answers: list[list[str]] = []
            taken: list[Any] = []  # what the consumer took off the channel, in order
            for k, (session, pairs, cut, takes) in enumerate(runs):
                if close_after is not None and k == close_after:
                    recv.close()
                ems = [em for em, _ in pairs]
                times = [t for _, t in pairs]
                if through_runs:
                    answers.append(_by_runs(ctx, session, ems, times, cut))
                else:
                    answers.append([_answer(ctx, session, em, t) for em, t in pairs])
                for _ in range(takes):  # the consumer takes a few between requests
                    try:
                        taken.append(recv.receive_nowait())
                    except (trio.WouldBlock, trio.ClosedResourceError):
                        break
            while True:
                try:
                    taken.append(recv.receive_nowait())
                except (trio.WouldBlock, trio.ClosedResourceError):
                    break
            results.append((answers, [(o.bridge, json.dumps(o.event), o.redelivery)
                                      for o in taken], dict(ctx.stamper._seq), ctx.log_mark()))
        assert results[0] == results[1]


def test_stamp_run_stops_before_what_stamp_refuses():
    """The run ends before an emission stamp() refuses (nothing of it
    taken) and before an agent-scoped one; the caller's emit_nowait then
    answers each."""
    st_ = Stamper("a", host="h")
    ems = [{"type": "x.a.one"}, {"type": "x.a.two", "severity": "loud"}, {"type": "x.a.three"}]
    got = list(st_.stamp_run("s", ems, [None] * 3))
    assert [e["type"] for e in got] == ["x.a.one"] and st_._seq == {"s": 1}
    with pytest.raises(ValueError):
        st_.stamp("s", ems[1])
    assert [e["seq"] for e in st_.stamp_run("s", ems, [None] * 3, 2)] == [1]
    assert list(st_.stamp_run("s", [{"type": "agent.presence"}], [None])) == []
    assert list(st_.stamp_run("", ems, [None] * 3)) == []


_scalar = st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats(allow_nan=False) \
    | st.text(max_size=6)


@settings(max_examples=300, deadline=None)
@given(type_=st.sampled_from(["x.codex.otel.sse_event", "x.vscode.chat", "tool.completed",
                              "message.note", "session.started"]),
       data=st.dictionaries(st.sampled_from(["kind", "model", "tool_name", "error", "n", "x"]),
                            _scalar.filter(lambda v: v is not None), max_size=4),
       levels=st.dictionaries(st.sampled_from(["args", "prompt", "x.y", "result"]),
                              st.sampled_from(["redacted", "full"]), max_size=2),
       ceiling=st.sampled_from(["none", "metadata", "redacted", "full"]))
def test_a_true_plain_claim_stamps_what_the_gate_gives(type_, data, levels, ceiling):
    """``Gating.plain`` (an OTLP recipe's claim: scalars, no declared key)
    skips the gate's copy in ``stamp_run``: the envelope is ``stamp``'s,
    which gates in full and ignores the claim; on a registered type or a
    ``none`` ceiling the claim changes nothing. ``x`` is declared by
    ``x.y``'s prefix: such data is never claimed plain."""
    from bridges.core.capture import declares
    if declares(levels, data):
        return
    em = {"type": type_, "data": dict(data), "gating": {"levels": levels, "plain": True}}
    got, want = _run_and_one_by_one(CapturePolicy(ceiling=ceiling), em, data)
    assert got == want and json.dumps(got) == json.dumps(want)


def _run_and_one_by_one(policy: CapturePolicy, em: dict, data: dict) -> tuple[list, list]:
    """``em`` stamped by ``stamp_run`` and by ``stamp`` (``data`` copied
    fresh for it), by two stampers at ``policy`` on one frozen clock with
    the same ids: ``(run's envelopes, stamp's)``."""
    a, b = (Stamper("agent-x", epoch=3, host="h", policy=policy) for _ in range(2))
    for s in (a, b):
        s._ulid = envelope.Ulids()  # noqa: SLF001 -- the same ids from both
    ms = 1_764_500_000_000
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(envelope._time, "time_ns", lambda: ms * 1_000_000)  # noqa: SLF001
        mp.setattr(envelope.os, "urandom", lambda n: b"\x01" * n)
        got = list(a.stamp_run("s1", [em], [None]))
        want = [b.stamp("s1", {**em, "data": dict(data)})]
    return got, want


@pytest.mark.parametrize("ceiling", ["metadata", "redacted", "full"])
@pytest.mark.parametrize("gating", [
    {"levels": {"arguments": "full"}, "plain": False},  # said not plain
    {"levels": None, "plain": True},  # no levels: the gate claims the ceiling
    {"plain": True},
    {"levels": "arguments", "plain": True},  # not a mapping: stamp() refuses it, so must the run
], ids=["plain-false", "levels-none", "no-levels", "levels-not-a-mapping"])
def test_what_is_no_plain_claim_takes_the_whole_gate(gating, ceiling):
    """Only ``plain: True`` beside a ``levels`` mapping is the claim
    (:class:`bridges.core.bridge.Gating`): ``plain: False`` or a claim
    without levels is gated in full in ``stamp_run`` as in ``stamp``, so
    a declared ``full`` key never leaves at ``metadata`` and ``capture``
    never under-claims (a review's finding: the keys' presence was taken
    for the claim)."""
    data = {"arguments": "ghp_" + "a" * 36, "n": 1}
    em = {"type": "x.codex.otel.tool_result", "data": dict(data), "gating": gating}
    try:
        got, want = _run_and_one_by_one(CapturePolicy(ceiling=ceiling), em, data)
    except (AttributeError, TypeError) as e:  # stamp()'s answer to levels that are no mapping
        assert not isinstance(gating.get("levels"), (dict, type(None)))
        # the run raises it too, before a seq is taken (emit_run leaves it
        # to emit_nowait, which answers with stamp()'s refusal)
        run = Stamper("agent-x", host="h", policy=CapturePolicy(ceiling=ceiling))
        with pytest.raises(type(e)):
            list(run.stamp_run("s1", [em], [None]))
        assert run._seq.get("s1", 0) == 0  # noqa: SLF001 -- no seq taken
        return
    assert got == want and json.dumps(got) == json.dumps(want)
    if ceiling == "metadata" and gating.get("levels"):  # declared full: not at metadata
        assert "arguments" not in got[0].get("data", {})
