"""The pure mapping of ``kimi web`` (kap-server) WebSocket event frames to
AEP emissions.

Input: one WS event envelope as received (``{type, seq, session_id,
timestamp, payload, epoch, volatile?}``) plus the :class:`Posture`; output:
a list of emissions shaped exactly like the ``ws_modes`` pins' ``companion``
/ ``primary`` objects (``{type, data, subject?}``; ``severity`` and
``gating`` are envelope hints the stamper consumes and the pins do not
carry). No I/O, no clocks, no globals; never raises on garbage.

Pins: ``shared/aep/conformance/fixtures/mappings/kimi-code.json``
``ws_modes``. Design record: ``shared/aep/docs/adapter-kimi-code-design.md``
("The kimi web channel"); AEP-0002 §5.2/§5.3 (attention kinds), AEP-0006
(``field_spec``), AEP-0008 (answer channels).

Rules (both modes):

- volatile frames never emit (the vendor's own do-not-persist marker, and
  the 2.1.0 ``VOLATILE_EVENT_TYPES`` list for a frame that lost the flag);
- the internal ``permission.approval.*`` bus echoes never emit (their
  ``event.approval.*`` wire twins carry the moment);
- protocol frames (``server_hello``, ``ack``, ``ping``, ``resync_required``,
  ``error``...) are the receiver's, never mapped (:func:`map_frame` returns
  nothing for them).

``companion`` (default): every other frame becomes
``x.kimi-code.web.<vendor type>`` with empty data. ``primary``: the vendor's
real turn boundaries carry the run pair, ``tool.call.started`` opens the
tool pair, approvals and questions become attention (read-only: no options,
no ``respond_via``; the control gate decorates receiver-side with
:func:`answerable`), ``event.session.work_changed`` keeps ``busy`` and
``pending_interaction``; everything else is ``x.kimi-code.web.*`` with empty
data. ``tool.result`` maps to nothing here: the wire result names no tool,
so the receiver re-attaches the name recorded at ``tool.call.started`` and
calls :func:`tool_result` (an unpairable result degrades to channel
visibility, :func:`channel`).

Content: emissions are shaped to the capture ceiling of their type (content
only at ``redacted``+ through the shared capture helpers); the stamper's
gate runs again and agrees (tested).
"""
from __future__ import annotations

import json
import math
from typing import Any

from bridges.core import aep
from bridges.core import capture as _capture
from bridges.core.bridge import Emission
from bridges.core.naming import dotted_type
from bridges.core.posture import Posture
from bridges.core.readers import obj
from bridges.core.readers import text as _s

AGENT = "kimi-code"
CHANNEL = "web"

#: kap-server 2.1.0 ``transport/ws/v1/events.ts`` VOLATILE_EVENT_TYPES.
VOLATILE_TYPES = frozenset({
    "assistant.delta", "thinking.delta", "tool.call.delta", "tool.progress", "shell.output",
    "shell.started", "shell.completed", "agent.status.updated", "event.di.unit_changed",
    "event.capability.changed"})
#: Frames of the socket protocol itself (the receiver's business).
PROTOCOL_TYPES = frozenset({
    "server_hello", "client_hello", "ack", "ping", "pong", "resync_required", "error",
    "subscribe", "unsubscribe", "terminal_output"})
BUS_ECHO_PREFIX = "permission.approval."

#: The vendor's approval decisions (``protocol/approval.ts``), offered as
#: options when control is on; ``approved_for_session`` is the vendor's
#: ``scope: "session"`` approval (approve this tool for the session).
APPROVAL_OPTIONS: tuple[tuple[str, str], ...] = (
    ("approved", "Approve"), ("approved_for_session", "Approve for this session"),
    ("rejected", "Reject"))


def channel(vendor_type: Any) -> Emission:
    """``x.kimi-code.web.<vendor type>`` with empty data (the channel
    visibility every frame degrades to)."""
    return {"type": dotted_type(AGENT, str(vendor_type or "unknown"), prefix=CHANNEL), "data": {}}


def is_event_frame(frame: Any) -> bool:
    """A session/global event envelope (not a protocol frame)."""
    return (isinstance(frame, dict) and isinstance(frame.get("type"), str)
            and frame["type"] not in PROTOCOL_TYPES)


def silent(frame: Any) -> bool:
    """Frames that never emit in either mode: volatile ones, bus echoes."""
    if not isinstance(frame, dict):
        return True
    t = frame.get("type")
    if not isinstance(t, str):
        return True
    return frame.get("volatile") is True or t in VOLATILE_TYPES or t.startswith(BUS_ECHO_PREFIX)


