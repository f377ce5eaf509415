"""The AG-UI bridge's settings, table-driven (good and bad environments as
data), its capability block and the fleet wiring."""
from __future__ import annotations

import pytest

from bridges.agui import AguiBridge, from_env
from bridges.agui.config import SETTINGS, AguiConfig
from bridges.agui.config import from_env as config_from_env
from supervisor.config import FLEET, KNOWN_SETTINGS, load

UP = "http://127.0.0.1:8000"

GOOD = [
    ({"AEP_AGUI_UPSTREAM": UP}, AguiConfig(upstream=UP)),
    ({"AEP_AGUI_UPSTREAM": UP + "/agent/"}, AguiConfig(upstream=UP + "/agent")),
    ({"AEP_AGUI_UPSTREAM": "https://agent.example", "AEP_AGUI_LISTEN": "0.0.0.0:9000",
      "AEP_AGUI_DELTAS": "1", "AEP_AGENT_NAME": "my-agent", "AEP_AGUI_MAX_EVENT": "2048"},
     AguiConfig(upstream="https://agent.example", listen=("0.0.0.0", 9000), deltas=True,
                agent="my-agent", max_event=2048)),
    ({"AEP_AGUI_UPSTREAM": UP, "AEP_AGUI_LISTEN": "[::1]:8790"},
     AguiConfig(upstream=UP, listen=("::1", 8790))),
]

BAD = [
    ({}, "AEP_AGUI_UPSTREAM: not set"),
    ({"AEP_AGUI_UPSTREAM": "  "}, "AEP_AGUI_UPSTREAM: not set"),
    ({"AEP_AGUI_UPSTREAM": "127.0.0.1:8000"}, "AEP_AGUI_UPSTREAM='127.0.0.1:8000': expected http(s)"),
    ({"AEP_AGUI_UPSTREAM": UP + "?key=x"}, "no query or fragment"),
    ({"AEP_AGUI_UPSTREAM": UP, "AEP_AGUI_LISTEN": "8790"}, "AEP_AGUI_LISTEN='8790': expected host:port"),
    ({"AEP_AGUI_UPSTREAM": UP, "AEP_AGUI_DELTAS": "maybe"}, "AEP_AGUI_DELTAS='maybe': expected 1 or 0"),
    ({"AEP_AGUI_UPSTREAM": UP, "AEP_AGUI_MAX_EVENT": "10"}, "AEP_AGUI_MAX_EVENT=10: expected bytes"),
]


@pytest.mark.parametrize("env, want", GOOD)
def test_good_environments(env, want):
    assert config_from_env(env) == (want, [])


@pytest.mark.parametrize("env, problem", BAD)
def test_bad_environments_are_one_clear_line_each(env, problem):
    _, problems = config_from_env(env)
    assert len(problems) == 1 and problem in problems[0], problems


def test_every_setting_is_known_to_the_supervisor_and_documented():
    assert {s.name for s in SETTINGS} <= KNOWN_SETTINGS
    spec = next(s for s in FLEET if s.key == "agui")
    assert (spec.flag, spec.default, spec.factory) == ("AEP_BRIDGE_AGUI", False,
                                                        "bridges.agui:from_env")


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


def test_the_readme_knob_table_is_the_settings_metadata():
    from bridges.core.settings import render_table
    from tests.support.daemon import ROOT
    assert render_table(SETTINGS) in (ROOT / "README.md").read_text()
