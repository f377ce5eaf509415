"""Where the suite's CPU goes, per test file (issue 29: the warm run's
floor is its CPU time over the machine's cores).

``pytest --cpu-report DIR`` (``scripts/dev test --cpu-report DIR``): each
process (the controller, every xdist worker) writes one JSON line per test
file to ``DIR/cpu-<worker>.jsonl``: ``{"file", "cpu_s", "wall_s",
"tests"}``, where ``cpu_s`` is user + system seconds of the test process
and of the children it reaped (vendor servers, CLIs, daemons) during the
file's setup, calls and teardowns. A module-scoped fixture's teardown
runs in its file's last test, so its cost stays with its file. Children
not reaped by the test (none should be) are not counted.

``python -m tests.support.cpureport DIR`` prints the files by CPU, the
total, and the floor it sets on a machine of N cores (total / N)."""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest

__all__ = ["CpuReport", "summarize"]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuReport:
    """The pytest plugin behind ``--cpu-report DIR`` (see the module)."""

    def __init__(self, out: Path, worker: str) -> None:
        self.out = out
        self.worker = worker
        self.files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Iterator[None]:
        cpu, wall = _cpu(), time.monotonic()
        yield
        row = self.files[item.nodeid.split("::", 1)[0]]
        row[0] += _cpu() - cpu
        row[1] += time.monotonic() - wall
        row[2] += 1

    def pytest_sessionfinish(self) -> None:
        if not self.files:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / f"cpu-{self.worker}.jsonl", "a", encoding="utf-8") as f:
            for name, (cpu, wall, n) in self.files.items():
                f.write(json.dumps({"file": name, "cpu_s": round(cpu, 3),
                                    "wall_s": round(wall, 3), "tests": int(n)}) + "\n")


def summarize(out: Path, cores: int, top: int = 40) -> str:
    """The report of ``out`` (a ``--cpu-report`` directory) as text: the
    ``top`` files by CPU seconds, then the total and ``total / cores``."""
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for path in sorted(out.glob("cpu-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            acc = files[row["file"]]
            acc[0] += row["cpu_s"]
            acc[1] += row["wall_s"]
            acc[2] += row["tests"]
    total = sum(r[0] for r in files.values())
    lines = [f"{'cpu s':>8} {'wall s':>8} {'tests':>6}  file"]
    for name, (cpu, wall, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{cpu:8.1f} {wall:8.1f} {int(n):6d}  {name}")
    lines.append(f"total {total:.0f} CPU s over {len(files)} files; on {cores} cores the run "
                 f"cannot take less than {total / cores / 60:.1f} min")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - a developer's command
    print(summarize(Path(sys.argv[1]), os.cpu_count() or 1))
