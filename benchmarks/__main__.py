"""``python -m benchmarks [NAME...]`` (``scripts/dev bench``): run every
``benchmarks/*_bench.py`` (or the named ones, e.g. ``otlp``) in turn."""
from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import benchmarks


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.endswith("_bench"))
    wanted = [a for a in argv if not a.startswith("-")]
    if wanted:
        names = [n for n in names if n.removesuffix("_bench") in wanted or n in wanted]
        if not names:
            print(f"no benchmark named {' '.join(wanted)}", file=sys.stderr)
            return 2
    for name in names:
        print(f"\n== {name} ==", flush=True)
        t0 = time.perf_counter()
        importlib.import_module(f"benchmarks.{name}").main([a for a in argv if a.startswith("-")])
        print(f"({name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
