"""Past one machine (issue 14): the relay served from JetStream beside the
embedded relay, in one run.

1. **End to end**: ``n`` events POSTed as NDJSON batches (500 a batch) to
   a relay while one SSE consumer (httpx, live) reads ``/stream``; the time
   from the first POST to the consumer holding the last event. Three
   relays, same process, same load: the embedded relay (the floor: in
   memory, one process), the JetStream relay on a 1-node nats-server, and
   on a 3-node cluster with an R3 stream. Reported: events/s delivered and
   the ratio to the embedded relay.
2. **Attach + replay**: ``m`` events held (the embedded relay's buffers;
   the stream of a 1-node server), then one consumer attaches with
   ``from=all&live=0`` and reads to ``: replay-complete``: seconds and
   events/s, and the ratio to the embedded relay.

Everything runs on loopback in this one process (the nats-servers are
their own processes); 2 shared cores here: compare ratios within a run, not
absolutes (the load average is printed). ``python -m benchmarks jetstream``
(``scripts/dev bench jetstream``; ``--quick``: 3k events end to end, 10k
replayed; else 20k and 100k)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.js_relay_harness import running_js_relay  # noqa: E402
from tests.support.nats import NatsCluster  # noqa: E402
from tests.support.relay_harness import running_relay  # noqa: E402

TOKEN = "bench-token-0123456789abcdef0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
POST = {**AUTH, "content-type": "application/x-ndjson", "aep-version": "0.1"}
BATCH = 500
SESSIONS = 20


def events(n: int, tag: str) -> list[bytes]:
    """``n`` ~300-byte AEP events over :data:`SESSIONS` sessions, as NDJSON lines."""
    out = []
    for i in range(n):
        s = f"{tag}-{i % SESSIONS}"
        out.append(json.dumps({
            "aep": "0.1", "id": f"{tag}-{i}", "type": "tool.completed",
            "time": "2026-12-01T12:00:00.000Z", "source": f"aep://bench/agent/codex/session/{s}",
            "agent": "codex", "session": s, "seq": i // SESSIONS, "severity": "notice",
            "data": {"tool": "bash", "exit_code": 0, "duration_ms": i % 997}},
            separators=(",", ":")).encode())
    return out


async def post_all(client: httpx.AsyncClient, base: str, lines: list[bytes]) -> None:
    for i in range(0, len(lines), BATCH):
        r = await client.post(base + "/events", content=b"\n".join(lines[i:i + BATCH]),
                              headers=POST)
        assert r.status_code == 202, r.text


async def count_sse(client: httpx.AsyncClient, url: str, params: dict[str, str], want: int,
                    ready: trio.Event | None = None, until_comment: str | None = None) -> int:
    """Read ``url`` until ``want`` events (or the comment ``until_comment``)."""
    n = 0
    async with client.stream("GET", url, params=params, headers=AUTH) as r:
        async for line in r.aiter_lines():
            if line.startswith(": connected") and ready is not None:
                ready.set()
            elif line.startswith("data: "):
                n += 1
                if n >= want and until_comment is None:
                    return n
            elif until_comment is not None and line.startswith(": " + until_comment):
                return n
    return n


async def end_to_end(base: str, n: int, tag: str, settle: Any = None) -> float:
    """Events/s POSTed to ``base`` and delivered to one live SSE consumer."""
    lines = events(n, tag)
    limits = httpx.Limits(max_connections=8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        ready = trio.Event()
        done = trio.Event()
        got = [0]

        async def consume() -> None:
            got[0] = await count_sse(client, base + "/stream",
                                     {"filter": json.dumps({"session": [f"{tag}-{k}" for k in
                                                                        range(SESSIONS)]})},
                                     n, ready)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await ready.wait()
            if settle is not None:
                await settle()
            t0 = time.perf_counter()
            await post_all(client, base, lines)
            await done.wait()
            dt = time.perf_counter() - t0
        assert got[0] == n, got
        return n / dt


async def attach_replay(base: str, m: int, tag: str) -> tuple[float, float]:
    """Load ``m`` events, then ``(seconds, events/s)`` of one replay-all consumer."""
    async with httpx.AsyncClient(timeout=300) as client:
        await post_all(client, base, events(m, tag))
        t0 = time.perf_counter()
        flt = json.dumps({"session": [f"{tag}-{k}" for k in range(SESSIONS)]})
        got = await count_sse(client, base + "/stream",
                              {"from": "all", "live": "0", "filter": flt}, m,
                              until_comment="replay-complete")
        dt = time.perf_counter() - t0
    assert got == m, (got, m)
    return dt, m / dt


@asynccontextmanager
async def embedded() -> AsyncIterator[str]:
    async with running_relay(token=TOKEN, buffer=10_000, max_sessions=2_000,
                             total_bytes=1 << 30) as (_, base):
        yield base


@asynccontextmanager
async def jetstream(cluster: NatsCluster, replicas: int) -> AsyncIterator[tuple[Any, str]]:
    async with running_js_relay(cluster.url, token=TOKEN,
                                env={"AEP_NATS_REPLICAS": str(replicas)}) as (relay, base):
        yield relay, base


async def wait_consumer(relay: Any) -> None:
    with trio.fail_after(30):
        while not relay.consumers:
            await trio.sleep(0.01)


async def run(quick: bool, tmp: Path) -> None:
    n = 3_000 if quick else 20_000
    m = 10_000 if quick else 100_000
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print(f"End to end: {n} events POSTed (NDJSON, {BATCH} a batch), one live SSE consumer")
    async with embedded() as base:
        floor = await end_to_end(base, n, "e2e")
    print(f"  embedded relay (floor)         {floor:>9,.0f} events/s")
    (tmp / "one").mkdir()
    (tmp / "three").mkdir()
    with NatsCluster(1, tmp / "one") as one:
        async with jetstream(one, 1) as (relay, base):
            rate1 = await end_to_end(base, n, "e2e", lambda: wait_consumer(relay))
        print(f"  JetStream relay, 1 node        {rate1:>9,.0f} events/s   ratio {rate1 / floor:.3f}")
        with NatsCluster(3, tmp / "three") as three:
            async with jetstream(three, 3) as (relay, base):
                rate3 = await end_to_end(base, n, "e2e", lambda: wait_consumer(relay))
            print(f"  JetStream relay, 3 nodes (R3)  {rate3:>9,.0f} events/s   "
                  f"ratio {rate3 / floor:.3f}")
        print(f"Attach + replay: {m} events held, one consumer from=all live=0")
        async with embedded() as base:
            edt, erate = await attach_replay(base, m, "rep")
        print(f"  embedded relay (floor)         {edt:>7.2f} s {erate:>9,.0f} events/s")
        async with jetstream(one, 1) as (relay, base):
            jdt, jrate = await attach_replay(base, m, "rep")
        print(f"  JetStream relay, 1 node        {jdt:>7.2f} s {jrate:>9,.0f} events/s   "
              f"ratio {jrate / erate:.3f}")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run, quick, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])
