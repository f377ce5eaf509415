"""OpenHands bridge: throughput and memory per attached conversation
(issue 4, section 6).

1. Frames (and events) per second through the bridge's own path, in
   process: socket text frame -> ``Receiver.handle_raw`` (``json.loads``,
   vendor-id dedupe, the pure mapping, run/attention synthesis, envelope
   stamping with the capture gate) -> the relay channel -> the fleet's JSONL
   session log (``supervisor.sessionlog.jsonlog.SessionLog`` with spare files, as the
   fleet runs it, + ``encode_line``, real
   files). The frames are the real agent server's captured sequences
   (``tests/fixtures/openhands_real``) replayed over many conversations with
   fresh ids. The floor, measured in the same run: ``json.loads`` of the same
   frames and the json module's JSONL line of the same number of events, no mapping, no
   I/O. Reported as ``path / floor``.
2. Memory per attached conversation at 10 and 100 conversations (and 1000
   in the full run, not ``--quick``): a
   stub agent server (``python -m tests.support.openhands stub``, its own
   process, speaking the same REST + first-message-auth socket protocol)
   serves N finished conversations; the bridge (in this process) discovers
   them, attaches one socket each and replays them. Reported per
   conversation: the growth of this process's resident set (VmRSS, in a run
   without tracemalloc) and of Python-allocated memory (tracemalloc, in a
   second run), after everything is attached and idle, beside the idle
   baseline. The stub's conversations are short (5 events), so the dedupe
   ring is nearly empty; a full ring (:data:`SEEN_IDS` ids) adds ~14 KiB.

Figures compare runs on one machine (2 shared cores here); not absolutes."""
from __future__ import annotations

import gc
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import fleet_log  # noqa: E402
from bridges.core.bridge import BridgeContext, BridgeHealth  # noqa: E402
from bridges.core.capture import CapturePolicy  # noqa: E402
from bridges.core.envelope import Stamper  # noqa: E402
from bridges.core.posture import Posture  # noqa: E402
from bridges.openhands import from_env  # noqa: E402
from bridges.openhands.receiver import Conversation, Receiver, Settings  # noqa: E402
from supervisor.pump import take_batch  # noqa: E402
from supervisor.sessionlog.jsonlog import encode_line  # noqa: E402

REAL = ROOT / "tests" / "fixtures" / "openhands_real"
CAPTURES = ("approve", "reject", "pause_resume", "interrupt", "idle_pause_and_409", "model_500", "chat")


def corpus(n_conversations: int) -> list[tuple[str, list[str]]]:
    """``n_conversations`` copies of the captured sequences, each with fresh
    vendor ids (so nothing dedupes across copies)."""
    seqs = [json.loads((REAL / f"{c}.json").read_text())["frames"] for c in CAPTURES]
    out = []
    for i in range(n_conversations):
        frames = []
        for f in seqs[i % len(seqs)]:
            g = dict(f)
            g["id"] = str(uuid.uuid4())
            frames.append(json.dumps(g))
        out.append((str(uuid.uuid4()), frames))
    return out


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# --------------------------------------------------------------------------- throughput

#: the spare files' counters over the last :func:`path_rate`'s timed part
#: (``supervisor.sessionlog.spares.SpareFiles.counters``, end minus start)
SPARES_SEEN: dict[str, int] = {}


async def path_rate(convs: list[tuple[str, list[str]]], logdir: Path,
                    state_dir: Path | None = None) -> tuple[float, int, int]:
    """``state_dir``: with the bridge's state directory (the daemon always
    has one) and its state writer running, as :meth:`Receiver.run` runs it."""
    send, recv = trio.open_memory_channel(4096)
    _, crecv = trio.open_memory_channel(1)
    health = BridgeHealth()
    ctx = BridgeContext("openhands", Stamper("openhands", epoch=1, host="bench", policy=CapturePolicy()),
                        send, crecv, health, logging.getLogger("bench"))
    rx = Receiver(Settings(url="http://127.0.0.1:1", state_dir=state_dir), Posture(), ctx, None)
    n_frames = sum(len(f) for _, f in convs)
    written = 0

    async def sink() -> None:
        # the fleet's pump (supervisor.pump.Pump._pump): whatever is queued,
        # up to PUMP_BATCH, encoded once and appended with one write per file
        nonlocal written
        async for item in recv:
            batch = take_batch(recv, item)
            log.write_batch([(it.event, encode_line(it.event)) for it in batch])
            written += len(batch)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as spare_keeper:
        log = await fleet_log(spare_keeper, logdir)
        before = dict(log.spares.counters)
        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            n.start_soon(sink)
            async with trio.open_nursery() as writer:
                if state_dir is not None:
                    await writer.start(rx.persist)
                for cid, frames in convs:
                    conv = Conversation(cid)
                    rx.conversations[cid] = conv
                    for raw in frames:
                        await rx.handle_raw(conv, raw)
                    await rx._apply_pending(conv)
                writer.cancel_scope.cancel()  # the writer writes what is still queued as it ends
            await send.aclose()
        dt = time.perf_counter() - t0
        SPARES_SEEN.clear()
        SPARES_SEEN.update({k: v - before[k] for k, v in log.spares.counters.items()})
        spare_keeper.cancel_scope.cancel()
    log.close()
    return n_frames / dt, n_frames, written


