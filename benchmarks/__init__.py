"""Benchmarks: measured, not asserted. Each ``*_bench.py`` module has a
``main(argv) -> None`` printing its figures beside a floor measured in the
same run (as a ratio), so numbers from noisy machines stay comparable."""

from pathlib import Path

import trio


async def fleet_log(nursery: trio.Nursery, root: Path):
    """The session log as the fleet runs it (``supervisor/fleet.py``): a
    ``SessionLog`` under ``root`` whose new files are spares renamed into
    place, the spares kept by a task in ``nursery``; returns once the pool
    is full (the daemon fills it at start, before any event)."""
    from supervisor.sessionlog.jsonlog import SessionLog
    from supervisor.sessionlog.spares import SPARE_DIR, SpareFiles
    log = SessionLog(root)
    log.spares = spares = SpareFiles(root / SPARE_DIR)
    await nursery.start(spares.keep)
    while spares.ready() < spares.target:
        await trio.sleep(0.005)
    return log
