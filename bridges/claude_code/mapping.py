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

from typing import Any, Callable

from bridges.core.bridge import Emission
from bridges.core.posture import Posture
from bridges.hooks_common.forms import questions_form, schema_form
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


def _session_started(m: dict[str, Any], posture: Posture) -> list[Emission]:
    data: dict[str, Any] = {"client": {"name": posture.agent}}
    if s(m.get("source")):
        data["trigger"] = m["source"]
    if s(m.get("model")):
        data["gen_ai.request.model"] = m["model"]
    if s(m.get("cwd")):
        data["cwd"] = m["cwd"]
    return [{"type": "session.started", "data": data}]


def _notification(m: dict[str, Any], posture: Posture) -> list[Emission]:
    kind = s(m.get("notification_type")) or ""
    if kind in SUPPRESSED_NOTICES:
        return []
    if kind == "idle_prompt":
        return [{"type": "agent.idle", "data": {"reason": "idle_prompt"}}]
    data: dict[str, Any] = {"phase": kind or "notification"}
    if s(m.get("message")):
        data["message"] = m["message"]
    return [{"type": "progress.status", "data": data}]


def _tool_failed(m: dict[str, Any]) -> Emission:
    err: dict[str, Any] = {"type": "interrupted" if m.get("is_interrupt") is True else "tool_error"}
    if s(m.get("error")):
        err["message"] = m["error"]
    return tool_emission("tool.failed", m, error=err, **_duration(m))


def _task(m: dict[str, Any], done: bool) -> Emission:
    task: dict[str, Any] = {}
    if s(m.get("task_id")):
        task["id"] = m["task_id"]
    if s(m.get("task_subject")):
        task["title"] = m["task_subject"]
    data: dict[str, Any] = {"task": task}
    if done:
        data["status"] = "completed"
    return {"type": "progress.task.completed" if done else "progress.task.planned", "data": data}


def _kept(m: dict[str, Any]) -> dict[str, Any]:
    return {k: m[k] for k in FALLBACK_KEEP if isinstance(m.get(k), (str, int, bool))}


def gate_ask(m: dict[str, Any], posture: Posture) -> Emission:
    """The held ``PreToolUse`` gate's ask: a permission for the tool call."""
    return permission_ask(posture, m)


def _run_failed(m: dict[str, Any], posture: Posture) -> list[Emission]:
    # 2.1.197: ``error`` is the category ("unknown", "rate_limit"...), the
    # API error text rides in ``last_assistant_message`` (content)
    err = m.get("error")
    reason = (s(obj(err).get("type")) if isinstance(err, dict) else s(err)) or "error"
    e: dict[str, Any] = {"type": reason}
    text = s(obj(err).get("message")) or s(m.get("last_assistant_message"))
    if text:
        e["message"] = text
    return [{"type": "run.failed", "data": {"reason": reason, "error": e}}]


def _permission(m: dict[str, Any], posture: Posture) -> list[Emission]:
    if m.get("tool_name") == QUESTION_TOOL:
        return [questions_form(posture, m.get("tool_input"))]
    return [permission_ask(posture, m)]


def _prompt(m: dict[str, Any], posture: Posture) -> list[Emission]:
    data: dict[str, Any] = {"trigger": "user"}
    if s(m.get("prompt")):
        data["prompt"] = m["prompt"]
    return [{"type": "run.started", "data": data}]


def _stop(m: dict[str, Any], posture: Posture) -> list[Emission]:
    fin: dict[str, Any] = {}
    if s(m.get("last_assistant_message")):
        fin["summary"] = m["last_assistant_message"]
    return [{"type": "run.finished", "data": fin}]


def _duration(m: dict[str, Any]) -> dict[str, Any]:
    d = m.get("duration_ms")
    return {"duration_ms": d} if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else {}


def _completed(m: dict[str, Any], posture: Posture) -> list[Emission]:
    resp = m.get("tool_response")
    return [tool_emission("tool.completed", m, **_duration(m),
                          result=resp if isinstance(resp, (dict, str)) else {"value": resp})]


def _subagent(m: dict[str, Any], posture: Posture) -> list[Emission]:
    start = m.get("hook_event_name") == "SubagentStart"
    data = {"agent_type": m["agent_type"]} if start and s(m.get("agent_type")) else {}
    return [{"type": "delegation.subagent.started" if start else "delegation.subagent.stopped",
             "data": data, "subject": s(m.get("agent_id")) or "subagent"}]


def _compacted(m: dict[str, Any], posture: Posture) -> list[Emission]:
    return [{"type": "session.compacted",
             "data": {"trigger": m["trigger"]} if s(m.get("trigger")) else {}}]


def _elicitation(m: dict[str, Any], posture: Posture) -> list[Emission]:
    return [schema_form(posture, m.get("message"),
                        m.get("requested_schema") or m.get("requestedSchema"),
                        s(m.get("mcp_server_name")))]


def _display(m: dict[str, Any], posture: Posture) -> list[Emission]:
    # model text streamed to the screen (2.1.197: ``delta``, ``index``, ``final``):
    # content (gated), debug (per chunk)
    data = _kept(m)
    text = s(m.get("delta")) or s(m.get("text"))
    if text:
        data["delta"] = text
    return [fallback(posture, "MessageDisplay", data, severity="debug",
                     gating={"levels": {"delta": "redacted"}})]


def _expansion(m: dict[str, Any], posture: Posture) -> list[Emission]:
    data = {"prompt": m["prompt"]} if s(m.get("prompt")) else {}
    return [fallback(posture, "UserPromptExpansion", {**_kept(m), **data},
                     gating={"levels": {"prompt": "redacted"}})]


def _nothing(m: dict[str, Any], posture: Posture) -> list[Emission]:
    return []


Handler = Callable[[dict[str, Any], Posture], list[Emission]]

TABLE: dict[str, Handler] = {
    "SessionStart": _session_started,
    "SessionEnd": lambda m, p: [{"type": "session.ended",
                                 "data": {"reason": END_REASONS.get(str(m.get("reason")), "normal")}}],
    "UserPromptSubmit": _prompt,
    "Stop": _stop,
    "StopFailure": _run_failed,
    "PreToolUse": lambda m, p: [tool_emission("tool.requested", m, args=obj(m.get("tool_input")))],
    "PostToolUse": _completed,
    "PostToolUseFailure": lambda m, p: [_tool_failed(m)],
    "PermissionRequest": _permission,
    "PermissionDenied": lambda m, p: [tool_emission("tool.denied", m, by="policy")],
    "Notification": _notification,
    "SubagentStart": _subagent,
    "SubagentStop": _subagent,
    "PreCompact": _nothing,  # the documented deviation: compaction is said once, at PostCompact
    "PostCompact": _compacted,
    "TaskCreated": lambda m, p: [_task(m, False)],
    "TaskCompleted": lambda m, p: [_task(m, True)],
    "TeammateIdle": lambda m, p: [{"type": "agent.idle", "data": {"reason": "teammate_idle"}}],
    "Elicitation": _elicitation,
    "ElicitationResult": _nothing,  # settles the open form (the hub), no event of its own
    "MessageDisplay": _display,
    "UserPromptExpansion": _expansion,
}
"""Every event with a mapping of its own; the rest take the annex fallback."""


def map_hook(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """One Claude Code hook moment -> its emissions (see the module
    docstring). Never raises for a JSON object."""
    ev = s(m.get("hook_event_name")) or ""
    handler = TABLE.get(ev)
    if handler is None:
        return [fallback(posture, ev, _kept(m))]
    return handler(m, posture)
