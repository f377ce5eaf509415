"""Locate ``shared/`` (the AEP spec, schemas and conformance fixtures).

Checkouts live beside ``shared/`` (``/work/main`` and ``/work/shared``; CI: a
fresh clone with a copy of ``shared/`` beside it). ``AEP_SHARED`` overrides."""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]


_NEEDED = ("aep/schemas", "aep/conformance/fixtures/mappings")
"""What a ``shared/`` must hold for the tests."""


def _complete(c: Path) -> bool:
    return all((c / part).is_dir() and any((c / part).iterdir()) for part in _NEEDED)


@lru_cache(maxsize=1)
def shared_dir() -> Path:
    """The ``shared/`` the tests read: ``$AEP_SHARED`` when set (and then
    only it), else ``../shared`` beside the checkout or ``./shared``.
    Raises ``RuntimeError`` naming where it looked when none holds the
    schemas and the mapping fixtures."""
    env = os.environ.get("AEP_SHARED")
    if env:
        if _complete(Path(env)):
            return Path(env)
        raise RuntimeError(f"AEP_SHARED={env} does not hold the AEP schemas and mapping "
                           f"fixtures ({', '.join(_NEEDED)})")
    candidates = [ROOT.parent / "shared", ROOT / "shared"]
    for c in candidates:
        if _complete(c):
            return c
    raise RuntimeError(
        "the AEP spec and fixtures (shared/aep) are not beside this checkout "
        f"({' or '.join(str(c) for c in candidates)}); set AEP_SHARED=/path/to/shared")


def aep_dir() -> Path:
    return shared_dir() / "aep"


def fixture(rel: str) -> Any:
    """Load ``shared/aep/conformance/fixtures/<rel>`` as JSON."""
    return json.loads((aep_dir() / "conformance" / "fixtures" / rel).read_text())


def pin_entries(obj: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """Every pin entry (a dict with an ``input``) inside a mappings fixture,
    depth first, with its path (``/key`` per dict level, ``[i]`` per list
    item, after ``path``)."""
    if isinstance(obj, dict):
        if "input" in obj:
            yield path, obj
        for k, v in obj.items():
            if k != "input":
                yield from pin_entries(v, f"{path}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from pin_entries(v, f"{path}[{i}]")
