"""The pure OpenHands mapping: agent-server events -> AEP emissions.

Design record: ``shared/aep/docs/bridge-openhands-design.md`` ("Field maps",
"Run synthesis", "The attention loop", "Timestamps"); pins:
``shared/aep/conformance/fixtures/mappings/openhands.json`` (``events``,
``fallback``, ``status_transitions``); AEP-0002 Annex A.15.

Pure: no I/O, no clocks, no globals beyond constants. Every function accepts
any JSON-shaped input and never raises for it (hypothesis-fuzzed).

- :func:`map_event` ``(event, posture) -> list[Emission]``: one vendor event
  (the transport shape the socket or the REST search sends) to zero or one
  emission shaped like a pin's ``expected`` (``{type, data, subject?, step?}``)
  plus, for the stamper, ``severity`` (``debug`` on the vendor plane) and
  ``gating`` (``levels``/``structural`` capture hints, see below).
- :func:`status_of` ``(event) -> str | None``: the ``execution_status`` an
  event states (the ``execution_status`` key delta or a ``full_state``
  snapshot), the one input of run synthesis.
- :func:`status_moments` ``(prev, next, *, run_open=None)``: the pinned
  ``statusMoments`` table (runs, attention, session end) for one transition.
- :func:`is_ephemeral` ``(event)``: the event is not in the server's
  persisted log (a ``full_state`` snapshot, a streaming delta, a socket-level
  error frame), so it can neither be replayed nor anchor a ``since`` replay.

Capture: the mapping shapes ``data`` to the posture's ceiling for the
emission's type. At ``metadata`` (the bridge default, what the pins describe)
only metadata facts appear. At ``redacted``+ content is added: for registered
types under their schema names (``args``, ``result``, ``error.message``,
``state``, ``delta``), which the stamper's gate redacts or keeps per the
schema annotations; for ``x.openhands.*`` types (no schema) the content is
passed through the AEP-0003 §9.4 pipeline here already at ``redacted`` and
declared in ``gating.levels`` so the gate drops it below ``redacted`` and
claims the level honestly.

Transport shape (``tests/fixtures/openhands_real/README.md``): the pinned
version's ``event_transport_dump`` stripped ``parent_id``; the current server
(``model_dump(exclude_none=True)``) sends it. The mapping never reads
``parent_id`` (no lineage claim either way), so both shapes map identically.
"""
from __future__ import annotations

import functools
from typing import Any

from bridges.core import capture as _capture
from bridges.core.bridge import Emission
from bridges.core.naming import kind_type
from bridges.core.posture import Posture
from bridges.core.readers import text as _str

VENDOR = "openhands"


# ConversationExecutionStatus (openhands.sdk.conversation.state)
IDLE, RUNNING, PAUSED, WAITING = "idle", "running", "paused", "waiting_for_confirmation"
FINISHED, ERROR, STUCK, DELETING = "finished", "error", "stuck", "deleting"
STATUSES = (IDLE, RUNNING, PAUSED, WAITING, FINISHED, ERROR, STUCK, DELETING)

ATTENTION_PROMPT = "Awaiting confirmation for a pending action"
"""The ``attention.requested`` prompt: bridge-authored and structural (it
quotes nothing the model or the user wrote), so it is declared structural to
the capture gate and rides at every ceiling (AEP-0003 §9.2)."""

STATE_KIND = "ConversationStateUpdateEvent"
FULL_STATE = "full_state"

_EPHEMERAL_KINDS = frozenset({"StreamingDeltaEvent", "ServerErrorEvent", "TokenEvent"})
_BASE_FIELDS = frozenset({"kind", "id", "timestamp", "source", "parent_id"})


DEFAULT_POSTURE = Posture()
_REDACTED = _capture.rank("redacted")
_FULL = _capture.rank("full")


# --------------------------------------------------------------------------- helpers

