"""A ``claude -p`` one-tool turn with the installed hooks beside the same turn
without hooks (issue 27, "Benchmarks"; goal <= 1.3x).

The real Claude Code (the pinned npm release from the vendor cache),
offline against the Messages mock (``tests/support/mock_anthropic.py``):
one ``Bash`` call (``echo hi``, allowed by ``--allowedTools``) and a final
text. Hooked: what ``aep-bridges hooks install claude-code --project``
writes (HTTP hooks on every event Claude Code runs them for, the command
shim on ``SessionStart``/``Setup``), pointed at the real daemon
(``AEP_BRIDGE_CLAUDE_CODE=1``, ``AEP_TOKEN`` set, observe only: every
moment mapped, stamped and in the session log before its answer). The arms
alternate, ``ROUNDS`` each (``--quick``: 3); reported: the median wall time
of each, their ratio, and what the daemon counted.

Figures compare runs on one machine (2 shared cores here); not absolutes.
``python -m benchmarks claude_code`` (``scripts/dev bench claude_code``)."""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import claude_code as cc  # noqa: E402
from tests.support.daemon import DaemonProcess  # noqa: E402
from tests.support.hookinstall import install  # noqa: E402
from tests.support.mock_anthropic import MockAnthropicServer, Text, Tool  # noqa: E402

TOKEN = "bench-claude-code-token"
ROUNDS = 7
BASH_HI = Tool("Bash", {"command": "echo hi", "description": "Print hi"})


async def one_turn(binary: Path, root: Path, d: DaemonProcess | None) -> float:
    """One turn in a fresh home and project, hooked to ``d`` when given: its
    wall time in s. Raises ``RuntimeError`` when the turn did not finish."""
    home, proj = root / "home", root / "proj"
    cc.prepare_home(home, proj)
    if d is not None:
        install("claude-code", home, d, "--project", str(proj))
    mock = MockAnthropicServer(script=[BASH_HI, Text("ok")])
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        assert mock.base_url
        run = await cc.run_print(binary, home, proj, "run", base_url=mock.base_url,
                                 proxy_url=mock.base_url, args=("--allowedTools", "Bash"),
                                 env_extra={"AEP_TOKEN": TOKEN})
        n.cancel_scope.cancel()
    if run.returncode != 0 or (run.result or {}).get("result") != "ok":
        raise RuntimeError(run.describe())
    return run.wall_s


def main(argv: list[str]) -> None:
    rounds = 3 if "--quick" in argv else ROUNDS
    binary = cc.claude_binary()
    walls: dict[str, list[float]] = {"no hooks": [], "installed hooks": []}
    with tempfile.TemporaryDirectory(prefix="aep-ccbench-") as tmp:
        d = DaemonProcess(Path(tmp) / "state", {"AEP_BRIDGE_CLAUDE_CODE": "1",
                                                "AEP_BRIDGE_OTLP_IN": "0"}, token=TOKEN)
        d.start()
        try:
            async def rounds_() -> None:
                for i in range(rounds + 1):  # the first round warms the caches, not timed
                    for name, daemon in (("no hooks", None), ("installed hooks", d)):
                        with tempfile.TemporaryDirectory(dir=tmp) as one:
                            w = await one_turn(binary, Path(one), daemon)
                        if i:
                            walls[name].append(w)
            trio.run(rounds_)
            health = d.healthz(TOKEN)
        finally:
            d.stop()
    med = {k: statistics.median(v) for k, v in walls.items()}
    for name, ws in walls.items():
        print(f"{name:<16} wall median {med[name]:.2f} s (min {min(ws):.2f}, max {max(ws):.2f}, "
              f"{len(ws)} turns)")
    ratio = med["installed hooks"] / med["no hooks"]
    print(f"ratio {ratio:.2f} (goal <= 1.3)")
    counters = (health.get("bridges", {}).get("claude_code", {}) or {}).get("counters", {})
    print(f"daemon counters {json.dumps(counters)[:300]}")
