"""Tenth outside attack on issue 25, finding 8: hook session ids had no
length limit (1 MiB ids stamped on every event, past the relay's own
envelope bound of 4,096: refused upstream, health red). A session id over
:data:`SESSION_ID_MAX` characters is now the session ``"#"`` + its digest,
the same for every moment of that id."""
from __future__ import annotations

import trio

from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.hooks_common.config import HookConfig
from bridges.hooks_common.session import SESSION_ID_MAX
from tests.support.hooks import Rig


async def test_a_1_mib_session_id_becomes_a_short_stable_one():
    huge, other = "s" * (1 << 20), "s" * ((1 << 20) - 1) + "t"
    ok = "o" * SESSION_ID_MAX
    rig = Rig(CLAUDE, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        for sid in (huge, other, huge, ok):
            await rig.post({"hook_event_name": "UserPromptSubmit", "session_id": sid,
                            "prompt": "hi"})
        await rig.post({"hook_event_name": "Stop", "session_id": huge})
        n.cancel_scope.cancel()
    events = rig.events()
    assert events and all(len(e["session"]) <= SESSION_ID_MAX for e in events)
    started = [e["session"] for e in events if e["type"] == "run.started"]
    a, b, a2, kept = started
    assert a == a2 != b and a.startswith("#") and kept == ok
    finished = [e for e in events if e["type"] == "run.finished"]
    assert [e["session"] for e in finished] == [a]  # the same session closed its run
