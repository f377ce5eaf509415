"""Bounds on what one hook moment may put into events (issue 25, the fifth
outside attack). Pure.

- :func:`shallow`: a moment nested deeper than :data:`DEPTH_MAX` levels is
  cut there before any mapper walks it (each deeper part becomes the
  :data:`DEEP` marker), so no mapping, digest or encoding recurses without
  bound (a 980-deep ``tool_response`` was a ``RecursionError`` and a 500).
  The bound leaves room under the relay's ``MAX_DATA_DEPTH`` (64): a mapper
  puts vendor values a level or two below ``data``.
- :func:`meta`: a vendor string carried at capture ``metadata`` (names of
  things: a trigger, a model, a subagent id, an error category) goes
  through the AEP-0003 §9.4 redaction of the run's policy (a token in it is
  redacted as it is in an attention prompt) and is at most
  :data:`META_MAX` characters, a cut one ending in :data:`CUT`.
- :func:`fit`: the backstop on one mapped emission: encoded ``data`` over
  :data:`EVENT_MAX` bytes loses its largest members until it fits; what
  went is named under ``data["x-truncated"]`` (AEP-0002 §5.4: payloads are
  open, an extra member defaults to ``metadata``), and the hub counts it
  ``hooks_event_oversize``.
"""
from __future__ import annotations

import json
from typing import Any

from bridges.core import aep
from bridges.core.bridge import Emission
from bridges.core.capture import redact_text
from bridges.core.posture import Posture

__all__ = ["CUT", "DEEP", "DEPTH_MAX", "EVENT_MAX", "META_MAX", "TRUNCATED", "clip", "fit",
           "meta", "shallow"]

DEPTH_MAX = 48
"""Deepest nesting of a moment kept (the moment object is level 1)."""
DEEP = f"[cut: nested deeper than {DEPTH_MAX} levels]"
"""What a part of a moment past :data:`DEPTH_MAX` becomes."""
META_MAX = 512
"""Characters of one vendor string carried at ``metadata``."""
CUT = "\u2026"
"""The mark a cut string ends with."""
TRUNCATED = "x-truncated"
"""The payload member that says what a bound left out (a vendor-neutral
extension member: AEP-0002 §5.4's open payloads)."""
EVENT_MAX = 4 * 1024 * 1024 + 64 * 1024
"""Largest encoded ``data`` of one mapped emission, bytes: a hook body's
cap (4 MiB) and room for what a mapper adds; past it :func:`fit` degrades."""


_CONTAINERS = frozenset({dict, list})


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` levels (iterative: safe
    at any depth; only containers are stacked)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        kids = v.values() if type(v) is dict else v
        if not _CONTAINERS.intersection(map(type, kids)):
            continue  # only scalars below (a C-speed look: a million-value enum is cheap)
        stack.extend([(c, depth + 1) for c in kids if type(c) is dict or type(c) is list])
    return False


def _cut(v: Any, depth: int) -> Any:
    # recursion at most DEPTH_MAX deep: safe
    if type(v) is dict:
        return DEEP if depth > DEPTH_MAX else {k: _cut(x, depth + 1) for k, x in v.items()}
    if type(v) is list:
        return DEEP if depth > DEPTH_MAX else [_cut(x, depth + 1) for x in v]
    return v


def shallow(moment: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(moment, False)`` when it nests at most :data:`DEPTH_MAX` levels,
    else ``(a copy with every deeper part replaced by DEEP, True)``."""
    if not _deeper_than(moment, DEPTH_MAX):
        return moment, False
    out = _cut(moment, 1)
    assert isinstance(out, dict)
    return out, True


def clip(text: str, limit: int) -> str:
    """``text`` when at most ``limit`` characters, else its first ``limit``
    and :data:`CUT`."""
    return text if len(text) <= limit else text[:limit] + CUT


def meta(posture: Posture, value: object, limit: int = META_MAX) -> str | None:
    """A vendor string for a ``metadata`` field (see the module docstring);
    ``None`` unless ``value`` is a non-empty string. Redacted over a window
    of four times ``limit`` before the cut (a secret across the cut is
    still seen whole)."""
    if not isinstance(value, str) or not value:
        return None
    return clip(redact_text(value[: 4 * limit], posture.policy), limit)


def fit(em: Emission, limit: int = EVENT_MAX) -> tuple[Emission, int | None]:
    """``(em, None)`` when its encoded ``data`` is at most ``limit`` bytes;
    else ``(a copy without its largest data members, the original size)``,
    the members left out named in ``data["x-truncated"]``."""
    data = em.get("data")
    if not isinstance(data, dict):
        return em, None
    size = _size(data)
    if size <= limit:
        return em, None
    sizes = {k: _size(v) for k, v in data.items()}
    kept = dict(data)
    dropped: list[str] = []
    left = size
    for k in sorted(sizes, key=lambda k: -sizes[k]):
        if left <= limit // 2:
            break
        del kept[k]
        dropped.append(k)
        left -= sizes[k]
    kept[TRUNCATED] = {"bytes": size, "omitted": sorted(dropped)}
    out: Emission = {**em, "data": kept}
    return out, size


def _size(value: Any) -> int:
    """Bytes of ``value`` on the wire (the encoder's, or near it for what
    the encoder refuses: a lone surrogate, a NaN)."""
    try:
        return len(aep.dumps(value))
    except (ValueError, TypeError):  # UnicodeEncodeError is a ValueError
        return len(json.dumps(value, ensure_ascii=False, default=str)
                   .encode("utf-8", "surrogatepass"))
