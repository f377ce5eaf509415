"""The hook bridges' configuration, table-driven (``testdata/config/*.json``,
Claude Code's prefix; Codex's is the same code under ``AEP_CODEX_HOOKS_``),
plus the metadata rule and the FLEET registration."""
from __future__ import annotations

from pathlib import Path

import pytest

from bridges.claude_code import config as claude
from bridges.codex_hooks import config as codex
from supervisor.config import FLEET
from tests.support.configcases import cases, check, viewed
from tests.support.recording import RecordingEnv

HERE = Path(__file__).parent / "testdata" / "config"


@pytest.mark.parametrize("case", cases(HERE))
def test_claude_code_config_case(case):
    check(case, viewed(claude.from_env, "control_open"))


@pytest.mark.parametrize("mod", [claude, codex])
def test_the_metadata_names_every_setting_the_code_reads(mod):
    env = RecordingEnv({"HOME": "/h"})
    mod.from_env(env)
    own = {s.name for s in mod.SETTINGS}
    assert {n for n in env.read if n.startswith("AEP_")} == own | {"AEP_TOKEN", "AEP_STATE_DIR"}


def test_codex_names_its_own_knobs():
    assert [s.name for s in codex.SETTINGS] == ["AEP_CODEX_HOOKS_CONTROL", "AEP_CODEX_HOOKS_GATE_TOOLS",
                                                "AEP_CODEX_HOOKS_HOLD_S", "AEP_INSTRUCT",
                                                "AEP_CODEX_HOOKS_NEW_SESSIONS_PER_S"]
    cfg, problems = codex.from_env({"AEP_TOKEN": "t", "AEP_CODEX_HOOKS_CONTROL": "1",
                                    "AEP_CODEX_HOOKS_GATE_TOOLS": "*"})
    assert problems == [] and cfg.gated("shell") and cfg.gated("anything")


def test_both_bridges_are_in_the_fleet():
    specs = {s.key: s for s in FLEET}
    assert specs["claude_code"].flag == "AEP_BRIDGE_CLAUDE_CODE"
    assert specs["codex_hooks"].flag == "AEP_BRIDGE_CODEX_HOOKS"
    assert not specs["claude_code"].default and not specs["codex_hooks"].default


def test_with_the_codex_hook_bridge_the_otlp_codex_profile_is_companion():
    """Two channels, one agent (AEP-0002 Annex A.2): the hook bridge is the
    core-type authority, so the OTLP Codex profile drops to companion mode
    even with AEP_OTLP_PRIMARY=1; the VS Code profile is untouched."""
    from bridges.otlp_in import config as otlp
    env = {"AEP_OTLP_PRIMARY": "1", "AEP_OTLP_VENDOR": "codex,vscode",
           "AEP_OTLP_VSCODE_GRPC_LISTEN": "127.0.0.1:0", "AEP_OTLP_VSCODE_HTTP_LISTEN": "off"}
    alone, problems = otlp.from_env(env)
    assert problems == [] and [c.primary for c in alone] == [True, True]
    both, problems = otlp.from_env({**env, "AEP_BRIDGE_CODEX_HOOKS": "1"})
    assert problems == []
    assert [(c.vendor, c.primary, c.hook_channel) for c in both] == [
        ("codex", False, "AEP_BRIDGE_CODEX_HOOKS"), ("vscode", True, None)]
