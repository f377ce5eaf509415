"""How many pytest-xdist workers ``scripts/dev test`` runs (``-n auto``,
resolved by ``tests/conftest.py``'s ``pytest_xdist_auto_num_workers``).

Most of the suite's wall time is waiting (vendor servers starting, daemons
draining, browsers, SSE streams), not CPU: measured on the 2-core machine,
a single process used about a third of one core. So the suite runs with
more workers than cores (:data:`PER_CORE` each, at least :data:`MINIMUM`),
and with none when the selection is one test file: starting the workers
and collecting twice costs more than one file gains.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

PER_CORE = 2
MINIMUM = 2
MAXIMUM = 8
ROOT = Path(__file__).resolve().parents[2]


def cores() -> int:
    """CPUs this process may run on (affinity, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def one_file(args: Sequence[str]) -> bool:
    """True when pytest's positional ``args`` name exactly one test file
    (node ids of the same file count as that file); options are ignored."""
    files: set[str] = set()
    for a in args:
        if a.startswith("-"):
            continue
        path = Path(a.split("::", 1)[0])
        if not path.is_file():
            return False  # a directory, or no path at all: many files
        files.add(str(path.resolve()))
    return len(files) == 1


def unit_only(args: Sequence[str]) -> bool:
    """True when every path in ``args`` is inside ``tests/unit`` (at least one)."""
    unit = (ROOT / "tests" / "unit").resolve()
    paths = [Path(a.split("::", 1)[0]).resolve() for a in args if not a.startswith("-")]
    return bool(paths) and all(p == unit or unit in p.parents for p in paths)


def workers(args: Sequence[str]) -> int:
    """The worker count for ``-n auto``: 0 (no xdist) for one file; one per
    core for unit tests only (they compute, they do not wait: more workers
    would only add their collection); else ``PER_CORE`` per core within
    ``[MINIMUM, MAXIMUM]``."""
    if one_file(args):
        return 0
    if unit_only(args):
        return max(1, cores())
    return max(MINIMUM, min(MAXIMUM, PER_CORE * cores()))
