"""The hook family's shared event handlers (AEP-0002 Annex A.1/A.2). Pure.

A vendor's mapper is a table ``{event name: Handler}`` and :func:`dispatch`.
The handlers here read the fields the Claude Code contract names
(``tool_name``, ``tool_use_id``, ``tool_input``, ``prompt``...), which
Codex, Qwen Code and the other Claude Code-shaped vendors share; a vendor
takes the ones its events match from :data:`CORE` (under its own event
names when they differ) and writes only what is its own::

    TABLE = {**{k: CORE[k] for k in ("SessionStart", "PreToolUse", "Stop")},
             "BeforeAgent": CORE["UserPromptSubmit"],   # another name, same moment
             "Interrupt": lambda m, p: [{"type": "run.cancelled", "data": {"by": "user"}}]}

    def map_hook(m, posture):
        return dispatch(TABLE, m, posture)

Each handler is ``(moment, posture) -> [Emission]`` in the pins' shape,
never raises for a JSON object and never reads ``transcript_path``.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from bridges.core.bridge import Emission
from bridges.core.posture import Posture
from bridges.hooks_common.bounds import meta
from bridges.hooks_common.mapping import fallback, obj, permission_ask, s, tool_emission

__all__ = ["CORE", "Handler", "compacted", "dispatch", "duration", "kept", "nothing",
           "permission", "run_finished", "run_started", "session_ended", "session_started",
           "subagent", "tool_completed", "tool_requested"]

Handler = Callable[[dict[str, Any], Posture], list[Emission]]
"""``(moment, posture) -> [emission]``: one event's mapping."""


def kept(m: dict[str, Any], keys: Iterable[str], posture: Posture) -> dict[str, Any]:
    """The scalar fields of ``m`` named in ``keys`` (structural ones: names
    of things, never content), for a fallback type's ``data``; strings
    through :func:`~.bounds.meta` (redacted, bounded)."""
    out: dict[str, Any] = {}
    for k in keys:
        v = m.get(k)
        if isinstance(v, str):
            if (t := meta(posture, v)) is not None:
                out[k] = t
        elif isinstance(v, (int, bool)):
            out[k] = v
    return out


def duration(m: dict[str, Any]) -> dict[str, Any]:
    """``{"duration_ms": n}`` when the moment has a non-negative integer one."""
    d = m.get("duration_ms")
    return {"duration_ms": d} if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else {}


def session_started(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``session.started``: client, trigger (``source``), model, cwd."""
    data: dict[str, Any] = {"client": {"name": posture.agent}}
    if trigger := meta(posture, m.get("source")):
        data["trigger"] = trigger
    if model := meta(posture, m.get("model")):
        data["gen_ai.request.model"] = model
    if s(m.get("cwd")):
        data["cwd"] = m["cwd"]
    return [{"type": "session.started", "data": data}]


def session_ended(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``session.ended`` reason ``normal`` (a vendor with reasons maps its own)."""
    return [{"type": "session.ended", "data": {"reason": "normal"}}]


def run_started(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``run.started`` trigger ``user``, ``prompt`` (content: gated)."""
    data: dict[str, Any] = {"trigger": "user"}
    if s(m.get("prompt")):
        data["prompt"] = m["prompt"]
    return [{"type": "run.started", "data": data}]


def run_finished(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``run.finished``, ``summary`` = ``last_assistant_message`` (content)."""
    fin: dict[str, Any] = {}
    if s(m.get("last_assistant_message")):
        fin["summary"] = m["last_assistant_message"]
    return [{"type": "run.finished", "data": fin}]


def tool_requested(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``tool.requested``, ``args`` = ``tool_input`` (content)."""
    return [tool_emission("tool.requested", m, posture, args=obj(m.get("tool_input")))]


def tool_completed(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``tool.completed``, ``result`` = ``tool_response`` (content), duration."""
    resp = m.get("tool_response")
    return [tool_emission("tool.completed", m, posture, **duration(m),
                          result=resp if isinstance(resp, (dict, str)) else {"value": resp})]


def permission(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``attention.requested`` ``kind: permission`` for the tool moment."""
    return [permission_ask(posture, m)]


def subagent(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``delegation.subagent.started`` (``SubagentStart``, with
    ``agent_type``) or ``.stopped``; subject ``agent_id``."""
    start = m.get("hook_event_name") == "SubagentStart"
    kind = meta(posture, m.get("agent_type")) if start else None
    return [{"type": "delegation.subagent.started" if start else "delegation.subagent.stopped",
             "data": {"agent_type": kind} if kind else {},
             "subject": meta(posture, m.get("agent_id")) or "subagent"}]


def compacted(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """``session.compacted`` (``trigger``): said once, after the compaction."""
    trigger = meta(posture, m.get("trigger"))
    return [{"type": "session.compacted", "data": {"trigger": trigger} if trigger else {}}]


def nothing(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """No emission (``PreCompact``: the documented deviation, compaction is
    said once at ``PostCompact``)."""
    return []


CORE: dict[str, Handler] = {
    "SessionStart": session_started,
    "SessionEnd": session_ended,
    "UserPromptSubmit": run_started,
    "Stop": run_finished,
    "PreToolUse": tool_requested,
    "PostToolUse": tool_completed,
    "PermissionRequest": permission,
    "SubagentStart": subagent,
    "SubagentStop": subagent,
    "PreCompact": nothing,
    "PostCompact": compacted,
}
"""The family's moments under their Claude Code names (the contract the
Claude Code-shaped vendors copy): take the ones a vendor has."""


def dispatch(table: dict[str, Handler], m: dict[str, Any], posture: Posture, *,
             event: str | None = None, keep: Iterable[str] = ()) -> list[Emission]:
    """The emissions of moment ``m`` by ``table[event]`` (default
    ``m["hook_event_name"]``; a vendor that names it elsewhere passes it);
    an event the table lacks takes the annex fallback
    ``x.<agent>.session.<snake>`` with the ``keep`` fields (:func:`kept`).
    Never raises for a JSON object."""
    ev = (event if event is not None else s(m.get("hook_event_name"))) or ""
    handler = table.get(ev)
    if handler is None:
        return [fallback(posture, ev, kept(m, keep, posture))]
    return handler(m, posture)
