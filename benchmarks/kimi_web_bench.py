"""Kimi web bridge: throughput and memory per subscribed session (issue 8,
"Benchmark").

1. Frames per second through the bridge's own path, in process: the raw WS
   text frame -> ``Receiver._on_raw`` (``json.loads``, protocol/volatile
   classification, ``(session, epoch, seq)`` dedupe, the pure mapping and
   the tracker's run/tool/ask state, envelope stamping with the capture
   gate) -> the relay channel -> the fleet's JSONL session log
   (``supervisor.sessionlog.jsonlog.SessionLog`` with spare files, as the fleet runs it, + ``encode_line``, real files), in
   primary mode. The frames are the real ``kimi web`` 2.1.0 captures
   (``tests/fixtures/kimi_web_real``) replayed over many sessions with fresh
   session ids. The floor, measured in the same run: ``json.loads`` of the
   same frames and ``json.dumps`` of the same number of events (no mapping,
   no I/O). Reported as ``path / floor``.
2. Memory per subscribed session at 10, 100 and 1000 sessions: a stub
   kap-server (``python -m tests.support.kimi_stub``, its own process)
   lists N sessions and sends each one finished turn; the bridge (this
   process) lists them, subscribes them all on its one socket and maps the
   turns. Reported per session: the growth of this process's resident set
   (VmRSS) and of Python-allocated memory (tracemalloc) once everything is
   subscribed, mapped and idle, beside the bridge's fixed cost with none.

Figures compare runs on one machine (2 shared cores here); not absolutes."""
from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import fleet_log  # noqa: E402
from benchmarks.openhands_bench import rss_mib  # noqa: E402  (one VmRSS reader)
from bridges.core.bridge import BridgeContext, BridgeHealth  # noqa: E402
from bridges.core.capture import CapturePolicy  # noqa: E402
from bridges.core.envelope import Stamper  # noqa: E402
from bridges.core.posture import Posture  # noqa: E402
from bridges.kimi_web import from_env  # noqa: E402
from bridges.kimi_web.config import KimiWebConfig  # noqa: E402
from bridges.kimi_web.mapping import AGENT  # noqa: E402
from bridges.kimi_web.receiver import Receiver  # noqa: E402
from bridges.kimi_web.tracker import Tracker  # noqa: E402
from supervisor.fleet import run_bridge  # noqa: E402
from supervisor.sessionlog.jsonlog import encode_line  # noqa: E402

REAL = ROOT / "tests" / "fixtures" / "kimi_web_real"
CAPTURES = ("approve", "approve_session", "reject", "abort_pending", "question", "question_dismiss")


def corpus(n_sessions: int) -> tuple[list[str], list[str]]:
    """``(session ids, raw frames)``: the captured event frames of each
    scenario (pings, acks and hellos dropped), one copy per session with a
    fresh session id."""
    seqs = []
    for c in CAPTURES:
        frames = json.loads((REAL / f"{c}.json").read_text())["frames"]
        seqs.append([f for f in frames if isinstance(f.get("seq"), int)])
    sids, raws = [], []
    for i in range(n_sessions):
        sid = f"session_bench_{i:06d}"
        sids.append(sid)
        for f in seqs[i % len(seqs)]:
            g = dict(f)
            g["session_id"] = sid
            raws.append(json.dumps(g))
    return sids, raws


def context(send: trio.MemorySendChannel) -> BridgeContext:
    _, crecv = trio.open_memory_channel(1)
    return BridgeContext("kimi_web", Stamper("kimi-code", epoch=1, host="bench", policy=CapturePolicy()),
                         send, crecv, BridgeHealth(), logging.getLogger("bench"))


async def path_rate(sids: list[str], raws: list[str], logdir: Path) -> tuple[float, int]:
    send, recv = trio.open_memory_channel(4096)
    ctx = context(send)
    cfg = KimiWebConfig(home=logdir / "home", url="http://127.0.0.1:1", token="t", primary=True)
    rx = Receiver(cfg, Tracker(Posture(agent=AGENT, mode="primary")), ctx)
    rx.subscribed = set(sids)
    written = 0

    async def sink() -> None:
        nonlocal written
        async for item in recv:
            log.write(item.event, encode_line(item.event))
            written += 1

    async with trio.open_nursery() as spare_keeper:
        log = await fleet_log(spare_keeper, logdir)
        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            n.start_soon(sink)
            for raw in raws:
                await rx._on_raw(None, raw, n)
            await send.aclose()
        dt = time.perf_counter() - t0
        spare_keeper.cancel_scope.cancel()
    log.close()
    return len(raws) / dt, written


