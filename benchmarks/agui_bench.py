"""AG-UI tee proxy: added latency per event and events per second, beside a
direct connection to the same source in the same run (issue 12,
"Benchmark").

The source is a separate process (``python -m benchmarks.agui_bench
--source PORT``): an AG-UI agent stand-in answering ``POST /`` with one run
stream in the real framing (``data: {json}\\n\\n``, the event mix of a
pydantic-ai tool run: a text message of eight content deltas, a tool call
start/args/end/result), each event carrying its send time
(``time.monotonic_ns()``, one clock for every process on the host) in
``rawEvent.t``. The proxy is the real daemon (``aep-bridges run``, its own
process, ``AEP_BRIDGE_AGUI=1``, embedded relay, JSONL session log): every
event is parsed, mapped, stamped and logged on the tee while the bytes go
through. This process is the UI: httpx streaming, one line at a time.

1. **Latency**: the source paces ``RATE`` events/s; for each event the
   reader takes ``receive time - send time``. p50 / p99 / max in ms for the
   direct connection and through the proxy; the added latency is the
   difference of the percentiles.
2. **Throughput**: the source sends ``N_FAST`` events as fast as the socket
   takes them; events/s received direct and through the proxy, and their
   ratio (the direct figure is the floor measured in the same run).

Figures compare runs on one machine (2 shared cores here), not absolutes.
``python -m benchmarks agui`` (``scripts/dev bench agui``)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATE = 500
N_PACED = 4000
N_FAST = 30000
TURN = 13  # events per turn of the mix


def _turn(i: int) -> list[dict]:
    m, c = f"m{i}", f"c{i}"
    evs: list[dict] = [{"type": "TEXT_MESSAGE_START", "messageId": m, "role": "assistant"}]
    evs += [{"type": "TEXT_MESSAGE_CONTENT", "messageId": m, "delta": f"word{k} "} for k in range(8)]
    evs += [{"type": "TEXT_MESSAGE_END", "messageId": m},
            {"type": "TOOL_CALL_START", "toolCallId": c, "toolCallName": "lookup",
             "parentMessageId": m},
            {"type": "TOOL_CALL_ARGS", "toolCallId": c, "delta": "{\"city\":\"Paris\"}"},
            {"type": "TOOL_CALL_END", "toolCallId": c}]
    evs.append({"type": "TOOL_CALL_RESULT", "messageId": f"r{i}", "toolCallId": c,
                "content": "sunny in Paris", "role": "tool"})
    return evs


# --------------------------------------------------------------------------- the source

def source_app():
    from bridges.core.asgi import lifespan, read_body

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["type"] != "http":
            return
        body = await read_body(receive) or b"{}"
        doc = json.loads(body)
        n, rate = int(doc.get("n", 100)), float(doc.get("rate", 0))
        thread, run = doc.get("threadId", "t"), doc.get("runId", "r")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        def frame(ev: dict) -> bytes:
            ev["rawEvent"] = {"t": time.monotonic_ns()}
            return b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n"

        await send({"type": "http.response.body", "more_body": True,
                    "body": frame({"type": "RUN_STARTED", "threadId": thread, "runId": run})})
        t0 = time.monotonic()
        sent = 0
        i = 0
        while sent < n:
            for ev in _turn(i):
                if rate:
                    wait = t0 + sent / rate - time.monotonic()
                    if wait > 0:
                        await trio.sleep(wait)
                await send({"type": "http.response.body", "body": frame(ev), "more_body": True})
                sent += 1
                if sent >= n:
                    break
            i += 1
        await send({"type": "http.response.body", "more_body": False, "body": frame(
            {"type": "RUN_FINISHED", "threadId": thread, "runId": run})})
    return app


def serve_source(port: int) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    cfg = Config()
    cfg.bind = [f"127.0.0.1:{port}"]
    cfg.accesslog = None
    cfg.errorlog = None
    trio.run(serve, source_app(), cfg)


# --------------------------------------------------------------------------- the reader

async def read_run(url: str, run: str, n: int, rate: float) -> tuple[list[float], float]:
    """One run through ``url``: per-event latencies (ms) and events/s."""
    lat: list[float] = []
    body = json.dumps({"threadId": f"bench-{run}", "runId": run, "n": n, "rate": rate}).encode()
    count = 0
    async with httpx.AsyncClient(trust_env=False, timeout=None) as c:
        t0 = time.perf_counter()
        async with c.stream("POST", url + "/", content=body,
                            headers={"accept": "text/event-stream"}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    now = time.monotonic_ns()
                    ev = json.loads(line[6:])
                    lat.append((now - ev["rawEvent"]["t"]) / 1e6)
                    count += 1
        dt = time.perf_counter() - t0
    return lat, count / dt


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the process behind {url} exited ({proc.returncode})")
        try:
            httpx.get(url, timeout=1, trust_env=False)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not up")


def main(argv: list[str]) -> None:
    from tests.support.daemon import console_script
    from tests.support.net import free_port, free_ports

    src_port = free_port()
    src = subprocess.Popen([sys.executable, "-m", "benchmarks.agui_bench", "--source", str(src_port)],
                           cwd=str(ROOT))
    source = f"http://127.0.0.1:{src_port}"
    tmp = tempfile.mkdtemp(prefix="agui-bench-")
    relay_port, proxy_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    env.update(AEP_LISTEN=f"127.0.0.1:{relay_port}", AEP_STATE_DIR=tmp, AEP_BRIDGE_OTLP_IN="0",
               AEP_BRIDGE_AGUI="1", AEP_AGUI_UPSTREAM=source,
               AEP_AGUI_LISTEN=f"127.0.0.1:{proxy_port}", AEP_LOG_LEVEL="warning")
    daemon = subprocess.Popen(console_script() + ["run"], cwd=str(ROOT), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = f"http://127.0.0.1:{proxy_port}"
    try:
        _wait_http(source + "/", src)
        _wait_http(f"http://127.0.0.1:{relay_port}/healthz", daemon)
        _wait_http(proxy + "/", daemon)

        async def run_all():
            await read_run(source, "warm-d", 500, 0)
            await read_run(proxy, "warm-p", 500, 0)
            d_lat, _ = await read_run(source, "paced-d", N_PACED, RATE)
            p_lat, _ = await read_run(proxy, "paced-p", N_PACED, RATE)
            _, d_rate = await read_run(source, "fast-d", N_FAST, 0)
            _, p_rate = await read_run(proxy, "fast-p", N_FAST, 0)
            return d_lat, p_lat, d_rate, p_rate

        d_lat, p_lat, d_rate, p_rate = trio.run(run_all)
        health = httpx.get(f"http://127.0.0.1:{relay_port}/healthz", trust_env=False).json()
        counters = health["bridges"]["agui"].get("counters", {})
        print(f"latency at {RATE} events/s, {N_PACED} events (ms):")
        for name, xs in (("direct", d_lat), ("proxied", p_lat)):
            print(f"  {name:8s} p50 {pct(xs, 50):7.2f}  p99 {pct(xs, 99):7.2f}  "
                  f"max {max(xs):7.2f}  mean {statistics.mean(xs):7.2f}")
        print(f"  added    p50 {pct(p_lat, 50) - pct(d_lat, 50):7.2f}  "
              f"p99 {pct(p_lat, 99) - pct(d_lat, 99):7.2f}")
        print(f"throughput, {N_FAST} events unpaced: direct {d_rate:,.0f} events/s, proxied "
              f"{p_rate:,.0f} events/s (ratio {p_rate / d_rate:.2f})")
        print(f"tee: {counters.get('agui.events', 0):,} SSE events parsed, "
              f"{counters.get('agui.emitted', 0):,} AEP events emitted, "
              f"{counters.get('agui.dropped_saturated', 0):,} dropped (relay channel full)")
    finally:
        daemon.terminate()
        src.terminate()
        for p in (daemon, src):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--source"]:
        serve_source(int(sys.argv[2]))
    else:
        main(sys.argv[1:])
