"""Tolerant readers for untrusted vendor JSON, written once for every pure
mapper (DESIGN.md "Pure mapping modules"; a vendor frame is never trusted to
have the shape its protocol promises, and a mapper never raises on garbage).

Each returns the value when it has the asked JSON shape, else an empty or
``None`` stand-in, so a mapper can read ``obj(frame).get("x")`` without a
guard per level."""
from __future__ import annotations

from typing import Any

__all__ = ["arr", "obj", "text", "whole"]


def text(v: object) -> str | None:
    """``v`` when it is a non-empty string, else ``None``."""
    return v if isinstance(v, str) and v else None


def obj(v: object) -> dict[str, Any]:
    """``v`` when it is a JSON object, else ``{}``."""
    return v if isinstance(v, dict) else {}


def arr(v: object) -> list[Any]:
    """``v`` when it is a JSON array, else ``[]``."""
    return v if isinstance(v, list) else []


def whole(v: object) -> int | None:
    """``v`` when it is an integer (a JSON ``true`` is not), else ``None``."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None
