"""The Codex OTel-channel mapper (pure). Pins:
``conformance/fixtures/mappings/codex-otel.json``; design record
``docs/bridge-otlp-inbound-design.md`` ("Mapping", "Capture"); AEP-0002
Annex A (Codex OTel channel).

:func:`map_record` takes one flattened record (the pins' input shape) and the
:class:`~bridges.core.posture.Posture` and returns the emissions:

- companion (default): one ``x.codex.otel.<leaf>`` emission per record;
- primary: ``codex.conversation_starts`` -> ``session.started``;
  ``codex.tool_result`` -> ``tool.completed``/``tool.failed`` by the success
  flag; ``codex.tool_decision`` denied by config -> ``tool.denied``
  ``by: policy``, by automation -> ``by: runtime``, by the user -> nothing
  (a human decision, not a policy block). Everything else stays in
  ``x.codex.otel.*`` in both modes (transport and prompt internals fail the
  fleet-observer test), and so does a record whose core mapping cannot be
  decided (no tool name, no success flag...: degraded and noted).
- unknown event names -> ``x.codex.otel.unknown`` carrying only the name.

Primary-mode choices the pins leave open: an approval (``decision =
"approved"``) has no core type and stays ``x.codex.otel.tool_decision``; a
deny whose source is neither user, config nor automation, and a tool result
without a tool name or a readable success flag, degrade to their vendor type
(noted ``otlp.degraded``).

The event set covers the pins, the design record's table and what the real
Codex exporter sends (captured from 0.171.0 in
``tests/fixtures/codex_otel_real/``, whose README lists the drift; the
vendor source ``codex-rs/otel`` for the rarer events): the ``event.kind``
key of ``codex.sse_event`` and its token counts, ``http.response.status_code``
and ``attempt`` (ints) on ``codex.api_request``, ``tool_namespace``,
``call_id``, ``tool_result_seq``, ``output_truncated`` and the always-sent
``arguments``/``output`` (``full`` only) on tool results, capitalised
decision sources (``Config``, ``AutomatedReviewer``), and the later events
``codex.startup_phase``, ``codex.turn_ttft`` (seen live),
``codex.websocket_connect``, ``codex.sandbox_outcome``,
``codex.auth_recovery``, ``codex.plugin_install_*`` (vendor source).
Typed values pass through as sent (``"412"`` and ``412`` alike); the
primary mapping normalises them (:func:`~bridges.otlp_in.common.to_int`,
:func:`~bridges.otlp_in.common.to_bool`).
"""
from __future__ import annotations

from typing import Any

from bridges.core import capture as _capture
from bridges.core.bridge import Emission
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

NAMESPACE = "x.codex.otel"
CLIENT = "codex"

_ERR = ("error", "error.message")

EVENTS: dict[str, EventSpec] = {
    "codex.conversation_starts": EventSpec(
        "conversation_starts",
        meta=("model", "approval_policy", "sandbox_policy", "provider_name", "reasoning_effort",
              "reasoning_summary", "context_window", "auto_compact_token_limit"),
        redacted=("mcp_servers",)),
    "codex.user_prompt": EventSpec(
        "user_prompt",
        meta=("prompt_length", "text_input_count", "image_input_count",
              "local_image_input_count")),
    "codex.tool_decision": EventSpec(
        "tool_decision",
        meta=("tool_name", "tool_namespace", "call_id", "decision", "source")),
    "codex.tool_result": EventSpec(
        "tool_result",
        meta=("tool_name", "tool_namespace", "call_id", "tool_result_seq", "success",
              "duration_ms", "output_truncated", "mcp_server", "tool_origin", "mcp_tool",
              "arguments_length", "output_length", "output_line_count"),
        # agent_name is a filesystem path on 0.171 ("/root"): redacted-grade.
        redacted=_ERR + ("mcp_server_origin", "agent_name"),
        full=("arguments", "output")),
    "codex.api_request": EventSpec(
        "api_request",
        meta=("status", "duration_ms", "attempts", "attempt", "http.response.status_code",
              "endpoint", "success"),
        redacted=_ERR),
    "codex.sse_event": EventSpec(
        "sse_event",
        meta=("kind", "event.kind", "success", "duration_ms", "input_token_count",
              "output_token_count", "cached_token_count", "cache_write_token_count",
              "reasoning_token_count", "tool_token_count", "ttft_ms"),
        redacted=_ERR),
    "codex.websocket_request": EventSpec(
        "websocket_request", meta=("duration_ms", "success", "auth.connection_reused"),
        redacted=_ERR),
    "codex.websocket_event": EventSpec(
        "websocket_event", meta=("kind", "event.kind", "success", "duration_ms"),
        redacted=_ERR),
    "codex.websocket_connect": EventSpec(
        "websocket_connect",
        meta=("duration_ms", "http.response.status_code", "success", "endpoint",
              "auth.connection_reused"),
        redacted=_ERR),
    "codex.sandbox_outcome": EventSpec(
        "sandbox_outcome",
        meta=("tool_name", "call_id", "outcome", "initial_duration_ms", "escalated_duration_ms")),
    "codex.startup_phase": EventSpec(
        "startup_phase", meta=("startup.phase", "startup.status", "duration_ms")),
    "codex.turn_ttft": EventSpec("turn_ttft", meta=("duration_ms",)),
    "codex.auth_recovery": EventSpec(
        "auth_recovery",
        meta=("auth.mode", "auth.step", "auth.outcome", "auth.recovery_reason",
              "auth.state_changed", "auth.error_code"),
        redacted=("auth.error",)),
    "codex.plugin_install_elicitation_sent": EventSpec(
        "plugin_install_elicitation_sent",
        meta=("plugin_install.tool_type", "plugin_install.tool_id", "plugin_install.tool_name")),
    "codex.plugin_install_suggestion": EventSpec(
        "plugin_install_suggestion",
        meta=("plugin_install.tool_type", "plugin_install.tool_id", "plugin_install.tool_name",
              "plugin_install.response_action", "plugin_install.user_confirmed",
              "plugin_install.completed")),
}
"""The known ``event.name`` set -> vendor leaf and capture grades."""

