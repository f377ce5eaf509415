"""How many pytest-xdist workers ``scripts/dev test`` runs (``-n auto``,
resolved by ``tests/conftest.py``'s ``pytest_xdist_auto_num_workers``).

Most of the suite's wall time is waiting (vendor servers starting, daemons
draining, browsers, SSE streams), not CPU: measured on the 2-core machine,
a single process used about a third of one core. So the suite runs with
more workers than cores (:data:`PER_CORE` each, at least :data:`MINIMUM`),
and with none when the selection is one test file: starting the workers
and collecting twice costs more than one file gains.

The order files are handed to workers (``--dist loadfile
--no-loadscope-reorder``, :func:`file_rank`): the longest first, so that no
worker starts a two-minute file while the others have run out of work.
xdist's own order (the files with the most tests first) started the many
quick unit tests first and left the few slow real-vendor files for the end.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

PER_CORE = 2
MINIMUM = 2
MAXIMUM = 8
ROOT = Path(__file__).resolve().parents[2]


SLOW_FIRST: tuple[str, ...] = (
    "tests/integration/console/test_console_page.py",
    "tests/integration/openhands/test_openhands_real.py",
    "tests/integration/sse_common/test_sse_daemon.py",
    "tests/integration/hardening/test_stalls.py",
    "tests/integration/hooks_live/test_claude_code_print.py",
    "tests/integration/hooks/test_live_claude_code.py",
    "tests/integration/kimi_web/test_restarts.py",
    "tests/integration/supervisor/test_service_install.py",
    "tests/integration/supervisor/test_daemon.py",
    "tests/integration/console/test_console_resume.py",
    "tests/integration/acp/test_acp_daemon.py",
    "tests/integration/hardening/test_retention_fairness.py",
)
"""The files with the longest wall time (each over a minute in a parallel
run on the 2-core machine, 2026-12-07), longest first."""


def file_rank(path: str) -> tuple[int, int]:
    """Sort key of a test file (``tests/...``, relative to the checkout):
    the :data:`SLOW_FIRST` files in their order, then every other
    integration file, then the unit tests (seconds or less each)."""
    if path in SLOW_FIRST:
        return (0, SLOW_FIRST.index(path))
    return (1 if path.startswith("tests/integration/") else 2, 0)


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