def payload(frame: Any) -> dict[str, Any]:
    return obj(frame.get("payload")) if isinstance(frame, dict) else {}


def map_frame(frame: Any, posture: Posture) -> list[Emission]:
    """One WS event frame -> emissions (see the module docstring). Never
    raises; anything unusable maps to nothing."""
    if not is_event_frame(frame) or silent(frame):
        return []
    t = frame["type"]
    if not posture.primary:
        return [channel(t)]
    try:
        return _primary(t, payload(frame), posture)
    except Exception:  # garbage inside a known type: channel visibility, never a crash
        return [channel(t)]


def _primary(t: str, p: dict[str, Any], posture: Posture) -> list[Emission]:
    if t == "turn.started":
        return [run_started(p, posture)]
    if t == "turn.ended":
        return [run_ended(p)]
    if t == "tool.call.started":
        e = tool_requested(p, posture)
        return [e] if e else [channel(t)]
    if t == "tool.result":
        return []  # the receiver pairs it (tool_result)
    if t == "event.approval.requested":
        return [approval_requested(p, posture)]
    if t == "event.approval.resolved":
        return [approval_resolved(p, posture)]
    if t == "event.question.requested":
        return [question_requested(p, posture)]
    if t == "event.question.answered":
        return [question_answered(p)]
    if t == "event.question.dismissed":
        return [_with_subject({"type": "attention.resolved", "data": {"resolution": "dismissed"}},
                              p.get("question_id"))]
    if t == "event.session.work_changed":
        data: dict[str, Any] = {}
        if isinstance(p.get("busy"), bool):
            data["busy"] = p["busy"]
        if _s(p.get("pending_interaction")):
            data["pending_interaction"] = p["pending_interaction"]
        return [{"type": channel(t)["type"], "data": data}]
    return [channel(t)]


def _with_subject(e: Emission, subject: Any) -> Emission:
    if _s(subject):
        e["subject"] = subject
    return e


TRIGGERS = frozenset({"user", "schedule", "agent", "control", "resume"})


def run_started(p: dict[str, Any], posture: Posture) -> Emission:
    """``turn.started`` -> ``run.started``: ``origin.kind`` is the trigger
    when it is one of the schema's words; the prompt at ``redacted``+."""
    data: dict[str, Any] = {}
    origin = obj(p.get("origin"))
    kind = origin.get("kind")
    if kind in TRIGGERS:
        data["trigger"] = kind
    if _capture.rank(posture.policy.ceiling_for("run.started")) >= _capture.rank("redacted") \
            and _s(p.get("prompt")):
        data["prompt"] = _capture.redact_text(p["prompt"], posture.policy)
    return {"type": "run.started", "data": data}


def run_ended(p: dict[str, Any]) -> Emission:
    """``turn.ended``: ``completed`` -> ``run.finished``; ``cancelled`` ->
    ``run.cancelled`` (no ``by`` claim: the channel does not know who);
    anything else -> ``run.failed`` with the vendor word as ``reason``."""
    reason = p.get("reason")
    if reason == "completed":
        return {"type": "run.finished", "data": {}}
    if reason == "cancelled":
        return {"type": "run.cancelled", "data": {}}
    word = reason if isinstance(reason, str) and reason else "unknown"
    return {"type": "run.failed", "data": {"reason": word[:200]}}


def tool_requested(p: dict[str, Any], posture: Posture) -> Emission | None:
    """``tool.call.started`` -> ``tool.requested`` (subject = tool name;
    ``args_digest`` always, ``args`` only at ``full``)."""
    name, call = _s(p.get("name")), _s(p.get("toolCallId"))
    if name is None:
        return None
    tool: dict[str, Any] = {"name": name}
    if call:
        tool["call_id"] = call
    data: dict[str, Any] = {"tool": tool}
    if "args" in p:
        data["args_digest"] = _capture.digest(p["args"])
        if posture.policy.ceiling_for("tool.requested") == "full":
            data["args"] = _capture.redact_value(p["args"], posture.policy)
    return {"type": "tool.requested", "data": data, "subject": name}


