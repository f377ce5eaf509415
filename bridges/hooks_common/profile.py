"""What a vendor package declares to join the hook family.

A hook vendor is a :class:`HookProfile`: its identity (agent id, FLEET key,
environment prefix), its pure mapper, the names of the moments the shared
machinery acts on (runs, tools, asks, the held gate, steering), and the
shapes of its decision replies. Everything else (the endpoint, run
synthesis, tool pairing, the held gate, the steering queue, spool ingestion,
dedupe, the controller) is :mod:`bridges.hooks_common` and never branches on
the vendor. Design: ``ARCHITECTURE.md`` "The hook family"; the vendors'
design records (``shared/aep/docs/adapters.md``, ``adapter-*-design.md``).

The defaults are the Claude Code hook contract, which Qwen Code and the VS
Code agent adopted; a vendor states only where it differs (Codex: a real
turn id; Antigravity: the event name in the shim's argument; Gemini: no
answerable moment, so no permission events and no gate).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bridges.core.bridge import Emission
from bridges.core.posture import Posture

from .answers import Decision
from .session import SESSION_ID_MAX, bounded_key

__all__ = ["HookProfile", "Mapper", "Moment", "claude_reply", "context_reply", "no_decision"]

Moment = dict[str, Any]
"""One hook firing: the vendor's JSON object exactly as it arrived."""

Mapper = Callable[[Moment, Posture], list[Emission]]
"""A vendor's pure mapping: moment + posture -> emissions (the pins' shape);
never raises, never does I/O; an unknown moment degrades to the fallback."""


def claude_reply(moment: Moment, decision: Decision) -> dict[str, Any]:
    """The Claude Code decision reply (Codex and Qwen use the same shape):
    ``PermissionRequest`` -> ``decision.behavior`` (``allow``; ``deny`` +
    ``message``, which reaches the model); ``PreToolUse`` ->
    ``permissionDecision`` + ``permissionDecisionReason``. A form's reply
    is the vendor's own (see ``bridges/claude_code/mapping.py``)."""
    event = moment.get("hook_event_name")
    if event == "PreToolUse":
        out: dict[str, Any] = {"hookEventName": "PreToolUse",
                               "permissionDecision": decision.option}
        if decision.message:
            out["permissionDecisionReason"] = decision.message
        return {"hookSpecificOutput": out}
    d: dict[str, Any] = {"behavior": decision.option}
    if decision.option == "deny":
        d["message"] = decision.message or "Denied via AEP"
    return {"hookSpecificOutput": {"hookEventName": str(event), "decision": d}}


def no_decision(event: str) -> dict[str, Any]:
    """The reply that decides nothing (``{}``; Antigravity's would be
    ``{"decision": ""}`` on its ``PreToolUse`` and ``Stop``)."""
    return {}


def context_reply(event: str, text: str) -> dict[str, Any]:
    """The steering reply: ``hookSpecificOutput.additionalContext``
    (``docs/control-steering-design.md``)."""
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}}


