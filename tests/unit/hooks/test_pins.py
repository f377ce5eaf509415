"""Every pin of ``mappings/claude-code.json`` and ``mappings/codex.json``
reproduces exactly through the bridges' pure mappers and the stamper's
capture gate, read from ``shared/`` at test time. The pins' posture: the
reference adapters' (capture ``metadata``, ``attention.*`` at
``redacted``, asks answerable: ``respond_via: ["control"]``)."""
from __future__ import annotations

import pytest

from bridges.claude_code.mapping import map_hook as claude_map
from bridges.codex_hooks.mapping import map_hook as codex_map
from bridges.core import capture
from bridges.core.posture import Posture
from tests.support.shared import fixture


def gated(e: dict, policy: capture.CapturePolicy, agent: str) -> dict:
    hints = e.get("gating") or {}
    data, _ = capture.gate(e["type"], e.get("data"), policy.ceiling_for(e["type"]), policy,
                           agent=agent, subject=e.get("subject"),
                           form_fields=hints.get("form_fields"), levels=hints.get("levels"),
                           structural=hints.get("structural", ()))
    out = {"type": e["type"], "data": data or {}}
    if "subject" in e:
        out["subject"] = e["subject"]
    return out


def codex_pins() -> dict:
    f = fixture("mappings/codex.json")
    return {**f["hooks"], "fallback": f["fallback"]}


def test_every_codex_pin_is_here():
    assert len(codex_pins()) == 11


@pytest.mark.parametrize("name", sorted(codex_pins()))
def test_codex_pin(name):
    pin = codex_pins()[name]
    policy = capture.CapturePolicy()
    out = [gated(e, policy, "codex")
           for e in codex_map(pin["input"], Posture(agent="codex", mode="primary", policy=policy,
                                                    answerable=True))]
    expected = pin["expected"]
    if expected is None:
        assert out == []
    else:
        assert out == [{k: v for k, v in expected.items() if not k.startswith("$")}]


CLAUDE = ["ask_user_question", "elicitation"]


def claude_input(name: str) -> dict:
    pin = fixture("mappings/claude-code.json")[name]
    if name == "ask_user_question":
        return {"hook_event_name": "PermissionRequest", "session_id": "s",
                "tool_name": "AskUserQuestion", "tool_input": pin["input"]}
    return {"hook_event_name": "Elicitation", "session_id": "s", "message": pin["input"]["message"],
            "requested_schema": pin["input"]["requestedSchema"]}


@pytest.mark.parametrize("name", CLAUDE)
@pytest.mark.parametrize("ceiling", ["redacted", "metadata"])
def test_claude_code_pin(name, ceiling):
    pin = fixture("mappings/claude-code.json")[name]
    policy = capture.CapturePolicy.from_env({"AEP_CAPTURE_ATTENTION": ceiling}) \
        if ceiling == "metadata" else capture.CapturePolicy()
    assert policy.ceiling_for("attention.requested") == ceiling
    out = claude_map(claude_input(name), Posture(agent="claude-code", mode="primary",
                                                 policy=policy, answerable=True))
    assert len(out) == 1 and out[0]["type"] == "attention.requested"
    expected = pin["expected_data" if ceiling == "redacted" else "expected_data_metadata"]
    assert gated(out[0], policy, "claude-code")["data"] == expected


def test_claude_code_maps_the_codex_shared_hooks_like_the_codex_pins():
    """The moments the two vendors share map alike (the family's one
    shape), apart from the client name."""
    policy = capture.CapturePolicy()
    for name, pin in codex_pins().items():
        if name in ("fallback",):
            continue
        got = [gated(e, policy, "claude-code")
               for e in claude_map(pin["input"], Posture(agent="claude-code", mode="primary",
                                                         policy=policy, answerable=True))]
        exp = pin["expected"]
        if exp is None:
            assert got == []
            continue
        exp = {k: v for k, v in exp.items() if not k.startswith("$")}
        if exp["type"] == "session.started":
            exp["data"]["client"] = {"name": "claude-code"}
        assert got == [exp], name


@pytest.mark.parametrize("spelling", ["requestedSchema", "requested_schema"])
def test_the_elicitation_pin_in_both_spellings_with_the_real_extras(spelling):
    """The pin names the schema ``requestedSchema`` (the MCP wire name);
    Claude Code 2.1.197 sends ``requested_schema`` and adds
    ``mcp_server_name`` and ``mode: "form"``
    (``tests/fixtures/claude_code_real/print-elicitation``): both map to the
    pin's form, the server as the subject."""
    pin = fixture("mappings/claude-code.json")["elicitation"]
    moment = {"hook_event_name": "Elicitation", "session_id": "s", "mode": "form",
              "mcp_server_name": "deploy", "message": pin["input"]["message"],
              spelling: pin["input"]["requestedSchema"]}
    policy = capture.CapturePolicy()
    (out,) = claude_map(moment, Posture(agent="claude-code", mode="primary", policy=policy,
                                        answerable=True))
    assert out.get("subject") == "deploy"
    assert gated(out, policy, "claude-code")["data"] == pin["expected_data"]
