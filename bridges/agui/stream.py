"""The pure per-stream state of one teed AG-UI run stream (one POST).

Design record ``bridge-agui-design.md`` ("Identity: real vendor ids, no
synthesis"): ``threadId`` -> AEP ``session``, ``runId`` -> ``run``,
``RUN_STARTED`` opens, ``RUN_FINISHED``/``RUN_ERROR`` closes, events on the
same tee stream scope to that stream's run, ``STEP_*`` stamp the envelope
``step``. The joins the pins leave to the receiver (``agui.json`` top
comment) live here:

- tool calls pair by ``toolCallId``: ``TOOL_CALL_START`` (or the first
  ``TOOL_CALL_CHUNK`` naming a new call, the protocol's shorthand for a
  start) records the name, ``TOOL_CALL_RESULT`` gets it re-attached
  (``unknown`` when the start was never seen);
- text messages: ``TEXT_MESSAGE_START``'s ``role`` is re-attached to the
  ``TEXT_MESSAGE_END`` (1.0 ends carry no role), and the streamed content
  is assembled (capped at :data:`MAX_TEXT` characters) so an empty
  assistant message (pydantic-ai's parent of a tool call) is no reply and
  the reply terminal carries its text at ``redacted``+.

Before any ``RUN_STARTED`` the stream is scoped by the run input the UI
POSTed (``RunAgentInput.threadId``/``runId``, the same real ids the agent
echoes), so nothing emitted early is unscoped. A stream that ends with its
run still open (the UI left, the agent's stream broke or simply ended) is
closed by :meth:`TeeStream.close` with ``run.failed`` and the reason: the
AEP stream never keeps a dangling run.

Pure: no I/O, no clocks; memory bounded (:data:`MAX_TRACKED` calls,
:data:`MAX_MESSAGES` messages, :data:`MAX_TEXT` characters each, text kept
only at ``redacted``+).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from bridges.core import capture as _capture
from bridges.core.naming import kind_type
from bridges.core.readers import text as _str

from .mapping import DEFAULT_POSTURE, VENDOR, Emission, Posture, canonical_type, map_event

END_TYPE = kind_type(VENDOR, "TEXT_MESSAGE_END", drop_event_suffix=False)

MAX_TRACKED = 4096
"""Open tool calls remembered per stream (oldest forgotten first)."""

MAX_MESSAGES = 256
"""Open text messages remembered per stream (oldest forgotten first)."""

MAX_TEXT = 64 * 1024
"""Characters of one message's text assembled for the reply terminal."""

_TS_MIN, _TS_MAX = 946_684_800_000, 7_258_118_400_000  # 2000-01-01 .. 2200-01-01, ms


class Moment(NamedTuple):
    """One emission with its envelope scope: ``session`` (``None``: the
    stream has no ``threadId`` yet, nothing to stamp it into), ``run``,
    ``time`` (the event's own ``timestamp``, when it states a sane one)."""

    session: str | None
    run: str | None
    emission: Emission
    time: datetime | None = None


@dataclass
class _Message:
    role: str
    parts: list[str] = field(default_factory=list)
    size: int = 0
    had_text: bool = False

    def add(self, delta: str, keep: bool) -> None:
        if delta:
            self.had_text = True
        room = MAX_TEXT - self.size
        if keep and room > 0 and delta:
            self.parts.append(delta[:room])
            self.size += min(len(delta), room)


def event_time(event: Any) -> datetime | None:
    """An AG-UI ``timestamp`` (ms since the Unix epoch, what every SDK
    sets) as a UTC datetime; ``None`` when absent or outside 2000..2200."""
    ts = event.get("timestamp") if isinstance(event, dict) else None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not _TS_MIN <= ts <= _TS_MAX:
        return None
    return datetime.fromtimestamp(ts / 1000, tz=timezone.utc)


def _bounded_put(d: OrderedDict, key: str, value: Any, cap: int = MAX_TRACKED) -> None:
    d[key] = value
    d.move_to_end(key)
    while len(d) > cap:
        d.popitem(last=False)


