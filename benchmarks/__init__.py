"""Benchmarks: measured, not asserted. Each ``*_bench.py`` module has a
``main(argv) -> None`` printing its figures beside a floor measured in the
same run (as a ratio), so numbers from noisy machines stay comparable."""
