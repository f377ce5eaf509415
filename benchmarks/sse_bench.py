"""OpenCode / Kilo Code SSE bridges: throughput and added latency (issue 3,
section 7).

1. **Events per second**, local SSE source -> mapping -> the JSONL log. The
   source is a separate process (``python -m benchmarks.sse_bench --source``)
   serving ``GET /global/event`` as fast as the socket takes it: the real
   servers' captured ``/global/event`` frames (``tests/fixtures/*_real``,
   both vendors, both frame forms, heartbeats and deltas included) replayed
   over many sessions with fresh session and event ids. The path: the
   bridge's own receiver (httpx + httpx-sse, ``parse_frame``, vendor-id
   dedupe, the tracker and pure mapping, envelope stamping with the capture
   gate) -> the relay channel -> the fleet's JSONL session log
   (``supervisor.sessionlog.jsonlog`` with spare files, as the fleet runs it; real files), in primary mode. The floor, measured
   in the same run on the same stream (floor and path alternate, three
   rounds each, each figure the best of its rounds): httpx-sse parsing + ``json.loads`` of
   every frame + ``json.dumps`` of it, nothing else. Reported: frames/s and
   events/s of the path, frames/s of the floor, and ``path time / floor
   time``.
2. **Added latency**, vendor frame -> the relay's SSE output: the real daemon
   (``aep-bridges run``, its own process, embedded relay, primary mode) reads
   a source in this process that emits one ``session.created`` per new
   session at a steady rate; this process also reads the daemon's ``/stream``
   and times each ``session.started`` against the moment its frame was
   written. p50 / p99 / max in milliseconds, once the daemon has settled
   (its start-up work done: a fresh state directory's spare log files
   made). Beside it, the floor: the same source read by the same reader
   with no daemon between (what the harness itself adds).

Figures compare runs on one machine (2 shared cores here); not absolutes.
``python -m benchmarks sse`` (``scripts/dev bench sse``)."""
from __future__ import annotations

import gc
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import httpx
import trio
import trio.testing
from httpx_sse import aconnect_sse
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import fleet_log  # noqa: E402
from bridges.core.asgi import lifespan  # noqa: E402
from bridges.core.bridge import BridgeContext, BridgeHealth  # noqa: E402
from bridges.core.capture import CapturePolicy  # noqa: E402
from bridges.core.envelope import Stamper  # noqa: E402
from bridges.opencode_sse import PROFILE  # noqa: E402
from bridges.sse_common.bridge import SseBridge  # noqa: E402
from bridges.sse_common.config import SseConfig  # noqa: E402
from bridges.sse_common.receiver import ReceiverSettings  # noqa: E402
from supervisor.pump import take_batch  # noqa: E402
from supervisor.sessionlog.jsonlog import encode_line  # noqa: E402

REAL = ROOT / "tests" / "fixtures"
END = "ses_benchmark_end"


def corpus(copies: int) -> list[str]:
    """The captured global frames, ``copies`` times, each copy with fresh
    session and event ids (nothing dedupes across copies); a final
    ``session.created``/``session.deleted`` pair marks the end."""
    frames = []
    for vendor in ("opencode", "kilocode"):
        for f in json.loads((REAL / f"{vendor}_real" / "frames.json").read_text()):
            if f["stream"].startswith("/global") and "data" in f:
                frames.append(f["data"])
    out = []
    for i in range(copies):
        for data in frames:
            out.append(data.replace("ses_", f"ses_{i:05d}x").replace("evt_", f"evt_{i:05d}x"))
    for t in ("session.created", "session.deleted"):
        out.append(json.dumps({"directory": "/b", "payload": {
            "id": f"evt_{t}_end", "type": t,
            "properties": {"sessionID": END, "info": {"id": END, "version": "0"}}}}))
    return out


# ------------------------------------------------------------------ the source process

