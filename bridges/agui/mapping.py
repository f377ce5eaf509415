"""The pure AG-UI mapping: one AG-UI event (a JSON object from the run's SSE
stream) -> AEP emissions.

Design record: ``shared/aep/docs/bridge-agui-design.md`` ("Mapping:
lifecycle, tools, steps, and state on core; streaming planes vendor"); pins:
``shared/aep/conformance/fixtures/mappings/agui.json`` (AEP-0002 Annex A).
The record and pins were written against ``@ag-ui/core`` 0.0.57; the current
protocol is 1.0 (``ag-ui-protocol`` 1.0.0 / ``@ag-ui/core`` 1.0.0, 31 event
types, :data:`EVENT_TYPES`). What 1.0 changed and how it maps is listed in
``tests/fixtures/agui_real/README.md``; in short:

- ``THINKING_*`` left the protocol; a pre-1.0 stream's aliases still map
  exactly like their ``REASONING_*`` replacements (:data:`DEPRECATED_ALIASES`).
- ``RUN_FINISHED.outcome`` (1.0): ``cancelled`` -> ``run.cancelled``;
  ``interrupt`` stays ``run.finished`` with ``data.outcome`` and the count of
  interrupts (the record rejects mapping interrupts to ``attention.*``: no
  respond path on a read-only channel); ``usage`` sums into
  ``gen_ai.usage.*``.
- ``SUBAGENT_*``, ``ACTIVITY_*``, ``REASONING_MESSAGE_*``: the record's rule
  "everything else rides at debug in the vendor namespace", with their ids
  and counts at metadata; ``subagentRunId`` on any event rides as
  ``data.subagent_run``.
- ``TEXT_MESSAGE_END`` carries no ``role`` in 1.0: the receiver
  (:class:`bridges.agui.stream.TeeStream`) re-attaches the role its
  ``TEXT_MESSAGE_START`` declared, like the tool name on results.

Everything here is pure: no I/O, no clocks, no globals beyond constants.
:func:`map_event` accepts any value and never raises (hypothesis-fuzzed).

Capture: ``data`` is shaped to the posture's ceiling for the emission's
type. At ``metadata`` (the default, what the pins describe) only ids, names,
counts and statuses appear. At ``redacted``+ content is added: for
registered types under their schema names (``summary``, ``error.message``,
``result``, ``state``, ``delta``), which the stamper's gate redacts or keeps
per the schema annotations; for ``x.agui.*`` types (no schema) the content is
passed through the AEP-0003 §9.4 pipeline here at ``redacted`` and declared
in ``gating.levels`` so the gate drops it below its level and claims the
level honestly. ``RAW``'s payload is ``full`` only (the record).
"""
from __future__ import annotations

import json
from typing import Any

from bridges.core import capture as _capture
from bridges.core.bridge import Emission
from bridges.core.naming import kind_type
from bridges.core.posture import Posture
from bridges.core.readers import text as _str

VENDOR = "agui"


EVENT_TYPES: tuple[str, ...] = (
    "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "TEXT_MESSAGE_CHUNK",
    "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_CHUNK", "TOOL_CALL_RESULT",
    "STATE_SNAPSHOT", "STATE_DELTA", "MESSAGES_SNAPSHOT", "ACTIVITY_SNAPSHOT", "ACTIVITY_DELTA",
    "RAW", "CUSTOM", "RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "STEP_STARTED", "STEP_FINISHED",
    "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_END", "REASONING_MESSAGE_CHUNK", "REASONING_END",
    "REASONING_ENCRYPTED_VALUE", "SUBAGENT_STARTED", "SUBAGENT_FINISHED", "SUBAGENT_ERROR",
)
"""The AG-UI 1.0 event union (``ag_ui.core.EventType``, checked in the tests
against the installed ``ag-ui-protocol``)."""

