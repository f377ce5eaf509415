"""Claude Code hook moments -> AEP emissions (AEP-0002 Annex A.1). Pure.

:func:`map_hook` ``(moment, posture) -> [emission]`` in the pins' shape;
posture ``primary`` always (the hook channel is the core-type authority for
Claude Code). Per event (the README's decision table says why for each):

=====================  ====================================================
``SessionStart``       ``session.started`` (client, trigger, model, cwd)
``SessionEnd``         ``session.ended`` (reason)
``UserPromptSubmit``   ``run.started`` (trigger user, prompt: content)
``Stop``               ``run.finished``; ``StopFailure`` ``run.failed``
``PreToolUse``         ``tool.requested`` (args: content)
``PostToolUse``        ``tool.completed``; ``PostToolUseFailure`` ``tool.failed``
``PermissionRequest``  ``attention.requested`` permission (``AskUserQuestion``: form)
``PermissionDenied``   ``tool.denied`` (by policy: the auto-mode classifier)
``Notification``       by ``notification_type``: ``permission_prompt`` and
                       ``elicitation_dialog`` nothing (the first-class hooks
                       carry them); ``idle_prompt`` ``agent.idle``; others
                       ``progress.status``
``Subagent*``          ``delegation.subagent.started`` / ``.stopped``
``PreCompact``         nothing; ``PostCompact`` ``session.compacted``
``TaskCreated``        ``progress.task.planned``; ``TaskCompleted`` ``.completed``
``TeammateIdle``       ``agent.idle``
``Elicitation``        ``attention.requested`` form (MCP schema)
``ElicitationResult``  nothing here (settles the open form, in the hub)
others                 ``x.claude-code.session.<snake>`` (the annex fallback)
=====================  ====================================================

``transcript_path`` is never read.
"""
from __future__ import annotations

from typing import Any

from bridges.core.bridge import Emission
from bridges.core.posture import Posture
from bridges.hooks_common.bounds import meta
from bridges.hooks_common.forms import questions_form, schema_form
from bridges.hooks_common.handlers import CORE, Handler, dispatch, duration, kept, nothing
from bridges.hooks_common.mapping import fallback, obj, permission_ask, s, tool_emission

__all__ = ["AGENT", "END_REASONS", "FALLBACK_KEEP", "Handler", "QUESTION_TOOL",
           "SUPPRESSED_NOTICES", "TABLE", "gate_ask", "map_hook"]

AGENT = "claude-code"
QUESTION_TOOL = "AskUserQuestion"
SUPPRESSED_NOTICES = frozenset({"permission_prompt", "elicitation_dialog"})
END_REASONS = {"clear": "normal", "logout": "normal", "prompt_input_exit": "normal",
               "other": "normal", "resume": "normal"}
# structural fields kept on the fallback types (names of things, never content)
FALLBACK_KEEP = ("source", "trigger", "reason", "change_type", "event", "load_reason",
                 "memory_type", "agent_type", "notification_type", "command_name",
                 "command_source", "expansion_type", "message_id", "index", "final")


def _notification(m: dict[str, Any], posture: Posture) -> list[Emission]:
    kind = s(m.get("notification_type")) or ""
    if kind in SUPPRESSED_NOTICES:
        return []
    if kind == "idle_prompt":
        return [{"type": "agent.idle", "data": {"reason": "idle_prompt"}}]
    data: dict[str, Any] = {"phase": meta(posture, kind) or "notification"}
    if s(m.get("message")):
        data["message"] = m["message"]
    return [{"type": "progress.status", "data": data}]


def _tool_failed(m: dict[str, Any], posture: Posture) -> Emission:
    err: dict[str, Any] = {"type": "interrupted" if m.get("is_interrupt") is True else "tool_error"}
    if s(m.get("error")):
        err["message"] = m["error"]
    return tool_emission("tool.failed", m, posture, error=err, **duration(m))


