"""The pure mapping of OpenCode / Kilo Code moments to AEP emissions.

Input: one vendor moment plus the :class:`~bridges.core.posture.Posture` (vendor identity, mode,
capture policy, whether asks are answerable); output: a list of emissions
shaped exactly like the mapping pins' ``expected`` objects (``{type, data,
subject?}``, plus the envelope hints ``severity`` and ``gating`` that the
stamper consumes and the pins do not carry). No I/O, no clocks, no globals.

Pins: ``shared/aep/conformance/fixtures/mappings/opencode.json`` and
``kilocode.json`` (``moments``, ``todos``, ``fallback``, ``sse_modes``).
Design records: ``shared/aep/docs/adapter-opencode-design.md`` (the SSE
bridge section), ``adapter-kilocode-design.md``; AEP-0002 §5.3 and Annex A
(A.7, A.8), AEP-0006 (the form kind), AEP-0008 (answer channels).

Three postures (:attr:`Posture.mode`):

- ``adapter``: the plugin adapter's posture the ``moments`` block pins (the
  hold-open ``permission.ask`` hook is the ask carrier, so the bus
  ``permission.updated`` maps to nothing; the >=7.4.6 bus asks carry the
  vendor reply vocabulary and ``respond_via: ["control"]``). The SSE bridge
  never runs in it; it exists so every pin reproduces.
- ``companion`` (the SSE bridge's default): ONLY ``x.{agent}.*``, zero core
  types: core-mapped and suppressed moments become ``x.{agent}.{bus type}``
  with empty data; already-vendor moments keep their mapped shape.
- ``primary``: the full bus mapping with the read-only-channel rule: asks
  carry no options and no ``respond_via`` (a form keeps its fields), unless
  :attr:`Posture.answerable` (the control gate is honored): then a
  permission ask offers the vendor's own ``once``/``always``/``reject`` and
  both kinds declare ``respond_via: ["control"]``.

Streaming is never emitted: ``message.part.delta`` and non-tool
``message.part.updated`` parts (text, reasoning, step markers) map to
nothing in every mode; so does ``server.heartbeat`` (liveness only).

Content: each emission is already shaped to the capture ceiling of its type
(content fields only at ``redacted``+, through the AEP-0003 §9.4 pipeline);
the stamper's gate runs again and agrees (tested).
"""
from __future__ import annotations

import copy
import json
from typing import Any, Callable

from bridges.core import capture as _capture
from bridges.core.bridge import Emission
from bridges.core.posture import Posture
from bridges.core.readers import arr as _l
from bridges.core.readers import obj as _d
from bridges.core.readers import text as _s
from bridges.core.readers import whole as _int

#: The >=7.4.6 / current reply enum, verbatim as options (design record
#: "respond: answerable attention in the vendor's own vocabulary").
PERMISSION_OPTIONS: tuple[tuple[str, str], ...] = (
    ("once", "Allow once"), ("always", "Always allow"), ("reject", "Reject"))
#: What the hold-open hook surface can deliver (``output.status``).
HOOK_OPTIONS: tuple[tuple[str, str], ...] = (("allow", "Allow"), ("deny", "Deny"))

#: Bus types that are the model/stream plane: never emitted.
STREAMING = frozenset({"message.part.delta", "server.heartbeat"})


def _debug(e: Emission) -> Emission:
    e["severity"] = "debug"
    return e


# ---------------------------------------------------------------- entry points

def map_moment(moment: object, posture: Posture) -> list[Emission]:
    """Map one pinned moment shape: ``{kind: "bus", event: {type,
    properties}}`` or the plugin hooks ``{kind: "tool.before" | "tool.after",
    input, output}`` / ``{kind: "permission.ask", permission}``. Anything
    unrecognizable maps to nothing (never raises for JSON-shaped input)."""
    m = _d(moment)
    kind = m.get("kind")
    if kind == "bus":
        ev = _d(m.get("event"))
        type_ = _s(ev.get("type"))
        if type_ is None:
            return []
        return map_bus(type_, _d(ev.get("properties")), posture)
    if kind == "tool.before":
        return [_tool_before(_d(m.get("input")), _d(m.get("output")), posture)]
    if kind == "tool.after":
        return [_tool_after(_d(m.get("input")), _d(m.get("output")), posture)]
    if kind == "permission.ask":
        return [_permission_ask(_d(m.get("permission")), posture, HOOK_OPTIONS, True)]
    return []


