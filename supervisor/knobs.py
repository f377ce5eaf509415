"""The knob tables of ``docs/configuration.md``, generated from the settings
metadata (issue 7, "one config shape"): ``python -m supervisor.knobs`` checks
the page, ``--write`` rewrites its tables in place.

Each table on the page sits between markers naming whose settings it shows::

    <!-- knobs:core -->            the daemon's core settings and the bridge flags
    <!-- knobs:openhands -->       one bridge (a FLEET key)
    <!-- knobs:opencode_sse,kilocode_sse -->   profiles of one family, merged
    ...
    <!-- /knobs -->

The owners are :func:`supervisor.config.all_settings` (``core``, ``dev``,
and every built bridge's key). Several owners in one marker merge row by
row (their settings lists must be parallel: same length, same meanings), so
a vendor family shares one table (`` `AEP_OPENCODE_URL` / `AEP_KILOCODE_URL` ``).
``tests/unit/supervisor/test_knobs.py`` fails when the page drifts.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

from bridges.core.settings import Row, render_table

from . import config

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
"""The page that holds every knob table (the README links to it)."""

MARKED = re.compile(r"(?P<open><!-- knobs:(?P<owners>[a-z0-9_,]+) -->\n)(?P<body>.*?)"
                    r"(?P<close><!-- /knobs -->)", re.S)


def rows(owners: Sequence[str]) -> list[Row]:
    """The rows of the table for ``owners`` (see the module docstring).
    Raises ``ValueError`` for an unknown owner or owners whose settings do
    not line up."""
    known = config.all_settings()
    unknown = [o for o in owners if o not in known]
    if unknown:
        raise ValueError(f"knobs:{','.join(owners)}: unknown {unknown} (known: {sorted(known)})")
    tables = [known[o] for o in owners]
    if len(tables) == 1:
        return list(tables[0])
    if len({len(t) for t in tables}) != 1:
        raise ValueError(f"knobs:{','.join(owners)}: the settings lists differ in length")
    return [tuple(group) for group in zip(*tables, strict=True)]


def render(text: str) -> str:
    """``text`` (the page) with every marked table regenerated. Raises
    ``ValueError`` when ``text`` has no marked table at all."""
    if not MARKED.search(text):
        raise ValueError("no <!-- knobs:... --> table markers found")

    def table(m: re.Match[str]) -> str:
        body = render_table(rows(m["owners"].split(",")))
        return f"{m['open']}\n{body}\n{m['close']}"
    return MARKED.sub(table, text)


def main(argv: Sequence[str] | None = None) -> int:
    """``--write``: rewrite the page's tables; else exit 1 when they
    differ from the metadata. ``--page`` names another file (tests)."""
    ap = argparse.ArgumentParser(prog="python -m supervisor.knobs", description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the tables in place")
    ap.add_argument("--page", type=Path, default=PAGE)
    args = ap.parse_args(argv)
    text = args.page.read_text()
    new = render(text)
    if new == text:
        return 0
    if args.write:
        args.page.write_text(new)
        print(f"{args.page}: knob tables regenerated")
        return 0
    print(f"{args.page}: knob tables differ from the settings metadata; run "
          "`python -m supervisor.knobs --write`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