async def _serve_source(frames_path: str) -> None:
    body = b"".join(f"data: {line}\n\n".encode() for line in
                    (await trio.Path(frames_path).read_text()).splitlines())

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["path"] == "/global/event":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for i in range(0, len(body), 1 << 16):
                await send({"type": "http.response.body", "body": body[i:i + (1 << 16)],
                            "more_body": True})
            await trio.sleep_forever()
        obj: list[object] | dict[str, object] = [] if scope["path"] in ("/permission", "/question", "/session") else {}
        data = json.dumps(obj).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    async with trio.open_nursery() as n:
        binds = await n.start(partial(hypercorn_serve, app, config))
        print(binds[0], flush=True)


def start_source(frames: list[str], tmp: Path) -> tuple[subprocess.Popen, str]:
    path = tmp / "frames.txt"
    path.write_text("\n".join(frames))
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.sse_bench", "--source", str(path)],
                            cwd=str(ROOT), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


# ------------------------------------------------------------------ 1. throughput

async def floor_run(url: str, n_frames: int) -> tuple[float, float]:
    """httpx-sse parse + json.loads + json.dumps of every frame; returns
    (seconds, CPU seconds), both from the first frame on (as the path's)."""
    async with httpx.AsyncClient(timeout=None) as c:
        async with aconnect_sse(c, "GET", url + "/global/event") as es:
            t0 = c0 = 0.0
            n = 0
            async for sse in es.aiter_sse():
                if n == 0:
                    t0, c0 = time.perf_counter(), time.process_time()
                json.dumps(json.loads(sse.data))
                n += 1
                if n == n_frames:
                    return time.perf_counter() - t0, time.process_time() - c0
    raise RuntimeError("source ended early")


async def path_run(url: str, logdir: Path) -> tuple[float, int, dict]:
    """The bridge's path to the JSONL log; returns (seconds, events, counters)."""
    bridge = SseBridge(PROFILE, SseConfig.defaults(PROFILE, url=url, primary=True),
                       policy=CapturePolicy(),
                       receiver_settings=ReceiverSettings(degraded_interval=3600))
    send, recv = trio.open_memory_channel(4096)
    _, cmd_r = trio.open_memory_channel(1)
    ctx = BridgeContext(bridge.name, Stamper("opencode", epoch=1, host="bench"), send, cmd_r,
                        BridgeHealth(), logging.getLogger("bench"))
    box: dict = {"events": 0}
    done = trio.Event()

    async def pump():
        # the fleet's pump (supervisor/pump.py `_pump`): what is queued as one
        # batch, encoded once, one `write` per session file, then a yield
        async for item in recv:
            if box["events"] == 0:
                box["t0"] = time.perf_counter()
                box["c0"] = time.process_time()
            batch = take_batch(recv, item)
            log.write_batch([(it.event, encode_line(it.event)) for it in batch])
            box["events"] += len(batch)
            ev = batch[-1].event
            if ev.get("session") == END and ev["type"] == "session.ended":
                box["t1"] = time.perf_counter()
                box["c1"] = time.process_time()
                done.set()
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as n:
        log = await fleet_log(n, logdir)
        n.start_soon(pump)
        await n.start(bridge.run, ctx)
        await done.wait()
        n.cancel_scope.cancel()
    box["counters"] = dict(ctx.health.counters)
    return box["t1"] - box["t0"], box["events"], box


async def throughput(copies: int = 40, rounds: int = 3) -> dict:
    """Floor and path ``rounds`` times each, alternating (the machine is
    shared: each figure is the best of its rounds, wall-clock and CPU
    alike, and the floor is the same floor every round)."""
    frames = corpus(copies)
    floors: list[tuple[float, float]] = []
    paths: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_source(frames, Path(tmp))
        try:
            for r in range(rounds):
                floors.append(await floor_run(url, len(frames)))
                path, events, box = await path_run(url, Path(tmp) / f"logs{r}")
                paths.append((path, box["c1"] - box["c0"]))
            counters = box["counters"]
        finally:
            proc.terminate()
            proc.wait()
    floor, floor_cpu = min(f[0] for f in floors), min(f[1] for f in floors)
    path, path_cpu = min(p[0] for p in paths), min(p[1] for p in paths)
    return {"frames": len(frames), "events": events, "rounds": rounds,
            "path_frames_per_s": len(frames) / path, "path_events_per_s": events / path,
            "floor_frames_per_s": len(frames) / floor, "ratio": path / floor,
            "cpu_ratio": path_cpu / floor_cpu,
            "cpu_10k": path_cpu * 10_000 / events,
            "floor_cpu_10k": floor_cpu * 10_000 / events,
            "skipped": {k: v for k, v in counters.items()
                        if k in ("duplicates", "deltas_skipped", "sessionless_skipped",
                                 "repeats_reduced", "heartbeats")}}


