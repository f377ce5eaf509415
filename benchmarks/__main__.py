"""``python -m benchmarks [NAME...]`` (``scripts/dev bench``): run every
``benchmarks/*_bench.py`` (or the named ones, e.g. ``otlp``) in turn."""
from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import benchmarks

FLAGS = {"--quick": "shorter runs (fewer requests and rounds)",
         "--state": "sse: the tracker-state row alone"}


def usage(names: list[str]) -> str:
    flags = "\n".join(f"  {k:<9} {v}" for k, v in FLAGS.items())
    return (f"usage: python -m benchmarks [NAME...] [--quick] [--state]\n"
            f"  NAME      one of: {' '.join(n.removesuffix('_bench') for n in names)}"
            f" (default: all)\n{flags}")


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.endswith("_bench"))
    if "-h" in argv or "--help" in argv:
        print(usage(names))
        return 0
    unknown = [a for a in argv if a.startswith("-") and a not in FLAGS]
    if unknown:  # a typo must not start the whole ~5-minute run
        print(f"unknown option {' '.join(unknown)}\n{usage(names)}", file=sys.stderr)
        return 2
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
