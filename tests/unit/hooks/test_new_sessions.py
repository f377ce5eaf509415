"""The hook family's new-session bucket (issue 25): a moment of a session
the run has not seen, past ``AEP_<AGENT>_NEW_SESSIONS_PER_S`` (bursts of
``BURST_S`` seconds of it), is not logged, answered with no decision and
counted ``sessions_refused``; live or spooled; known sessions always pass.
Trio's ``mock_clock`` holds time still, so the bucket refills only when the
test jumps it."""
from __future__ import annotations

import trio

from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.core.limits import BURST_S
from bridges.hooks_common.config import HookConfig
from tests.support.hooks import Rig

RATE = 1
BURST = RATE * BURST_S


def m(event: str, session: str, **kw: object) -> dict:
    return {"hook_event_name": event, "session_id": session, "cwd": "/w", **kw}


async def test_new_sessions_past_the_bucket_are_refused_and_known_ones_pass(mock_clock):
    rig = Rig(CLAUDE, HookConfig(new_sessions_per_s=RATE))
    async with trio.open_nursery() as n:
        await rig.start(n)
        assert (await rig.post(m("SessionStart", "known")))[0::2] == (200, {})
        for i in range(20):  # 20 new sessions at one instant: BURST - 1 tokens are left
            status, _, reply = await rig.post(m("UserPromptSubmit", f"new-{i}", prompt="x"))
            assert (status, reply) == (200, {})  # refused or not: no decision, the agent goes on
        refused = 20 - (BURST - 1)
        assert rig.ctx.health.counters["sessions_refused"] == refused
        # a known session is never refused, the bucket empty or not
        for _ in range(3):
            assert (await rig.post(m("UserPromptSubmit", "known", prompt="y")))[0::2] == (200, {})
        # a spooled moment goes through the same rule; a refused hook id is not remembered
        spooled = {"X-AEP-Hook-Spooled": "1", "X-AEP-Hook-Id": "b" * 32}
        await rig.post(m("UserPromptSubmit", "late", prompt="z"), headers=spooled)
        assert rig.ctx.health.counters["sessions_refused"] == refused + 1
        mock_clock.jump(1.0 / RATE)  # one token back
        await rig.post(m("UserPromptSubmit", "late", prompt="z"), headers=spooled)
        assert rig.ctx.health.counters["hooks_duplicate"] == 0
        await rig.post(m("UserPromptSubmit", "later", prompt="z"))
        n.cancel_scope.cancel()
    counters = rig.ctx.health.counters
    assert counters["sessions_refused"] == refused + 2
    sessions = {e["session"] for e in rig.events()}
    assert sessions == {"known", "late", *(f"new-{i}" for i in range(BURST - 1))}
    assert len(rig.of("run.started")) == 3 + (BURST - 1) + 1  # known's 3 prompts, new-*, late