# ------------------------------------------------------------------ 2. latency

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _frames_app(n: int, rate: float, sent: dict[str, float], go: trio.Event):
    """The latency runs' vendor source (ASGI): ``/global/event`` streams
    ``n`` ``session.created`` frames, each a new session, ``rate`` a second
    once ``go`` is set, noting in ``sent`` when each was written; the REST
    reads a bridge makes at start get empty answers."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["path"] == "/global/event":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await go.wait()
            for i in range(n):
                sid = f"ses_lat{i:06d}"
                frame = {"directory": "/b", "payload": {"id": f"evt_{i}", "type": "session.created",
                                                        "properties": {"sessionID": sid, "info": {
                                                            "id": sid, "version": "0"}}}}
                sent[sid] = time.perf_counter()
                await send({"type": "http.response.body", "more_body": True,
                            "body": f"data: {json.dumps(frame)}\n\n".encode()})
                await trio.sleep(1 / rate)
            await trio.sleep_forever()
        obj: list[object] | dict[str, object] = [] if scope["path"] in ("/permission", "/question", "/session") else {}
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(obj).encode()})
    return app


def _quantiles(sent: dict[str, float], got: dict[str, float]) -> dict:
    lat = sorted((got[s] - sent[s]) * 1000 for s in got if s in sent)
    q = statistics.quantiles(lat, n=100)
    return {"events": len(lat), "p50_ms": q[49], "p99_ms": q[98], "max_ms": lat[-1],
            "over_2ms": sum(x > 2.0 for x in lat)}


async def latency_floor(n: int = 1500, rate: float = 150.0) -> dict:
    """The latency runs' floor: the same source, read by the same reader
    (httpx-sse + ``json.loads``, in this process and loop) straight from
    the source, no daemon between: what the harness itself adds to every
    figure of :func:`latency` (a hypercorn send, a loopback hop, an SSE
    read). p50 / p99 / max in milliseconds."""
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    go = trio.Event()
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn_serve, _frames_app(n, rate, sent, go), config))
        async with httpx.AsyncClient(timeout=None) as c:
            with trio.fail_after(n / rate + 60):
                async with aconnect_sse(c, "GET", binds[0] + "/global/event") as es:
                    go.set()
                    async for sse in es.aiter_sse():
                        ev = json.loads(sse.data)
                        got[ev["payload"]["properties"]["sessionID"]] = time.perf_counter()
                        if len(got) == n:
                            break
        nursery.cancel_scope.cancel()
    return _quantiles(sent, got)


async def _settle(c: httpx.AsyncClient, port: int, pid: int, timeout: float = 60.0) -> None:
    """Wait until the daemon's start-up work is done: its spare session log
    files made (the count unchanged for 0.5 s) and no CPU tick of it in that
    time. A fresh state directory's first start makes the whole pool in a
    worker thread; a daemon that runs all day has it made, and so does the
    measured run (the OTLP runs settle the same way)."""
    t_end = time.monotonic() + timeout
    last = (await _spares_made(c, port), _cpu_s(pid))
    while time.monotonic() < t_end:
        await trio.sleep(0.5)
        now = (await _spares_made(c, port), _cpu_s(pid))
        if now == last:
            return
        last = now
    print(f"  (the daemon did not settle in {timeout:.0f} s: still making spare files or busy;"
          " the latency run below counts that work)")


async def latency(n: int = 1500, rate: float = 150.0) -> dict:
    """Vendor frame -> relay ``/stream`` through the real daemon, settled
    first (:func:`_settle`): p50 / p99 / max in ms, the daemon's CPU per 10k
    events, and what the machine and the daemon's threads did meanwhile."""
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    go = trio.Event()
    app = _frames_app(n, rate, sent, go)

    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    with tempfile.TemporaryDirectory() as tmp:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(hypercorn_serve, app, config))
            port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
            env.update({"AEP_BRIDGE_OPENCODE_SSE": "1", "AEP_BRIDGE_OTLP_IN": "0",
                        "AEP_OPENCODE_URL": binds[0], "AEP_OPENCODE_SSE_PRIMARY": "1",
                        "AEP_LISTEN": f"127.0.0.1:{port}", "AEP_STATE_DIR": tmp,
                        "AEP_LOG_LEVEL": "warning"})
            # Popen returns at once; the daemon is the benchmark's child, ended in `finally`.
            daemon = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "supervisor.cli", "run"], env=env, cwd=str(ROOT),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                async with httpx.AsyncClient(timeout=None) as c:
                    with trio.fail_after(30):
                        while True:
                            try:
                                await c.get(f"http://127.0.0.1:{port}/healthz")
                                break
                            except httpx.HTTPError:
                                await trio.sleep(0.1)

                    async def read():
                        async with aconnect_sse(c, "GET", f"http://127.0.0.1:{port}/stream") as es:
                            go.set()
                            async for sse in es.aiter_sse():
                                if not sse.data:
                                    continue
                                ev = json.loads(sse.data)
                                if ev.get("type") == "session.started":
                                    got[ev["session"]] = time.perf_counter()
                                    if len(got) == n:
                                        return
                    await _settle(c, port, daemon.pid)
                    with trio.fail_after(n / rate + 60):
                        load = os.getloadavg()[0]
                        made0 = await _spares_made(c, port)
                        threads0, pressure0, t0 = _thread_cpu_s(daemon.pid), _cpu_pressure_s(), \
                            time.perf_counter()
                        cpu0 = _cpu_s(daemon.pid)
                        await read()
                        cpu = _cpu_s(daemon.pid) - cpu0
                        threads1, pressure1, t1 = _thread_cpu_s(daemon.pid), _cpu_pressure_s(), \
                            time.perf_counter()
                        made = await _spares_made(c, port) - made0
            finally:
                daemon.terminate()
                daemon.wait(timeout=10)
                nursery.cancel_scope.cancel()
    loop_s = threads1.get(daemon.pid, 0.0) - threads0.get(daemon.pid, 0.0)
    out = _quantiles(sent, got)
    out.update({"rate_per_s": rate, "cpu_10k": cpu * 10_000 / out["events"],
                # what the machine and the daemon's own threads did meanwhile
                "load": load, "pressure_pct": None if pressure0 is None or pressure1 is None
                else (pressure1 - pressure0) / (t1 - t0) * 100,
                "loop_cpu_s": loop_s, "worker_cpu_s": cpu - loop_s, "spares_made": made})
    return out