LEVELS: dict[str, dict[str, str]] = {
    vendor_type(NAMESPACE, spec.leaf): spec_levels(spec, {
        "codex.user_prompt": {"prompt": "redacted"},
        "codex.conversation_starts": {"host.name": "redacted", "user.email": "full"},
    }.get(name))
    for name, spec in EVENTS.items()}
"""Per vendor type, the content keys :func:`map_record` may put in its
payload and their grade (the stamper's ``gating.levels`` hint)."""

READS = frozenset({"event.name", "conversation.id", "event.timestamp", "prompt", "user.email",
                   "model", "tool_name", "call_id", "success", "duration_ms", "output", "error",
                   "error.message", "decision", "source"}.union(
                       *(spec.grades for spec in EVENTS.values())))
"""Every LogRecord attribute this profile looks at (event name, session key,
time, payload keys, the primary mapping's keys): the protobuf decoder
flattens only these (:attr:`bridges.otlp_in.profiles.Profile.reads`); a
0.171 ``codex.sse_event`` carries 10 attributes, 5 of them read."""
RESOURCE_READS = frozenset({"host.name", "user.email"})
"""The resource attributes this profile looks at."""
FIELDS = frozenset({"event_name", "body", "time_unix_nano", "observed_time_unix_nano"})
"""The record fields this profile looks at besides the attributes and the
resource (the event name's fallbacks, the record time's candidates)."""

SPECIAL = frozenset({"codex.user_prompt", "codex.conversation_starts"})
"""The events whose companion payload is more than :func:`gated_payload`
(:func:`_companion`'s double-gated prompt, host name and e-mail)."""
CORE = frozenset({"codex.conversation_starts", "codex.tool_result", "codex.tool_decision"})
"""The events :func:`_primary` may map to a core type."""

PRIMARY_TYPES = ("session.started", "tool.completed", "tool.failed", "tool.denied")
"""The core subset this profile emits in primary mode (design record)."""

PROMPT_PLACEHOLDER = "[REDACTED]"
"""What Codex sends in ``prompt`` unless ``otel.log_user_prompt`` is on."""

_DENY = frozenset({"deny", "denied", "reject", "rejected", "abort", "aborted"})
_BY_SOURCE = {"config": "policy", "automatedreviewer": "runtime", "automated_reviewer": "runtime",
              "automation": "runtime", "automated": "runtime"}


def session_key(rec: dict[str, Any]) -> object:
    """Codex's session key: the per-record ``conversation.id`` attribute."""
    return attrs(rec).get("conversation.id")


_TYPES = {name: vendor_type(NAMESPACE, spec.leaf) for name, spec in EVENTS.items()}
"""Each known event name -> its vendor type (worked out once)."""


def map_record(rec: dict[str, Any], posture: Posture, notes: list[str] | None = None
               ) -> list[Emission]:
    """One flattened Codex LogRecord -> emissions (0 or 1). ``notes``
    collects counter names for anything degraded (pure otherwise)."""
    notes = [] if notes is None else notes
    name = event_name(rec, notes)
    spec = EVENTS.get(name) if name else None
    if spec is None or name is None:
        if name:
            notes.append("otlp.unknown_event")
        return [unknown(NAMESPACE, name)]
    a = attrs(rec)
    if posture.mode == "primary":
        core = _primary(name, a, posture, notes)
        if core is not None:
            return core
    return [_companion(name, spec, rec, a, posture, notes)]