DEPRECATED_ALIASES: dict[str, str] = {
    "THINKING_START": "REASONING_START",
    "THINKING_END": "REASONING_END",
    "THINKING_TEXT_MESSAGE_START": "REASONING_MESSAGE_START",
    "THINKING_TEXT_MESSAGE_CONTENT": "REASONING_MESSAGE_CONTENT",
    "THINKING_TEXT_MESSAGE_END": "REASONING_MESSAGE_END",
}
"""Pre-1.0 ``THINKING_*`` names (``@ag-ui/core`` 0.0.57, removed in 1.0) ->
their ``REASONING_*`` replacements; mapped identically (the pins'
``thinking_start_deprecated_alias``)."""

DELTA_TYPES = frozenset({
    "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CHUNK", "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_CHUNK", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_CHUNK",
})
"""Token/argument deltas: nothing by default, ``x.agui.*`` at debug with
``AEP_AGUI_DELTAS=1`` (the record; pins' ``deltas_expected``)."""

NEVER = frozenset({"REASONING_ENCRYPTED_VALUE"})
"""Opaque ciphertext is not observability: nothing, ever, no opt-in."""

UNKNOWN_TOOL = "unknown"
"""``tool.name`` of a result whose start was never seen (a mid-stream attach;
pin ``tool_call_result_unjoined``)."""

MALFORMED_TYPE = kind_type(VENDOR, "")
"""``x.agui.unknown.event``: what an SSE event that is not an AG-UI event
(not JSON, not an object, no ``type``, over the parse cap) degrades to."""

_REDACTED = _capture.rank("redacted")
_FULL = _capture.rank("full")


DEFAULT_POSTURE = Posture()
"""The pinned posture (``metadata``, deltas off): the shared
:class:`bridges.core.posture.Posture` with its defaults."""


# --------------------------------------------------------------------------- helpers

def canonical_type(event: Any) -> str | None:
    """The event's ``type`` with deprecated aliases resolved; ``None`` when
    ``event`` is not an object with a non-empty string ``type``."""
    if not isinstance(event, dict):
        return None
    t = _str(event.get("type"))
    if t is None:
        return None
    return DEPRECATED_ALIASES.get(t, t)


