"""``BridgeContext.emit_nowait`` (issue 11): it offers the stamped envelope
to the channel and takes it back (``Stamper.unstamp``) when the channel
refuses, instead of asking the channel for its statistics before every
event. Held equal to the check it replaced: it raises ``Saturated``
exactly when ``saturated()`` said so beforehand, and what went through
carries every session's ``seq`` from 0 without a gap (no ``seq`` burnt by a
refusal), while the stamper's ``knows`` matches."""
from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.bridge import BridgeContext, BridgeHealth, Saturated
from bridges.core.envelope import Stamper


def _ctx(size: int):
    send, recv = trio.open_memory_channel(size)
    _, commands = trio.open_memory_channel(1)
    ctx = BridgeContext("b", Stamper("b", host="h"), send, commands, BridgeHealth(),
                        logging.getLogger("test"))
    return ctx, recv


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 4), ops=st.lists(st.one_of(
    st.sampled_from(["s1", "s2", "s3"]), st.just("take")), max_size=60))
def test_emit_nowait_refuses_exactly_when_saturated_and_burns_no_seq(size, ops):
    ctx, recv = _ctx(size)
    seen: dict[str, list[int]] = {}
    offered: dict[str, int] = {}  # sessions with at least one event that went through
    for op in ops:
        if op == "take":
            try:
                ev = recv.receive_nowait().event
            except trio.WouldBlock:
                continue
            seen.setdefault(ev["session"], []).append(ev["seq"])
            continue
        full = ctx.saturated()
        if full:
            with pytest.raises(Saturated):
                ctx.emit_nowait(op, {"type": "x.b.tick"})
        else:
            ev = ctx.emit_nowait(op, {"type": "x.b.tick"})
            offered[op] = offered.get(op, 0) + 1
            assert ev["seq"] == offered[op] - 1
        assert ctx.stamper.knows(op) == (op in offered)
    while True:
        try:
            ev = recv.receive_nowait().event
        except trio.WouldBlock:
            break
        seen.setdefault(ev["session"], []).append(ev["seq"])
    assert {s: seqs for s, seqs in seen.items()} == \
        {s: list(range(n)) for s, n in offered.items()}
    assert ctx.log_mark() == sum(offered.values())


def test_a_refused_first_event_leaves_its_session_unknown():
    ctx, recv = _ctx(1)
    ctx.emit_nowait("a", {"type": "x.b.tick"})
    with pytest.raises(Saturated):
        ctx.emit_nowait("new", {"type": "x.b.tick"})
    assert not ctx.stamper.knows("new")  # the OTLP session cap counts on this
    recv.receive_nowait()
    assert ctx.emit_nowait("new", {"type": "x.b.tick"})["seq"] == 0


async def test_logged_since_wakes_on_each_verdict_and_reports_a_failure():
    # log_result swaps its wake-up Event only while someone waits in
    # logged_since: every waiter still sees every verdict
    ctx, recv = _ctx(16)
    ctx.attach_log(lambda: True)
    results: dict[str, bool] = {}

    async def wait(name: str, mark: int) -> None:
        results[name] = await ctx.logged_since(mark)

    ctx.emit_nowait("s", {"type": "x.b.tick"})
    ctx.log_result(True)  # a verdict no one waits for
    mark = ctx.log_mark()
    for _ in range(3):
        ctx.emit_nowait("s", {"type": "x.b.tick"})
    async with trio.open_nursery() as n:
        n.start_soon(wait, "first", mark)
        n.start_soon(wait, "second", mark)
        await trio.testing.wait_all_tasks_blocked()
        assert results == {}
        ctx.log_result(True)
        ctx.log_result(True)
        await trio.testing.wait_all_tasks_blocked()
        assert results == {}  # one verdict still to come
        ctx.log_result(False)
    assert results == {"first": False, "second": False}
    assert ctx._waiting == 0
    ctx.emit_nowait("s", {"type": "x.b.tick"})
    later = ctx.log_mark() - 1
    async with trio.open_nursery() as n:
        n.start_soon(wait, "third", later)
        await trio.testing.wait_all_tasks_blocked()
        ctx.log_result(True)
    assert results["third"] is True