def _base(ev: dict[str, Any]) -> dict[str, Any]:
    """The metadata floor every emission carries: the vendor's naive
    server-local timestamp verbatim and the vendor event id (the dedupe key)."""
    data: dict[str, Any] = {}
    ts = _str(ev.get("timestamp"))
    if ts is not None:
        data["vendor_ts"] = ts
    eid = _str(ev.get("id"))
    if eid is not None:
        data["vendor_event_id"] = eid
    return data


def content_text(content: object) -> str:
    """The text of a content-part list (``[{type: text, text}...]``), joined
    with no separator like the SDK's ``Observation.text``; a bare string is
    itself; anything else is ``""``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and p.get("type", "text") == "text"
                       and isinstance(p.get("text"), str))
    return ""


def _tool(ev: dict[str, Any]) -> dict[str, Any] | None:
    name = _str(ev.get("tool_name"))
    if name is None:
        return None
    ref: dict[str, Any] = {"name": name}
    call_id = _str(ev.get("tool_call_id"))
    if call_id is not None:
        ref["call_id"] = call_id
    return ref


@functools.lru_cache(maxsize=1024)
def _kind_type(kind: str) -> str:
    """:func:`bridges.core.naming.kind_type` for this vendor, memoized (a
    pure function of the kind; a few dozen kinds recur on every frame)."""
    return kind_type(VENDOR, kind)


def _vendor(ev: dict[str, Any], kind: str, posture: Posture, *,
            extra: dict[str, Any] | None = None, content: dict[str, Any] | None = None,
            subject: str | None = None, step: str | None = None) -> Emission:
    """An ``x.openhands.*`` emission at ``debug``: metadata ``extra`` plus
    ``content`` (redaction-gated: only at ``redacted``+, through the §9.4
    pipeline at ``redacted``, declared in ``levels``)."""
    type_ = _kind_type(kind)
    data = _base(ev)
    if extra:
        data.update(extra)
    levels: dict[str, str] = {}
    lvl = posture.level(type_)
    if content and lvl >= _REDACTED:
        for k, v in content.items():
            if v is None:
                continue
            data[k] = v if lvl >= _FULL else _capture.redact_value(v, posture.policy)
            levels[k] = "redacted"
    # the gate hint is always given: with no content the honored level is
    # metadata (an unhinted x.* payload would claim the whole ceiling)
    out: Emission = {"type": type_, "data": data, "severity": "debug", "gating": {"levels": levels}}
    if subject is not None:
        out["subject"] = subject
    if step is not None:
        out["step"] = step
    return out


def _payload(ev: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ev.items() if k not in _BASE_FIELDS}


# --------------------------------------------------------------------------- per kind

def _action(ev: dict[str, Any], posture: Posture) -> Emission | None:
    tool = _tool(ev)
    if tool is None:
        return None
    data = _base(ev)
    data["tool"] = tool
    risk = _str(ev.get("security_risk"))
    if risk is not None and risk != "UNKNOWN":
        data["risk"] = risk
    action = ev.get("action")
    if action is not None:
        # The digest rule: SHA-256/16 over the canonical JSON of the typed
        # ``action`` object as the transport carries it (AEP-0003 §9.3).
        data["args_digest"] = _capture.digest(action)
    lvl = posture.level("tool.requested")
    if lvl >= _REDACTED and isinstance(action, dict):
        data["args"] = action  # [full]; the gate derives args_redacted at redacted
    out: Emission = {"type": "tool.requested", "data": data, "subject": tool["name"]}
    if lvl >= _REDACTED and isinstance(ev.get("summary"), str):
        data["summary"] = ev["summary"] if lvl >= _FULL else _capture.redact_text(
            ev["summary"], posture.policy)
        out["gating"] = {"levels": {"summary": "redacted"}}
    step = _str(ev.get("llm_response_id"))
    if step is not None:
        out["step"] = step
    return out


def _observation(ev: dict[str, Any], posture: Posture) -> Emission | None:
    tool = _tool(ev)
    obs = ev.get("observation")
    if tool is None or not isinstance(obs, dict):
        return None
    data = _base(ev)
    data["tool"] = tool
    text = content_text(obs.get("content"))
    if obs.get("is_error") is True:
        err: dict[str, Any] = {"type": "tool_error"}
        if posture.level("tool.failed") >= _REDACTED and text:
            err["message"] = text
        data["error"] = err
        return {"type": "tool.failed", "data": data, "subject": tool["name"]}
    data["result_digest"] = _capture.digest(text)
    if posture.level("tool.completed") >= _REDACTED:
        data["result"] = text
    return {"type": "tool.completed", "data": data, "subject": tool["name"]}


def _user_reject(ev: dict[str, Any], kind: str, posture: Posture) -> Emission | None:
    tool = _tool(ev)
    if tool is None:
        return None
    if ev.get("rejection_source") == "hook":
        data = _base(ev)
        data["tool"] = tool
        data["by"] = "policy"
        return {"type": "tool.denied", "data": data, "subject": tool["name"]}
    # A user rejection is a human decision, not a policy block: vendor-scoped.
    return _vendor(ev, kind, posture, extra={"tool": tool},
                   content={"reason": ev.get("rejection_reason")}, subject=tool["name"])


def _agent_error(ev: dict[str, Any], posture: Posture) -> Emission | None:
    tool = _tool(ev)
    if tool is None:
        return None
    data = _base(ev)
    data["tool"] = tool
    err: dict[str, Any] = {"type": "agent_error"}
    if posture.level("tool.failed") >= _REDACTED and isinstance(ev.get("error"), str):
        err["message"] = ev["error"]
    data["error"] = err
    return {"type": "tool.failed", "data": data, "subject": tool["name"]}


def _conversation_error(ev: dict[str, Any], posture: Posture) -> Emission:
    data = _base(ev)
    code = _str(ev.get("code"))
    if code is not None:
        data["code"] = code
    if posture.level("error.raised") >= _REDACTED and isinstance(ev.get("detail"), str):
        data["error"] = {"message": ev["detail"]}
    return {"type": "error.raised", "data": data}


def _condensation(ev: dict[str, Any], posture: Posture) -> Emission:
    data = _base(ev)
    forgotten = ev.get("forgotten_event_ids")
    if isinstance(forgotten, list):
        data["forgotten"] = len(forgotten)
    out: Emission = {"type": "session.compacted", "data": data}
    lvl = posture.level("session.compacted")
    if lvl >= _REDACTED and isinstance(ev.get("summary"), str):
        data["summary"] = ev["summary"] if lvl >= _FULL else _capture.redact_text(
            ev["summary"], posture.policy)
        out["gating"] = {"levels": {"summary": "redacted"}}
    return out


def _state(ev: dict[str, Any], posture: Posture) -> Emission:
    data = _base(ev)
    key = ev.get("key")
    value = ev.get("value")
    if key == FULL_STATE:
        if posture.level("state.snapshot") >= _REDACTED and isinstance(value, dict):
            data["state"] = value
        return {"type": "state.snapshot", "data": data}
    if isinstance(key, str) and key:
        data["key"] = key
        if posture.level("state.delta") >= _REDACTED and "value" in ev:
            data["delta"] = [{"op": "replace", "path": "/" + _pointer(key), "value": value}]
    return {"type": "state.delta", "data": data}


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")  # RFC 6901


def _message(ev: dict[str, Any], kind: str, posture: Posture) -> Emission:
    extra: dict[str, Any] = {}
    msg = ev.get("llm_message")
    role = _str(msg.get("role")) if isinstance(msg, dict) else None
    if role is not None:
        extra["role"] = role
    sender = _str(ev.get("sender"))
    if sender is not None:
        extra["sender"] = sender
    skills = ev.get("activated_skills")
    if isinstance(skills, list) and skills:
        extra["skills"] = len(skills)
    content = content_text(msg.get("content")) if isinstance(msg, dict) else ""
    return _vendor(ev, kind, posture, extra=extra, content={"content": content or None},
                   step=_str(ev.get("llm_response_id")))


# --------------------------------------------------------------------------- public

def map_event(event: object, posture: Posture = DEFAULT_POSTURE) -> list[Emission]:
    """Map one agent-server event (transport shape) to emissions.

    Returns ``[]`` for what maps to nothing: a non-object, an event without
    a string ``kind`` (the receiver counts it as malformed), ``TokenEvent``
    (always: token-id planes are not observability), ``StreamingDeltaEvent``
    unless ``posture.deltas``. A kind whose core mapping lacks its required
    facts (an ``ActionEvent`` without ``tool_name``...) degrades to its
    mechanical ``x.openhands.*`` type, never to a guess or a crash."""
    if not isinstance(event, dict):
        return []
    kind = event.get("kind")
    if not isinstance(kind, str) or not kind:
        return []
    out: Emission | None
    if kind == "TokenEvent":
        return []
    if kind == "StreamingDeltaEvent":
        if not posture.deltas:
            return []
        return [_vendor(event, kind, posture, content={"content": event.get("content")})]
    if kind == "ActionEvent":
        out = _action(event, posture)
    elif kind == "ObservationEvent":
        out = _observation(event, posture)
    elif kind == "UserRejectObservation":
        out = _user_reject(event, kind, posture)
    elif kind == "AgentErrorEvent":
        out = _agent_error(event, posture)
    elif kind == "ConversationErrorEvent":
        out = _conversation_error(event, posture)
    elif kind == "Condensation":
        out = _condensation(event, posture)
    elif kind == STATE_KIND:
        out = _state(event, posture)
    elif kind == "MessageEvent":
        out = _message(event, kind, posture)
    else:
        out = None
    if out is None:  # every other and every future kind, and degraded core kinds
        out = _vendor(event, kind, posture, content={"payload": _payload(event) or None})
    return [out]


def status_of(event: object) -> str | None:
    """The ``execution_status`` stated by ``event``: a
    ``ConversationStateUpdateEvent`` whose ``key`` is ``execution_status``
    (string ``value``) or ``full_state`` (``value.execution_status``).
    Unknown status strings are returned as given (the enum may grow)."""
    if not isinstance(event, dict) or event.get("kind") != STATE_KIND:
        return None
    key, value = event.get("key"), event.get("value")
    if key == "execution_status":
        return value if isinstance(value, str) and value else None
    if key == FULL_STATE and isinstance(value, dict):
        st = value.get("execution_status")
        return st if isinstance(st, str) and st else None
    return None


def is_snapshot(event: object) -> bool:
    """A ``full_state`` state update (the server pushes one to every new
    subscriber, then after lifecycle calls; never persisted)."""
    return isinstance(event, dict) and event.get("kind") == STATE_KIND and event.get("key") == FULL_STATE


def is_ephemeral(event: object) -> bool:
    """Not in the server's persisted event log, so absent from any replay:
    ``full_state`` snapshots, ``StreamingDeltaEvent`` (the record: deltas are
    not persisted), ``TokenEvent``, and the socket's own ``ServerErrorEvent``
    frames. Such events never advance the ``since`` anchor."""
    if not isinstance(event, dict):
        return True
    kind = event.get("kind")
    return is_snapshot(event) or (isinstance(kind, str) and kind in _EPHEMERAL_KINDS)


def frame_facts(event: dict[str, Any]) -> tuple[bool, str | None, bool]:
    """``(is_snapshot(event), status_of(event), is_ephemeral(event))`` in one
    look at ``kind`` (the receiver asks all three of every frame; a frame
    that is no state update answers without a second lookup). ``event``: a
    dict (the receiver's checked frame); equal to the three functions for
    every dict (a property test holds it to them)."""
    kind = event.get("kind")
    if kind != STATE_KIND:
        return False, None, kind in _EPHEMERAL_KINDS if isinstance(kind, str) else False
    key, value = event.get("key"), event.get("value")
    if key == "execution_status":
        return False, value if isinstance(value, str) and value else None, False
    if key == FULL_STATE:
        st = value.get("execution_status") if isinstance(value, dict) else None
        return True, st if isinstance(st, str) and st else None, True
    return False, None, False


def status_moments(prev: str | None, next_: str | None, *,
                   run_open: bool | None = None) -> list[Emission]:
    """The moments one ``execution_status`` transition produces, in order.

    With ``run_open=None`` this is exactly the pinned ``statusMoments``
    table (``status_transitions``), where a run counts as open when ``prev``
    is ``running``, ``paused`` or ``waiting_for_confirmation``:

    - leaving ``waiting_for_confirmation``: ``attention.resolved``
      (``answered``; ``dismissed`` when the exit is ``paused``/``deleting``);
    - entering it: ``attention.requested`` (``kind: permission``, no options,
      no respond path: the read-only channel), preceded by ``run.started``
      when no run is open: the vendor enters ``waiting_for_confirmation``
      only from inside a run (its step), so an ask is never without its
      run, even when the flip to ``running`` was missed (a bridge attached
      mid-step gets the step's live flip before the replay of the past,
      whose ``running`` is then stale: :mod:`bridges.openhands.receiver`);
    - -> ``running`` with no run open: ``run.started``;
    - -> ``finished``: ``run.finished``; -> ``error``/``stuck``:
      ``run.failed`` (``reason`` = the status); ``running`` -> ``idle``:
      ``run.finished`` ``{reason: idle}``;
    - -> ``deleting``: ``run.cancelled`` ``{reason: deleting}`` (when a run
      is open) and ``session.ended`` ``{reason: killed}``;
    - ``paused`` and ``waiting_for_confirmation`` never close a run.

    The receiver passes its own ``run_open`` (it knows whether a run was
    opened, e.g. an idle conversation paused and then run has none); then a
    run left open when the status lands on ``idle`` from anywhere (a denied
    confirmation goes ``waiting`` -> ``idle``) is closed ``{reason: idle}``
    too, so no run dangles. ``None``/unknown statuses never open or close a
    run except as listed."""
    if prev == next_ or next_ is None:
        return []
    explicit = run_open is not None
    is_open = run_open if explicit else prev in (RUNNING, PAUSED, WAITING)
    out: list[Emission] = []
    if prev == WAITING:
        resolution = "dismissed" if next_ in (PAUSED, DELETING) else "answered"
        out.append({"type": "attention.resolved", "data": {"resolution": resolution}})
    if next_ == WAITING:
        if not is_open:  # the vendor asks only inside a run: one whose opening we missed
            out.append({"type": "run.started", "data": {}})
        out.append({"type": "attention.requested",
                    "data": {"kind": "permission", "prompt": ATTENTION_PROMPT},
                    "gating": {"structural": ["prompt"]}})
    if next_ == RUNNING:
        if not is_open:
            out.append({"type": "run.started", "data": {}})
    elif next_ == FINISHED:
        if is_open:
            out.append({"type": "run.finished", "data": {}})
    elif next_ in (ERROR, STUCK):
        if is_open:
            out.append({"type": "run.failed", "data": {"reason": next_}})
    elif next_ == IDLE:
        if is_open and (prev == RUNNING or explicit):
            out.append({"type": "run.finished", "data": {"reason": "idle"}})
    elif next_ == DELETING:
        if is_open:
            out.append({"type": "run.cancelled", "data": {"reason": "deleting"}})
        out.append({"type": "session.ended", "data": {"reason": "killed"}})
    return out


def opens_run(moments: list[Emission]) -> bool:
    return any(m["type"] == "run.started" for m in moments)


def closes_run(moments: list[Emission]) -> bool:
    return any(m["type"] in ("run.finished", "run.failed", "run.cancelled") for m in moments)


def pin_view(emission: Emission) -> dict[str, Any]:
    """The pin-comparable part of an emission: ``{type, data, subject?,
    step?}`` (``severity``/``gating`` are stamper hints)."""
    out = {"type": emission["type"], "data": emission.get("data", {})}
    for k in ("subject", "step"):
        if emission.get(k) is not None:
            out[k] = emission[k]
    return out
