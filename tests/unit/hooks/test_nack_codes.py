"""A late command to an ask that is no longer open says why in a
``metadata`` member (issue 27's trial, finding 2): ``control.rejected``
carries ``code`` (``answered-oob``, ``timed-out``, ``unknown-request``...)
beside the capture-gated ``detail``, also once the bridge forgot the ask."""
from __future__ import annotations

import pytest
import trio

from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.core.control import Refuse
from bridges.hooks_common.config import HookConfig
from tests.support.hooks import Rig
from tests.unit.hooks.test_hub import BASH, OPEN, S, finish, held, hung_up, m


def test_a_nack_code_is_a_short_token():
    assert Refuse("refused", code="answered-oob").code == "answered-oob"
    for bad in ("Answered", "x" * 33, "a b", "", "-x"):
        with pytest.raises(ValueError):
            Refuse("refused", code=bad)


async def test_late_commands_say_why_at_metadata_capture():
    rig = Rig(CLAUDE, OPEN)
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        ask = await hung_up(rig, m("PermissionRequest", **BASH))
        await rig.post(m("PostToolUse", tool_use_id="x", tool_response="ok", **BASH))
        await rig.wait_for("attention.resolved")
        late = await rig.command("control.attention.respond", S, {"answer": {"option": "deny"}},
                                 subject=ask["id"], cid="c1")
        assert late["data"] == {"reason": "refused", "code": "answered-oob"}  # no detail at metadata
        # a new ask of the session forgets the closed one: the code stays
        box2, ask2 = await held(rig, m("PermissionRequest", tool_name="Bash",
                                       tool_input={"command": "pwd"}))
        gone = await rig.command("control.attention.respond", S, {"answer": {"option": "deny"}},
                                 subject=ask["id"], cid="c2")
        assert gone["data"]["code"] == "answered-oob"
        unknown = await rig.command("control.attention.respond", S, {"answer": {"option": "deny"}},
                                    subject="01NOSUCHASK", cid="c3")
        assert unknown["data"]["code"] == "unknown-request"
        ok = await rig.command("control.attention.respond", S, {"answer": {"option": "allow"}},
                               subject=ask2["id"], cid="c4")
        assert ok["type"] == "control.accepted"
        await finish(box2)
        twice = await rig.command("control.attention.respond", S, {"answer": {"option": "deny"}},
                                  subject=ask2["id"], cid="c5")
        assert twice["data"]["code"] == "answered"
        n.cancel_scope.cancel()


async def test_a_late_command_after_the_hold_timed_out_says_so():
    rig = Rig(CLAUDE, HookConfig(control=True, aep_token=True, hold_s=0.05))
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, m("PermissionRequest", **BASH))
        await finish(box)
        await rig.wait_for("attention.timeout")
        late = await rig.command("control.attention.respond", S, {"answer": {"option": "allow"}},
                                 subject=ask["id"])
        assert late["data"]["code"] == "timed-out"
        n.cancel_scope.cancel()
