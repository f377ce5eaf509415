"""The committed ``tests/fixtures/claude_code_real/`` still describe the pinned Claude
Code: a few scenarios re-run live and compared on what a bridge depends on (which
events fire, how many times, and each event's top-level keys). When a Claude Code bump
changes this, the test fails: regenerate the fixtures
(``python -m tests.support.claude_code_captures``) and re-read their README's drift
section."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.support import claude_code as cc
from tests.support.claude_code_captures import SCENARIOS, run_scenario
from tests.support.system import require

pytestmark = pytest.mark.vendor

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "claude_code_real"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
BY_NAME = {s.name: s for s in SCENARIOS}


def _shape(pairs) -> tuple[Counter, dict[str, set[str]]]:
    counts: Counter = Counter()
    keys: dict[str, set[str]] = {}
    for event, body in pairs:
        counts[event] += 1
        keys.setdefault(event, set()).update(body)
    return counts, keys


def _fixture_shape(name: str):
    pairs = []
    for p in sorted((FIXTURES / name).glob("*.json")):
        pairs.append((p.stem.split("-", 1)[1], json.loads(p.read_text())))
    return _shape(pairs)


@pytest.fixture(scope="module")
def claude_bin() -> Path:
    return cc.claude_binary()


@pytest.mark.parametrize("name", ["print-bash", "print-bash-failure", "print-elicitation",
                                  "tui-permission"])
async def test_live_payloads_match_the_fixtures(claude_bin, tmp_path, name):
    sc = BY_NAME[name]
    tmux = require("tmux") if sc.tui else "tmux"
    cap = await run_scenario(claude_bin, tmp_path, sc, tmux=tmux)
    assert cap.mock is not None and not cap.mock.egress() and not cap.mock.problems
    live = _shape((h.event, h.body) for h in cap.hooked)
    assert Counter(MANIFEST["scenarios"][name]["events"]) == _fixture_shape(name)[0]
    assert live == _fixture_shape(name), (
        f"Claude Code's hook payloads changed for {name}: regenerate "
        "tests/fixtures/claude_code_real and re-read its README")