def map_bus(type_: str, props: dict[str, Any], posture: Posture) -> list[Emission]:
    """Map one bus event (``type`` + ``properties``) in ``posture``."""
    if type_ in STREAMING:
        return []
    if type_ == "message.part.updated" and _d(props.get("part")).get("type") != "tool":
        return []
    core = _core(type_, props, posture)
    if posture.mode == "companion":
        if core is None or not core or any(not e["type"].startswith("x.") for e in core):
            return [fallback(type_, posture)]
        return core
    if core is None:
        return [fallback(type_, posture)]
    return core


def fallback(type_: str, posture: Posture) -> Emission:
    """The mechanical fallback: ``x.{agent}.{bus type}``, empty data, debug
    (unknown types are never guessed; pins ``fallback``)."""
    return _debug({"type": posture.vendor(type_), "data": {}})


# ---------------------------------------------------------------- the table

Mapped = list[Emission] | None
"""A table entry's result: ``None`` = no mapping (fallback), ``[]`` =
deliberately nothing."""


def _core(type_: str, p: dict[str, Any], posture: Posture) -> Mapped:
    """The adapter/primary mapping of one bus type (:data:`_TABLE`)."""
    entry = _TABLE.get(type_)
    return entry(p, posture) if entry is not None else None


def _session_status(p: dict[str, Any], posture: Posture) -> Mapped:
    status = _d(p.get("status"))
    data: dict[str, Any] = {}
    msg = _s(status.get("message"))
    if msg and posture.content("progress.status"):
        data["message"] = posture.text("progress.status", msg)
    return [{"type": "progress.status", "data": data,
             "subject": _s(status.get("type")) or "unknown"}]


def _session_error(p: dict[str, Any], posture: Posture) -> Mapped:
    err = _d(p.get("error"))
    data = {"type": err["name"]} if _s(err.get("name")) else {}
    return [{"type": posture.vendor("session.error"), "data": data, "severity": "error"}]


def _message_updated(p: dict[str, Any], posture: Posture) -> Mapped:
    info = _d(p.get("info"))
    role = info.get("role")
    if role == "user":
        return [{"type": "run.started", "data": {"trigger": "user"}}]
    if role != "assistant":
        return None
    data: dict[str, Any] = {"role": "assistant"}
    tokens = _d(info.get("tokens"))
    if _int(tokens.get("input")) is not None:
        data["gen_ai.usage.input_tokens"] = tokens["input"]
    if _int(tokens.get("output")) is not None:
        data["gen_ai.usage.output_tokens"] = tokens["output"]
    return [_debug({"type": posture.vendor("message.updated"), "data": data})]


def _permission_updated(p: dict[str, Any], posture: Posture) -> Mapped:
    """The <=7.4.5 / 1.17 ask moment."""
    if posture.mode == "adapter":
        return []  # the hold-open hook carries it (pin permission_updated)
    return [_permission_ask(p, posture, PERMISSION_OPTIONS, posture.answerable)]


def _permission_asked(p: dict[str, Any], posture: Posture) -> Mapped:
    """The current ask moment."""
    answerable = posture.mode == "adapter" or posture.answerable
    return [_permission_ask(p, posture, PERMISSION_OPTIONS, answerable)]


def _command_executed(p: dict[str, Any], posture: Posture) -> Mapped:
    data = {"name": p["name"]} if _s(p.get("name")) else {}
    return [_debug({"type": posture.vendor("command.executed"), "data": data})]


def _vendor_debug(type_: str) -> Callable[[dict[str, Any], Posture], Mapped]:
    """``x.{agent}.{type_}``, empty data, debug."""
    return lambda p, posture: [_debug({"type": posture.vendor(type_), "data": {}})]


