"""Hypothesis: the pure mappers, the answer rule and the hub never raise on
garbage; every emission is a legal AEP type whose payload the stamper
takes; a form answer that passes the check is one the form accepts."""
from __future__ import annotations

import re

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.claude_code import mapping as claude
from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.codex_hooks import mapping as codex
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.ledger import Refuse
from bridges.core.posture import Posture
from bridges.hooks_common.answers import decide, form_error
from bridges.hooks_common.config import HookConfig
from tests.support.hooks import Rig

TYPE = re.compile(r"^(x\.[a-z0-9_-]+(\.[a-z0-9_]+)+|[a-z]+(\.[a-z_]+)+)$")
EVENTS = sorted(set(claude.TABLE) | set(codex.TABLE) | {"Setup", "CwdChanged", "WorktreeCreate"})

leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                 st.text(max_size=20))
value = st.recursive(leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                               st.dictionaries(st.text(max_size=10), c, max_size=4)),
                     max_leaves=20)
moment = st.fixed_dictionaries(
    {"hook_event_name": st.one_of(st.sampled_from(EVENTS), st.text(max_size=30), value)},
    optional={k: value for k in ("session_id", "turn_id", "tool_name", "tool_use_id", "tool_input",
                                 "tool_response", "prompt", "source", "model", "reason", "error",
                                 "notification_type", "message", "agent_id", "agent_type",
                                 "trigger", "requested_schema", "task_id", "task_subject", "text",
                                 "is_interrupt", "last_assistant_message", "cwd")})


@settings(max_examples=400, deadline=None)
@given(moment, st.sampled_from(["metadata", "redacted", "full"]), st.booleans())
def test_mappers_never_raise_and_emit_legal_types_the_stamper_takes(m, capture, answerable):
    policy = CapturePolicy(ceiling=capture)
    stamper = Stamper("claude-code", epoch=1, host="h", policy=policy)
    for mod, agent in ((claude, "claude-code"), (codex, "codex")):
        posture = Posture(agent=agent, mode="primary", policy=policy, answerable=answerable)
        for e in mod.map_hook(m, posture) + [mod.gate_ask(m, posture)]:
            assert TYPE.match(e["type"]), e
            assert not e["type"].startswith(f"x.{agent}.control.")
            stamper.stamp("s", e)


answer = st.one_of(value, st.fixed_dictionaries({}, optional={
    "option": st.one_of(st.sampled_from(["allow", "deny", "Allow"]), value),
    "text": st.one_of(st.sampled_from(["allow", " DENY ", "use rg"]), value),
    "values": st.one_of(st.dictionaries(st.sampled_from(["1", "2", "x"]), value, max_size=3),
                        value)}))
FIELDS = [{"id": "1", "type": "select", "required": True, "choices": [{"id": "a"}, {"id": "b"}]},
          {"id": "2", "type": "number", "required": False}]
OPTIONS = [{"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"}]


@settings(max_examples=400, deadline=None)
@given(answer)
def test_the_answer_rule_decides_or_refuses_and_free_text_never_allows(a):
    try:
        d = decide(a, OPTIONS, None)
    except Refuse as r:
        assert r.reason == "invalid"
    else:
        assert d.option in ("allow", "deny")
        if d.option == "allow":
            said = (a.get("option"), (a.get("text") or "").strip().lower() if isinstance(
                a.get("text"), str) else None)
            assert "allow" in said
    try:
        f = decide(a, None, FIELDS)
    except Refuse as r:
        assert r.reason == "invalid"
    else:
        assert f.values is not None and form_error(FIELDS, f.values) is None
        assert f.values["1"] in ("a", "b")


@settings(max_examples=40, deadline=None)
@given(st.lists(moment, max_size=8))
def test_the_hub_takes_any_sequence_of_moments(ms):
    async def main():
        rig = Rig(CLAUDE, HookConfig(instruct=True, aep_token=True))
        async with trio.open_nursery() as n:
            await rig.start(n)
            for m in ms:
                m = dict(m)
                if not isinstance(m.get("session_id"), str):
                    m["session_id"] = "s"
                status, _, reply = await rig.post(m)
                assert status == 200 and isinstance(reply, dict)
            n.cancel_scope.cancel()
        assert rig.ctx.health.counters.get("stamp_errors", 0) == 0
    trio.run(main)
