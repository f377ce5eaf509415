"""What one hook moment may put into events (issue 25, the fifth outside
attack, ``/tmp/attack5``): the form caps and their answer path, the
backstop on one event's size, the nesting bound before mapping, a hook id
remembered only once its moment went out, and every vendor string at
``metadata`` redacted and bounded."""
from __future__ import annotations

import dataclasses
import json

import pytest
import trio

from bridges.claude_code.mapping import map_hook as claude_map
from bridges.claude_code.profile import PROFILE as CLAUDE
from bridges.codex_hooks.mapping import map_hook as codex_map
from bridges.core.capture import CapturePolicy
from bridges.core.posture import Posture
from bridges.hooks_common import bounds, forms
from bridges.hooks_common.config import HookConfig
from tests.support.hooks import Rig
from tests.unit.hooks.test_hub import OPEN, S, finish, held, m

TOKEN = "ghp_" + "a" * 36
RELAY_DEPTH = 64  # supervisor/relay/envelope.py MAX_DATA_DEPTH: data deeper is refused


def depth(v: object) -> int:
    stack, most = [(v, 1)], 0
    while stack:
        x, d = stack.pop()
        most = max(most, d)
        kids = x.values() if isinstance(x, dict) else x if isinstance(x, list) else ()
        stack.extend((c, d + 1) for c in kids if isinstance(c, (dict, list)))
    return most


def elicitation(props: dict, **kw) -> dict:
    return m("Elicitation", mcp_server_name="mcp", message="pick",
             requested_schema={"type": "object", "properties": props, **kw})


async def test_a_huge_enum_is_carried_bounded_and_an_answer_past_the_cap_is_refused():
    n_values = 100_000
    enum = [f"v{i}" for i in range(n_values)]
    prop = {"type": "string", "title": "T" * 5000, "enum": enum,
            "enumNames": ["N" * 5000] * 100}
    rig = Rig(CLAUDE, OPEN)
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, elicitation({"a": prop}, required=["a"]))
        (field,) = ask["data"]["fields"]
        assert [c["id"] for c in field["choices"]] == enum[:forms.CHOICES_MAX]
        assert field["x-truncated"] == {"choices": n_values}
        assert len(json.dumps(ask)) < 64 * 1024
        beyond = await rig.command("control.attention.respond", S,
                                   {"answer": {"values": {"a": enum[-1]}}},
                                   subject=ask["id"], cid="beyond")
        assert beyond["type"] == "control.rejected" and beyond["data"]["reason"] == "invalid"
        assert "r" not in box  # still pending: answerable with a carried value
        ok = await rig.command("control.attention.respond", S,
                               {"answer": {"values": {"a": "v3"}}}, subject=ask["id"], cid="ok")
        assert ok["type"] == "control.accepted"
        _, _, reply = await finish(box)
        assert reply["hookSpecificOutput"]["content"] == {"a": "v3"}
        n.cancel_scope.cancel()


def test_labels_and_the_prompt_are_cut_and_marked():
    posture = Posture(agent="claude-code", mode="primary", policy=CapturePolicy(),
                      answerable=True)
    em = forms.schema_form(posture, "M" * 10_000,
                           {"properties": {"a": {"title": "T" * 5000, "enum": ["x"],
                                                 "enumNames": ["N" * 5000]}}})
    (f,) = em["data"]["fields"]
    assert f["label"] == "T" * forms.LABEL_MAX + bounds.CUT
    assert f["choices"] == [{"id": "x", "label": "N" * forms.LABEL_MAX + bounds.CUT}]
    assert em["data"]["prompt"] == "M" * forms.PROMPT_MAX + bounds.CUT
    assert "x-truncated" not in f and "x-truncated" not in em["data"]


def test_an_id_too_long_or_changed_by_redaction_is_left_out_never_rewritten():
    posture = Posture(agent="claude-code", mode="primary", policy=CapturePolicy(),
                      answerable=True)
    em = forms.schema_form(posture, "m", {"properties": {
        "a": {"enum": ["ok", TOKEN, "z" * (forms.ID_MAX + 1)]}, TOKEN: {"type": "string"}}})
    (f,) = em["data"]["fields"]
    assert f["choices"] == [{"id": "ok", "label": "ok"}]
    assert f["x-truncated"] == {"choices": 3}
    assert em["data"]["x-truncated"] == {"fields": 2}
    assert em["data"]["respond_via"] == ["oob"]  # the field left out could not be answered
    assert TOKEN not in json.dumps(em)