def _const(*emissions: Emission) -> Callable[[dict[str, Any], Posture], Mapped]:
    """Always these emissions (fresh copies each time)."""
    return lambda p, posture: [copy.deepcopy(e) for e in emissions]


_TABLE: dict[str, Callable[[dict[str, Any], Posture], Mapped]] = {
    "session.created": lambda p, posture: [_session_started(_d(p.get("info")), posture)],
    "session.deleted": _const({"type": "session.ended", "data": {"reason": "normal"}}),
    "session.idle": _const({"type": "run.finished", "data": {}}),
    "session.compacted": _const({"type": "session.compacted", "data": {}}),
    "session.status": _session_status,
    "session.error": _session_error,
    "message.updated": _message_updated,
    "message.part.updated": lambda p, posture: map_tool_part(_d(p.get("part")), posture),
    "permission.updated": _permission_updated,
    "permission.asked": _permission_asked,
    "permission.replied": lambda p, posture: [
        _resolved("answered", _s(p.get("permissionID")) or _s(p.get("requestID")))],
    "question.asked": lambda p, posture: [
        _question_ask(p, posture, posture.mode == "adapter" or posture.answerable)],
    "question.replied": lambda p, posture: [_resolved("answered", _s(p.get("requestID")))],
    "question.rejected": lambda p, posture: [_resolved("dismissed", _s(p.get("requestID")))],
    # a snapshot: the receiver diffs consecutive ones (pin todos)
    "todo.updated": _const(),
    "file.edited": _vendor_debug("file.edited"),
    "command.executed": _command_executed,
    "server.connected": _vendor_debug("server.connected"),
}
"""Bus type -> its mapping (the design record's table, one entry per row)."""


def _resolved(resolution: str, subject: str | None) -> Emission:
    e: Emission = {"type": "attention.resolved", "data": {"resolution": resolution}}
    if subject:
        e["subject"] = subject
    return e


def _session_started(info: dict[str, Any], posture: Posture) -> Emission:
    client: dict[str, Any] = {"name": posture.agent}
    if _s(info.get("version")):
        client["version"] = info["version"]
    data: dict[str, Any] = {"client": client}
    if _s(info.get("parentID")):
        data["parent"] = {"session": info["parentID"]}
    if posture.content("session.started"):
        if _s(info.get("title")):
            data["label"] = posture.text("session.started", info["title"])
        if _s(info.get("directory")):
            data["cwd"] = posture.text("session.started", info["directory"])
    return {"type": "session.started", "data": data}


def _options(pairs: tuple[tuple[str, str], ...], posture: Posture) -> list[dict[str, str]]:
    real = posture.content("attention.requested") is not None
    return [{"id": i, "label": label if real else i} for i, label in pairs]


def permission_title(p: dict[str, Any]) -> str | None:
    """The human line of a permission ask: the pinned ``title``, else the
    current shape's ``patterns`` (the command pattern being asked for)."""
    if _s(p.get("title")):
        return p["title"]
    pats = [x for x in _l(p.get("patterns")) if _s(x)]
    if pats:
        return ", ".join(pats)
    return _s(p.get("pattern"))


def _permission_ask(p: dict[str, Any], posture: Posture,
                    options: tuple[tuple[str, str], ...], answerable: bool) -> Emission:
    """``attention.requested`` kind ``permission`` from either ask shape:
    pinned ``{id, type, pattern, title, callID...}`` or current
    ``{id, permission, patterns, metadata, always, tool}``. Subject: the
    permission type (the tool, ``bash``)."""
    tool = _s(p.get("type")) or _s(p.get("permission")) or "permission"
    t = "attention.requested"
    if posture.content(t):
        title = permission_title(p)
        prompt = f"Permission requested: {tool} \u2014 {title}" if title \
            else f"Permission requested: {tool}"
        prompt = posture.text(t, prompt)
    else:
        prompt = _capture.synthesize_prompt(posture.agent, "permission", tool)
    data: dict[str, Any] = {"kind": "permission", "prompt": prompt}
    if answerable:
        data["options"] = _options(options, posture)
        data["respond_via"] = ["control"]
    return {"type": t, "data": data, "subject": tool}


