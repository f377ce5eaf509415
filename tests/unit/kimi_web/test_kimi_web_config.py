"""The Kimi web bridge's configuration, table-driven
(``testdata/config/*.json``), plus the shape rules."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridges.kimi_web import config
from tests.support.configcases import cases, check, viewed
from tests.support.recording import RecordingEnv

HERE = Path(__file__).parent / "testdata" / "config"


@pytest.mark.parametrize("case", cases(HERE))
def test_kimi_web_config_case(case):
    check(case, viewed(config.from_env, "control_open"))


def test_the_metadata_names_every_setting_the_code_reads():
    env = RecordingEnv({"HOME": "/h"})
    config.from_env(env)
    own = {s.name for s in config.SETTINGS}
    assert {n for n in env.read if n.startswith(("AEP_", "KIMI_"))} == own | {"AEP_TOKEN", "AEP_STATE_DIR"}


def test_config_is_frozen_typed_and_keeps_the_token_out_of_repr():
    cfg = config.KimiWebConfig(home=Path("/h"), token="tok-secret")
    assert "tok-secret" not in repr(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.control = True  # type: ignore[misc]
    with pytest.raises(TypeError, match="guard_ms"):
        config.KimiWebConfig(home=Path("/h"), guard_ms="8000")  # type: ignore[arg-type]
    assert [s.name for s in config.SETTINGS if s.secret] == ["AEP_KIMI_WEB_TOKEN"]
