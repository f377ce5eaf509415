"""The command shim's cost per hook (issue 27, "Benchmarks"): a vendor starts
``aep-bridges hook <agent>`` for every hook moment and waits for it, so its
start-up is on the agent's critical path. Goal: at most 1.5x a bare
``python3 -S -E -c pass``.

Each candidate command line is started as the vendor would (a new process,
the hook JSON on stdin, stdout read to the end) against a stub of the
daemon's endpoint answering ``{}`` at once (``tests/support/hook_stub.py``,
hypercorn, in its own process). The candidates, run round-robin so they
share the machine's noise:

- ``floor``: ``<python> -S -E -c pass``, the interpreter doing nothing;
- ``installed``: the line ``aep-bridges hooks install`` writes
  (``supervisor.hookinstall.common.shim_command``: ``-S -E -c`` importing
  ``shim`` from its directory, its cached bytecode);
- ``script``: ``<python> -S -E .../shim.py`` (compiled on every start);
- ``plain``: ``<python> .../shim.py`` (``site``: site-packages, ``.pth`` files);
- ``console``: the ``aep-bridges hook`` console script (``site`` + the
  entry point; ``supervisor/cli.py`` dispatches ``hook`` before importing
  anything else);
- ``exchange``: the floor plus the same HTTP exchange written inline with
  ``_socket`` (no argument parsing, no checks): what any client must pay;
- ``down``: the installed line with nothing listening (connection refused:
  the moment is spooled, the fail-open path);
- ``signed``: the installed line with ``AEP_TOKEN`` set, against a stub
  holding the token: the request signed and the stub's proof checked
  (``bridges/core/signed.py``), what a daemon with a token costs.

Reported: median and p90 in ms, and the median as a ratio to the floor's
median in the same run. Figures compare runs on one machine; not absolutes."""
from __future__ import annotations

import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from supervisor.hookinstall.common import shim_command, shim_path  # noqa: E402

PAYLOAD = (b'{"session_id":"0199a1b2-c3d4","transcript_path":"/home/u/.codex/sessions/x.jsonl",'
           b'"cwd":"/home/u/project","hook_event_name":"PreToolUse","model":"gpt-5",'
           b'"permission_mode":"default","turn_id":"t-1","tool_name":"Bash",'
           b'"tool_input":{"command":"ls -la"},"tool_use_id":"call_1"}')


def _exchange_code(port: int) -> str:
    return ("import _socket, posix; b = posix.read(0, 1 << 20); s = _socket.socket(); "
            f"s.connect(('127.0.0.1', {port})); "
            "s.sendall(b'POST /hooks/codex HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n"
            "Content-Type: application/json\\r\\nContent-Length: %d\\r\\n"
            "Connection: close\\r\\n\\r\\n' % len(b) + b)\n"
            "r = b''\nwhile (c := s.recv(65536)): r += c\n"
            "posix.write(1, r.partition(b'\\r\\n\\r\\n')[2])")


#: the token of the ``signed`` candidate (its own stub proves itself with it)
TOKEN = "bench-shim-token"
#: environment added per candidate
ENV = {"signed": {"AEP_TOKEN": TOKEN}}


def candidates(url: str, down_url: str, spool: str, signed_url: str) -> dict[str, list[str]]:
    py = sys.executable
    shim = str(shim_path())
    port = int(url.rsplit(":", 1)[1])
    console = str(Path(py).with_name("aep-bridges"))
    return {
        "floor": [py, "-S", "-E", "-c", "pass"],
        "installed": shlex.split(shim_command("codex", daemon=url, python=py)),
        "script": [py, "-S", "-E", shim, "codex", "--daemon", url],
        "plain": [py, shim, "codex", "--daemon", url],
        "console": [console, "hook", "codex", "--daemon", url],
        "exchange": [py, "-S", "-E", "-c", _exchange_code(port)],
        "down": shlex.split(shim_command("codex", daemon=down_url, python=py))
        + ["--spool", spool],
        "signed": shlex.split(shim_command("codex", daemon=signed_url, python=py)),
    }


def _once(argv: list[str], env: dict[str, str] | None = None) -> float:
    full = {**os.environ, **env} if env else None
    t0 = time.perf_counter()
    out = subprocess.run(argv, input=PAYLOAD, capture_output=True, check=False, env=full)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{argv[:3]}: exit {out.returncode}: {out.stderr[-300:]!r}")
    if env and out.stderr:  # the signed exchange must succeed, not fall back to the spool
        raise RuntimeError(f"{argv[:3]}: {out.stderr[-300:]!r}")
    return took


def measure(rounds: int) -> dict[str, list[float]]:
    """``{candidate: [seconds per run]}`` over ``rounds`` round-robin rounds."""
    stub = subprocess.Popen([sys.executable, "-m", "tests.support.hook_stub", "answer"],
                            cwd=ROOT, stdout=subprocess.PIPE)
    signed = subprocess.Popen([sys.executable, "-m", "tests.support.hook_stub", "answer", TOKEN],
                              cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert stub.stdout is not None and signed.stdout is not None
        url = stub.stdout.readline().decode().strip()
        signed_url = signed.stdout.readline().decode().strip()
        with socket.socket() as s:  # a port nothing listens on: connection refused
            s.bind(("127.0.0.1", 0))
            down = f"http://127.0.0.1:{s.getsockname()[1]}"
        with tempfile.TemporaryDirectory(prefix="aep-shim-bench-") as spool:
            cands = candidates(url, down, spool, signed_url)
            for name, argv in cands.items():  # warm: page cache, bytecode caches
                _once(argv, ENV.get(name))
            times: dict[str, list[float]] = {k: [] for k in cands}
            for _ in range(rounds):
                for name, argv in cands.items():
                    times[name].append(_once(argv, ENV.get(name)))
        return times
    finally:
        for p in (stub, signed):
            p.kill()
            p.wait()


def _p90(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def main(argv: list[str]) -> None:
    rounds = 20 if "--quick" in argv else 80
    times = measure(rounds)
    floor = statistics.median(times["floor"])
    print(f"shim per hook, {rounds} runs each, round-robin; the floor is "
          f"`{Path(sys.executable).name} -S -E -c pass` (goal: installed <= 1.5x)")
    print(f"{'candidate':<10} {'median ms':>10} {'p90 ms':>8} {'x floor':>8} {'added ms':>9}")
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"{name:<10} {med * 1e3:>10.2f} {_p90(xs) * 1e3:>8.2f} {med / floor:>8.2f} "
              f"{(med - floor) * 1e3:>9.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