async def test_a_form_with_fields_left_out_is_not_held_and_answers_in_the_agent():
    props = {f"f{i}": {"type": "string"} for i in range(forms.FIELDS_MAX + 10)}
    rig = Rig(CLAUDE, OPEN)
    async with trio.open_nursery() as n:
        await rig.start(n)
        status, _, reply = await rig.post(elicitation(props))
        assert (status, reply) == (200, {})
        (ask,) = rig.of("attention.requested")
        assert len(ask["data"]["fields"]) == forms.FIELDS_MAX
        assert ask["data"]["x-truncated"] == {"fields": forms.FIELDS_MAX + 10}
        assert ask["data"]["respond_via"] == ["oob"]
        ack = await rig.command("control.attention.respond", S,
                                {"answer": {"values": {"f0": "x"}}}, subject=ask["id"])
        assert ack["type"] == "control.rejected"
        n.cancel_scope.cancel()
    assert rig.ctx.health.counters["hooks_held"] == 0


async def test_ask_user_question_answers_with_the_vendors_own_uncut_label():
    long = "L" * (forms.LABEL_MAX + 100)
    qs = {"questions": [{"question": "Which?", "header": "H", "multiSelect": False,
                         "options": [{"label": "short"}, {"label": long}]}]}
    rig = Rig(CLAUDE, OPEN)
    async with trio.open_nursery() as n:
        rig.nursery = n
        await rig.start(n)
        box, ask = await held(rig, m("PermissionRequest", tool_name="AskUserQuestion",
                                     tool_input=qs))
        label = ask["data"]["fields"][0]["choices"][1]["label"]
        assert label == "L" * forms.LABEL_MAX + bounds.CUT
        ok = await rig.command("control.attention.respond", S,
                               {"answer": {"values": {"1": "2"}}}, subject=ask["id"])
        assert ok["type"] == "control.accepted"
        _, _, reply = await finish(box)
        assert reply["hookSpecificOutput"]["decision"]["updatedInput"]["answers"] == \
            {"Which?": long}
        n.cancel_scope.cancel()


def test_an_emission_over_the_event_bound_loses_its_largest_members():
    em = {"type": "tool.completed", "data": {"tool": {"name": "Read"}, "result": "x" * 5000,
                                             "duration_ms": 3}}
    out, size = bounds.fit(em, limit=1000)
    assert size is not None and size > 5000
    assert out["data"] == {"tool": {"name": "Read"}, "duration_ms": 3,
                           "x-truncated": {"bytes": size, "omitted": ["result"]}}
    assert bounds.fit(em) == (em, None)


async def test_a_spooled_moment_over_the_event_bound_goes_out_degraded_and_counted():
    rig = Rig(CLAUDE, HookConfig())
    big = "y" * (bounds.EVENT_MAX + 10)  # a spool line may be 32 MiB; a POST body 4
    async with trio.open_nursery() as n:
        run = await rig.start(n)
        await run.hub.handle(m("PostToolUse", tool_name="Read", tool_use_id="t",
                               tool_input={}, tool_response=big), spooled=True)
        n.cancel_scope.cancel()
    (done,) = rig.of("tool.completed")
    assert done["data"]["x-truncated"]["omitted"] == ["result"]
    assert len(json.dumps(done)) < 4096
    assert rig.ctx.health.counters["hooks_event_oversize"] == 1


async def test_a_moment_nested_600_deep_maps_within_the_relays_depth_and_is_counted():
    raw = ('{"hook_event_name":"PostToolUse","session_id":"%s","tool_name":"Read",'
           '"tool_use_id":"t3","tool_input":{},"tool_response":%s}'
           % (S, "[" * 600 + "]" * 600)).encode()  # the attack's 980 is too deep for pytest's stack
    rig = Rig(CLAUDE, HookConfig(), CapturePolicy(ceiling="full"))
    async with trio.open_nursery() as n:
        await rig.start(n)
        status, _, reply = await rig.post(None, raw=raw)
        n.cancel_scope.cancel()
    assert (status, reply) == (200, {})
    (done,) = rig.of("tool.completed")
    assert depth(done["data"]) <= RELAY_DEPTH
    assert bounds.DEEP in json.dumps(done["data"])
    assert rig.ctx.health.counters["hooks_too_deep"] == 1


