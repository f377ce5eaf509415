"""An eleventh outside attack on issue 25, finding 2: the container cap is
per line, and ``POST /events`` yielded every 128 lines whatever they held.
80 valid events of 65,000 empty arrays each (5.2 million, 15.6 MB, each
line under the cap) were parsed between two yields: the loop was held
2.3 s and a gated hook failed open. The parse now yields by work done
(:class:`bridges.core.pacing.Pacer`): between two checkpoints at most one
budget (256 KiB, 65,536 containers, 128 lines) or one line bigger than it.

No clock: another task ticks at every checkpoint it gets, and each parsed
line notes the tick it was parsed in; trio may run the ticker before or
after the poster in a round, so one tick spans at most two of the poster's
steps."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from bridges.core.aep import containers
from bridges.core.pacing import YIELD_BYTES, YIELD_CONTAINERS, YIELD_ITEMS, Pacer
from supervisor.relay import app as relay_app
from supervisor.relay.core import Relay
from tests.support.ticker import Ticker
from tests.unit.relay.test_relay_core import ev


def _line(i: int, inner: str) -> bytes:
    e = ev(i + 1, "pace")
    e["data"] = {"x": "@@"}
    return json.dumps(e).replace('"@@"', inner).encode()


async def _post_paced(monkeypatch, lines: list[bytes]) -> tuple[int, dict[int, list[bytes]]]:
    """POST ``lines`` as one batch while a ticker runs: (status, the lines
    parsed in each tick)."""
    relay = Relay(token="t")
    ticker = Ticker()
    parsed: dict[int, list[bytes]] = defaultdict(list)
    formed = relay_app.formed_entry
    monkeypatch.setattr(relay_app, "formed_entry",
                        lambda ln: parsed[ticker.ticks].append(ln) or formed(ln))
    sent: list = []
    scope = {"type": "http", "path": "/events", "method": "POST", "query_string": b"",
             "server": ("127.0.0.1", 1), "headers": [
                 (b"host", b"127.0.0.1"), (b"content-type", b"application/x-ndjson"),
                 (b"aep-version", b"0.1"), (b"authorization", b"Bearer t")]}
    msgs = iter([{"type": "http.request", "body": b"\n".join(lines), "more_body": False}])

    async def receive():
        return next(msgs)

    async def send(m):
        sent.append(m)
    await ticker.beside(lambda: relay_app.make_app(relay)(scope, receive, send))
    assert sum(len(v) for v in parsed.values()) == len(lines)
    return sent[0]["status"], parsed


async def test_a_batch_of_lines_each_under_the_container_cap_yields_by_containers(monkeypatch):
    """The attack's shape, smaller: 8 lines of 65,000 arrays (all 8 were
    parsed in one step before: 520,000 containers)."""
    lines = [_line(i, "[" + ",".join(["[]"] * 65_000) + "]") for i in range(8)]
    status, parsed = await _post_paced(monkeypatch, lines)
    assert status == 202
    worst = max(sum(containers(ln) for ln in step) for step in parsed.values())
    assert worst <= 2 * YIELD_CONTAINERS, worst


async def test_a_batch_of_big_lines_yields_by_bytes(monkeypatch):
    """40 lines of 100 KB of text: 4 MB in one step before (128 lines a step)."""
    lines = [_line(i, json.dumps("a" * 100_000)) for i in range(40)]
    status, parsed = await _post_paced(monkeypatch, lines)
    assert status == 202
    worst = max(sum(len(ln) for ln in step) for step in parsed.values())
    assert worst <= 2 * YIELD_BYTES, worst


async def test_small_lines_still_yield_every_128(monkeypatch):
    lines = [_line(i, "1") for i in range(600)]
    status, parsed = await _post_paced(monkeypatch, lines)
    assert status == 202
    assert max(len(step) for step in parsed.values()) <= 2 * YIELD_ITEMS


@pytest.mark.parametrize(("items", "steps"), [
    ([(10, 0)] * 3, [3]),  # small: no checkpoint due
    ([(100, 0)] * 3, [2, 1]),  # the budget reached exactly, then passed
    ([(500, 0), (1, 0)], [1, 1]),  # one item over the budget alone, then a checkpoint
    ([(0, 7), (0, 4), (0, 1)], [1, 2]),
    ([(1, 0)] * 7, [3, 3, 1]),  # items
])
def test_a_pacer_checkpoints_before_the_item_that_would_pass_a_budget(items, steps):
    pace = Pacer(max_bytes=200, max_containers=10, max_items=3)
    seen: list[list[tuple[int, int]]] = [[]]
    for nbytes, conts in items:
        if pace.due(nbytes, conts):
            seen.append([])
        seen[-1].append((nbytes, conts))
    assert [len(s) for s in seen] == steps
    for step in seen:  # each step: within the budgets, or one item alone
        assert len(step) == 1 or (sum(b for b, _ in step) <= 200 and sum(c for _, c in step) <= 10)
