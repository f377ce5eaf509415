"""Readers for the real OpenCode / Kilo Code captures
(``tests/fixtures/{opencode,kilocode}_real/``, see the README there)."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from bridges.sse_common.frames import BusEvent, parse_frame

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@lru_cache(maxsize=None)
def _load(vendor: str, name: str) -> Any:
    return json.loads((FIXTURES / f"{vendor}_real" / name).read_text())


def real_frames(vendor: str, stream: str = "") -> Iterator[tuple[str, str]]:
    """``(stream path, data)`` of every captured frame (``stream``: a prefix
    filter such as ``/global``)."""
    for f in _load(vendor, "frames.json"):
        if "data" in f and f["stream"].startswith(stream):
            yield f["stream"], f["data"]


def global_events(vendor: str) -> list[BusEvent]:
    """The ``/global/event`` frames parsed, in arrival order (both forms)."""
    return [parse_frame(d, wrapped=True) for _, d in real_frames(vendor, "/global")]


def real_event(vendor: str, type_: str, pred: Callable[[BusEvent], bool] | None = None,
               n: int = 0) -> BusEvent:
    """The ``n``-th bus-form event of ``type_`` on the global stream."""
    hits = [e for e in global_events(vendor) if e.form == "bus" and e.type == type_
            and (pred is None or pred(e))]
    return hits[n]


def rest(vendor: str, label: str) -> dict:
    """The REST exchange recorded under ``label`` in ``rest.json``."""
    for r in _load(vendor, "rest.json"):
        if r["label"] == label:
            return r
    raise KeyError(label)


def meta(vendor: str) -> dict:
    return _load(vendor, "meta.json")
