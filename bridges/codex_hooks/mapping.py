"""Codex hook moments -> AEP emissions (AEP-0002 Annex A.2). Pure.

Identity (pin ``identity``, mappings/codex.json): ``session_id`` (the Codex
thread) is the AEP session, ``turn_id`` the AEP run. Per event:

=====================  ====================================================
``SessionStart``       ``session.started``; ``SessionEnd`` ``session.ended``
``UserPromptSubmit``   ``run.started`` (trigger user, prompt: content)
``Stop``               ``run.finished``
``Interrupt``          ``run.cancelled`` (by user): the nearest core type
``PreToolUse``         ``tool.requested``
``PostToolUse``        ``tool.completed`` (a failed command too: no split)
``PermissionRequest``  ``attention.requested`` permission
``Subagent*``          ``delegation.subagent.started`` / ``.stopped``
``PreCompact``         nothing; ``PostCompact`` ``session.compacted``
``Pre/PostModelRequest`` ``x.codex.session.*`` (the model plane stays
                       vendor-namespaced, debug; model id at metadata)
others                 ``x.codex.session.<snake>`` (pin ``fallback``)
=====================  ====================================================
"""
from __future__ import annotations

from typing import Any

from bridges.core.bridge import Emission
from bridges.core.posture import Posture
from bridges.hooks_common.bounds import meta
from bridges.hooks_common.handlers import CORE, Handler, dispatch
from bridges.hooks_common.mapping import fallback, permission_ask

__all__ = ["AGENT", "TABLE", "USAGE", "gate_ask", "map_hook"]

AGENT = "codex"


def gate_ask(m: dict[str, Any], posture: Posture) -> Emission:
    """The held ``PreToolUse`` gate's ask."""
    return permission_ask(posture, m)


USAGE = {"input_tokens": "gen_ai.usage.input_tokens", "output_tokens": "gen_ai.usage.output_tokens"}


def _model_plane(m: dict[str, Any], posture: Posture) -> list[Emission]:
    # 0.171.0: {kind, request_id, attempt_number, model}; Post adds status, error,
    # token_usage: the structural ones ride at metadata, never the error text
    data: dict[str, Any] = {}
    if model := meta(posture, m.get("model")):
        data["gen_ai.request.model"] = model
    for k in ("kind", "status", "attempt_number"):
        v = m.get(k)
        if isinstance(v, str):
            if (t := meta(posture, v)) is not None:
                data[k] = t
        elif isinstance(v, int) and not isinstance(v, bool):
            data[k] = v
    usage = m.get("token_usage")
    if isinstance(usage, dict):
        for k, name in USAGE.items():
            v = usage.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                data[name] = v
    return [fallback(posture, str(m.get("hook_event_name")), data, severity="debug")]


TABLE: dict[str, Handler] = {
    **CORE,  # the family's moments (hooks_common.handlers): SessionEnd's reason is normal
    "Interrupt": lambda m, p: [{"type": "run.cancelled", "data": {"by": "user"}}],
    "PreModelRequest": _model_plane,
    "PostModelRequest": _model_plane,
}
"""Codex's events: the family's (:data:`bridges.hooks_common.handlers.CORE`)
where the annex agrees, plus its own."""


def map_hook(m: dict[str, Any], posture: Posture) -> list[Emission]:
    """One Codex hook moment -> its emissions. Never raises for a JSON object."""
    return dispatch(TABLE, m, posture)
