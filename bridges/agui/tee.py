"""The tee of one run stream: the copy of the bytes the proxy forwarded ->
SSE events (:mod:`bridges.agui.sse`) -> AG-UI events -> the stream's state
and mapping (:mod:`bridges.agui.stream`, :mod:`bridges.agui.mapping`) ->
the bridge's :class:`~bridges.core.bridge.BridgeContext`.

The proxy calls :meth:`Tee.feed` only after the chunk went to the UI, and
:meth:`Tee.feed` never waits: emissions go out with ``ctx.emit_nowait``. When
the fleet's relay channel is full the emission is dropped and counted
(``agui.dropped_saturated``, logged once per spell) rather than making the
UI's stream wait for the relay: the record's first rule is that observation
must not drive (or slow) the run.

Counters (``/healthz`` behind the token): ``agui.events`` (SSE events
parsed), ``agui.emitted``, ``agui.malformed`` (not JSON, not an object, no
``type``), ``agui.oversize`` (over the parse cap, passed through unparsed),
``agui.over_budget`` (would have taken the bytes held across streams past
``AEP_AGUI_MAX_BUFFERED``: passed through unparsed, like an oversized one),
``agui.truncated`` (the stream ended inside an event), ``agui.unscoped``
(nothing to stamp it into: no ``threadId`` seen), ``agui.stamp_errors``,
``sessions_refused`` (a new session past ``AEP_AGUI_NEW_SESSIONS_PER_S``,
once per stream and session: :class:`NewSessions`; its stream still
passes through to the UI untouched, its events are not emitted).
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

import trio

from bridges.core.bridge import BridgeContext, Saturated
from bridges.core.limits import BURST_S, PeerLog, SessionBucket

from .mapping import Posture, malformed
from .sse import Budget, SseEvent, SseParser
from .stream import Moment, TeeStream

_TYPE_PEEK = re.compile(r'"type"\s*:\s*"([A-Z][A-Z0-9_]{0,63})"')


def run_input_ids(body: bytes) -> tuple[str | None, str | None]:
    """``(threadId, runId)`` of a POSTed ``RunAgentInput`` (JSON), or
    ``(None, None)`` when the body is not one (never raises)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    tid, rid = doc.get("threadId"), doc.get("runId")
    return (tid if isinstance(tid, str) and tid else None,
            rid if isinstance(rid, str) and rid else None)


def decode(ev: SseEvent) -> tuple[Any, str | None]:
    """An SSE event -> ``(AG-UI event object, None)`` or ``(None, reason)``
    (``oversize``, ``over_budget``, ``not_json``)."""
    if ev.over_budget:
        return None, "over_budget"
    if ev.oversize:
        return None, "oversize"
    try:
        return json.loads(ev.data), None
    except (ValueError, RecursionError):
        return None, "not_json"


class NewSessions:
    """The new-session budget of one run of the proxy (issue 25, fifth
    outside attack: 1,500 unauthenticated runs, each with a new
    ``threadId``, made 1,500 session log files): the shared
    :class:`~bridges.core.limits.SessionBucket` of the hook bridges and
    ACP, ``per_s`` a second in bursts of :data:`~bridges.core.limits.BURST_S`
    seconds of it (``AEP_AGUI_NEW_SESSIONS_PER_S``). :meth:`admit` answers
    for a session a stream is about to emit into: a session this run's
    stamper knows never costs a token; past the bucket it is refused,
    counted ``sessions_refused``, with a rate-limited log line."""

    def __init__(self, ctx: BridgeContext, per_s: int) -> None:
        self.ctx = ctx
        self.bucket = SessionBucket(per_s, per_s * BURST_S)
        self._log = PeerLog(ctx.log)
        ctx.health.counters.setdefault("sessions_refused", 0)

    def admit(self, session: str) -> bool:
        if self.ctx.stamper.knows(session):
            return True
        now = trio.current_time()
        if self.bucket.take(now):
            return True
        self.ctx.health.count("sessions_refused")
        self._log.note("new-sessions", now, "agui: new sessions (threadIds) arrive faster than "
                       "AEP_AGUI_NEW_SESSIONS_PER_S; their streams pass through to the UI "
                       "unmapped and unlogged (counted sessions_refused)")
        return False


