"""Claude Code (agent ``claude-code``) on the hook family: its
:class:`~bridges.hooks_common.profile.HookProfile`, and its form replies.

Claude Code 2.1.197: 30 hook events; ``type: "http"`` hooks POST the JSON
to ``/hooks/claude-code`` (not run for ``SessionStart`` and ``Setup``: the
installer puts the command shim there); in print mode ``PermissionRequest``
never fires, so the only gate there is the held ``PreToolUse``
(``AEP_CLAUDE_CODE_GATE_TOOLS``). Runs are synthesized per prompt (no turn
id). Steering rides ``additionalContext`` on the moments that take it.
"""
from __future__ import annotations

from typing import Any

from bridges.hooks_common.answers import Decision
from bridges.hooks_common.forms import answered_values, question_answers, question_fields
from bridges.hooks_common.profile import HookProfile, Moment, claude_reply

from . import mapping

__all__ = ["PROFILE", "reply"]


def reply(moment: Moment, decision: Decision) -> dict[str, Any]:
    """The decision JSON: a permission or gate answer
    (:func:`~bridges.hooks_common.profile.claude_reply`); an
    ``AskUserQuestion`` form -> ``allow`` with ``updatedInput: {questions,
    answers}`` (the vendor's own dialog is skipped); an ``Elicitation``
    form -> ``{action: accept, content: values}``."""
    event = moment.get("hook_event_name")
    if decision.values is not None and event == "Elicitation":
        return {"hookSpecificOutput": {"hookEventName": "Elicitation", "action": "accept",
                                       "content": decision.values}}
    if decision.values is not None:
        tool_input = moment.get("tool_input")
        answers = question_answers(tool_input, question_fields(tool_input), decision.values)
        updated = dict(tool_input) if isinstance(tool_input, dict) else {}
        updated["answers"] = answers
        return {"hookSpecificOutput": {"hookEventName": str(event),
                                       "decision": {"behavior": "allow",
                                                    "updatedInput": updated}}}
    return claude_reply(moment, decision)


PROFILE = HookProfile(
    key="claude_code", agent=mapping.AGENT, env="CLAUDE_CODE", title="the Claude Code hook bridge",
    pins="mappings/claude-code.json", map_hook=mapping.map_hook, gate_ask=mapping.gate_ask,
    form_events=frozenset({"Elicitation"}), form_results=frozenset({"ElicitationResult"}),
    reply=reply, form_answer=answered_values, run_field="prompt_id",
    context_events=frozenset({"SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse",
                              "PostToolUseFailure", "SubagentStart"}),
    vendor_timeout_s={"UserPromptSubmit": 30.0, "SessionEnd": 1.5},
)
