"""Every real Codex 0.171.0 hook capture (``tests/fixtures/codex_hooks_real/``,
``codex exec`` offline, one directory per scenario, moments in the order
the hooks started) through the Codex hook bridge: schema-valid, the
vendor's ``turn_id`` as the run, tools paired, no transcript path, and the
stories (a ``PermissionRequest`` settled by what Codex did next: its
``tool_input`` has the ``description`` its ``PreToolUse``/``PostToolUse``
lack). ``CODEX_HOOKS_REAL_DIR`` points elsewhere; without captures the
module skips, loudly."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridges.codex_hooks.profile import PROFILE as CODEX
from tests.support.hooks import Rig, captured_moments, replay_capture
from tests.support.schema import validated

ROOT = Path(__file__).resolve().parents[3]
REAL = Path(os.environ.get("CODEX_HOOKS_REAL_DIR") or ROOT / "tests" / "fixtures" / "codex_hooks_real")
SCENARIOS = sorted(p.name for p in REAL.iterdir() if p.is_dir()) if REAL.is_dir() else []
if not SCENARIOS:
    pytest.skip(f"no Codex hook captures at {REAL} (set CODEX_HOOKS_REAL_DIR)",
                allow_module_level=True)

MODEL = "x.codex.session.pre_model_request"
POST = "x.codex.session.post_model_request"
STORIES = {
    "exec-shell": ["session.started", "run.started", MODEL, POST, "tool.requested",
                   "tool.completed", MODEL, POST, "run.finished"],
    "exec-permission-allow": ["session.started", "run.started", MODEL, POST, "tool.requested",
                              "attention.requested", "attention.answered", "attention.resolved",
                              "tool.completed", MODEL, POST, "run.finished"],
    "exec-permission-deny": ["session.started", "run.started", MODEL, POST, "tool.requested",
                             "attention.requested", MODEL, POST, "attention.resolved",
                             "run.finished"],
}


def moments(scenario: str) -> list[dict]:
    return captured_moments(REAL, scenario)


async def replay(scenario: str) -> Rig:
    return await replay_capture(CODEX, REAL, scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_real_codex_capture(scenario):
    rig = await replay(scenario)
    evs = validated(rig.events())
    assert all("transcript" not in json.dumps(e) and "rollout" not in json.dumps(e) for e in evs)
    turns = {m["turn_id"] for m in moments(scenario) if m.get("turn_id")}
    assert {e["run"] for e in evs if e.get("run")} <= turns
    for e in evs:
        if e["type"] == "tool.completed":
            assert {x["id"]: x for x in evs}[e["cause"]]["type"] == "tool.requested"
    if scenario in STORIES:
        ends = ["session.ended"] if any(m["hook_event_name"] == "SessionEnd"
                                        for m in moments(scenario)) else []
        assert [e["type"] for e in evs] == STORIES[scenario] + ends


async def test_the_permission_request_links_its_tool_and_is_answered_by_the_tool_running():
    rig = await replay("exec-permission-allow")
    req, ask = rig.of("tool.requested")[0], rig.of("attention.requested")[0]
    assert ask["cause"] == req["id"] and ask["data"]["respond_via"] == ["oob"]
    ans = rig.of("attention.answered")[0]
    assert ans["data"] == {"answer": {"option": "allow"}, "via": "oob"}


async def test_the_model_plane_carries_the_token_counts():
    rig = await replay("exec-shell")
    post = rig.of(POST)[0]
    assert post["severity"] == "debug"
    assert isinstance(post["data"]["gen_ai.usage.input_tokens"], int)
    assert post["data"]["gen_ai.request.model"] == "mock-codex-model"
