"""The fleet reports one drain's session-log verdicts per bridge in one
``BridgeContext.log_results`` call (issue 11: a call and a wake-up per event
were ~3% of the OTLP daemon). Held equal, by hypothesis, to the slow path it
replaced: one ``log_result`` per event, in channel order, so
``logged_since`` answers exactly as before for every mark."""
from __future__ import annotations

import logging

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.bridge import BridgeContext, BridgeHealth, Outbound
from bridges.core.envelope import Stamper
from supervisor.config import Config
from supervisor.fleet import Fleet


def _ctx() -> BridgeContext:
    send, _recv = trio.open_memory_channel(1)
    _, commands = trio.open_memory_channel(1)
    ctx = BridgeContext("b", Stamper("b", host="h"), send, commands, BridgeHealth(),
                        logging.getLogger("test"))
    ctx.attach_log(lambda: True)
    return ctx


def _state(ctx: BridgeContext) -> tuple[int, int]:
    return ctx._done, ctx._failed_at


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.booleans(), max_size=12), max_size=8))
def test_log_results_equals_one_log_result_per_verdict(chunks):
    slow, fast = _ctx(), _ctx()
    for chunk in chunks:
        for ok in chunk:
            slow.log_result(ok)
        last_failed = max((i + 1 for i, ok in enumerate(chunk) if not ok), default=0)
        fast.log_results(len(chunk), last_failed)
        assert _state(fast) == _state(slow)


class Quiet:
    """A bridge that never emits on its own (the test feeds its verdicts)."""

    def __init__(self, name: str) -> None:
        self.name = self.agent = name

    def capabilities(self):
        return {"emits": ["x"]}

    def preflight(self):
        return []

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        await trio.sleep_forever()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "gone"]), st.booleans()), max_size=40))
def test_a_drains_verdicts_reach_each_bridge_as_one_call_per_event_would(tmp_path_factory, drain):
    tmp = tmp_path_factory.mktemp("fleet")
    fleet = Fleet(Config(state_dir=tmp), [Quiet("a"), Quiet("b")], host="h")
    slow = {name: _ctx() for name in ("a", "b")}
    fresh = []
    for i, (bridge, ok) in enumerate(drain):
        ev = {"type": "x.a.tick.seen" if i % 3 else "control.accepted", "cause": str(i)}
        fresh.append((Outbound(bridge, ev), ev, b"{}\n"))
        if bridge in slow:
            slow[bridge].log_result(ok)
    fleet._logged(fresh, [ok for _, ok in drain])
    for name, ctx in slow.items():
        assert _state(fleet.members[name].ctx) == _state(ctx)
    assert fleet.counters["events"] == len(drain)
    assert fleet.counters.get("jsonl_unwritten", 0) == sum(not ok for _, ok in drain)


async def _noop_deliver(cmd):
    return None


async def _deliver_with_a_bad_pair(tmp_path, bad: int, n: int):
    import re

    from supervisor.fleet import _RelaySink
    from supervisor.relay.attrmatch import Filter
    from supervisor.relay.core import Relay
    fleet = Fleet(Config(state_dir=tmp_path), [Quiet("codex")], host="h")
    relay = Relay(buffer=1000)
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    conn = relay.attach_emitter({"role": "emitter", "identity": {"agent": "codex", "instance": "h"},
                                 "capabilities": {"emits": ["x"], "control": {
                                     "accepts": [], "ack_window_ms": 1000}}}, _noop_deliver)
    fleet.members["codex"].sink = _RelaySink(conn)
    st_ = Stamper("codex", host="h", epoch=1)
    evs = [st_.stamp("s1", {"type": "x.codex.tool.seen", "data": {"n": i}}) for i in range(n)]
    evs[bad]["severity"] = "warn"  # a bridge bug: no rank for it, the relay's entry raises
    await fleet._deliver_batch([Outbound("codex", e) for e in evs])
    live = [int(re.search(rb'"seq":(\d+)', bytes(i.payload)).group(1)) for i in outlet._q
            if b'"seq"' in bytes(i.payload)]
    return fleet, relay, live


async def test_a_pair_that_fails_in_a_run_is_counted_once_and_nothing_is_handed_over_twice(tmp_path):
    """The pump's run path re-admitted what a failing run had already taken
    (the break-it review: 10 admissions and 6 duplicates for 5 events, live
    seqs going backwards; quadratic in the failing pair's position)."""
    fleet, relay, live = await _deliver_with_a_bad_pair(tmp_path, bad=3, n=5)
    assert live == [0, 1, 2, 4]
    assert relay.buffers.counters["duplicates"] == 0 and relay.counters["events"] == 4
    assert fleet.counters["sink_errors"] == 1


async def test_a_fault_inside_an_admission_resumes_after_that_pair(tmp_path, monkeypatch):
    from supervisor.relay.core import Relay
    real = Relay._admit
    calls = {"n": 0}

    def flaky(self, e, conn):
        calls["n"] += 1
        if calls["n"] == 3:  # the third admission fails part way
            raise RuntimeError("fanout broke")
        return real(self, e, conn)
    monkeypatch.setattr(Relay, "_admit", flaky)
    fleet, relay, live = await _deliver_with_a_bad_pair(tmp_path, bad=5, n=8)
    assert live == [0, 1, 3, 4, 6, 7]  # 2 failed inside its admission, 5 before it
    assert relay.buffers.counters["duplicates"] == 0
    assert fleet.counters["sink_errors"] == 2
