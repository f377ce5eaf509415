"""``serve_app``'s two connection budgets (``bridges/core/http.py``
``_Budgets``, issue 25): connections still sending their request headers
have a pool of their own, where the one waiting longest is closed for a
newcomer; only served connections count against the cap and its 2 s
overflow. Driven through ``_Phase`` as hypercorn's idle signal drives it."""
from __future__ import annotations

import math

import trio

from bridges.core import http


async def test_waiting_connections_evict_each_other_never_a_served_one():
    b = http._Budgets(8, "test", header_cap=2)
    served = http._Phase(b)
    served.request()  # a /stream consumer: its headers are in
    first, second = http._Phase(b), http._Phase(b)
    assert list(b.waiting) == [first, second]
    third = http._Phase(b)  # the pool is full: the longest waiting goes
    assert first.scope.cancel_called and first.gone and list(b.waiting) == [second, third]
    for _ in range(20):  # a trickle flood only ever evicts the waiting
        http._Phase(b)
    assert not served.scope.cancel_called and served.scope.deadline == math.inf
    assert len(b.waiting) == 2 and b.serving == 1
    late = http._Phase(b)
    late.request()  # a well-formed request arriving now is served, unbounded
    assert not late.scope.cancel_called and late.scope.deadline == math.inf and b.serving == 2


async def test_headers_have_a_deadline_and_idle_connections_go_back_to_waiting():
    b = http._Budgets(8, "test", header_timeout=10.0, idle_timeout=85.0)
    now = trio.current_time()
    p = http._Phase(b)
    assert now + 9 < p.scope.deadline <= trio.current_time() + 10
    p.request()
    assert p.scope.deadline == math.inf and p not in b.waiting
    p.idle()  # keep-alive: waiting for the next request's headers
    assert p in b.waiting and b.serving == 0
    assert trio.current_time() + 84 < p.scope.deadline <= trio.current_time() + 85
    p.leave()
    assert p not in b.waiting and b.serving == 0


async def test_past_the_served_cap_the_overflow_gets_two_seconds_then_none():
    b = http._Budgets(8, "test", header_cap=64)
    phases = [http._Phase(b) for _ in range(8 + b.overflow + 1)]
    for p in phases:
        p.request()
    assert all(p.scope.deadline == math.inf for p in phases[:8])
    assert all(p.scope.deadline <= trio.current_time() + http._OVERFLOW_S
               for p in phases[8:8 + b.overflow])
    assert phases[-1].scope.cancel_called
    for p in phases:
        p.leave()
    assert b.serving == 0 and not b.waiting
