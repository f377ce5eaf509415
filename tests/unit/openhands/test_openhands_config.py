"""The OpenHands bridge's configuration, table-driven
(``testdata/config/*.json``), plus the shape rules."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridges.openhands import config
from tests.support.configcases import cases, check, viewed
from tests.support.recording import RecordingEnv

HERE = Path(__file__).parent / "testdata" / "config"


@pytest.mark.parametrize("case", cases(HERE))
def test_openhands_config_case(case):
    check(case, viewed(config.from_env, "control_open"))


def test_the_metadata_names_every_setting_the_code_reads():
    env = RecordingEnv({"HOME": "/h"})
    config.from_env(env)
    own = {s.name for s in config.SETTINGS}
    assert {n for n in env.read if n.startswith("AEP_")} == own | {"AEP_TOKEN", "AEP_STATE_DIR"}


def test_config_is_frozen_typed_and_keeps_secrets_out_of_repr():
    cfg = config.OpenHandsConfig(key="k-secret-1", token="tok-secret")
    assert "k-secret-1" not in repr(cfg) and "tok-secret" not in repr(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.control = True  # type: ignore[misc]
    with pytest.raises(TypeError, match="poll"):
        config.OpenHandsConfig(poll="15")  # type: ignore[arg-type]
    assert [s.name for s in config.SETTINGS if s.secret] == ["AEP_OPENHANDS_SESSION_API_KEY"]
