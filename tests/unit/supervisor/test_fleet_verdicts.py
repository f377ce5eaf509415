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