def question_fields(questions: list[Any], posture: Posture) -> list[dict[str, Any]]:
    """AEP-0006 ``field_spec`` list for a vendor ``questions`` array, on the
    AskUserQuestion shape the Kilo pin fixes: field and choice ids are
    1-based indexes (structural at any ceiling); labels are
    ``"{header}: {question}"`` / the option labels at ``redacted``+ and the
    ids at ``metadata``; ``custom`` (vendor default true) -> ``other``;
    ``multiple`` -> ``multi``; every question is required."""
    real = posture.content("attention.requested") is not None
    fields = []
    for i, q in enumerate(questions, 1):
        q = _d(q)
        fid = str(i)
        header, question = _s(q.get("header")), _s(q.get("question"))
        text = f"{header}: {question}" if header and question else (question or header or fid)
        choices = []
        for j, o in enumerate(_l(q.get("options")), 1):
            lab = _s(_d(o).get("label")) or str(j)
            choices.append({"id": str(j), "label": posture.text("attention.requested", lab)
                            if real else str(j)})
        f: dict[str, Any] = {"id": fid, "type": "select" if choices else "string",
                             "label": posture.text("attention.requested", text) if real else fid,
                             "required": True}
        if choices:
            if q.get("multiple") is True:
                f["multi"] = True
            if q.get("custom") is not False:
                f["other"] = True
            f["choices"] = choices
        fields.append(f)
    return fields


def _question_ask(p: dict[str, Any], posture: Posture, answerable: bool) -> Emission:
    qs = _l(p.get("questions"))
    n = len(qs)
    data: dict[str, Any] = {
        "kind": "form",
        "prompt": f"{posture.agent} asks {n} question{'' if n == 1 else 's'}",
        "fields": question_fields(qs, posture),
    }
    if answerable:
        data["respond_via"] = ["control"]
    e: Emission = {"type": "attention.requested", "data": data,
                   "gating": {"structural": ["prompt"]}}
    if _s(p.get("id")):
        e["subject"] = p["id"]
    return e


# ---------------------------------------------------------------- tools

def _tool_ref(name: Any, call: Any) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": _s(name) or "unknown"}
    if _s(call):
        ref["call_id"] = call
    return ref


def _args(data: dict[str, Any], args: Any, posture: Posture, t: str) -> None:
    data["args_digest"] = _capture.digest(args)
    level = posture.content(t)
    if not isinstance(args, dict):  # the schema's args are an object
        return
    if level == "full":
        data["args"] = args
    elif level == "redacted":
        data["args_redacted"] = _capture.redact_value(args, posture.policy)


def _result(data: dict[str, Any], result: Any, posture: Posture, t: str) -> None:
    data["result_digest"] = _capture.digest(result)
    level = posture.content(t)
    if result is None:
        return
    if not isinstance(result, (dict, str)):  # the schema's result: object | string
        result = json.dumps(result, ensure_ascii=False, default=str)
    if level == "full":
        data["result"] = result
    elif level == "redacted":
        data["result_redacted"] = _capture.redact_value(result, posture.policy)


def _tool_before(inp: dict[str, Any], out: dict[str, Any], posture: Posture) -> Emission:
    data: dict[str, Any] = {"tool": _tool_ref(inp.get("tool"), inp.get("callID"))}
    _args(data, out.get("args"), posture, "tool.requested")
    return {"type": "tool.requested", "data": data, "subject": data["tool"]["name"]}


def _tool_after(inp: dict[str, Any], out: dict[str, Any], posture: Posture) -> Emission:
    data: dict[str, Any] = {"tool": _tool_ref(inp.get("tool"), inp.get("callID"))}
    _result(data, out.get("output"), posture, "tool.completed")
    return {"type": "tool.completed", "data": data, "subject": data["tool"]["name"]}