def tool_result(p: dict[str, Any], name: str, posture: Posture) -> Emission:
    """``tool.result`` with the tool ``name`` the receiver recorded at
    ``tool.call.started``: ``isError`` true -> ``tool.failed`` (message at
    ``redacted``+), else ``tool.completed`` (``result_digest`` always,
    ``result_redacted`` / ``result`` at their tiers)."""
    tool: dict[str, Any] = {"name": name}
    if _s(p.get("toolCallId")):
        tool["call_id"] = p["toolCallId"]
    out = p.get("output")
    ceiling = _capture.rank(posture.policy.ceiling_for("tool.completed"))
    if p.get("isError") is True:
        err: dict[str, Any] = {"type": "tool_error"}
        if ceiling >= _capture.rank("redacted") and isinstance(out, str) and out:
            err["message"] = _capture.redact_text(out[:2000], posture.policy)
        return {"type": "tool.failed", "data": {"tool": tool, "error": err}, "subject": name}
    data: dict[str, Any] = {"tool": tool}
    if out is not None:
        data["result_digest"] = _capture.digest(out)
        if isinstance(out, (str, dict)):
            if ceiling >= _capture.rank("full"):
                data["result"] = _capture.redact_value(out, posture.policy)
            elif ceiling >= _capture.rank("redacted"):
                data["result_redacted"] = _capture.redact_value(out, posture.policy)
    return {"type": "tool.completed", "data": data, "subject": name}


def approval_requested(p: dict[str, Any], posture: Posture) -> Emission:
    """``event.approval.requested`` -> ``attention.requested`` kind
    ``permission``, prompt = the vendor's ``action`` line, subject = the
    ``approval_id``; read-only (no options, no ``respond_via``)."""
    data: dict[str, Any] = {"kind": "permission"}
    prompt = _s(p.get("action")) or (f"Allow {p['tool_name']}?" if _s(p.get("tool_name")) else None)
    if prompt:
        data["prompt"] = _capture.redact_text(prompt[:2000], posture.policy)
    return _with_subject({"type": "attention.requested", "data": data}, p.get("approval_id"))


def approval_resolved(p: dict[str, Any], posture: Posture) -> Emission:
    """``event.approval.resolved``: a decision ``approved``/``rejected`` ->
    ``attention.answered`` (``answer.option`` the decision, the vendor's
    ``feedback`` as ``answer.text``, ``via: oob``); no decision (or
    ``cancelled``: the turn went away) -> ``attention.resolved`` dismissed."""
    decision = p.get("decision")
    if decision in ("approved", "rejected"):
        option = "approved_for_session" if decision == "approved" and p.get("scope") == "session" \
            else decision
        answer: dict[str, Any] = {"option": option}
        if _s(p.get("feedback")):
            answer["text"] = _capture.redact_text(p["feedback"], posture.policy)
        return _with_subject({"type": "attention.answered", "data": {"answer": answer, "via": "oob"}},
                             p.get("approval_id"))
    return _with_subject({"type": "attention.resolved", "data": {"resolution": "dismissed"}},
                         p.get("approval_id"))


def question_fields(questions: Any) -> list[dict[str, Any]]:
    """The vendor's ``questions`` as AEP-0006 ``field_spec``s: every item a
    ``select`` (``multi_select`` -> ``multi``, ``allow_other`` ->
    ``other``), the vendor's option ids preserved."""
    fields = []
    for q in questions if isinstance(questions, list) else []:
        if not isinstance(q, dict) or not _s(q.get("id")):
            continue
        f: dict[str, Any] = {"id": q["id"], "type": "select",
                             "label": q["question"] if _s(q.get("question")) else q["id"]}
        choices = [{"id": o["id"], "label": o["label"] if _s(o.get("label")) else o["id"]}
                   for o in q.get("options") or [] if isinstance(o, dict) and _s(o.get("id"))]
        f["choices"] = choices
        if q.get("multi_select") is True:
            f["multi"] = True
        if q.get("allow_other") is True:
            f["other"] = True
        fields.append(f)
    return fields


def question_requested(p: dict[str, Any], posture: Posture) -> Emission:
    """``event.question.requested`` -> ``attention.requested`` kind ``form``
    (prompt = the first question; subject = ``question_id``); read-only."""
    fields = question_fields(p.get("questions"))
    data: dict[str, Any] = {"kind": "form"}
    if fields:
        data["prompt"] = _capture.redact_text(fields[0]["label"], posture.policy)
        data["fields"] = fields
    e = _with_subject({"type": "attention.requested", "data": data}, p.get("question_id"))
    e["gating"] = {"form_fields": fields}
    return e


