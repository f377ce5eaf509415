"""``aep-bridges timeline FILE...``: a session log rendered as ``tail``
renders a live stream (the ecosystem's ``aep timeline --file``).

Reads JSONL (a daemon's session log, ``logs/<agent>/<session>.jsonl``, a
rotated ``.gz`` segment, or ``-`` for stdin) and prints each event through
:class:`supervisor.tools.tail.Timeline`: the same columns, gists, pending
asks and date lines; whole type names when not writing to a terminal. An
ask whose outcome the same input carries (any of the files) is shown with
it (``→ answered``...), never ``PENDING``: the input is scanned for
outcomes first (stdin is held in memory for that).
A line that is not a JSON object, or is over
:data:`.validate.MAX_LINE` bytes (never read whole: a small ``.gz`` can
inflate to gigabytes on one line), is reported on stderr with its line
number and skipped (``aep-bridges validate`` says more). Exit 0, or 2 when a file
cannot be read."""
from __future__ import annotations

import json
import sys
from typing import Iterable, TextIO

from .gist import AskKey
from .tail import Timeline, _console, _safe
from .tailstream import OUTCOMES, settle

__all__ = ["outcomes", "render", "run"]


def render(lines: Iterable[str], timeline: Timeline, print_line, *, name: str,
           err: TextIO) -> int:
    """Render each JSONL line through ``timeline`` with ``print_line``
    (a ``rich.text.Text`` each); returns the events shown. Bad lines are
    named on ``err`` (``FILE:LINE: ...``)."""
    from .validate import parsed
    shown = 0
    for n, ev, problem in parsed(lines):
        if ev is None:
            print(_safe(f"{name}:{n}: {problem}; skipped"), file=err)
            continue
        if (day := timeline.date_line(ev)) is not None:
            print_line(day)
        print_line(timeline.line(ev))
        shown += 1
    return shown


def outcomes(lines: Iterable[str], into: dict[AskKey, str]) -> None:
    """Note in ``into`` every ask the JSONL ``lines`` settle (its
    :func:`.gist.ask_key` -> how,
    :func:`.tailstream.settle`); only lines naming an outcome type are
    parsed, bad ones skipped (``render`` reports them)."""
    for line in lines:
        if any(t in line for t in OUTCOMES):
            try:
                settle(json.loads(line), into)
            except ValueError:
                continue


def run(names: list[str], *, color: str = "auto", out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """Render each file of ``names`` in turn (one :class:`Timeline`, so an
    ask in one file and its answer in the next pair up)."""
    from .validate import read_lines
    out, err = out or sys.stdout, err or sys.stderr
    console = _console(color, out)
    timeline = Timeline(full_types=not console.is_terminal)

    def print_line(text) -> None:
        console.print(text, no_wrap=True, overflow="ellipsis")

    status = 0
    held: dict[str, list[str]] = {}
    for name in names:  # outcomes first, so a settled ask is not drawn PENDING
        try:
            lines: Iterable[str] = read_lines(name)
            if name == "-":
                lines = held.setdefault(name, list(lines))
            outcomes(lines, timeline.settled)
        except OSError:
            pass  # said once, below
    for name in names:
        shown = "<stdin>" if name == "-" else name
        try:
            render(held.get(name) or read_lines(name), timeline, print_line, name=shown, err=err)
        except OSError as e:
            print(_safe(f"aep-bridges timeline: {shown}: {e.strerror or e}"), file=err)
            status = 2
        out.flush()
    return status