def tool_status(part: dict[str, Any]) -> str | None:
    """``pending``/``running``/``completed``/``error`` of a tool part."""
    return _s(_d(part.get("state")).get("status"))


def map_tool_part(part: dict[str, Any], posture: Posture, *,
                  denied_by: str | None = None) -> list[Emission]:
    """A ``message.part.updated`` tool part (the SSE surface's tool plane:
    ``state.status`` pending -> running -> completed | error). Stateless:
    pending/running -> ``tool.requested`` (``args_digest`` once the input
    is known), completed -> ``tool.completed`` (``result_digest``,
    ``duration_ms``), error -> ``tool.failed``, or ``tool.denied`` when the
    caller knows the error is a refused permission (``denied_by``: ``policy``
    for an operator's AEP reject, ``runtime`` for one made in the vendor's
    own UI). The receiver emits each call's ``requested`` once and one
    terminal."""
    state = _d(part.get("state"))
    status = _s(state.get("status"))
    tool = _tool_ref(part.get("tool"), part.get("callID"))
    name = tool["name"]
    data: dict[str, Any] = {"tool": tool}
    times = _d(state.get("time"))
    start, end = _int(times.get("start")), _int(times.get("end"))
    duration = end - start if start is not None and end is not None and end >= start else None
    if status in ("pending", "running"):
        inp = state.get("input")
        if isinstance(inp, dict) and inp:
            _args(data, inp, posture, "tool.requested")
        return [{"type": "tool.requested", "data": data, "subject": name}]
    if status == "completed":
        _result(data, state.get("output"), posture, "tool.completed")
        if duration is not None:
            data["duration_ms"] = duration
        return [{"type": "tool.completed", "data": data, "subject": name}]
    if status == "error":
        if denied_by:
            data["by"] = denied_by
            return [{"type": "tool.denied", "data": data, "subject": name}]
        err: dict[str, Any] = {"type": "tool_error"}
        if _s(state.get("error")) and posture.content("tool.failed"):
            err["message"] = posture.text("tool.failed", state["error"])
        data["error"] = err
        if duration is not None:
            data["duration_ms"] = duration
        return [{"type": "tool.failed", "data": data, "subject": name}]
    return []


# ---------------------------------------------------------------- todos

def todo_key(todo: object) -> str | None:
    """A todo's identity: the pinned ``id``; the current vendor ``Todo``
    (``{content, status, priority}``) has none, so its content stands in."""
    t = _d(todo)
    return _s(t.get("id")) or _s(t.get("content"))


def todo_subject(todo: object) -> str:
    """The ``subject`` of a task event: the vendor id, else a digest of the
    content (the content itself is ``redacted``-gated; a subject is not)."""
    t = _d(todo)
    return _s(t.get("id")) or "todo-" + _capture.digest(_s(t.get("content")) or "")[:16]


def diff_todos(prev: object, nxt: object, posture: Posture) -> list[Emission]:
    """The pure snapshot diff (pin ``todos``): ids new in ``nxt`` plan;
    transitions to ``completed`` (including new items already completed)
    complete; removals and other churn stay silent. Task content rides as
    ``task.title`` only at ``redacted``+."""
    before = {}
    for t in _l(prev):
        k = todo_key(t)
        if k is not None:
            before[k] = _d(t).get("status")
    out: list[Emission] = []
    for t in _l(nxt):
        k = todo_key(t)
        if k is None:
            continue
        status = _d(t).get("status")
        data_for = _task_data(t, posture)
        subject = todo_subject(t)
        if k not in before:
            out.append({"type": "progress.task.planned", "data": data_for("progress.task.planned"),
                        "subject": subject})
        if status == "completed" and before.get(k) != "completed":
            out.append({"type": "progress.task.completed",
                        "data": data_for("progress.task.completed"), "subject": subject})
    return out


def _task_data(todo: Any, posture: Posture):
    content = _s(_d(todo).get("content"))

    def data(t: str) -> dict[str, Any]:
        if content and posture.content(t):
            return {"task": {"title": posture.text(t, content)}}
        return {}
    return data
