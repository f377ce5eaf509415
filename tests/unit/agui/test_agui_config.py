"""The AG-UI bridge's settings, table-driven (good and bad environments as
data), its capability block and the fleet wiring."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bridges.agui import AguiBridge, from_env
from bridges.agui.config import SETTINGS, AguiConfig
from bridges.agui.config import from_env as config_from_env
from supervisor.config import FLEET, known_settings, load
from tests.support.configcases import cases, check
from tests.support.recording import RecordingEnv

UP = "http://127.0.0.1:8000"
HERE = Path(__file__).parent / "testdata" / "config"


@pytest.mark.parametrize("case", cases(HERE))
def test_agui_config_case(case):
    check(case, config_from_env)


def test_the_metadata_names_every_setting_the_code_reads():
    env = RecordingEnv({"HOME": "/h"})
    config_from_env(env)
    assert {n for n in env.read if n.startswith("AEP_")} == {s.name for s in SETTINGS}


def test_config_is_frozen_and_typed():
    cfg = AguiConfig(upstream=UP)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.deltas = True  # type: ignore[misc]
    with pytest.raises(TypeError, match="max_event"):
        AguiConfig(max_event="8")  # type: ignore[arg-type]
    assert not [s for s in SETTINGS if s.secret]


def test_every_setting_is_known_to_the_supervisor_and_documented():
    assert {s.name for s in SETTINGS} | {"AEP_BRIDGE_AGUI"} <= known_settings()
    spec = next(s for s in FLEET if s.key == "agui")
    assert (spec.flag, spec.default, spec.factory, spec.settings) == (
        "AEP_BRIDGE_AGUI", False, "bridges.agui:from_env", "bridges.agui.config:SETTINGS")


def test_enabled_without_upstream_is_refused_before_anything_binds():
    from supervisor.daemon import build_bridges
    cfg, problems = load({"AEP_BRIDGE_AGUI": "1", "AEP_BRIDGE_OTLP_IN": "0"}, check_ports=False)
    assert problems == [] and [s.key for s in cfg.enabled] == ["agui"]
    bridges, problems = build_bridges(cfg, check_ports=False)
    assert [b.name for b in bridges] == ["agui"]
    assert problems == ["AEP_AGUI_UPSTREAM: not set; the AG-UI bridge needs the agent server's "
                        "base URL (e.g. http://127.0.0.1:8000)"]


def test_read_only_capabilities_and_agent_name():
    b = from_env({"AEP_AGUI_UPSTREAM": UP})
    assert isinstance(b, AguiBridge) and (b.name, b.agent) == ("agui", "agui")
    caps = b.capabilities()
    assert caps["control"]["accepts"] == []
    assert caps["capture"] == ["none", "metadata"]
    assert b.listeners() == {"http": ("127.0.0.1", 8790)}
    assert from_env({"AEP_AGUI_UPSTREAM": UP, "AEP_AGENT_NAME": "crew"}).agent == "crew"


def test_preflight_reports_a_taken_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        b = from_env({"AEP_AGUI_UPSTREAM": UP, "AEP_AGUI_LISTEN": f"127.0.0.1:{port}"})
        assert b.preflight() == [f"AEP_AGUI_LISTEN=127.0.0.1:{port}: address in use or not bindable"]
        assert b.preflight(check_ports=False) == []