class Tee:
    """One stream's tee. ``ctx``: where emissions go; ``posture``: capture +
    deltas; ``session_hint``/``run_hint``: the POSTed input's ids;
    ``max_event``: the SSE parse cap in bytes; ``budget``: the bytes held
    across the proxy's streams (:class:`~bridges.agui.sse.Budget`);
    ``admit(session) -> bool``: whether a session not emitted into by this
    stream yet may be (:meth:`NewSessions.admit`; default: every one)."""

    def __init__(self, ctx: BridgeContext, posture: Posture, *, session_hint: str | None = None,
                 run_hint: str | None = None, max_event: int | None = None,
                 budget: Budget | None = None,
                 admit: Callable[[str], bool] | None = None) -> None:
        self.ctx = ctx
        self.parser = SseParser(max_event or SseParser().max_event, budget)
        self.state = TeeStream(posture, session_hint=session_hint, run_hint=run_hint)
        self._saturated_warned = False
        self._admit = admit
        #: the sessions this stream was answered for (a stream has one, rarely two)
        self._verdicts: dict[str, bool] = {}

    def feed(self, chunk: bytes) -> None:
        """Parse and emit what ``chunk`` completes. Never raises for the
        stream's content; never waits."""
        for ev in self.parser.feed(chunk):
            self._event(ev)

    def close(self, reason: str) -> None:
        """The stream is over: count an unterminated event, close an open run
        (``run.failed {reason}``), give the held bytes back to the budget."""
        if self.state.closed:
            self.parser.release()
            return
        if self.parser.pending():
            self.ctx.health.count("agui.truncated")
        self.parser.release()
        self._emit(self.state.close(reason))

    # ------------------------------------------------------------------ internals
    def _event(self, ev: SseEvent) -> None:
        health = self.ctx.health
        health.count("agui.events")
        obj, problem = decode(ev)
        if problem is not None:
            health.count(f"agui.{problem}" if problem in ("oversize", "over_budget")
                         else "agui.malformed")
            peek = _TYPE_PEEK.search(ev.data) if ev.oversize else None
            moments = self.state.feed_malformed(malformed(
                problem, bytes=ev.size, vendor_type=peek.group(1) if peek else None))
        else:
            if not isinstance(obj, dict) or not isinstance(obj.get("type"), str) or not obj["type"]:
                health.count("agui.malformed")
            moments = self.state.feed(obj)
        self._emit(moments)

    def _admitted(self, session: str) -> bool:
        ok = self._verdicts.get(session)
        if ok is None:
            assert self._admit is not None
            if len(self._verdicts) >= 16:  # a stream naming ever new threadIds: bounded
                self.ctx.health.count("sessions_refused")
                return False
            ok = self._verdicts[session] = self._admit(session)
        return ok

    def _emit(self, moments: list[Moment]) -> None:
        ctx = self.ctx
        for m in moments:
            if m.session is None:
                ctx.health.count("agui.unscoped")
                continue
            if self._admit is not None and not self._admitted(m.session):
                continue  # past the new-session budget: the UI's stream goes on, unmapped
            try:
                ctx.emit_nowait(m.session, m.emission, run=m.run, time=m.time)
            except Saturated:
                ctx.health.count("agui.dropped_saturated")
                if not self._saturated_warned:
                    self._saturated_warned = True
                    ctx.log.warning("relay channel full: AG-UI events dropped from the AEP "
                                    "stream (the UI's stream is not held; counted in "
                                    "agui.dropped_saturated)")
                continue
            except ValueError as e:  # an emission the stamper refuses: a bridge bug, never fatal
                ctx.health.count("agui.stamp_errors")
                ctx.log.warning("cannot stamp %s: %s", m.emission.get("type"), type(e).__name__)
                continue
            self._saturated_warned = False
            ctx.health.count("agui.emitted")