async def test_a_failed_mapping_is_a_counted_500_and_the_spooled_copy_gets_through():
    calls = {"n": 0}

    def flaky(moment, posture):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RecursionError("the first attempt fails")
        return CLAUDE.map_hook(moment, posture)

    rig = Rig(dataclasses.replace(CLAUDE, map_hook=flaky), HookConfig())
    hid = {"X-AEP-Hook-Id": "b" * 32}
    async with trio.open_nursery() as n:
        await rig.start(n)
        status, _, reply = await rig.post(m("PostCompact", trigger="auto"), headers=hid)
        assert status == 500 and "error" in reply
        status, _, _ = await rig.post(m("PostCompact", trigger="auto"),
                                      headers={**hid, "X-AEP-Hook-Spooled": "1"})
        assert status == 200
        status, _, _ = await rig.post(m("PostCompact", trigger="auto"), headers=hid)
        n.cancel_scope.cancel()
    assert rig.types() == ["session.compacted"]  # the spooled copy; the third is a repeat
    counters = rig.ctx.health.counters
    assert (counters["hooks_map_failed"], counters["hooks_duplicate"]) == (1, 1)


def _policy() -> Posture:
    return Posture(agent="claude-code", mode="primary", policy=CapturePolicy())


@pytest.mark.parametrize("moment, where", [
    ({"hook_event_name": "SessionStart", "source": TOKEN, "model": TOKEN},
     ("trigger", "gen_ai.request.model")),
    ({"hook_event_name": "PostCompact", "trigger": TOKEN}, ("trigger",)),
    ({"hook_event_name": "StopFailure", "error": TOKEN}, ("reason",)),
    ({"hook_event_name": "SubagentStart", "agent_id": TOKEN, "agent_type": TOKEN},
     ("agent_type",)),
    ({"hook_event_name": "ConfigChange", "command_name": TOKEN, "reason": TOKEN},
     ("command_name", "reason")),
    ({"hook_event_name": "Notification", "notification_type": TOKEN}, ("phase",)),
])
def test_vendor_strings_at_metadata_are_redacted(moment, where):
    posture = _policy()
    (em,) = claude_map({"session_id": "s", **moment}, posture)
    for k in where:
        assert em["data"][k] == "[REDACTED:secret]"
    assert TOKEN not in json.dumps(em)


def test_codex_model_plane_and_the_tool_subject_are_redacted():
    posture = Posture(agent="codex", mode="primary", policy=CapturePolicy())
    (em,) = codex_map({"hook_event_name": "PreModelRequest", "session_id": "s",
                       "model": TOKEN, "kind": TOKEN}, posture)
    assert TOKEN not in json.dumps(em)
    (tool,) = codex_map({"hook_event_name": "PreToolUse", "session_id": "s",
                         "tool_name": TOKEN, "tool_use_id": TOKEN}, posture)
    assert TOKEN not in json.dumps({k: tool[k] for k in ("subject", "type")}) \
        and TOKEN not in json.dumps(tool["data"]["tool"])


def test_vendor_strings_at_metadata_are_bounded_and_marked():
    long = "k" * 100_000
    (em,) = claude_map({"hook_event_name": "ConfigChange", "session_id": "s",
                        "command_name": long}, _policy())
    assert em["data"]["command_name"] == "k" * bounds.META_MAX + bounds.CUT
    (sub,) = claude_map({"hook_event_name": "SubagentStop", "session_id": "s",
                         "agent_id": long}, _policy())
    assert sub["subject"] == "k" * bounds.META_MAX + bounds.CUT


async def test_a_spool_line_whose_mapping_fails_is_counted_and_the_next_one_taken(tmp_path):
    def failing_compacts(moment, posture):
        if moment.get("hook_event_name") == "PostCompact":
            raise ValueError("a mapper bug")
        return CLAUDE.map_hook(moment, posture)

    def line(hid, payload):
        return json.dumps({"id": hid, "agent": "claude-code", "spooled_at_ms": 1,
                           "payload": {"session_id": "sp", **payload}}) + "\n"

    (tmp_path / "claude-code.jsonl").write_text(
        line("a" * 32, {"hook_event_name": "PostCompact"})
        + line("b" * 32, {"hook_event_name": "UserPromptSubmit"}))
    rig = Rig(dataclasses.replace(CLAUDE, map_hook=failing_compacts),
              HookConfig(spool_dir=tmp_path))
    async with trio.open_nursery() as n:
        await rig.start(n)
        for _ in range(5000):  # bounded: the sweep runs every 50 ms here
            if rig.ctx.health.counters.get("hooks_spooled_ingested"):
                break
            await trio.sleep(0.001)
        n.cancel_scope.cancel()
    assert rig.types() == ["run.started"]
    assert rig.ctx.health.counters["hooks_map_failed"] == 1
    assert not list(tmp_path.iterdir())