def floor_rate(raws: list[str], n_events: int) -> float:
    """``json.loads`` of every frame + ``json.dumps`` of as many stamped-shape
    events as the path produced."""
    sample = {"aep": "0.1", "id": "01M8P9BB1GXGD4GD9HDDSTFTN3", "type": "tool.completed",
              "time": "2026-12-01T09:27:09.331Z", "source": "aep://bench/agent/kimi-code/session/x",
              "agent": "kimi-code", "session": "x", "run": "msg_01M8REVVK3YJX83PK5942J1311", "seq": 7,
              "epoch": 1, "capture": "metadata", "subject": "Bash",
              "data": {"tool": {"name": "Bash", "call_id": "call_mock_2"},
                       "result_digest": "1302ac90f3d7b2e4aafbcd38a2b1517c"}}
    t0 = time.perf_counter()
    for raw in raws:
        json.loads(raw)
    for _ in range(n_events):
        json.dumps(sample)
    return len(raws) / (time.perf_counter() - t0)


def start_stub(n: int) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.kimi_stub", "--sessions", str(n)],
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().split()
    if len(line) != 2 or not line[0].startswith("http"):
        proc.kill()
        raise RuntimeError("stub did not start")
    return proc, line[0], line[1]


async def memory_per_session(n: int) -> dict[str, float]:
    proc, url, token = start_stub(n)
    try:
        with tempfile.TemporaryDirectory() as state:
            bridge = from_env({"AEP_KIMI_WEB_URL": url, "AEP_KIMI_WEB_TOKEN": token,
                               "AEP_KIMI_WEB_PRIMARY": "1", "AEP_STATE_DIR": state,
                               "KIMI_CODE_HOME": state}, policy=CapturePolicy())
            send, recv = trio.open_memory_channel(4096)
            ctx = context(send)
            events = 0

            async def drain() -> None:
                nonlocal events
                async for _ in recv:
                    events += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain)
                gc.collect()
                tracemalloc.start()
                base_py = tracemalloc.get_traced_memory()[0]
                base_rss = rss_mib()
                t0 = time.perf_counter()
                run = await nursery.start(run_bridge, bridge, ctx)
                with trio.fail_after(300):
                    while not (ctx.health.source is True and events >= 2 * n
                               and len(run.receiver.subscribed) >= n):
                        await trio.sleep(0.1)
                attach_s = time.perf_counter() - t0
                await trio.sleep(2)  # idle: the socket open, nothing flowing
                gc.collect()
                py = tracemalloc.get_traced_memory()[0] - base_py
                rss = rss_mib() - base_rss
                tracemalloc.stop()
                nursery.cancel_scope.cancel()
            return {"n": n, "rss_kib": rss * 1024, "py_kib": py / 1024, "attach_s": attach_s,
                    "events": events}
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    n_sessions = 300 if quick else 3000
    sids, raws = corpus(n_sessions)
    with tempfile.TemporaryDirectory() as tmp:
        rate, n_events = trio.run(path_rate, sids, raws, Path(tmp))
    floor = floor_rate(raws, n_events)
    print(f"Frames through mapping and stamping to the JSONL log ({len(raws):,} real captured frames over "
          f"{n_sessions} sessions -> {n_events:,} events, primary mode)")
    print(f"  path:  {rate:>10,.0f} frames/s  ({rate * n_events / len(raws):,.0f} events/s)")
    print(f"  floor: {floor:>10,.0f} frames/s  (json.loads + json.dumps, no mapping, no I/O)")
    print(f"  ratio to floor: {rate / floor:.3f}")
    print("Memory per subscribed session (stub kap-server in its own process; marginal over a running "
          "bridge with no session)")
    trio.run(memory_per_session, 5)  # warm-up: lazy imports, first sockets, allocator arenas
    base = trio.run(memory_per_session, 0)
    print(f"  bridge with 0 sessions: {base['rss_kib']:.0f} KiB RSS, {base['py_kib']:.0f} KiB "
          "Python-allocated (fixed cost)")
    for n in ((10, 100) if quick else (10, 100, 1000)):
        r = trio.run(memory_per_session, n)
        print(f"  {n:>5} sessions: {(r['rss_kib'] - base['rss_kib']) / n:7.1f} KiB RSS/session, "
              f"{(r['py_kib'] - base['py_kib']) / n:7.1f} KiB Python-allocated/session; subscribed+mapped "
              f"in {r['attach_s']:.1f} s ({r['events']:,} events)")


if __name__ == "__main__":
    main(sys.argv[1:])
