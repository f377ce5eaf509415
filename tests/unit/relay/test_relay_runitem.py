"""An SSE stream queues a fanned-out run as one :class:`RunItem` (issue
11: the writer joins and takes it as one), held equal to the run queued
event by event: the same items queued (:meth:`Outlet.flat`), shed,
evicted and counted the same, and the writer's batches
(:meth:`Outlet.next_batch`) the same bytes in the same turns, whatever
``max_bytes`` cuts a run at. The clock stands still (``MockClock``): an
outlet's stuck check reads it."""
from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.relay.core import Relay
from supervisor.relay.outlet import EventItem, Outlet, RunItem


def _state(o: Outlet) -> tuple:
    return (o.state, o.dropped, o.queued_bytes,
            [(type(i).__name__, getattr(i, "payload", None), i.size, getattr(i, "sev", None))
             for i in o.flat()])


# round sizes too: a batch cut exactly at max_bytes
_item = st.tuples(st.one_of(st.integers(12, 700), st.sampled_from([100, 200, 300])),
                  st.integers(0, 5))
_op = st.one_of(
    st.tuples(st.just("run"), st.lists(_item, min_size=1, max_size=8)),
    st.tuples(st.just("lazy"), st.lists(_item, min_size=1, max_size=8)),
    st.tuples(st.just("one"), _item),
    st.tuples(st.just("take"), st.one_of(st.integers(1, 3000), st.sampled_from([200, 300, 600]))),
    st.tuples(st.just("frame"), st.integers(1, 300)),
    st.tuples(st.just("send"), st.booleans()),
    st.tuples(st.just("end"), st.just(0)))


@settings(max_examples=600, deadline=None)
@given(ops=st.lists(_op, max_size=25), soft=st.integers(300, 5000), hard_x=st.integers(1, 4))
def test_a_queued_run_equals_its_events_queued_one_by_one(ops, soft, hard_x):
    async def main() -> None:
        def outlet() -> Outlet:
            return Outlet(Relay(queue_soft_bytes=soft, queue_hard_bytes=soft * hard_x), "sse")
        one, many = outlet(), outlet()
        n = 0
        for op, arg in ops:
            if op in ("run", "lazy"):
                items = []
                for size, sev in arg:
                    payload = b"e%d." % n
                    # a lazy run's items are made from its payloads: a size is the payload's
                    items.append(EventItem(payload + b"x" * (size - len(payload)) if op == "lazy"
                                           else payload, size, sev))
                    n += 1
                for item in items:
                    one.offer(item)
                total = sum(i.size for i in items)
                if op == "run":
                    many.offer_many(items, total)
                else:  # a run made from its payloads and severities (the fan-out's shared run)
                    run = RunItem(None, total, payloads=[i.payload for i in items],
                                  sevs=[i.sev for i in items])
                    many.offer_many(None, total, run)
            elif op == "one":
                item = EventItem(b"o%d." % n, arg[0], arg[1])
                n += 1
                one.offer(item)
                many.offer(item)
            elif op == "frame":
                one.push_frame(b"f" * arg)
                many.push_frame(b"f" * arg)
            elif op == "send":  # the writer in a send (since now, or stuck for longer than stuck_s)
                for o in (one, many):
                    o.in_send = True
                    o.send_started = trio.current_time() - (o._stuck_s + 1 if arg else 0)
            elif op == "end":
                one.end(True)
                many.end(True)
            else:
                for o in (one, many):
                    o.in_send = False
                if one.queued or many.queued:
                    a, b = await one.next_batch(arg), await many.next_batch(arg)
                    assert (b"".join(b[0]), b[1]) == (b"".join(a[0]), a[1])
            assert _state(many) == _state(one)
            assert many.hub.counters == one.hub.counters
    trio.run(main, clock=trio.testing.MockClock())


def test_a_run_is_one_item_joined_once_for_every_stream():
    """Not vacuous: a run the budgets take is queued whole, and the streams
    sharing it write one joined ``bytes``."""
    async def main() -> None:
        relay = Relay()
        items = [EventItem(b"a\n\n", 3, 2), EventItem(b"b\n\n", 3, 2)]
        run = RunItem(items, 6)
        outlets = [Outlet(relay, "sse") for _ in range(3)]
        for o in outlets:
            o.offer_many(items, 6, run)
            assert o.queued == 1 and o.flat() == items
        batches = [await o.next_batch() for o in outlets]
        assert all(b == ([b"a\n\nb\n\n"], None) for b in batches)
        assert all(b[0][0] is batches[0][0][0] for b in batches)  # one join, shared
    trio.run(main)
