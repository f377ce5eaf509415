"""Codex (agent ``codex``) on the hook family: its
:class:`~bridges.hooks_common.profile.HookProfile`.

Codex 0.171.0: command hooks only (the shim), 14 events; ``turn_id`` is the
AEP run (no synthesis); ``PermissionRequest`` (TUI with ``on-request``, or
``exec --approve-for-me``) takes Claude Code's decision shape; a held
``PreToolUse`` can deny (``permissionDecision: deny`` + reason) and an
allow is no decision (Codex's own flow goes on). No tool-failure hook: a
failed command is ``tool.completed`` too. Steering: ``additionalContext``
on ``SessionStart``, ``SubagentStart``, ``PreToolUse``, ``PostToolUse``,
``UserPromptSubmit`` (``docs/control-steering-design.md``).
"""
from __future__ import annotations

from typing import Any

from bridges.hooks_common.answers import Decision
from bridges.hooks_common.profile import HookProfile, Moment, claude_reply

from . import mapping

__all__ = ["PROFILE", "reply"]


def reply(moment: Moment, decision: Decision) -> dict[str, Any]:
    """Claude Code's shape, except that an allowed ``PreToolUse`` is no
    decision (``{}``): Codex documents the gate's deny, not an allow."""
    if moment.get("hook_event_name") == "PreToolUse" and decision.option == "allow":
        return {}
    return claude_reply(moment, decision)


PROFILE = HookProfile(
    key="codex_hooks", agent=mapping.AGENT, env="CODEX_HOOKS", title="the Codex hook bridge",
    pins="mappings/codex.json", map_hook=mapping.map_hook, gate_ask=mapping.gate_ask,
    run_field="turn_id", run_closes=frozenset({"Stop", "Interrupt"}),
    tool_post=frozenset({"PostToolUse"}), tool_done=frozenset({"PostToolUse"}),
    tool_denied=frozenset(), reply=reply,
    context_events=frozenset({"SessionStart", "SubagentStart", "PreToolUse", "PostToolUse",
                              "UserPromptSubmit"}),
    vendor_timeout_s={"SessionEnd": 1.0, "Interrupt": 1.0},
)