def question_answered(p: dict[str, Any]) -> Emission:
    """``event.question.answered`` -> ``attention.answered`` with the
    vendor's ``answers`` as ``values`` (``via: oob``)."""
    answers = p.get("answers") if isinstance(p.get("answers"), dict) else {}
    return _with_subject({"type": "attention.answered",
                          "data": {"answer": {"values": answers}, "via": "oob"}},
                         p.get("question_id"))


def aep_values(answers: Any, fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The vendor's answers in AEP-0006 form (``field_spec.id`` -> a choice
    id, a list of ids, or the ``other`` text; ``skipped`` omitted): what the
    receiver puts on the live stream once the request's ``fields`` are known,
    so a consumer checks values against ``field_spec`` ids. Two vendor
    shapes: the protocol's ``{question id: {kind, option_id...}}`` (the pin)
    and 2.1.0's live ``{question text: option label}``."""
    fields = [f for f in fields or [] if isinstance(f, dict)]
    by_id = {f.get("id"): f for f in fields}
    by_label = {f.get("label"): f for f in fields}

    def choice(f: dict[str, Any] | None, v: Any) -> Any:
        for c in (f or {}).get("choices") or []:
            if isinstance(c, dict) and v in (c.get("id"), c.get("label")):
                return c.get("id")
        return v  # free text (an ``other`` answer)

    out: dict[str, Any] = {}
    for k, a in answers.items() if isinstance(answers, dict) else ():
        f = by_id.get(k) or by_label.get(k)
        key = f["id"] if f and isinstance(f.get("id"), str) else k
        if isinstance(a, str):
            out[key] = choice(f, a)
        elif isinstance(a, list):
            out[key] = [choice(f, x) for x in a if isinstance(x, str)]
        elif isinstance(a, dict):
            kind = a.get("kind")
            if kind == "single" and _s(a.get("option_id")):
                out[key] = a["option_id"]
            elif kind == "multi" and isinstance(a.get("option_ids"), list):
                out[key] = [x for x in a["option_ids"] if isinstance(x, str)]
            elif kind == "other" and isinstance(a.get("text"), str):
                out[key] = a["text"]
            elif kind == "multi_with_other":
                ids = [x for x in a.get("option_ids") or [] if isinstance(x, str)]
                out[key] = ids + ([a["other_text"]] if isinstance(a.get("other_text"), str) else [])
    return out


def answerable(emission: Emission) -> Emission:
    """The control gate's decoration of a permission ask: the vendor's own
    options and ``respond_via: ["control"]`` (AEP-0008). Returns a new
    emission; a form stays read-only (question answers are not actuated)."""
    if emission.get("type") != "attention.requested" or \
            (emission.get("data") or {}).get("kind") != "permission":
        return emission
    e = emission.copy()
    e["data"] = {**emission["data"], "options": [{"id": i, "label": lbl} for i, lbl in APPROVAL_OPTIONS],
                 "respond_via": ["control"]}
    return e


#: what :func:`parse_frame` answers for text that is not JSON
NOT_JSON = object()


def seq_of(frame: dict[str, Any]) -> int:
    seq = frame.get("seq")
    return seq if isinstance(seq, int) else 0


DEFAULT_HEARTBEAT_S = 10.0
#: the server's ``heartbeat_ms`` is clamped to this range (seconds)
HEARTBEAT_MIN_S, HEARTBEAT_MAX_S = 1.0, 300.0


def heartbeat_s(hb: object) -> float:
    """The server's announced ``heartbeat_ms`` in seconds, clamped to
    [:data:`HEARTBEAT_MIN_S`, :data:`HEARTBEAT_MAX_S`];
    :data:`DEFAULT_HEARTBEAT_S` for anything not a positive finite number
    (a boolean, a string, NaN, Infinity)."""
    if isinstance(hb, bool) or not isinstance(hb, (int, float)) or not math.isfinite(hb) or hb <= 0:
        return DEFAULT_HEARTBEAT_S
    return min(HEARTBEAT_MAX_S, max(HEARTBEAT_MIN_S, hb / 1000))


def parse_frame(raw: Any) -> Any:
    """A socket frame's JSON, or :data:`NOT_JSON`: also for a frame over
    :func:`bridges.core.aep.check_json`'s caps (refused before the parse:
    a 16 MiB frame of them held the event loop for seconds)."""
    try:
        if isinstance(raw, (str, bytes)):
            aep.check_json(raw)
        return json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return NOT_JSON
