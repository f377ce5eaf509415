"""An eleventh outside attack on issue 25, finding 3: six 16 MiB lines of
``[{},{},...]`` (5.6 million members each) from one ACP tee held the
daemon's loop 1.6-2.2 s each, and ``malformed`` counted 33.5 million (one
per member): lines were parsed with no JSON bound, every member of a
batch array was walked, and a tee batch's lines were fed without a yield.

Now a line past :func:`bridges.core.aep.check_json`'s bounds is not
parsed, a batch array of over :data:`~bridges.acp.join.MAX_BATCH` members
is not walked (each one ``malformed`` line, counted ``refused``/
``lines_refused`` too and logged rate-limited), and the bridge yields
between the lines of a batch by bytes parsed (no clock: a ticker task's
ticks, noted by each line fed)."""
from __future__ import annotations

import json
import logging
from collections import defaultdict

import pytest
import trio

from bridges.acp import AcpBridge
from bridges.acp.bridge import TeeHub, TeeState
from bridges.acp.join import AGENT, MAX_BATCH, Story, parse_line
from bridges.core.aep import MAX_CONTAINERS, MAX_FLOATS
from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.envelope import Stamper
from bridges.core.pacing import YIELD_BYTES
from tests.support.ticker import Ticker


def _note(i: int) -> dict:
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": f"s{i}", "update": {"sessionUpdate": "plan", "entries": []}}}


@pytest.mark.parametrize("line", [
    b"[" + b",".join([b"{}"] * (MAX_CONTAINERS + 1)) + b"]",  # the attack's shape, past the cap
    b"[" + b",".join([b"{}"] * (MAX_BATCH + 1)) + b"]",  # under the cap, past the batch bound
    b'{"jsonrpc":"2.0","method":"x","params":{"v":[' + b",".join([b"0.5"] * (MAX_FLOATS + 1))
    + b"]}}",
])
def test_a_line_past_the_bounds_is_one_malformed_line_and_never_walked(line):
    story = Story("T")
    assert story.feed(AGENT, line) == []
    c = story.counters
    assert (c.lines, c.malformed, c.refused, c.frames) == (1, 1, 1, 0), c
    assert parse_line(line) is None


def test_a_batch_at_the_bound_is_walked():
    story = Story("T")
    batch = json.dumps([_note(i % 8) for i in range(MAX_BATCH)]).encode()
    outs = story.feed(AGENT, batch)
    assert story.counters.frames == MAX_BATCH and story.counters.refused == 0
    assert outs


def _hub() -> tuple[TeeHub, TeeState]:
    send, _ = trio.open_memory_channel(10_000)
    _, commands = trio.open_memory_channel(1)
    ctx = BridgeContext("acp", Stamper("acp", epoch=1, host="h"), send, commands, BridgeHealth(),
                        logging.getLogger("test.acp.bounds"))
    hub = TeeHub(AcpBridge(), ctx)
    return hub, TeeState("T1", Story("T1", hub.posture))


async def test_a_batch_of_big_lines_is_fed_with_yields_by_bytes(monkeypatch):
    """40 lines of 100 KB that carry no frame (nothing emitted, so nothing
    else yields): all 40 (4 MB) were fed in one step before."""
    hub, tee = _hub()
    lines: list[bytes | int] = [json.dumps({"x": "a" * 100_000}).encode() for _ in range(40)]
    ticker = Ticker()
    fed: dict[int, int] = defaultdict(int)
    feed = tee.story.feed
    monkeypatch.setattr(tee.story, "feed", lambda d, ln: fed.__setitem__(
        ticker.ticks, fed[ticker.ticks] + len(ln)) or feed(d, ln))
    await ticker.beside(lambda: hub._lines(tee, AGENT, lines))
    assert sum(fed.values()) == sum(len(ln) for ln in lines if isinstance(ln, bytes))
    # trio may run the ticker before or after the feeder in a round: two steps a tick
    assert max(fed.values()) <= 2 * YIELD_BYTES, max(fed.values())
    assert tee.story.counters.malformed == 40


async def test_a_refused_line_is_counted_and_logged_rate_limited(caplog):
    hub, tee = _hub()
    attack = b"[" + b",".join([b"{}"] * (MAX_CONTAINERS + 1)) + b"]"
    with caplog.at_level(logging.WARNING, logger="test.acp.bounds"):
        await hub._lines(tee, AGENT, [attack] * 3)
    assert hub.ctx.health.counters["lines_refused"] == 3
    assert tee.story.counters.malformed == 3
    logged = [r for r in caplog.records if "lines_refused" in r.getMessage()]
    assert len(logged) == 1, logged  # the first of a peer; the rest suppressed
    assert hub.ctx.health.counters["log_suppressed"] == 2
