"""Every real Claude Code 2.1.197 hook capture (``tests/fixtures/claude_code_real/``,
recorded by the live harness, one directory per scenario, the moments in
the order the vendor fired them) goes through the bridge (gate off):
every event schema-valid, never a transcript path, runs on the vendor's
``prompt_id``, tools paired, and the scenario's story as expected.

``HOOKS_REAL_DIR`` points elsewhere (the captures live in the ``cclive``
branch until merged); without captures the module skips, loudly."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bridges.claude_code.profile import PROFILE as CLAUDE
from tests.support.hooks import Rig, captured_moments, replay_capture
from tests.support.schema import validated

ROOT = Path(__file__).resolve().parents[3]
REAL = Path(os.environ.get("HOOKS_REAL_DIR") or ROOT / "tests" / "fixtures" / "claude_code_real")
SCENARIOS = sorted(p.name for p in REAL.iterdir() if p.is_dir()) if REAL.is_dir() else []
if not SCENARIOS:
    pytest.skip(f"no Claude Code captures at {REAL} (set HOOKS_REAL_DIR)", allow_module_level=True)

STORIES = {
    "print-bash": ["session.started", "run.started", "tool.requested", "tool.completed",
                   "x.claude-code.session.post_tool_batch", "x.claude-code.session.message_display",
                   "run.finished", "session.ended"],
    "print-bash-failure": ["session.started", "run.started", "tool.requested", "tool.failed",
                           "x.claude-code.session.post_tool_batch",
                           "x.claude-code.session.message_display", "run.finished", "session.ended"],
    "print-stop-failure": ["session.started", "run.started", "x.claude-code.session.message_display",
                           "run.failed", "session.ended"],
    "tui-permission": ["session.started", "run.started", "tool.requested", "attention.requested",
                       "attention.answered", "attention.resolved", "tool.completed",
                       "x.claude-code.session.post_tool_batch",
                       "x.claude-code.session.message_display", "run.finished", "session.ended"],
    "tui-ask-user-question": ["session.started", "run.started", "tool.requested",
                              "attention.requested", "attention.answered", "attention.resolved",
                              "tool.completed", "x.claude-code.session.post_tool_batch",
                              "x.claude-code.session.message_display", "run.finished",
                              "session.ended"],
}


def moments(scenario: str) -> list[dict]:
    return captured_moments(REAL, scenario)


async def replay(scenario: str) -> Rig:
    return await replay_capture(CLAUDE, REAL, scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_real_capture(scenario):
    rig = await replay(scenario)
    evs = validated(rig.events())
    assert all("transcript" not in json.dumps(e) and ".jsonl" not in json.dumps(e) for e in evs)
    assert rig.ctx.health.counters["stamp_errors"] == 0
    prompts = {m["prompt_id"] for m in moments(scenario) if m.get("hook_event_name") == "UserPromptSubmit"}
    assert {e["run"] for e in evs if e.get("run")} <= prompts
    by_id = {e["id"]: e for e in evs}
    for e in evs:
        if e["type"] in ("tool.completed", "tool.failed"):
            assert by_id[e["cause"]]["type"] == "tool.requested"
            assert isinstance(e["data"]["duration_ms"], int)
    if scenario in STORIES:
        assert [e["type"] for e in evs] == STORIES[scenario]


async def test_the_question_answered_in_the_tui_is_answered_oob_with_its_values():
    rig = await replay("tui-ask-user-question")
    ask = rig.of("attention.requested")[0]
    ans = rig.of("attention.answered")[0]
    assert ask["data"]["kind"] == "form"
    assert ans["data"] == {"answer": {"values": {"1": "1"}}, "via": "oob"}  # "Staging"
    assert ans["cause"] == ask["id"]
    assert rig.of("attention.resolved")[0]["data"]["resolution"] == "answered"


async def test_the_permission_prompt_notification_is_suppressed_and_the_ask_links_its_tool():
    rig = await replay("tui-permission")
    assert not rig.of("progress.status")
    req = rig.of("tool.requested")[0]
    assert rig.of("attention.requested")[0]["cause"] == req["id"]
