"""Validate AEP events against ``shared/aep/schemas/`` (JSON Schema 2020-12).

The validator is the shipped one, :mod:`supervisor.tools.validate`
(``aep-bridges validate``), pointed at the protocol's own schemas in
``../shared`` (the ground truth), not at the package's copy; it reads
capture honesty from the schemas' ``x-aep-capture`` annotations,
independent of the daemon's own table in :mod:`bridges.core.captable`.

- :func:`validate_event`: one envelope, its payload when the type is
  registered, capture honesty. Raises ``AssertionError`` with every problem.
- :func:`validate_stream`: every event, then the cross-event rules the
  invalid corpus (``conformance/fixtures/invalid/cases.json``) pins.
- :func:`validated`: both, returning the events.

Compiled validators are cached per process; schemas are read once.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Iterable

from jsonschema import Draft202012Validator

from supervisor.tools.validate import Schemas, _label

from .shared import aep_dir


@lru_cache(maxsize=1)
def _shared() -> Schemas:
    return Schemas(aep_dir() / "schemas")


def registered_types() -> dict[str, dict[str, Any]]:
    """``schemas/registry/types.json`` entries by type."""
    return _shared().registered_types


def _validator(name: str) -> Draft202012Validator:
    return _shared().validator(name)


def type_schema(type_: str) -> dict[str, Any] | None:
    """The payload schema of a registered type, else ``None``."""
    return _shared().type_schema(type_)


def capture_problems(type_: str, data: Any, capture: str) -> list[str]:
    """Fields of ``data`` whose ``x-aep-capture`` annotation (read from the
    type's schema) exceeds ``capture``."""
    return _shared().capture_problems(type_, data, capture)


def event_problems(ev: Any) -> list[str]:
    """Every problem :func:`validate_event` would report (empty: valid)."""
    return _shared().event_problems(ev)


def stream_problems(events: Iterable[Any]) -> list[str]:
    """Every problem :func:`validate_stream` would report."""
    return _shared().stream_problems(events)


def validate_event(ev: Any) -> None:
    """Assert ``ev`` is a valid AEP 0.1 event (see the module docstring).
    Raises ``AssertionError`` listing every problem."""
    problems = event_problems(ev)
    if problems:
        raise AssertionError(f"invalid AEP event ({_label(ev)}):\n  " + "\n  ".join(problems)
                             + f"\n  event: {json.dumps(ev, default=str)[:2000]}")


def validate_stream(events: Iterable[Any]) -> None:
    """Assert a sequence of events is valid one by one AND together (see
    the module docstring). Raises ``AssertionError`` listing every
    problem."""
    problems = stream_problems(events)
    if problems:
        raise AssertionError("invalid AEP stream:\n  " + "\n  ".join(problems))


def validated(events: Iterable[Any]) -> list[Any]:
    """:func:`validate_event` on each event (its message shows the event),
    then :func:`validate_stream` on them together; returns them as a list,
    e.g. ``evs = validated(stream.of(session))``."""
    evs = list(events)
    for ev in evs:
        validate_event(ev)
    validate_stream(evs)
    return evs
