"""The pure ACP moment -> AEP emissions mapping.

Input: one *moment* (the tee's reduction of a newline-framed JSON-RPC 2.0
line, see :mod:`bridges.acp.join`)::

    {"kind": "request" | "response" | "notification",
     "method": str,                  # a response carries its request's method
     "params"?: dict,                # request / notification
     "result"?: Any, "error"?: dict, # response
     "request"?: dict}               # response: the joined request's params

plus the :class:`Posture`; output: a list of emissions shaped exactly like
the mapping pins' ``expected`` objects (``{type, data, subject?}``, plus the
envelope hints ``severity`` / ``gating`` that the stamper consumes and the
pins do not carry). No I/O, no clocks, no globals; never raises for any
JSON-shaped input (hypothesis-fuzzed).

Pins: ``shared/aep/conformance/fixtures/mappings/acp.json``. Design record:
``shared/aep/docs/bridge-acp-design.md`` ("Core vs ``x.acp.*``"); AEP-0002
Annex A, AEP-0003 §9 (capture), AEP-0008 (read-only attention).

Content follows the capture ceiling of each type, as the pins fix it at the
default posture (capture ``metadata``, ``attention.*`` at ``redacted``):
digests (AEP-0003 §9.3, over the original value) at ``metadata``, content
fields through the §9.4 pipeline at ``redacted``, verbatim at ``full``.

Drift handled beside the pins (``tests/fixtures/acp_real/README.md``): the
real schema-v1.19 ``usage_update`` carries ``used``/``size``/``cost`` (the
pin's ``usedTokens``/``outputTokens`` shape is mapped too); the unstable
``PromptResponse.usage`` (``inputTokens``/``outputTokens``) rides
``run.finished`` as ``gen_ai.usage.*``; ``session/cancel`` is a notification
on the real wire (the pin calls it a request; both map alike);
``session/fork`` and ``session/resume`` responses bind sessions like
``session/new``/``load``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridges.core import capture as _capture
from bridges.core.naming import path_type
from bridges.core.readers import arr as _l
from bridges.core.readers import obj as _d
from bridges.core.readers import text as _s
from bridges.core.readers import whole as _int

Emission = dict[str, Any]

VENDOR = "acp"
"""The extension namespace: ``x.acp.*`` whatever the agent id (the bridge
observes a protocol, not a vendor)."""

CLIENT_NAME = "acp"
"""``session.started.client.name`` (the pin): the wire the session was seen on."""

#: ``session/prompt`` ``stopReason`` -> the run terminal (design record
#: "Id joins and identity": bounded terminations are completions).
STOP_FINISHED = frozenset({"end_turn", "max_tokens", "max_turn_requests"})

#: Responses whose result binds a session (``session.started``).
SESSION_BINDS = frozenset({"session/new", "session/load", "session/fork", "session/resume"})
#: Requests that end a session.
SESSION_ENDS = frozenset({"session/close", "session/delete"})

#: ``session/update`` chunk tags, emitted only with the deltas opt-in.
CHUNKS = {
    "agent_message_chunk": "x.acp.agent.message.chunk",
    "agent_thought_chunk": "x.acp.agent.thought.chunk",
    "user_message_chunk": "x.acp.user.message.chunk",
}

TOOL_TERMINALS = ("completed", "failed")


@dataclass(frozen=True)
class Posture:
    """``policy``: the capture posture (the stamper's); ``deltas``: map
    message/thought/user chunks (``AEP_ACP_DELTAS=1``); ``agent``: the AEP
    agent id (used only for the synthesized ``metadata`` prompt)."""

    policy: _capture.CapturePolicy = field(default_factory=_capture.CapturePolicy)
    deltas: bool = False
    agent: str = VENDOR

    def content(self, type_: str) -> str | None:
        """``redacted`` / ``full`` when content may ride on ``type_``."""
        c = self.policy.ceiling_for(type_)
        return c if c in ("redacted", "full") else None

    def text(self, type_: str, value: str) -> str:
        """``value`` at this type's ceiling (call only when :meth:`content`)."""
        if self.policy.ceiling_for(type_) == "full":
            return value
        return _capture.redact_text(value, self.policy)

    def value(self, type_: str, value: Any) -> Any:
        if self.policy.ceiling_for(type_) == "full":
            return value
        return _capture.redact_value(value, self.policy)


# ---------------------------------------------------------------- small readers

def _debug(e: Emission) -> Emission:
    e["severity"] = "debug"
    return e


def vendor_type(name: str) -> str:
    """``x.acp.<segments>`` by the mechanical rule (every ``/`` and ``_``
    separates a segment; a single segment gains ``.event``)."""
    return path_type(VENDOR, name)


def fallback(name: str, data: dict[str, Any] | None = None) -> Emission:
    """The machinery plane: ``x.acp.<name>`` at ``debug``."""
    return _debug({"type": vendor_type(name), "data": data or {}})


# ---------------------------------------------------------------- entry point

def map_moment(moment: Any, posture: Posture | None = None) -> list[Emission]:
    """Map one moment (module docstring) at ``posture``. Anything
    unrecognizable maps to the mechanical fallback or to nothing; never
    raises for JSON-shaped input."""
    posture = posture or Posture()
    m = _d(moment)
    kind = m.get("kind")
    method = _s(m.get("method"))
    if method is None:
        return []
    if kind == "request":
        return _request(method, _d(m.get("params")), posture)
    if kind == "notification":
        if method == "session/update":
            return _update(_d(_d(m.get("params")).get("update")), posture)
        return _request(method, _d(m.get("params")), posture)
    if kind == "response":
        return _response(method, m, posture)
    return []


def session_of(moment: Any) -> str | None:
    """The AEP session of a moment: ``params.sessionId``, else (a
    response) ``result.sessionId`` (``session/new``, ``fork``), else the
    joined request's ``sessionId``; ``None`` for connection-level moments
    (``initialize``, ``authenticate``)."""
    m = _d(moment)
    return (_s(_d(m.get("params")).get("sessionId"))
            or _s(_d(m.get("result")).get("sessionId"))
            or _s(_d(m.get("request")).get("sessionId")))


# ---------------------------------------------------------------- requests

def prompt_text(blocks: Any) -> str:
    """The text of a ``session/prompt`` ``prompt`` (text blocks joined by
    newlines; resources by their URI; other blocks by their type)."""
    parts = []
    for b in _l(blocks):
        b = _d(b)
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            parts.append(b["text"])
        elif _s(b.get("uri")) or _s(_d(b.get("resource")).get("uri")):
            parts.append(f"[{_s(b.get('uri')) or _d(b.get('resource')).get('uri')}]")
        elif _s(b.get("type")):
            parts.append(f"[{b['type']}]")
    return "\n".join(parts)


def _request(method: str, p: dict[str, Any], posture: Posture) -> list[Emission]:
    if method == "session/prompt":
        data: dict[str, Any] = {"trigger": "user"}
        if "prompt" in p:
            data["message_digest"] = _capture.digest(p["prompt"])
            if posture.content("run.started"):
                data["prompt"] = posture.text("run.started", prompt_text(p["prompt"]))
        return [{"type": "run.started", "data": data}]
    if method == "session/request_permission":
        return [_permission(p, posture)]
    if method in SESSION_ENDS:
        return [{"type": "session.ended", "data": {"reason": "normal"}}]
    return [fallback(method)]


def _permission(p: dict[str, Any], posture: Posture) -> Emission:
    """The editor's gate, observed READ-ONLY (AEP-0008): no ``options``
    claim, no ``respond_via``; the option list rides as a count."""
    tool = _d(p.get("toolCall"))
    subject = _s(tool.get("toolCallId"))
    title = _s(tool.get("title"))
    if posture.content("attention.requested") and title:
        prompt = posture.text("attention.requested", f"Permission requested: {title}")
    else:
        prompt = _capture.synthesize_prompt(posture.agent, "permission", subject)
    data: dict[str, Any] = {"kind": "permission", "prompt": prompt,
                            "options_count": len(_l(p.get("options")))}
    e: Emission = {"type": "attention.requested", "data": data}
    if subject:
        e["subject"] = subject
    return e


# ---------------------------------------------------------------- responses

def _error_type(err: dict[str, Any]) -> str:
    code = _int(err.get("code"))
    return f"jsonrpc_{code}" if code is not None else "jsonrpc_error"


def _response(method: str, m: dict[str, Any], posture: Posture) -> list[Emission]:
    err = m.get("error")
    if method == "session/prompt":
        return [_prompt_result(m, posture)]
    if method == "session/request_permission":
        return _permission_result(m)
    code = _int(_d(err).get("code")) if err is not None else None
    if method in SESSION_BINDS:
        if err is not None:
            return [fallback(f"{method}/error", {"code": code} if code is not None else {})]
        return [{"type": "session.started", "data": {"client": {"name": CLIENT_NAME}}}]
    data: dict[str, Any] = {}
    if err is not None:
        data["error"] = True
        if code is not None:
            data["code"] = code
    return [fallback(f"{method}/result", data)]


def _prompt_result(m: dict[str, Any], posture: Posture) -> Emission:
    """The turn's terminal by ``stopReason`` (a JSON-RPC error fails it)."""
    err = m.get("error")
    if err is not None:
        data: dict[str, Any] = {"reason": "error", "error": {"type": _error_type(_d(err))}}
        msg = _s(_d(err).get("message"))
        if msg and posture.content("run.failed"):
            data["error"]["message"] = posture.text("run.failed", msg)
        return {"type": "run.failed", "data": data}
    result = _d(m.get("result"))
    stop = _s(result.get("stopReason"))
    if stop == "cancelled":
        return {"type": "run.cancelled", "data": {"by": "user"}}
    if stop == "refusal":
        return {"type": "run.failed", "data": {"reason": "refusal"}}
    data = {"stop_reason": stop} if stop else {}
    usage = _d(result.get("usage"))  # schema-v1.19 UNSTABLE PromptResponse.usage
    for key, field_ in (("inputTokens", "gen_ai.usage.input_tokens"),
                        ("outputTokens", "gen_ai.usage.output_tokens")):
        n = _int(usage.get(key))
        if n is not None and n >= 0:
            data[field_] = n
    return {"type": "run.finished", "data": data}


def _permission_result(m: dict[str, Any]) -> list[Emission]:
    """The editor's answer: ``attention.answered`` (the option verbatim, via
    ``oob``), or ``attention.resolved`` dismissed for a cancelled outcome."""
    subject = _s(_d(_d(m.get("request")).get("toolCall")).get("toolCallId"))
    outcome = _d(_d(m.get("result")).get("outcome"))
    option = _s(outcome.get("optionId"))
    e: Emission
    if m.get("error") is None and outcome.get("outcome") == "selected" and option:
        e = {"type": "attention.answered", "data": {"answer": {"option": option}, "via": "oob"}}
    else:
        e = {"type": "attention.resolved", "data": {"resolution": "dismissed"}}
    if subject:
        e["subject"] = subject
    return [e]


def resolution(moment: Any) -> Emission | None:
    """The follow-up ``attention.resolved`` (resolution ``answered``) of an
    answered permission moment, or ``None``: the pins leave the pairing to
    the tee's runtime state (:mod:`bridges.acp.join`)."""
    m = _d(moment)
    if m.get("kind") != "response" or m.get("method") != "session/request_permission":
        return None
    outcome = _d(_d(m.get("result")).get("outcome"))
    if m.get("error") is None and outcome.get("outcome") == "selected" and _s(outcome.get("optionId")):
        e: Emission = {"type": "attention.resolved", "data": {"resolution": "answered"}}
        subject = _s(_d(_d(m.get("request")).get("toolCall")).get("toolCallId"))
        if subject:
            e["subject"] = subject
        return e
    return None


# ---------------------------------------------------------------- session/update

def _tool_ref(u: dict[str, Any], title: str | None) -> dict[str, Any]:
    call_id = _s(u.get("toolCallId"))
    ref: dict[str, Any] = {"name": _s(u.get("title")) or title or call_id or "tool"}
    if call_id:
        ref["call_id"] = call_id
    return ref


def _with_subject(e: Emission, u: dict[str, Any]) -> Emission:
    if _s(u.get("toolCallId")):
        e["subject"] = u["toolCallId"]
    return e


def _update(u: dict[str, Any], posture: Posture, title: str | None = None) -> list[Emission]:
    tag = _s(u.get("sessionUpdate"))
    if tag is None:
        return [fallback("session/update")]
    if tag == "tool_call":
        data: dict[str, Any] = {"tool": _tool_ref(u, title)}
        if _s(u.get("kind")):
            data["kind"] = u["kind"]
        if "rawInput" in u:
            data["args_digest"] = _capture.digest(u["rawInput"])
            if posture.content("tool.requested") == "redacted":
                data["args_redacted"] = posture.value("tool.requested", u["rawInput"])
            elif posture.content("tool.requested") == "full":
                data["args"] = u["rawInput"]
        return [_with_subject({"type": "tool.requested", "data": data}, u)]
    if tag == "tool_call_update":
        return [_tool_update(u, posture, title)]
    if tag in CHUNKS:
        if not posture.deltas:
            return []
        text = _d(u.get("content")).get("text")
        data = {}
        if isinstance(text, str) and posture.content(CHUNKS[tag]):
            data["delta"] = posture.text(CHUNKS[tag], text)
        return [_debug({"type": CHUNKS[tag], "data": data})]
    if tag == "plan":
        return [_plan(u, posture)]
    if tag == "usage_update":
        return [_usage(u)]
    return [fallback(tag)]


def map_update(update: Any, posture: Posture | None = None, *, title: str | None = None
               ) -> list[Emission]:
    """One ``session/update`` ``update`` object; ``title``: the tool title
    remembered from the call's first update (a later update may omit it)."""
    return _update(_d(update), posture or Posture(), title)


def _tool_update(u: dict[str, Any], posture: Posture, title: str | None) -> Emission:
    status = _s(u.get("status"))
    ref = _tool_ref(u, title)
    if status == "completed":
        data: dict[str, Any] = {"tool": ref}
        if "rawOutput" in u:
            data["result_digest"] = _capture.digest(u["rawOutput"])
            if posture.content("tool.completed") == "redacted":
                data["result_redacted"] = posture.value("tool.completed", u["rawOutput"])
            elif posture.content("tool.completed") == "full":
                data["result"] = u["rawOutput"]
        return _with_subject({"type": "tool.completed", "data": data}, u)
    if status == "failed":
        return _with_subject({"type": "tool.failed",
                              "data": {"tool": ref, "error": {"type": "tool_error"}}}, u)
    return _with_subject(_debug({"type": "x.acp.tool_call.update",
                                 "data": {"status": status} if status else {}}), u)


def _plan(u: dict[str, Any], posture: Posture) -> Emission:
    """Entry counts by status, never invented task transitions (plan
    entries carry no id); the entries themselves only at ``redacted``+."""
    counts: dict[str, int] = {}
    entries = [_d(e) for e in _l(u.get("entries"))]
    for e in entries:
        status = _s(e.get("status"))
        if status:
            key = f"entries_{status}"
            counts[key] = counts.get(key, 0) + 1
    data: dict[str, Any] = dict(counts)
    type_ = "x.acp.plan.updated"
    if posture.content(type_):
        data["entries"] = [{"content": posture.text(type_, e["content"])
                            if isinstance(e.get("content"), str) else None,
                            "priority": e.get("priority"), "status": e.get("status")}
                           for e in entries]
    return _debug({"type": type_, "data": data})


def _usage(u: dict[str, Any]) -> Emission:
    data: dict[str, Any] = {}
    # the pin's shape
    if _int(u.get("usedTokens")) is not None:
        data["gen_ai.usage.input_tokens"] = u["usedTokens"]
    if _int(u.get("outputTokens")) is not None:
        data["gen_ai.usage.output_tokens"] = u["outputTokens"]
    # schema-v1.19 (the real SDKs): context window use and cumulative cost
    if _int(u.get("used")) is not None:
        data["context_used_tokens"] = u["used"]
    if _int(u.get("size")) is not None:
        data["context_size_tokens"] = u["size"]
    cost = _d(u.get("cost"))
    if isinstance(cost.get("amount"), (int, float)) and not isinstance(cost.get("amount"), bool):
        data["cost"] = {"total": cost["amount"]}
        if _s(cost.get("currency")):
            data["cost"]["currency"] = cost["currency"]
    return _debug({"type": "x.acp.usage.updated", "data": data})
