"""The JetStream sink (issue 14): events/s published and acknowledged
through a 1-node server and a 3-node cluster (R3 stream), beside the
embedded relay alone in the same run.

The path, in this process: a bridge stamping ``N`` events as fast as the
relay channel takes them (``ctx.emit``, the real stamper and capture gate)
-> the fleet's pump (JSONL session log, real files; the embedded relay) ->
with ``AEP_NATS_URL``: the publisher's outbox -> JetStream publishes with
acks, one in flight per session. The clock runs from the first emit until
the last event is (floor) through the pump, or (JetStream) acknowledged by
the server with an empty outbox. The floor is the same fleet without
``AEP_NATS_URL`` (embedded relay only), measured first in the same run.

Reported per case: events/s, ``time / floor time``, CPU seconds per 10k
events of this process (the daemon's work) and of the nats-server
processes. Two session mixes: 64 sessions (publishes pipelined across
sessions) and 1 session (the order rule's cost: one server round trip per
event). ``--quick``: fewer events.

Figures compare runs on one machine (2 shared cores here); not absolutes.
``python -m benchmarks jetstream_publish`` (``scripts/dev bench jetstream_publish``;
the relay side is ``jetstream_bench.py``)."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridges.core.bridge import BridgeRun  # noqa: E402
from supervisor.config import Config  # noqa: E402
from supervisor.fleet import Fleet  # noqa: E402
from supervisor.jetstream.config import from_env  # noqa: E402
from supervisor.relay.core import Relay  # noqa: E402
from tests.support.nats import NatsCluster  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


class Emitter:
    """Stamps ``n`` events over ``sessions`` sessions once ``go`` is set."""

    name = "bench"
    agent = "bench"

    def __init__(self, n: int, sessions: int) -> None:
        self.n, self.sessions = n, sessions
        self.go = trio.Event()

    def capabilities(self) -> dict[str, Any]:
        return {"emits": ["x.bench.*"]}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        return []

    def listeners(self) -> dict[str, Any]:
        return {}

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(BridgeRun())
        await self.go.wait()
        sev = ("info", "notice")
        for i in range(self.n):
            await ctx.emit(f"ses-{i % self.sessions}", {"type": "x.bench.tick",
                                                       "data": {"i": i, "text": "x" * 200}},
                           severity=sev[i & 1])
        await trio.sleep_forever()


def _server_cpu(c: NatsCluster | None) -> float:
    if c is None:
        return 0.0
    total = 0
    for p in c.procs:
        if p is not None and p.poll() is None:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


async def _one(tmp: Path, n: int, sessions: int, cluster: NatsCluster | None) -> dict[str, float]:
    nats = None
    if cluster is not None:
        nats, problems = from_env({"AEP_NATS_URL": cluster.url,
                                   "AEP_NATS_REPLICAS": str(cluster.n),
                                   "AEP_NATS_OUTBOX": str(max(16, n))})
        assert nats is not None, problems
    cfg = Config(state_dir=tmp, nats=nats)
    bridge = Emitter(n, sessions)
    fleet = Fleet(cfg, [bridge], relay=Relay(), host="bench")
    async with trio.open_nursery() as nursery:
        await nursery.start(fleet.run)
        if fleet.jetstream is not None:  # connected and the stream ensured before the clock
            while fleet.jetstream.stream_state is None or not fleet.jetstream.connected:
                await trio.sleep(0.05)
        cpu0, srv0, t0 = time.process_time(), _server_cpu(cluster), time.perf_counter()
        bridge.go.set()
        while True:
            if fleet.jetstream is None:
                if fleet.counters["events"] >= n:
                    break
            else:
                st = fleet.jetstream.publisher.stats()
                if st["acked"] >= n and st["outbox"] == 0:
                    break
            await trio.sleep(0.002)
        wall = time.perf_counter() - t0
        cpu, srv = time.process_time() - cpu0, _server_cpu(cluster) - srv0
        nursery.cancel_scope.cancel()
    return {"wall": wall, "eps": n / wall, "cpu10k": cpu * 10_000 / n, "srv10k": srv * 10_000 / n}


def _run(case: str, n: int, sessions: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="aep-js-bench-") as d:
        tmp = Path(d)
        if case == "embedded":
            return trio.run(_one, tmp / "state", n, sessions, None)
        with NatsCluster(1 if case == "1-node" else 3, tmp / "nats") as c:
            return trio.run(_one, tmp / "state", n, sessions, c)


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    print(f"load average: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    for sessions, n in ((64, 3000 if quick else 20_000), (1, 1000 if quick else 4000)):
        print(f"\n{n} events over {sessions} session(s)")
        print(f"{'case':<22}{'events/s':>10}{'x floor':>9}{'CPU s/10k':>11}{'server CPU s/10k':>18}")
        floor = None
        for case in ("embedded", "1-node", "3-node R3"):
            r = _run(case, n, sessions)
            floor = floor or r["wall"]
            label = "embedded relay (floor)" if case == "embedded" else f"JetStream {case}"
            print(f"{label:<22}{r['eps']:>10.0f}{r['wall'] / floor:>9.2f}{r['cpu10k']:>11.2f}"
                  f"{r['srv10k']:>18.2f}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