def _text(value: Any) -> str:
    """Content as text: a string is itself, anything else its compact JSON
    (``RUN_FINISHED.result`` is any JSON value; ``summary`` is a string)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError, RecursionError):
        return ""


def _common(ev: dict[str, Any]) -> dict[str, Any]:
    """Metadata every emission carries when the event states it: the 1.0
    subagent attribution."""
    sub = _str(ev.get("subagentRunId"))
    return {"subagent_run": sub} if sub is not None else {}


def _vendor(ev: dict[str, Any], t: str, posture: Posture, *, extra: dict[str, Any] | None = None,
            content: dict[str, Any] | None = None, full_only: bool = False,
            subject: str | None = None) -> Emission:
    """An ``x.agui.*`` emission at ``debug``: metadata ``extra`` plus
    ``content`` (``redacted``+, through the §9.4 pipeline at ``redacted``;
    ``full_only``: at ``full`` only), declared in ``gating.levels``."""
    type_ = kind_type(VENDOR, t, drop_event_suffix=False)
    data = _common(ev)
    if extra:
        data.update({k: v for k, v in extra.items() if v is not None})
    levels: dict[str, str] = {}
    lvl = posture.level(type_)
    need = _FULL if full_only else _REDACTED
    if content and lvl >= need:
        for k, v in content.items():
            if v is None:
                continue
            data[k] = v if lvl >= _FULL else _capture.redact_value(v, posture.policy)
            levels[k] = "full" if full_only else "redacted"
    out: Emission = {"type": type_, "data": data, "severity": "debug",
                     "gating": {"levels": levels}}
    if subject is not None:
        out["subject"] = subject
    return out


def _usage(ev: dict[str, Any], data: dict[str, Any]) -> None:
    """1.0 ``usage: TokenUsage[]`` -> ``gen_ai.usage.input/output_tokens``
    (sums; every entry is a total in the protocol's own accounting)."""
    usage = ev.get("usage")
    if not isinstance(usage, list):
        return
    for src, dst in (("inputTokens", "gen_ai.usage.input_tokens"),
                     ("outputTokens", "gen_ai.usage.output_tokens")):
        vals = [u.get(src) for u in usage if isinstance(u, dict)]
        nums = [v for v in vals if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
        if nums:
            data[dst] = sum(nums)


def _ops(patch: Any) -> int | None:
    return len(patch) if isinstance(patch, list) else None


# --------------------------------------------------------------------------- per type

def _run_started(ev: dict[str, Any]) -> Emission:
    data: dict[str, Any] = {"trigger": "user", **_common(ev)}
    parent = _str(ev.get("parentRunId"))
    if parent is not None:
        data["parent_run"] = parent  # lineage at metadata, not session lineage (record)
    version = _str(ev.get("protocolVersion"))
    if version is not None:
        data["protocol_version"] = version
    return {"type": "run.started", "data": data}


def _run_finished(ev: dict[str, Any], posture: Posture) -> Emission:
    outcome = ev.get("outcome")
    kind = _str(outcome.get("type")) if isinstance(outcome, dict) else None
    data: dict[str, Any] = _common(ev)
    if kind == "cancelled":
        return {"type": "run.cancelled", "data": data}
    if kind == "interrupt":
        data["outcome"] = "interrupt"
        ints = outcome.get("interrupts") if isinstance(outcome, dict) else None
        if isinstance(ints, list):
            data["interrupts"] = len(ints)
    _usage(ev, data)
    if "result" in ev and ev["result"] is not None and posture.level("run.finished") >= _REDACTED:
        data["summary"] = _text(ev["result"])  # [redacted]: the gate runs §9.4 over it
    return {"type": "run.finished", "data": data}


def _run_error(ev: dict[str, Any], posture: Posture) -> Emission:
    data: dict[str, Any] = {"reason": _str(ev.get("code")) or "error", **_common(ev)}
    _usage(ev, data)
    msg = _str(ev.get("message"))
    if msg is not None and posture.level("run.failed") >= _REDACTED:
        data["error"] = {"message": msg}
    return {"type": "run.failed", "data": data}


def _step(ev: dict[str, Any], t: str, posture: Posture) -> Emission:
    name = _str(ev.get("stepName"))
    if name is None:  # a step without its identity: the vendor fact, not a guess
        return _vendor(ev, t, posture)
    type_ = "run.step.started" if t == "STEP_STARTED" else "run.step.finished"
    return {"type": type_, "data": _common(ev), "subject": name, "step": name}


def _tool_start(ev: dict[str, Any], t: str, posture: Posture) -> Emission:
    call_id, name = _str(ev.get("toolCallId")), _str(ev.get("toolCallName"))
    if call_id is None or name is None:
        return _vendor(ev, t, posture, extra={"call_id": call_id}, subject=name)
    data = {"tool": {"name": name, "call_id": call_id}, **_common(ev)}
    return {"type": "tool.requested", "data": data, "subject": name}


def _tool_result(ev: dict[str, Any], t: str, posture: Posture) -> Emission:
    call_id = _str(ev.get("toolCallId"))
    if call_id is None:
        return _vendor(ev, t, posture, content={"content": ev.get("content")})
    name = _str(ev.get("toolCallName")) or UNKNOWN_TOOL
    content = ev.get("content")
    data: dict[str, Any] = {"tool": {"name": name, "call_id": call_id}, **_common(ev)}
    if content is not None:
        # AEP-0003 §9.3: the digest of the content as the stream carries it
        data["result_digest"] = _capture.digest(content)
        if posture.level("tool.completed") >= _REDACTED and isinstance(content, (str, dict)):
            data["result"] = content  # [full]; the gate derives result_redacted at redacted
    return {"type": "tool.completed", "data": data, "subject": call_id}


def _state_snapshot(ev: dict[str, Any], posture: Posture) -> Emission:
    data = _common(ev)
    snap = ev.get("snapshot")
    if isinstance(snap, dict) and posture.level("state.snapshot") >= _REDACTED:
        data["state"] = snap
    return {"type": "state.snapshot", "data": data}


def _state_delta(ev: dict[str, Any], posture: Posture) -> Emission:
    data = _common(ev)
    patch = ev.get("delta")
    if isinstance(patch, list):
        data["ops"] = len(patch)  # structure, at metadata (pin state_delta)
        if posture.level("state.delta") >= _REDACTED and all(isinstance(p, dict) for p in patch):
            data["delta"] = patch
    return {"type": "state.delta", "data": data}


def _text_end(ev: dict[str, Any], t: str, posture: Posture) -> list[Emission]:
    role = _str(ev.get("role")) or "assistant"  # 1.0: role optional, assistant by default
    if role != "assistant":
        return []  # the user side is the UI's own doing (pin text_message_end_user)
    content = ev.get("content")
    if isinstance(content, str) and not content:
        # An assistant message that streamed no text is no reply: pydantic-ai
        # opens and closes an empty one as the parent of each tool call.
        return []
    return [_vendor(ev, t, posture, content={"content": content if isinstance(content, str) else None},
                    subject=_str(ev.get("messageId")))]


def _delta(ev: dict[str, Any], t: str, posture: Posture) -> list[Emission]:
    if not posture.deltas:
        return []
    payload = ev.get("delta")
    return [_vendor(ev, t, posture, content={"delta": payload if isinstance(payload, str) else None})]


def _other(ev: dict[str, Any], t: str, posture: Posture) -> Emission:
    """The vendor plane: every type the record does not map to core."""
    mid = _str(ev.get("messageId"))
    if t == "TEXT_MESSAGE_START":
        return _vendor(ev, t, posture, extra={"role": _str(ev.get("role"))}, subject=mid)
    if t in ("REASONING_START", "REASONING_END", "REASONING_MESSAGE_START",
             "REASONING_MESSAGE_END"):
        return _vendor(ev, t, posture, subject=mid)
    if t == "MESSAGES_SNAPSHOT":
        msgs = ev.get("messages")
        return _vendor(ev, t, posture, content={"messages": msgs if isinstance(msgs, list) and msgs
                                                else None})
    if t == "ACTIVITY_SNAPSHOT":
        return _vendor(ev, t, posture, extra={
            "activity_type": _str(ev.get("activityType")),
            "replace": ev["replace"] if isinstance(ev.get("replace"), bool) else None},
            content={"content": ev.get("content")}, subject=mid)
    if t == "ACTIVITY_DELTA":
        patch = ev.get("patch")
        return _vendor(ev, t, posture, extra={"activity_type": _str(ev.get("activityType")),
                                              "ops": _ops(patch)},
                       content={"patch": patch if isinstance(patch, list) else None}, subject=mid)
    if t == "RAW":
        return _vendor(ev, t, posture, extra={"source": _str(ev.get("source"))},
                       content={"event": ev.get("event")}, full_only=True)
    if t == "CUSTOM":
        return _vendor(ev, t, posture, extra={"name": _str(ev.get("name"))},
                       content={"value": ev.get("value")})
    if t.startswith("SUBAGENT_"):
        return _subagent(ev, t, posture)
    # every future type: the mechanical name, its fields at redacted+
    rest = {k: v for k, v in ev.items() if k not in ("type", "timestamp", "rawEvent")}
    return _vendor(ev, t, posture, content={"payload": rest or None})


def _subagent(ev: dict[str, Any], t: str, posture: Posture) -> Emission:
    sub = _str(ev.get("subagentRunId"))
    extra: dict[str, Any] = {"subagent_run": sub}
    content: dict[str, Any] = {}
    if t == "SUBAGENT_STARTED":
        extra.update(name=_str(ev.get("name")),
                     parent_subagent_run=_str(ev.get("parentSubagentRunId")),
                     parent_tool_call=_str(ev.get("parentToolCallId")))
        content["description"] = _str(ev.get("description"))
    elif t == "SUBAGENT_FINISHED":
        outcome = ev.get("outcome")
        extra["outcome"] = _str(outcome.get("type")) if isinstance(outcome, dict) else None
        content["result"] = ev.get("result")
    elif t == "SUBAGENT_ERROR":
        extra["code"] = _str(ev.get("code"))
        content["message"] = _str(ev.get("message"))
    return _vendor(ev, t, posture, extra=extra, content=content, subject=sub)


# --------------------------------------------------------------------------- public

def map_event(event: Any, posture: Posture = DEFAULT_POSTURE) -> list[Emission]:
    """Map one AG-UI event (the decoded JSON of one SSE ``data``) to zero or
    one emission: ``{type, data, subject?, step?}`` as the pins' ``expected``,
    plus ``severity`` (``debug`` on the vendor plane) and ``gating`` (capture
    hints for the stamper) on ``x.agui.*``.

    Joins are the receiver's (:class:`bridges.agui.stream.TeeStream`): it
    passes ``TOOL_CALL_RESULT`` with the ``toolCallName`` of its start,
    ``TEXT_MESSAGE_END`` with the ``role`` of its start and the assembled
    ``content`` (``""`` for a message that streamed no text: no reply).

    Returns ``[]`` for what maps to nothing: deltas without ``posture.deltas``,
    ``REASONING_ENCRYPTED_VALUE`` always, a non-assistant message end, an
    empty assistant message. A value that is not an AG-UI event (not an
    object, no string ``type``) maps to :func:`malformed`. Never raises."""
    t = canonical_type(event)
    if t is None:
        return [malformed("not_object" if not isinstance(event, dict) else "no_type")]
    assert isinstance(event, dict)
    if t in NEVER:
        return []
    if t in DELTA_TYPES:
        return _delta(event, t, posture)
    if t == "RUN_STARTED":
        return [_run_started(event)]
    if t == "RUN_FINISHED":
        return [_run_finished(event, posture)]
    if t == "RUN_ERROR":
        return [_run_error(event, posture)]
    if t in ("STEP_STARTED", "STEP_FINISHED"):
        return [_step(event, t, posture)]
    if t == "TOOL_CALL_START":
        return [_tool_start(event, t, posture)]
    if t == "TOOL_CALL_RESULT":
        return [_tool_result(event, t, posture)]
    if t == "STATE_SNAPSHOT":
        return [_state_snapshot(event, posture)]
    if t == "STATE_DELTA":
        return [_state_delta(event, posture)]
    if t == "TEXT_MESSAGE_END":
        return _text_end(event, t, posture)
    return [_other(event, t, posture)]


def malformed(reason: str, **facts: Any) -> Emission:
    """The fallback for an SSE event that is not an AG-UI event:
    ``x.agui.unknown.event`` at debug, ``data.malformed`` = ``reason``
    (``not_json``, ``not_object``, ``no_type``, ``oversize``, ``over_budget``) plus metadata
    ``facts`` (``bytes``, ``vendor_type``); nothing of its content."""
    data: dict[str, Any] = {"malformed": reason}
    data.update({k: v for k, v in facts.items() if v is not None})
    return {"type": MALFORMED_TYPE, "data": data, "severity": "debug", "gating": {"levels": {}}}


def pin_view(emission: Emission) -> dict[str, Any]:
    """The pin-comparable part of an emission: ``{type, data, subject?,
    step?}`` (``severity``/``gating`` are stamper hints)."""
    return {k: emission[k] for k in ("type", "data", "subject", "step") if emission.get(k) is not None}