def floor_rate(convs: list[tuple[str, list[str]]], n_events: int) -> float:
    """json.loads of every frame + a JSONL line of as many (representative,
    stamped-shape) events as the path produced, no mapping, no I/O. The
    line is the json module's compact encoding (what ``encode_line`` was
    when issue 11 set the goals; it runs on orjson now): the floor stays
    the json module's, as every other floor here, and does not move with
    the path it measures."""
    frames = [raw for _, fs in convs for raw in fs]
    sample = {"aep": "0.1", "id": "01M8P9BB1GXGD4GD9HDDSTFTN3", "type": "tool.completed",
              "time": "2026-11-30T13:12:17.067Z", "source": "aep://bench/agent/openhands/session/x",
              "agent": "openhands", "session": "x", "run": "run:x:1", "seq": 7, "epoch": 1,
              "capture": "metadata", "subject": "terminal",
              "data": {"vendor_ts": "2026-11-30T13:12:17.067038", "vendor_event_id": "5f442091",
                       "tool": {"name": "terminal", "call_id": "call_term_1"},
                       "result_digest": "ad5c679d78b027a0fe8f7592a602326e"}}
    t0 = time.perf_counter()
    for raw in frames:
        json.loads(raw)
    for _ in range(n_events):
        json.dumps(sample, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    return len(frames) / (time.perf_counter() - t0)


def file_create_us(n: int) -> float:
    """Microseconds to create (``O_CREAT``) and close one empty file, ``n``
    files in a fresh directory (what the session log pays per new session)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for i in range(n):
            os.close(os.open(f"{tmp}/{i}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600))
        return (time.perf_counter() - t0) / max(1, n) * 1e6


# --------------------------------------------------------------------------- memory

def start_stub(n: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.openhands", "stub", "--conversations", str(n)],
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise RuntimeError("stub did not start")
    return proc, url


async def memory_per_conversation(n: int, trace: bool = False) -> dict[str, float]:
    """Attach ``n`` stub conversations and measure, once idle, this process's
    growth: resident set (``trace=False``: tracemalloc off, its own per-block
    bookkeeping would inflate RSS) or Python-allocated bytes
    (``trace=True``, tracemalloc on from before the bridge starts)."""
    proc, url = start_stub(n)
    try:
        with tempfile.TemporaryDirectory() as state:
            bridge = from_env({"AEP_OPENHANDS_URL": url, "AEP_OPENHANDS_SESSION_API_KEY":
                               "aep-test-session-key-0123456789abcdef", "AEP_OPENHANDS_POLL": "1",
                               "AEP_STATE_DIR": state}, policy=CapturePolicy())
            send, recv = trio.open_memory_channel(4096)
            _, crecv = trio.open_memory_channel(1)
            health = BridgeHealth()
            ctx = BridgeContext("openhands", Stamper("openhands", epoch=1, host="bench"), send, crecv, health,
                                logging.getLogger("bench"))
            events = 0

            async def drain() -> None:
                nonlocal events
                async for _ in recv:
                    events += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain)
                gc.collect()
                if trace:
                    tracemalloc.start()
                base_py = tracemalloc.get_traced_memory()[0]
                base_rss = rss_mib()
                t0 = time.perf_counter()
                run = await nursery.start(bridge.run, ctx)
                want = n * 6  # session.started + 5 mapped frames + run moments: at least this many
                with trio.fail_after(300):
                    while True:
                        convs = run.receiver.conversations
                        if health.source is True and len(convs) == n and all(
                                c.status == "finished" and c.pending_snap is None
                                for c in convs.values()) and events >= want:
                            break
                        await trio.sleep(0.2)
                attach_s = time.perf_counter() - t0
                await trio.sleep(2)  # idle: sockets open, nothing flowing
                gc.collect()
                py = tracemalloc.get_traced_memory()[0] - base_py
                rss = rss_mib() - base_rss
                if trace:
                    tracemalloc.stop()
                nursery.cancel_scope.cancel()
            return {"n": n, "rss_kib": rss * 1024, "py_kib": py / 1024, "attach_s": attach_s,
                    "events": events}
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    if "--memory-point" in argv:
        print(json.dumps(memory_point(int(argv[argv.index("--memory-point") + 1]))))
        return
    quick = "--quick" in argv
    n_convs = 200 if quick else 2000
    convs = corpus(n_convs)
    with tempfile.TemporaryDirectory() as tmp:
        c0 = time.process_time()
        rate, n_frames, n_events = trio.run(path_rate, convs, Path(tmp))
        cpu = time.process_time() - c0  # this process only: the agent stub runs in its own
        fresh_spares = dict(SPARES_SEEN)
        # the same conversations again into the same log directory: each session's
        # file exists now (what a long conversation's later frames see)
        warm, _, _ = trio.run(path_rate, convs, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        c0 = time.process_time()
        stateful, _, _ = trio.run(path_rate, convs, Path(tmp) / "log", Path(tmp) / "state")
        state_cpu = time.process_time() - c0
    floor = floor_rate(convs, n_events)
    create_us = file_create_us(n_convs)
    print(f"Frames through mapping to the JSONL log ({n_frames:,} real captured frames over {n_convs} "
          f"conversations -> {n_events:,} events)")
    print(f"  path:  {rate:>10,.0f} frames/s  ({rate * n_events / n_frames:,.0f} events/s)")
    print(f"  floor: {floor:>10,.0f} frames/s  (json.loads + json.dumps of a JSONL line, no mapping, no I/O)")
    print(f"  ratio to floor: {rate / floor:.3f}")
    print(f"  CPU s per 10k events: path {cpu * 10_000 / n_events:.3f} (whole run, setup included)"
          f", floor {n_frames / floor * 10_000 / n_events:.3f}")
    print(f"  the {n_convs} session log files (one per conversation, {n_frames / n_convs:.0f} "
          f"frames each) are spares made ahead in a worker thread and linked into place, as "
          f"the fleet does; a create costs ~{create_us:,.0f} us a file on this disk now "
          f"(~{create_us * n_convs / 1e6 / (n_frames / rate):.0%} of the path's time if the "
          "event loop made them)")
    print(f"  spare files while the clock ran: {fresh_spares.get('taken', 0):,} taken, "
          f"{fresh_spares.get('missed', 0):,} missed (created on the event loop), "
          f"{fresh_spares.get('made', 0):,} made beside the burst (a worker thread's creates)")
    print(f"  path, each session's log file already there: {warm:>10,.0f} frames/s, ratio {warm / floor:.3f}")
    print(f"  path with the bridge's state directory (the daemon always has one; fresh log files): "
          f"{stateful:>10,.0f} frames/s, ratio {stateful / floor:.3f}, CPU s per 10k events "
          f"{state_cpu * 10_000 / n_events:.3f}")
    print("Memory per attached conversation (stub agent server in its own process; marginal over a "
          "running bridge with no conversation)")
    for n in ((10, 100) if quick else (10, 100, 1000)):
        # each point in a fresh process: RSS growth is not hidden by memory an
        # earlier point (or tracemalloc) freed and this one reuses
        out = subprocess.run([sys.executable, "-m", "benchmarks.openhands_bench", "--memory-point", str(n)],
                             cwd=str(ROOT), capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        if n == 10:
            print(f"  bridge with 0 conversations: {r['base_rss_kib']:.0f} KiB RSS, {r['base_py_kib']:.0f} KiB "
                  "Python-allocated (fixed cost)")
        print(f"  {n:>5} conversations: {r['rss_kib']:7.1f} KiB RSS/conv, {r['py_kib']:7.1f} KiB "
              f"Python-allocated/conv; attached+replayed in {r['attach_s']:.1f} s ({r['events']:,} events)")


def memory_point(n: int) -> dict[str, float]:
    """One memory point, in this (fresh) process: warm-up, the idle bridge,
    ``n`` conversations untraced (RSS), then both again traced (Python)."""
    trio.run(memory_per_conversation, 5)  # warm-up: lazy imports, first sockets, allocator arenas
    base = trio.run(memory_per_conversation, 0)
    r = trio.run(memory_per_conversation, n)
    base_py = trio.run(memory_per_conversation, 0, True)
    p = trio.run(memory_per_conversation, n, True)
    return {"n": n, "rss_kib": (r["rss_kib"] - base["rss_kib"]) / n, "py_kib": (p["py_kib"] - base_py["py_kib"]) / n,
            "base_rss_kib": base["rss_kib"], "base_py_kib": base_py["py_kib"], "attach_s": r["attach_s"],
            "events": r["events"]}

if __name__ == "__main__":
    main(sys.argv[1:])
