"""The VS Code agent OTel-channel mapper (pure): the ``copilot_chat.*``
LogRecord family behind ``github.copilot.chat.otel.enabled``. Pins:
``conformance/fixtures/mappings/vscode-otel.json``; design record
``docs/bridge-otlp-inbound-design.md`` ("Vendor profiles"); AEP-0002 Annex A
(VS Code agent OTel channel).

Same contract as :mod:`bridges.otlp_in.codex`, own known set, own
``x.vscode.otel.*`` namespace, and a deliberately smaller primary subset:
``copilot_chat.session.start`` -> ``session.started`` and
``copilot_chat.tool.call`` -> ``tool.completed``/``tool.failed`` (with the
vendor's own ``error.type`` token). ``tool.denied`` and ``session.ended``
are never emitted here (the hook decision tier never reaches OTel; session
end does not exist on this surface). The session key is the
resource-level ``session.id``.
"""
from __future__ import annotations

from typing import Any

from bridges.core.bridge import Emission
from bridges.core.capture import CapturePolicy
from bridges.core.posture import Posture

from .common import (
    EventSpec,
    Plain,
    attrs,
    event_name,
    gated_payload,
    resource,
    short_str,
    spec_levels,
    to_bool,
    to_int,
    unknown,
    vendor_type,
)

NAMESPACE = "x.vscode.otel"
CLIENT = "vscode"

_USAGE = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")

EVENTS: dict[str, EventSpec] = {
    "copilot_chat.session.start": EventSpec(
        "session.start", meta=("gen_ai.request.model", "gen_ai.agent.name")),
    "copilot_chat.tool.call": EventSpec(
        "tool.call",
        meta=("gen_ai.tool.name", "gen_ai.tool.call.id", "duration_ms", "success",
              "error.type")),
    "copilot_chat.agent.turn": EventSpec(
        "agent.turn", meta=("turn.index",) + _USAGE + ("tool_call_count",)),
    "gen_ai.client.inference.operation.details": EventSpec(
        "inference_details",
        meta=("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model")
        + _USAGE,
        # The GenAI content attributes: redacted+ (absent from the metadata pins).
        redacted=("gen_ai.input.messages", "gen_ai.output.messages",
                  "gen_ai.system_instructions")),
    "copilot_chat.edit.feedback": EventSpec(
        "edit.feedback",
        meta=("outcome", "language_id", "participant", "request_id", "edit_surface",
              "has_remaining_edits", "is_notebook")),
}
"""The known ``event.name`` set -> vendor leaf and capture grades."""

LEVELS: dict[str, dict[str, str]] = {
    vendor_type(NAMESPACE, spec.leaf): spec_levels(spec) for spec in EVENTS.values()}
"""Per vendor type, the content keys and their grade (``gating.levels``)."""

READS = frozenset({"event.name", "event.timestamp", "gen_ai.request.model", "gen_ai.tool.name",
                   "success", "gen_ai.tool.call.id", "error.type", "duration_ms"}.union(
                       *(spec.grades for spec in EVENTS.values())))
"""Every LogRecord attribute this profile looks at (the decoder flattens
only these; :attr:`bridges.otlp_in.profiles.Profile.reads`)."""
RESOURCE_READS = frozenset({"session.id"})
"""The resource attributes this profile looks at (the session key)."""
FIELDS = frozenset({"event_name", "body", "time_unix_nano", "observed_time_unix_nano"})
"""The record fields this profile looks at besides the attributes and the
resource (the event name's fallbacks, the record time's candidates)."""

SPECIAL: frozenset[str] = frozenset()
"""Every companion payload here is :func:`gated_payload`'s."""
CORE = frozenset({"copilot_chat.session.start", "copilot_chat.tool.call"})
"""The events :func:`_primary` may map to a core type."""

PRIMARY_TYPES = ("session.started", "tool.completed", "tool.failed")
"""The core subset this profile emits in primary mode (design record)."""


def session_key(rec: dict[str, Any]) -> object:
    """VS Code's session key: the resource-level ``session.id`` (one
    session per exporter process)."""
    return resource(rec).get("session.id")


def map_record(rec: dict[str, Any], posture: Posture, notes: list[str] | None = None
               ) -> list[Emission]:
    """One flattened VS Code LogRecord -> emissions (0 or 1). ``notes``
    collects counter names for anything degraded."""
    notes = [] if notes is None else notes
    name = event_name(rec, notes)
    spec = EVENTS.get(name) if name else None
    if spec is None or name is None:
        if name:
            notes.append("otlp.unknown_event")
        return [unknown(NAMESPACE, name)]
    a = attrs(rec)
    if posture.primary:
        core = _primary(name, a, posture.policy, notes)
        if core is not None:
            return core
    type_ = vendor_type(NAMESPACE, spec.leaf)
    return [{"type": type_, "data": gated_payload(spec, a, type_, posture, notes)}]


def _primary(name: str, a: dict[str, Any], policy: CapturePolicy, notes: list[str]
             ) -> list[Emission] | None:
    if name == "copilot_chat.session.start":
        data: dict[str, Any] = {"client": {"name": CLIENT}}
        model = short_str(a.get("gen_ai.request.model"), notes, policy)
        if model:
            data["gen_ai.request.model"] = model
        return [{"type": "session.started", "data": data}]
    if name == "copilot_chat.tool.call":
        tool_name = short_str(a.get("gen_ai.tool.name"), notes, policy)
        ok = to_bool(a.get("success"))
        if not tool_name or ok is None:
            notes.append("otlp.degraded")
            return None
        tool = {"name": tool_name}
        call_id = short_str(a.get("gen_ai.tool.call.id"), notes, policy)
        if call_id:
            tool["call_id"] = call_id
        data = {"tool": tool}
        if not ok:
            # The OTel error.type convention: a low-cardinality class token,
            # structural at metadata, never free text.
            data["error"] = {"type": short_str(a.get("error.type"), notes, policy) or "tool_error"}
        duration = to_int(a.get("duration_ms"))
        if duration is not None:
            data["duration_ms"] = duration
        return [{"type": "tool.completed" if ok else "tool.failed", "data": data,
                 "subject": tool_name}]
    return None


PLAIN = Plain(map_record, session_key, EVENTS, SPECIAL, CORE, None)
"""This mapper's plain events, for the profile's compiled plan
(:class:`~bridges.otlp_in.common.Plain`)."""