def _companion(name: str, spec: EventSpec, rec: dict[str, Any], a: dict[str, Any],
               posture: Posture, notes: list[str]) -> Emission:
    type_ = _TYPES[name]
    data = gated_payload(spec, a, type_, posture, notes)
    if name == "codex.user_prompt":
        prompt = a.get("prompt")
        # Double gate: the vendor sent content (not its placeholder) AND the
        # ceiling is redacted+; redacted runs the AEP-0003 §9.4 pipeline.
        if (isinstance(prompt, str) and prompt and prompt != PROMPT_PLACEHOLDER
                and posture.allows(type_, "redacted")):
            data["prompt"] = (prompt if posture.allows(type_, "full")
                              else _capture.redact_text(prompt, posture.policy))
    elif name == "codex.conversation_starts":
        host = resource(rec).get("host.name")
        if isinstance(host, str) and host and posture.allows(type_, "redacted"):
            data["host.name"] = host
        email = a.get("user.email", resource(rec).get("user.email"))
        if isinstance(email, str) and email and posture.allows(type_, "full"):
            data["user.email"] = email
    return {"type": type_, "data": data}


def _primary(name: str, a: dict[str, Any], posture: Posture, notes: list[str]
             ) -> list[Emission] | None:
    """The core mapping, or ``None`` when the record stays vendor-namespaced."""
    if name == "codex.conversation_starts":
        data: dict[str, Any] = {"client": {"name": CLIENT}}
        model = short_str(a.get("model"), notes, posture.policy)
        if model:
            data["gen_ai.request.model"] = model
        return [{"type": "session.started", "data": data}]
    if name == "codex.tool_result":
        return _tool_result(a, posture, notes)
    if name == "codex.tool_decision":
        return _tool_decision(a, posture, notes)
    return None


def _tool(a: dict[str, Any], posture: Posture, notes: list[str]) -> dict[str, Any] | None:
    tool_name = short_str(a.get("tool_name"), notes, posture.policy)
    if not tool_name:
        return None
    tool = {"name": tool_name}
    call_id = short_str(a.get("call_id"), notes, posture.policy)
    if call_id:
        tool["call_id"] = call_id
    return tool


def _tool_result(a: dict[str, Any], posture: Posture, notes: list[str]) -> list[Emission] | None:
    tool = _tool(a, posture, notes)
    ok = to_bool(a.get("success"))
    if tool is None or ok is None:
        notes.append("otlp.degraded")
        return None
    if ok:
        data: dict[str, Any] = {"tool": tool}
        duration = to_int(a.get("duration_ms"))
        if duration is not None:
            data["duration_ms"] = duration
        output = a.get("output")
        if isinstance(output, str) and posture.allows("tool.completed", "full"):
            data["result"] = output  # design record: output gated full
        return [{"type": "tool.completed", "data": data, "subject": tool["name"]}]
    # The channel exposes free text, not an error taxonomy: the type is
    # synthesized; the text is redacted-gated (pin tool_result_fail).
    error: dict[str, Any] = {"type": "tool_error"}
    text = a.get("error", a.get("error.message"))
    output = a.get("output")
    if isinstance(text, str) and text and posture.allows("tool.failed", "redacted"):
        error["message"] = (text if posture.allows("tool.failed", "full")
                            else _capture.redact_text(text, posture.policy))
    elif isinstance(output, str) and output and posture.allows("tool.failed", "full"):
        # 0.171 sends no error attribute; the reason is in the output,
        # which is full-grade content (design record).
        error["message"] = output
    return [{"type": "tool.failed", "data": {"tool": tool, "error": error},
             "subject": tool["name"]}]


def _tool_decision(a: dict[str, Any], posture: Posture, notes: list[str]
                   ) -> list[Emission] | None:
    decision = a.get("decision")
    if not isinstance(decision, str) or decision.strip().lower() not in _DENY:
        return None  # approvals have no core type; they stay vendor-namespaced
    source = a.get("source")
    src = source.strip().lower() if isinstance(source, str) else None
    if src == "user":
        return []  # a human decision already made in the CLI (pin tool_decision_user_deny)
    by = _BY_SOURCE.get(src or "")
    tool = _tool(a, posture, notes)
    if by is None or tool is None:
        notes.append("otlp.degraded")
        return None
    return [{"type": "tool.denied", "data": {"tool": tool, "by": by}, "subject": tool["name"]}]


PLAIN = Plain(map_record, session_key, EVENTS, SPECIAL, CORE, "conversation.id")
"""This mapper's plain events, for the profile's compiled plan
(:class:`~bridges.otlp_in.common.Plain`)."""