class TeeStream:
    """The state of one tee stream. ``feed(event)`` -> the :class:`Moment`
    list to emit for one decoded AG-UI event (any JSON value; never
    raises); ``close(reason)`` -> ``run.failed {reason}`` for a run left
    open (``[]`` otherwise; idempotent).

    ``session_hint``/``run_hint``: the ids of the POSTed run input, used
    until ``RUN_STARTED`` states its own."""

    def __init__(self, posture: Posture = DEFAULT_POSTURE, *, session_hint: str | None = None,
                 run_hint: str | None = None) -> None:
        self.posture = posture
        self.session = _str(session_hint)
        self.run = _str(run_hint)
        self.run_open = False
        self.closed = False
        self.steps: list[str] = []
        self.tools: OrderedDict[str, str] = OrderedDict()
        self.messages: OrderedDict[str, _Message] = OrderedDict()
        self._chunk_message: str | None = None
        # the text is kept only when the reply terminal may carry it
        self._keep_text = posture.level(END_TYPE) >= _capture.rank("redacted")

    # ------------------------------------------------------------------ feeding
    def feed(self, event: Any) -> list[Moment]:
        t = canonical_type(event)
        if t is None:
            return self._moments(map_event(event, self.posture), None)
        assert isinstance(event, dict)
        when = event_time(event)
        early = self._open(event) if t == "RUN_STARTED" else []
        event, pre = self._join(t, event)
        moments = early + self._moments(pre + map_event(event, self.posture), when)
        self._after(t, event)
        return moments

    def _open(self, event: dict[str, Any]) -> list[Moment]:
        early: list[Moment] = []
        if self.run_open:
            # a new run while one is open (the protocol forbids it): the old
            # one is not left dangling on the AEP stream
            early = self._moments([{"type": "run.failed", "data": {"reason": "superseded"}}],
                                  None)
        self.session = _str(event.get("threadId")) or self.session
        self.run = _str(event.get("runId")) or self.run
        self.run_open = True
        self.steps.clear()
        return early

    def _join(self, t: str, event: dict[str, Any]) -> tuple[dict[str, Any], list[Emission]]:
        """Record what later events join on; re-attach what this one lacks.
        Returns the (possibly enriched) event and emissions it stands for
        beside its own (a chunk that starts a tool call)."""
        if t == "TOOL_CALL_START":
            self._remember_tool(event)
        elif t == "TOOL_CALL_CHUNK":
            return event, self._tool_chunk(event)
        elif t == "TOOL_CALL_RESULT":
            return self._join_result(event), []
        elif t == "TEXT_MESSAGE_START":
            mid = _str(event.get("messageId"))
            if mid is not None:
                _bounded_put(self.messages, mid, _Message(_str(event.get("role")) or "assistant"),
                             MAX_MESSAGES)
        elif t == "TEXT_MESSAGE_CONTENT":
            msg = self.messages.get(_str(event.get("messageId")) or "")
            if msg is not None and isinstance(event.get("delta"), str):
                msg.add(event["delta"], self._keep_text)
        elif t == "TEXT_MESSAGE_CHUNK":
            self._text_chunk(event)
        elif t == "TEXT_MESSAGE_END":
            return self._join_end(event), []
        return event, []

    def _after(self, t: str, event: dict[str, Any]) -> None:
        name = _str(event.get("stepName"))
        if t == "STEP_STARTED" and name:
            self.steps.append(name)
        elif t == "STEP_FINISHED" and name in self.steps:
            self.steps.remove(name)
        elif t in ("RUN_FINISHED", "RUN_ERROR"):
            self.run_open = False
            self.steps.clear()

    def feed_malformed(self, emission: Emission) -> list[Moment]:
        """Scope an emission for an SSE event that never became an AG-UI
        event (:func:`bridges.agui.mapping.malformed`) to this stream."""
        return self._moments([emission], None)

    def close(self, reason: str) -> list[Moment]:
        """The stream ended (``reason``: ``client_disconnected``,
        ``upstream_ended``, ``upstream_error``...). A run still open is
        closed ``run.failed {reason}``; the state is dropped."""
        if self.closed:
            return []
        self.closed = True
        out: list[Moment] = []
        if self.run_open:
            self.run_open = False
            out = self._moments([{"type": "run.failed", "data": {"reason": reason}}], None)
        self.tools.clear()
        self.messages.clear()
        return out

    # ------------------------------------------------------------------ joins
    def _remember_tool(self, event: dict[str, Any]) -> None:
        call_id, name = _str(event.get("toolCallId")), _str(event.get("toolCallName"))
        if call_id is not None and name is not None:
            _bounded_put(self.tools, call_id, name)

    def _tool_chunk(self, event: dict[str, Any]) -> list[Emission]:
        """A chunk naming a call not seen yet stands for its start (the
        protocol's shorthand): ``tool.requested`` once, name remembered."""
        call_id, name = _str(event.get("toolCallId")), _str(event.get("toolCallName"))
        if call_id is None or name is None or call_id in self.tools:
            return []
        self._remember_tool(event)
        start = {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name}
        if _str(event.get("subagentRunId")):
            start["subagentRunId"] = event["subagentRunId"]
        return map_event(start, self.posture)

    def _join_result(self, event: dict[str, Any]) -> dict[str, Any]:
        call_id = _str(event.get("toolCallId"))
        name = self.tools.pop(call_id, None) if call_id is not None else None
        if name is None or _str(event.get("toolCallName")):
            return event
        return {**event, "toolCallName": name}

    def _text_chunk(self, event: dict[str, Any]) -> None:
        mid = _str(event.get("messageId")) or self._chunk_message
        if mid is None:
            return
        self._chunk_message = mid
        msg = self.messages.get(mid)
        if msg is None:
            msg = _Message(_str(event.get("role")) or "assistant")
            _bounded_put(self.messages, mid, msg, MAX_MESSAGES)
        if isinstance(event.get("delta"), str):
            msg.add(event["delta"], self._keep_text)

    def _join_end(self, event: dict[str, Any]) -> dict[str, Any]:
        mid = _str(event.get("messageId"))
        msg = self.messages.pop(mid, None) if mid is not None else None
        if msg is None:
            return event  # a message whose start was never seen: as it stands
        joined = dict(event)
        joined.setdefault("role", msg.role)
        if not msg.had_text:
            joined["content"] = ""  # streamed no text: no reply (the mapping drops it)
        elif self._keep_text:
            joined["content"] = "".join(msg.parts)
        return joined

    # ------------------------------------------------------------------ scope
    def _moments(self, emissions: list[Emission], when: datetime | None) -> list[Moment]:
        out = []
        step = self.steps[-1] if self.steps else None
        for em in emissions:
            if step is not None and em.get("step") is None:
                em = {**em, "step": step}
            out.append(Moment(self.session, self.run, em, when))
        return out