@dataclass(frozen=True, kw_only=True)
class HookProfile:
    """One hook vendor on the shared implementation.

    Identity: ``key`` (FLEET key, bridge name, health key: ``claude_code``),
    ``agent`` (AEP agent id and ``x.{agent}.*`` namespace), ``env`` (the
    knob prefix: ``CLAUDE_CODE`` -> ``AEP_BRIDGE_CLAUDE_CODE``,
    ``AEP_CLAUDE_CODE_CONTROL``, ``..._GATE_TOOLS``, ``..._HOLD_S``),
    ``title`` (the FLEET flag's meaning), ``pins`` (its mapping fixture).

    Mapping: ``map_hook`` (:data:`Mapper`); ``gate_ask``: the held
    ``PreToolUse`` gate's ``attention.requested`` for a moment (``None``:
    the vendor has no gate); ``event_field`` / ``session_field`` name the
    payload keys (``hook_event_name``, ``session_id``; dotted for a nested
    key: pi's ``event.type``, ``session.id``).

    Identity of runs: ``run_field`` names the vendor's turn id (Codex
    ``turn_id`` is the AEP run) or ``None``: runs are synthesized, opened
    by ``run_opens`` and closed by ``run_closes`` (and stale ones by the
    next open, ``run.cancelled``); ``session_ends`` end the session (state
    dropped, queued steering dropped and said).

    Asks: ``permission_events`` are held when the gate is open;
    ``form_events`` too (AEP-0006 forms); ``gate_event`` is the moment the
    ``GATE_TOOLS`` gate holds. An open ask settles out of band by what the
    vendor does next: ``tool_done`` (the tool ran: allowed), ``tool_denied``
    (denied), ``form_results`` (the form was answered elsewhere); any of
    ``run_opens``/``run_closes``/``session_ends`` dismisses it; a form's
    tool moment settles it as answered with ``form_answer(fields, moment)``
    (the values the person gave in the agent's own dialog; ``None``:
    dismissed).
    ``tool_pre`` / ``tool_post`` pair tool calls (``tool_use_id``).

    Replies: ``reply(moment, decision)`` -> the vendor's decision JSON;
    ``neutral(event)`` -> the reply that decides nothing (``{}``);
    ``context_events`` accept ``additionalContext`` steering
    (``context_reply(event, text)``, at most ``context_max`` characters).
    ``vendor_timeout_s``: the vendor's own default hook timeout per event
    where it is short (VS Code's 30 s ``PreToolUse``): a hold there ends
    before it (:meth:`bridges.hooks_common.hub.HookHub.hold_limit`)."""

    key: str
    agent: str
    env: str
    title: str
    pins: str
    map_hook: Mapper
    gate_ask: Callable[[Moment, Posture], Emission] | None = None
    event_field: str = "hook_event_name"
    session_field: str = "session_id"
    run_field: str | None = None
    run_opens: frozenset[str] = frozenset({"UserPromptSubmit"})
    run_closes: frozenset[str] = frozenset({"Stop", "StopFailure"})
    session_ends: frozenset[str] = frozenset({"SessionEnd"})
    permission_events: frozenset[str] = frozenset({"PermissionRequest"})
    form_events: frozenset[str] = frozenset()
    gate_event: str | None = "PreToolUse"
    tool_pre: frozenset[str] = frozenset({"PreToolUse"})
    tool_post: frozenset[str] = frozenset({"PostToolUse", "PostToolUseFailure"})
    tool_done: frozenset[str] = frozenset({"PostToolUse", "PostToolUseFailure"})
    tool_denied: frozenset[str] = frozenset({"PermissionDenied"})
    form_results: frozenset[str] = frozenset()
    reply: Callable[[Moment, Decision], dict[str, Any]] = claude_reply
    neutral: Callable[[str], dict[str, Any]] = no_decision
    context_events: frozenset[str] = frozenset()
    context_reply: Callable[[str, str], dict[str, Any]] = context_reply
    context_max: int = 10_000
    form_answer: Callable[[list[dict[str, Any]], Moment], dict[str, Any] | None] | None = None
    vendor_timeout_s: dict[str, float] = field(default_factory=dict)

    @property
    def flag(self) -> str:
        return f"AEP_BRIDGE_{self.env}"

    def knob(self, suffix: str) -> str:
        """``AEP_{env}_{suffix}`` (``knob("CONTROL")``)."""
        return f"AEP_{self.env}_{suffix}"

    @property
    def instruct(self) -> str:
        """The steering verb, ``x.{agent}.control.instruct``."""
        return f"x.{self.agent}.control.instruct"

    def event(self, moment: Moment) -> str:
        """The moment's event name (``""`` when it has none)."""
        v = _path(moment, self.event_field)
        return v if isinstance(v, str) else ""

    def session(self, moment: Moment) -> str | None:
        """The moment's session id, or ``None``; one over
        :data:`~.session.SESSION_ID_MAX` characters is ``"#"`` + its digest
        (the same for the same id: 1 MiB ids were stamped past the relay's
        envelope bound and refused upstream)."""
        v = _path(moment, self.session_field)
        return bounded_key(v, SESSION_ID_MAX) if isinstance(v, str) and v else None


def _path(moment: Moment, dotted: str) -> object:
    """``moment["a"]["b"]`` for ``"a.b"`` (pi nests: ``event.type``,
    ``session.id``); ``None`` where a step is missing."""
    v: object = moment
    for part in dotted.split("."):
        if not isinstance(v, dict):
            return None
        v = v.get(part)
    return v