def _task(m: dict[str, Any], posture: Posture, done: bool) -> Emission:
    task: dict[str, Any] = {}
    if tid := meta(posture, m.get("task_id")):
        task["id"] = tid
    if s(m.get("task_subject")):
        task["title"] = m["task_subject"]
    data: dict[str, Any] = {"task": task}
    if done:
        data["status"] = "completed"
    return {"type": "progress.task.completed" if done else "progress.task.planned", "data": data}


def gate_ask(m: dict[str, Any], posture: Posture) -> Emission:
    """The held ``PreToolUse`` gate's ask: a permission for the tool call."""
    return permission_ask(posture, m)


def _run_failed(m: dict[str, Any], posture: Posture) -> list[Emission]:
    # 2.1.197: ``error`` is the category ("unknown", "rate_limit"...), the
    # API error text rides in ``last_assistant_message`` (content)
    err = m.get("error")
    reason = meta(posture, obj(err).get("type") if isinstance(err, dict) else err) or "error"
    e: dict[str, Any] = {"type": reason}
    text = s(obj(err).get("message")) or s(m.get("last_assistant_message"))
    if text:
        e["message"] = text
    return [{"type": "run.failed", "data": {"reason": reason, "error": e}}]


def _permission(m: dict[str, Any], posture: Posture) -> list[Emission]:
    if m.get("tool_name") == QUESTION_TOOL:
        return [questions_form(posture, m.get("tool_input"))]
    return [permission_ask(posture, m)]


def _elicitation(m: dict[str, Any], posture: Posture) -> list[Emission]:
    return [schema_form(posture, m.get("message"),
                        m.get("requested_schema") or m.get("requestedSchema"),
                        meta(posture, m.get("mcp_server_name")))]


def _display(m: dict[str, Any], posture: Posture) -> list[Emission]:
    # model text streamed to the screen (2.1.197: ``delta``, ``index``, ``final``):
    # content (gated), debug (per chunk)
    data = kept(m, FALLBACK_KEEP, posture)
    text = s(m.get("delta")) or s(m.get("text"))
    if text:
        data["delta"] = text
    return [fallback(posture, "MessageDisplay", data, severity="debug",
                     gating={"levels": {"delta": "redacted"}})]


def _expansion(m: dict[str, Any], posture: Posture) -> list[Emission]:
    data = {"prompt": m["prompt"]} if s(m.get("prompt")) else {}
    return [fallback(posture, "UserPromptExpansion", {**kept(m, FALLBACK_KEEP, posture), **data},
                     gating={"levels": {"prompt": "redacted"}})]


TABLE: dict[str, Handler] = {
    **CORE,  # the family's moments (hooks_common.handlers): Claude Code names them
    "SessionEnd": lambda m, p: [{"type": "session.ended",
                                 "data": {"reason": END_REASONS.get(str(m.get("reason")), "normal")}}],
    "StopFailure": _run_failed,
    "PostToolUseFailure": lambda m, p: [_tool_failed(m, p)],
    "PermissionRequest": _permission,
    "PermissionDenied": lambda m, p: [tool_emission("tool.denied", m, p, by="policy")],
    "Notification": _notification,
    "TaskCreated": lambda m, p: [_task(m, p, False)],
    "TaskCompleted": lambda m, p: [_task(m, p, True)],
    "TeammateIdle": lambda m, p: [{"type": "agent.idle", "data": {"reason": "teammate_idle"}}],
    "Elicitation": _elicitation,
    "ElicitationResult": nothing,  # settles the open form (the hub), no event of its own
    "MessageDisplay": _display,
    "UserPromptExpansion": _expansion,
}
"""Every event with a mapping of its own; the rest take the annex fallback."""


def map_hook(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """One Claude Code hook moment -> its emissions (see the module
    docstring). Never raises for a JSON object."""
    return dispatch(TABLE, m, posture, keep=FALLBACK_KEEP)
