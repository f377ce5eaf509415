"""The OTLP decoding lane (``bridges/otlp_in/lane.py``): one holder at a
time, first come first served, a bounded wait, and a rest as long as the
hold (round 14 of issue 25: six decoding threads at once starved the loop
of the GIL and gated hooks failed open). Threads and a fake clock; no
timing assertions."""
from __future__ import annotations

import sys
import threading

import pytest

from bridges.otlp_in.lane import MAX_REST_S, Lane, LaneBusy


def _hold(lane: Lane, entered: threading.Event, release: threading.Event) -> threading.Thread:
    def run() -> None:
        with lane.held(30):
            entered.set()
            release.wait(30)
    t = threading.Thread(target=run)
    t.start()
    assert entered.wait(30)
    return t


def _until(cond, what: str) -> None:
    done = threading.Event()
    for _ in range(3000):
        if cond():
            return
        done.wait(0.01)
    raise AssertionError(f"never: {what}")


def test_waiters_enter_one_at_a_time_in_arrival_order():
    lane = Lane(rest=0)
    release = threading.Event()
    holder = _hold(lane, threading.Event(), release)
    order: list[int] = []
    inside = [0]
    most = [0]
    lock = threading.Lock()

    def waiter(i: int) -> None:
        with lane.held(30):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            order.append(i)
            threading.Event().wait(0.001)  # let another thread try to get in
            with lock:
                inside[0] -= 1

    threads = []
    for i in range(8):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        threads.append(t)
        _until(lambda i=i: lane.waiting == i + 1, f"waiter {i} queued")
    assert order == [] and lane.busy
    release.set()
    for t in [holder, *threads]:
        t.join(30)
    assert order == list(range(8))
    assert most[0] == 1
    assert not lane.busy and lane.waiting == 0


def test_a_wait_past_its_timeout_raises_and_leaves_the_queue():
    lane = Lane(rest=0)
    release = threading.Event()
    holder = _hold(lane, threading.Event(), release)
    got: list[str] = []

    def patient() -> None:
        with lane.held(30):
            got.append("patient")

    with pytest.raises(LaneBusy, match="no turn to decode within"):
        with lane.held(0.05):
            got.append("impatient")  # pragma: no cover - must not run
    assert lane.waiting == 0
    # a waiter queued behind one that gave up still gets its turn
    t = threading.Thread(target=patient)
    t.start()
    _until(lambda: lane.waiting == 1, "patient queued")
    release.set()
    holder.join(30)
    t.join(30)
    assert got == ["patient"]


def test_the_lane_rests_as_long_as_it_was_held_past_the_grace_capped():
    now = [100.0]
    slept: list[float] = []
    lane = Lane(rest=1.0, grace=0.005, clock=lambda: now[0], sleep=slept.append)
    with lane.held(1):
        now[0] += 0.2  # a slow decode of 0.2 s
    with lane.held(1):
        now[0] += 30.0  # a decode far past the cap
    with lane.held(1):
        now[0] += 0.004  # an ordinary decode, within the switch interval: no rest
    with lane.held(1):
        pass
    assert slept == [pytest.approx(0.195), MAX_REST_S]
    assert Lane().grace == sys.getswitchinterval()
    # the rest is taken while the lane is still held
    seen: list[bool] = []
    lane2 = Lane(rest=1.0, grace=0, clock=lambda: now[0],
                 sleep=lambda s: seen.append(lane2.busy))
    with lane2.held(1):
        now[0] += 0.1
    assert seen == [True] and not lane2.busy


def test_a_failing_body_still_releases_the_lane():
    lane = Lane(rest=0)
    with pytest.raises(ValueError):
        with lane.held(1):
            raise ValueError("decode failed")
    assert not lane.busy
    with lane.held(0.1):
        assert lane.busy


def _queue_in_order(lane: Lane, sizes: list[int], order: list[int],
                    before_each=lambda i: None) -> list[threading.Thread]:
    threads = []
    for i, size in enumerate(sizes):
        before_each(i)

        def waiter(i: int = i, size: int = size) -> None:
            with lane.held(30, size=size):
                order.append(i)
        t = threading.Thread(target=waiter)
        t.start()
        threads.append(t)
        _until(lambda i=i: lane.waiting == i + 1, f"waiter {i} queued")
    return threads


def test_a_small_body_goes_before_large_ones_that_came_just_before_it():
    """Round 15: one sender of slow 4 MB bodies kept legitimate exports of
    a few KB waiting 2-4 s; a body counts as arriving a second per MiB
    later, so the small one passes the queue."""
    lane = Lane(rest=0)
    release = threading.Event()
    holder = _hold(lane, threading.Event(), release)
    order: list[int] = []
    threads = _queue_in_order(lane, [4 << 20, 4 << 20, 4 << 20, 2048, 4 << 20], order)
    release.set()
    for t in [holder, *threads]:
        t.join(30)
    assert order == [3, 0, 1, 2, 4]


def test_a_large_body_is_not_passed_forever():
    now = [0.0]
    lane = Lane(rest=0, clock=lambda: now[0])
    release = threading.Event()
    holder = _hold(lane, threading.Event(), release)
    order: list[int] = []

    def later(i: int) -> None:
        if i == 1:
            now[0] += 5.0  # the 4 MiB body (4 s of lead) has waited 5 s

    threads = _queue_in_order(lane, [4 << 20, 2048], order, before_each=later)
    release.set()
    for t in [holder, *threads]:
        t.join(30)
    assert order == [0, 1]