async def _spares_made(c: httpx.AsyncClient, port: int) -> int:
    """The daemon's spare session log files made so far (``/metrics``)."""
    text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
    for line in text.splitlines():
        if line.startswith("aep_bridges_session_log_spare_files_total") and 'outcome="made"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _thread_cpu_s(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of process ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a worker thread that just ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _cpu_pressure_s() -> float | None:
    """Seconds so far in which some runnable task of this machine waited
    for a CPU (``/proc/pressure/cpu`` ``some total``; ``None`` without PSI)."""
    try:
        for line in Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return None


async def state_cost(open_runs: int, frames: int, *, mode: str) -> dict:
    """Persistence cost of one state-changing frame (an ask raised, then
    answered, in turn across the sessions) with ``open_runs`` runs open,
    timed from before the save to after the checkpoint that follows it (the
    receiver's next read): what the event loop is held for. ``mode``:
    ``whole``, what the bridge did before issue 11 (the whole snapshot
    serialized and the file replaced on every change); ``sync``, the
    incremental save (:meth:`StateFile.save_changes`: the changed entry
    appended to the journal) with each due compaction run inside the save;
    ``task``, the bridge's setup: the same saves with
    :meth:`StateFile.compactor` running, the compaction in steps at the
    checkpoints. The tracker's own work is the same in every mode, and not
    timed."""
    from bridges.core.paths import write_atomic
    from bridges.core.posture import Posture
    from bridges.core.statefile import StateFile
    from bridges.sse_common.frames import BusEvent
    from bridges.sse_common.tracker import Tracker

    tr = Tracker(Posture(agent="opencode", mode="primary"), max_sessions=max(5000, open_runs))
    stamper = Stamper("opencode", epoch=1, host="bench")

    def feed(ev: BusEvent) -> None:
        for o in tr.feed(ev):
            o.envelope = stamper.stamp(o.session, o.emission, run=o.run, cause=o.resolved_cause())
            if o.envelope["type"] == "run.started":
                tr.bind_run(o.session, o.envelope)
            tr.touch(o.session)

    for i in range(open_runs):
        sid = f"ses_{i:06d}"
        feed(BusEvent("message.updated", {"sessionID": sid, "info": {"id": f"msg_{i:06d}", "role": "user",
                                                                      "sessionID": sid}}))
    # the collector's passes, timed apart: a gen-2 pass walks every open
    # run's state (~50-60 ms at 5,000 here) and lands wherever it falls
    gc_time = [0.0, 0.0]  # total, longest
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            took = time.perf_counter() - started[0]
            gc_time[0] += took
            gc_time[1] = max(gc_time[1], took)
    gc.callbacks.append(on_gc)
    times: list[float] = []
    compacting: list[float] = []  # saves that compacted inside (mode sync)
    steps: list[float] = []  # checkpoints at which the compactor ran a step (mode task)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.json"
        sf = StateFile(path)
        sf.save(tr.snapshot())
        tr.changes()
        async with trio.open_nursery() as nursery:
            if mode == "task":
                nursery.start_soon(sf.compactor)
                await trio.testing.wait_all_tasks_blocked()
            for k in range(frames):
                sid = f"ses_{(k // 2) % open_runs:06d}"
                if k % 2 == 0:
                    feed(BusEvent("permission.asked", {"sessionID": sid, "id": f"per_{k}",
                                                       "permission": "bash", "patterns": ["ls"],
                                                       "tool": {"callID": f"call_{k}"}}))
                else:
                    feed(BusEvent("permission.replied", {"sessionID": sid, "requestID": f"per_{k - 1}",
                                                         "reply": "once"}))
                t0, g0 = time.perf_counter(), gc_time[0]
                if mode == "whole":
                    write_atomic(path, json.dumps(tr.snapshot(), sort_keys=True, separators=(",", ":")))
                    tr.changes()
                else:
                    before = sf.counters["compactions"]
                    sf.save_changes(tr.changes())
                    if sf.counters["compactions"] != before:
                        compacting.append(time.perf_counter() - t0 - (gc_time[0] - g0))
                t1, g1 = time.perf_counter(), gc_time[0]
                await trio.lowlevel.checkpoint()  # the compactor's steps run here
                t2 = time.perf_counter()
                times.append(t2 - t0)
                if sf._since is not None or t2 - t1 > 2e-4:  # noqa: SLF001 (a step ran)
                    steps.append(t2 - t1 - (gc_time[0] - g1))
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        size = path.stat().st_size
    gc.callbacks.remove(on_gc)
    times.sort()
    return {"open_runs": open_runs, "frames": frames, "mean_us": statistics.fmean(times) * 1e6,
            "p50_us": times[len(times) // 2] * 1e6, "max_us": times[-1] * 1e6,
            "compaction_max_us": max(compacting + steps, default=0.0) * 1e6,
            "gc_max_us": gc_time[1] * 1e6,
            "compactions": sf.counters["compactions"] - 1, "doc_kib": size / 1024}


def print_state_costs(quick: bool) -> None:
    print("SSE tracker state persistence per state-changing frame (ask raised / answered), "
          "runs open across sessions; the event loop held from the save to the next checkpoint:")
    for n in (10, 5000):
        old = trio.run(partial(state_cost, n, 40 if n > 100 else 400, mode="whole"))
        print(f"  {n:>5} open runs: whole-file rewrite (before issue 11) mean {old['mean_us']:9,.0f} us")
        for mode, what in (("sync", "journal, compaction inside the save"),
                           ("task", "journal, compaction in steps (the bridge's compactor task)")):
            # >= one compaction at 5,000
            new = trio.run(partial(state_cost, n, 5000 if quick else 12000, mode=mode))
            print(f"        {what}: mean {new['mean_us']:6,.0f} us, p50 {new['p50_us']:5,.0f} us, "
                  f"max {new['max_us']:8,.0f} us (longest collector pass {new['gc_max_us']:,.0f} us), "
                  f"longest hold by a compaction, collector passes excluded "
                  f"{new['compaction_max_us']:7,.0f} us ({new['compactions']} compactions in "
                  f"{new['frames']:,} frames, document {new['doc_kib']:,.0f} KiB); "
                  f"before/after mean {old['mean_us'] / new['mean_us']:.0f}x")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--source":
        trio.run(_serve_source, argv[1])
        return
    quick = "--quick" in argv
    if "--state" in argv:  # the tracker-state row alone
        print_state_costs(quick)
        return
    t = trio.run(throughput, 10 if quick else 40)
    print(f"throughput ({t['frames']} real frames -> {t['events']} events, primary mode):")
    print(f"  path  {t['path_frames_per_s']:>9.0f} frames/s  {t['path_events_per_s']:>8.0f} "
          f"events/s  (SSE -> mapping -> stamped -> JSONL)")
    print(f"  floor {t['floor_frames_per_s']:>9.0f} frames/s  (SSE parse + json.loads + "
          f"json.dumps)")
    print(f"  path / floor time = {t['ratio']:.2f}x (best of {t['rounds']} rounds each)   "
          f"skipped: {t['skipped']}")
    print(f"  CPU s per 10k events: path {t['cpu_10k']:.3f}, floor {t['floor_cpu_10k']:.3f} "
          f"(path / floor CPU = {t['cpu_ratio']:.2f}x; this process, from the first frame on: "
          "the source runs in its own)")
    n_lat = 450 if quick else 1500
    lat = trio.run(latency, n_lat)
    floor = trio.run(latency_floor, n_lat)
    print(f"latency vendor frame -> relay /stream ({lat['events']} events at "
          f"{lat['rate_per_s']:.0f}/s through the daemon): p50 {lat['p50_ms']:.1f} ms, "
          f"p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms; daemon CPU "
          f"{lat['cpu_10k']:.3f} s per 10k events (idle costs included: 10 s at 150/s)")
    pressure = "n/a" if lat["pressure_pct"] is None else f"{lat['pressure_pct']:.0f}%"
    per_spare = (f", {lat['worker_cpu_s'] * 1e6 / lat['spares_made']:,.0f} us each"
                 if lat["spares_made"] else "")
    print(f"  floor, the same source read by the same reader with no daemon between: p50 "
          f"{floor['p50_ms']:.1f} ms, p99 {floor['p99_ms']:.1f} ms, max {floor['max_ms']:.1f} ms"
          f" (the daemon added p50 {lat['p50_ms'] - floor['p50_ms']:+.1f} ms, p99 "
          f"{lat['p99_ms'] - floor['p99_ms']:+.1f} ms)")
    print(f"  {lat['over_2ms']} events over 2 ms; meanwhile: load {lat['load']:.2f}, CPU pressure "
          f"{pressure} (of the run's time, some runnable task of the machine waited for a CPU); "
          f"daemon CPU: event loop {lat['loop_cpu_s']:.2f} s, worker threads "
          f"{lat['worker_cpu_s']:.2f} s ({lat['spares_made']} spare log files made{per_spare})")
    print_state_costs(quick)


if __name__ == "__main__":
    main(sys.argv[1:])
