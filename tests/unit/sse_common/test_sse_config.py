"""The SSE family's configuration, table-driven (``testdata/config/*.json``,
each naming its profile's bridge), plus the shape rules: frozen, typed,
secrets out of ``repr``, and the metadata covers every name the code reads."""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from bridges.opencode_sse import PROFILE as OC
from bridges.sse_common.config import SseConfig, settings
from tests.support.configcases import cases, check
from tests.support.recording import RecordingEnv

HERE = Path(__file__).parent / "testdata" / "config"
BRIDGES = ("opencode_sse", "kilocode_sse")


class View:
    def __init__(self, cfg: SseConfig) -> None:
        self.cfg = cfg
        self.control_honored = cfg.control_honored

    def __getattr__(self, name: str):
        return getattr(self.cfg, name)


@pytest.mark.parametrize("case", cases(HERE))
def test_sse_config_case(case):
    mod = importlib.import_module(f"bridges.{case['bridge']}.config")

    def from_env(env):
        cfg, problems = mod.from_env(env)
        return View(cfg), problems
    check(case, from_env)


@pytest.mark.parametrize("bridge", BRIDGES)
def test_the_metadata_names_every_setting_the_code_reads(bridge):
    mod = importlib.import_module(f"bridges.{bridge}.config")
    env = RecordingEnv({"HOME": "/h"})
    mod.from_env(env)
    own = {s.name for s in mod.SETTINGS}
    shared = {"AEP_TOKEN", "AEP_STATE_DIR"}  # core settings every bridge honors
    assert {n for n in env.read if n.startswith("AEP_")} == own | shared
    prefix = importlib.import_module(f"bridges.{bridge}").PROFILE.env
    assert all(n.startswith(prefix + "_") for n in own)


def test_config_is_frozen_typed_and_keeps_secrets_out_of_repr():
    cfg = SseConfig.defaults(OC, password="hunter2-secret", token="tok-secret")
    assert "hunter2" not in repr(cfg) and "tok-secret" not in repr(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.primary = True  # type: ignore[misc]
    with pytest.raises(TypeError, match="guard_ms"):
        SseConfig.defaults(OC, guard_ms="8000")
    with pytest.raises(TypeError, match="primary"):
        SseConfig.defaults(OC, primary="1")


def test_the_two_profiles_share_one_readme_table():
    from bridges.kilocode_sse import PROFILE as KILO
    a, b = settings(OC), settings(KILO)
    assert [s.meaning for s in a] == [s.meaning for s in b]
    assert [s.name.removeprefix("AEP_OPENCODE") for s in a] == \
        [s.name.removeprefix("AEP_KILOCODE") for s in b]
    assert [s.name for s in a if s.secret] == ["AEP_OPENCODE_PASSWORD"]
