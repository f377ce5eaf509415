"""The HTTP hook round trip through the daemon beside a bare hypercorn
answering the same POST (issue 27, "Benchmarks"; goal <= 1.5x at p50 and p99).

Floor: a bare hypercorn (trio worker, its own process) whose ASGI app reads
the body and answers ``{}``. Path: the real daemon (``aep-bridges run``,
``AEP_BRIDGE_CLAUDE_CODE=1``, ``AEP_TOKEN`` set, control off: observe only)
answering ``POST /hooks/claude-code``: the Host guard, the bearer check,
mapping, stamping, the session log write, then the answer. The client is
this process, a new connection per hook (as a vendor's hook or the shim
makes one), a real-shaped ``PreToolUse``/``PostToolUse`` pair of one tool
call per round (Claude Code 2.1.197's payloads, ~0.6 KiB), the arms
interleaved in blocks; p50 and p99 of each arm, their ratio.

Also reported: what the daemon counted (hooks received, none lost).
Figures compare runs on one machine (2 shared cores here); not absolutes.
``python -m benchmarks hooks`` (``scripts/dev bench hooks``)."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.daemon import DaemonProcess  # noqa: E402
from tests.support.net import free_ports  # noqa: E402

TOKEN = "bench-hooks-token"
ROUND_TRIPS = 1000
WARMUP = 100
BLOCK = 50

FLOOR_APP = r"""
import sys, trio
from hypercorn.config import Config
from hypercorn.trio import serve

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})

c = Config()
c.bind = [f"127.0.0.1:{sys.argv[1]}"]
c.accesslog = None
c.errorlog = None
trio.run(serve, app, c)
"""


def moments(i: int) -> list[dict]:
    base = {"session_id": "c83d5a81-bb77-46b3-8f88-0e57ed585d03",
            "transcript_path": "/home/u/.claude/projects/-p/c83d5a81.jsonl", "cwd": "/home/u/p",
            "prompt_id": "066f010e-8f18-496a-85f0-7729c1fff850", "permission_mode": "default",
            "effort": {"level": "high"}, "tool_name": "Bash",
            "tool_input": {"command": f"echo {i}", "description": "Print"},
            "tool_use_id": f"toolu_bench{i:06d}"}
    return [{**base, "hook_event_name": "PreToolUse"},
            {**base, "hook_event_name": "PostToolUse", "duration_ms": 12,
             "tool_response": {"stdout": str(i), "stderr": "", "interrupted": False}}]


def post(url: str, body: bytes, headers: dict[str, str]) -> float:
    """One hook on a new connection (``http.client``, as the stdlib shim
    does: an httpx client's set-up alone would dwarf both arms)."""
    u = urllib.parse.urlsplit(url)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
    try:
        conn.request("POST", u.path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    dt = time.perf_counter() - t0
    assert r.status == 200 and json.loads(data) == {}, data
    return dt


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str]) -> None:
    n = ROUND_TRIPS // 5 if "--quick" in argv else ROUND_TRIPS
    (floor_port,) = free_ports(1)
    floor = subprocess.Popen([sys.executable, "-c", FLOOR_APP, str(floor_port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        d = DaemonProcess(Path(tmp) / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1",
                                                "AEP_BRIDGE_OTLP_IN": "0"}, token=TOKEN)
        d.start()
        try:
            floor_url = f"http://127.0.0.1:{floor_port}/hooks/claude-code"
            for _ in range(200):
                try:
                    httpx.post(floor_url, content=b"{}", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            arms = {"floor": (floor_url, {"Content-Type": "application/json"}),
                    "daemon": (f"{d.url}/hooks/claude-code",
                               {"Content-Type": "application/json",
                                "Authorization": f"Bearer {TOKEN}"})}
            times: dict[str, list[float]] = {k: [] for k in arms}
            i = 0
            while i < n + WARMUP:
                for name, (url, headers) in arms.items():
                    for j in range(i, i + BLOCK, 2):
                        for m in moments(j):
                            dt = post(url, json.dumps(m).encode(), headers)
                            if j >= WARMUP:
                                times[name].append(dt)
                i += BLOCK
            health = d.healthz(TOKEN)
        finally:
            d.stop()
            floor.terminate()
            floor.wait(10)
    for q in (0.5, 0.99):
        f, p = quantile(times["floor"], q), quantile(times["daemon"], q)
        print(f"p{int(q * 100):<3} bare hypercorn {f * 1000:7.2f} ms   daemon {p * 1000:7.2f} ms"
              f"   ratio {p / f:4.2f} (goal <= 1.5)")
    counters = (health.get("bridges", {}).get("claude_code", {}) or {}).get("counters", {})
    print(f"daemon: {len(times['daemon'])} hooks timed, counters {json.dumps(counters)[:300]}")


if __name__ == "__main__":
    main(sys.argv[1:])
