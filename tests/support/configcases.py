"""Table-driven configuration tests (issue 7), in the style of the
OpenTelemetry Collector's ``testdata/``: each case is one JSON file beside
the tests of the part it configures (``tests/unit/<part>/testdata/config/``)::

    {
      "about": "what the case shows (one line)",
      "env": {"AEP_...": "..."},            # the whole environment
      "config": {"field": expected, ...},    # fields of the resulting config
      "problems": ["exact problem line", ...],   # in order; [] for a good env
      "warnings": ["..."]                   # optional (core only)
    }

``config`` lists only the fields the case is about (JSON forms: a ``Path``
is its string, a tuple a list, a dataclass a dict). Expected problem lines
are the exact operator-facing text: they are the contract (DESIGN.md "one
clear line per problem")."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import pytest


def cases(directory: Path) -> list[Any]:
    """One ``pytest.param`` per ``*.json`` in ``directory`` (id = file stem)."""
    files = sorted(directory.glob("*.json"))
    assert files, f"no config cases in {directory}"
    return [pytest.param(json.loads(f.read_text()), id=f.stem) for f in files]


def plain(value: Any) -> Any:
    """``value`` in its JSON form (for comparing with a case's ``config``)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def check(case: dict[str, Any], from_env: Callable[[dict[str, str]], tuple[Any, list[str]]]
          ) -> Any:
    """Run ``from_env`` on the case's environment; assert its config fields
    and problem lines. Returns the config."""
    cfg, problems = from_env(dict(case["env"]))
    assert problems == case["problems"], case.get("about")
    got = {k: plain(getattr(cfg, k)) for k in case["config"]}
    assert got == case["config"], case.get("about")
    return cfg


class ConfigView:
    """A frozen config with some of its derived properties (``control_open``)
    exposed as plain attributes, so a case file can expect them like fields."""

    def __init__(self, cfg: Any, props: tuple[str, ...]) -> None:
        self._cfg = cfg
        for name in props:
            setattr(self, name, getattr(cfg, name))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


def viewed(from_env: Callable[[Any], tuple[Any, list[str]]], *props: str
           ) -> Callable[[Any], tuple[ConfigView, list[str]]]:
    """``from_env`` with its config wrapped in a :class:`ConfigView`."""
    def read(env: Any) -> tuple[ConfigView, list[str]]:
        cfg, problems = from_env(env)
        return ConfigView(cfg, props), problems
    return read
