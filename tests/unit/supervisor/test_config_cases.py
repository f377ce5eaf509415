"""The daemon's core configuration, table-driven: every case in
``testdata/config/*.json`` is an environment with the config fields and the
exact problem lines it must produce (``tests/support/configcases.py``)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from supervisor import config
from tests.support.configcases import cases, check, plain

HERE = Path(__file__).parent / "testdata" / "config"


class View:
    """The loaded config as the cases name it: the fields, plus ``enabled``
    as bridge keys and ``ceiling`` (the capture policy's)."""

    def __init__(self, cfg: config.Config) -> None:
        self.cfg = cfg
        self.enabled = [s.key for s in cfg.enabled]
        self.ceiling = cfg.policy.ceiling

    def __getattr__(self, name: str):
        return getattr(self.cfg, name)


@pytest.mark.parametrize("case", cases(HERE))
def test_core_config_case(case):
    def load(env):
        cfg, problems = config.load(env, relay_only=case.get("relay_only", False),
                                    check_ports=False)
        return View(cfg), problems
    view = check(case, load)
    if "warnings" in case:
        assert list(view.cfg.warnings) == case["warnings"]


def test_config_is_frozen_and_typed():
    cfg, _ = config.load({"HOME": "/h"}, check_ports=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.buffer = 5  # type: ignore[misc]
    with pytest.raises(TypeError, match="buffer"):
        config.Config(buffer="lots")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_from"):
        config.Config(max_from=True)  # type: ignore[arg-type]
    assert plain(config.Config(max_from=None).max_from) is None


def test_the_token_never_shows_in_the_repr():
    cfg, _ = config.load({"HOME": "/h", "AEP_TOKEN": "s3cret-token-value"}, check_ports=False)
    assert "s3cret-token-value" not in repr(cfg)
