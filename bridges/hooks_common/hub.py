"""One run of a hook bridge: the moments in, the events out, the replies back.

:meth:`HookHub.handle` takes one vendor moment (live, or spooled by a
shim), dedupes it by hook id, maps it with the profile's pure mapper, adds
what only state knows (the synthesized or vendor run, tool pairing and
cause links, the out-of-band settling of open asks; the runs themselves,
kept across a restart, are :mod:`.runs`), emits, waits for the
session log, and returns the reply: ``{}``, a steering reply, or a held ask
(:meth:`HookHub.hold` then waits for the decision, the hold limit or the
vendor hanging up). The ASGI endpoint is :mod:`.endpoint`. Contract:
``/work/hooks-contract.md`` §1, §3; steering:
``shared/aep/docs/control-steering-design.md``; asks:
``shared/aep/docs/adapters.md``.

Counters: ``hooks_received``, ``hooks_duplicate``, ``hooks_no_session``,
``hooks_held``, ``hooks_timeout``, ``hooks_hangup``, ``hooks_spooled_ingested``,
``hooks_spool_malformed``, ``hooks_spool_foreign``, ``hooks_bad_body``, ``hooks_session_reended`` (a
resumed session's later end, emitted as ``x.<agent>.session.session_end``),
``stamp_errors``, ``hooks_release_dropped`` (an open ask's dismissal the
channel refused at the run's end), ``hooks_map_failed`` (a moment whose
mapping raised: a bridge bug; :class:`MappingFailed`, the endpoint answers
500 and the shim spools it), ``hooks_too_deep`` (a moment cut at
:data:`~.bounds.DEPTH_MAX` levels), ``hooks_event_oversize`` (a mapped
emission over :data:`~.bounds.EVENT_MAX`, degraded by :func:`~.bounds.fit`),
``instructions_delivered``, ``instructions_dropped``, ``sessions_refused``,
``hooks_unauthorized`` (a request the daemon's token guard refused:
:meth:`.endpoint.HookEndpoint.refused`).

New sessions (each a session log file) go through a token bucket
(``AEP_<AGENT>_NEW_SESSIONS_PER_S``, bursts of
:data:`~bridges.core.limits.BURST_S` seconds of it; issue 25): a moment,
live or spooled, of a session this run has not seen while the bucket is
empty is not mapped and not logged, is answered with no decision (the
vendor goes on) and counted ``sessions_refused``, with at most one log line
a minute. A session already known always passes.

Dedupe: a hook id is remembered as seen once its moment's events are out
(a failed attempt leaves it unseen: the shim's spooled copy of it is then
taken, not dropped as a repeat); a second delivery of an id still being
handled waits for the first, then is a repeat unless the first failed.

Time: every event of a moment carries the moment's own time (``time``,
Unix ms): a live moment's arrival, a spooled one's ``spooled_at_ms``
(:func:`~.mapping.moment_ms`), and the run, tool and ask durations are
differences of those, so a turn that ran while the daemon was down keeps
its real times and durations when its moments are ingested later. Events
that no moment causes (a control answer, a hold's end, the run's end) take
the time they happen.
"""
from __future__ import annotations

import time as _time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import trio

from bridges.core.bridge import BridgeContext, Emission, Envelope, Saturated
from bridges.core.envelope import ms_text
from bridges.core.limits import BURST_S, PeerLog, SessionBucket
from bridges.core.posture import Posture
from bridges.core.statefile import StateFile

from .answers import Decision
from .bounds import fit, shallow
from .config import HookConfig
from .mapping import elapsed_ms, fallback
from .profile import HookProfile, Moment
from .runs import RESTORED_IDLE_S, RunBook
from .session import (
    ASKS_MAX,
    ASKS_TOTAL_MAX,
    PRINT_KEY_MAX,
    REQUESTED_MAX,
    Ask,
    Instruction,
    Sessions,
    SessionState,
    bounded_key,
    input_print,
    reply_moment,
)

__all__ = ["COUNTERS", "HOOK_ID_MAX", "HookHub", "MappingFailed", "Outcome", "REQUESTED_MAX",
           "SEEN_MAX", "TIMEOUT_MARGIN_S", "now_ms"]

TIMEOUT_MARGIN_S = 5.0
"""A hold ends at least this long before the vendor's own hook timeout."""
SEEN_MAX = 8192
"""Hook ids remembered for dedupe (contract §1)."""
HOOK_ID_MAX = 128
"""Longest hook id deduped on (the shim's are 32 hex): a longer one is not
remembered (``SEEN_MAX`` of them, each up to a header's size, cost ~128 MB)."""
COUNTERS = ("hooks_received", "hooks_duplicate", "hooks_no_session", "hooks_held",
            "hooks_timeout", "hooks_hangup", "hooks_spooled_ingested", "hooks_spool_malformed",
            "hooks_spool_foreign", "hooks_bad_body", "hooks_session_reended", "stamp_errors",
            "instructions_delivered", "instructions_dropped", "sessions_refused",
            "hooks_release_dropped", "hooks_map_failed", "hooks_too_deep", "hooks_event_oversize",
            "hooks_unauthorized")


class MappingFailed(Exception):
    """A moment's mapping raised (counted ``hooks_map_failed``, logged
    without its input); its hook id stays unseen."""


def now_ms() -> int:
    """The wall clock, Unix ms (the time of a live moment, of an answer)."""
    return _time.time_ns() // 1_000_000


@dataclass
class Outcome:
    """What a moment's handling decided: ``reply`` (the vendor JSON, when
    not held) or ``ask`` (held: :meth:`HookHub.hold` gives the reply)."""

    reply: dict[str, Any]
    ask: Ask | None = None


class HookHub:
    """See the module docstring. Built per bridge run."""

    def __init__(self, profile: HookProfile, config: HookConfig, ctx: BridgeContext, *,
                 state: StateFile | None = None, idle_s: float = RESTORED_IDLE_S) -> None:
        self.profile = profile
        self.config = config
        self.ctx = ctx
        policy = ctx.stamper.policy
        self.posture = Posture(agent=profile.agent, mode="primary", policy=policy,
                               answerable=config.control_open)
        self.quiet = Posture(agent=profile.agent, mode="primary", policy=policy)
        self.sessions = Sessions()
        #: the runs and their state file (:mod:`.runs`; ``state`` ``None``: not kept)
        self.runs = RunBook(profile, ctx, self.sessions, self._emit, state or StateFile(None),
                            idle_s=idle_s)
        #: sessions whose session.ended went out (a resumed session's next end is not another)
        self.ended: OrderedDict[str, None] = OrderedDict()
        #: moments that only happen inside a turn (a run seen mid-way is adopted from them)
        self._in_turn = profile.tool_pre | profile.tool_post | profile.permission_events \
            | profile.run_closes
        self.seen: OrderedDict[str, None] = OrderedDict()
        #: hook ids being handled now -> set when that handling ends
        self._inflight: dict[str, trio.Event] = {}
        rate = config.new_sessions_per_s
        self.new_sessions = SessionBucket(rate, rate * BURST_S)
        self._refusals = PeerLog(ctx.log)
        for c in COUNTERS:
            ctx.health.counters.setdefault(c, 0)

    # -- emitting ------------------------------------------------------------------
    async def _emit(self, session: str, em: Emission, *, run: str | None = None,
                    cause: str | None = None, at: int | None = None) -> Envelope | None:
        """Stamp and send ``em``; ``at``: its ``time`` (Unix ms; default now)."""
        try:
            return await self.ctx.emit(session, em, run=run, cause=cause,
                                       time=None if at is None else ms_text(at))
        except ValueError as e:  # an ill-formed envelope: a bridge bug, never fatal
            self.ctx.health.count("stamp_errors")
            self.ctx.log.warning("%s: cannot stamp %s: %s", self.profile.key, em.get("type"), e)
            return None

    async def _claim(self, hook_id: str | None) -> str | None:
        """The id to mark seen once handled (``None``: not deduped on), or
        raise :class:`_Repeat` when ``hook_id`` was seen already. A delivery
        of an id in flight waits for that one's end first."""
        if not hook_id or len(hook_id) > HOOK_ID_MAX:
            return None
        while (busy := self._inflight.get(hook_id)) is not None:
            await busy.wait()
        if hook_id in self.seen:
            raise _Repeat
        self._inflight[hook_id] = trio.Event()
        return hook_id

    def _release(self, hook_id: str | None, handled: bool) -> None:
        """End the claim on ``hook_id``; ``handled``: remember it as seen."""
        if hook_id is None:
            return
        self._inflight.pop(hook_id).set()
        if handled:
            self.seen[hook_id] = None
            if len(self.seen) > SEEN_MAX:
                self.seen.popitem(last=False)

    # -- one moment ----------------------------------------------------------------
    async def handle(self, moment: Moment, *, hook_id: str | None = None,
                     spooled: bool = False, at_ms: int | None = None) -> Outcome:
        """Map, emit and log one moment; the reply or the ask to hold. A
        spooled moment is never held and gets no steering (its reply is
        thrown away). ``at_ms``: when the moment happened, Unix ms
        (:func:`~.mapping.moment_ms`; default now, a live moment's arrival):
        the ``time`` of each of its events and the clock of its durations."""
        at = now_ms() if at_ms is None else at_ms
        health = self.ctx.health
        try:
            claim = await self._claim(hook_id)
        except _Repeat:
            health.count("hooks_duplicate")
            return Outcome(self.profile.neutral(self.profile.event(moment)))
        handled = False
        try:
            outcome, handled = await self._handle(moment, spooled, at)
        finally:
            self._release(claim, handled)
        return outcome

    async def _handle(self, moment: Moment, spooled: bool, at: int) -> tuple[Outcome, bool]:
        """:meth:`handle` past dedupe; ``(outcome, whether the moment was
        taken)``: a refused one is not (a later send of it is no repeat)."""
        health = self.ctx.health
        health.count("hooks_received")
        sid = self.profile.session(moment)
        if sid is None:
            health.count("hooks_no_session")
            return Outcome(self.profile.neutral(self.profile.event(moment))), True
        if self._refused(sid):
            return Outcome(self.profile.neutral(self.profile.event(moment))), False
        moment, cut = shallow(moment)
        if cut:
            health.count("hooks_too_deep")
        st, evicted = self.sessions.touch(sid)
        if evicted is not None:
            self.runs.save(evicted, gone=True)
            await self._drop_queue(evicted, "session-forgotten")
        mark = self.ctx.log_mark()
        async with st.lock:
            try:
                outcome = await self._map(st, moment, spooled, at)
            except Exception as e:  # a bridge bug: counted, said, the moment left unseen
                health.count("hooks_map_failed")
                self.ctx.log.warning("%s: cannot map a %s moment (%s); answered 500, not "
                                     "remembered as seen", self.profile.key,
                                     self.profile.event(moment)[:64] or "?", type(e).__name__)
                raise MappingFailed(type(e).__name__) from e
            finally:  # what a late moment after a restart needs (:mod:`.runs`)
                self.runs.save(st, gone=st.ended)
        await self.ctx.logged_since(mark)
        return outcome, True

    def _refused(self, sid: str) -> bool:
        """Whether ``sid`` is a new session past the new-session bucket
        (counted ``sessions_refused``; a rate-limited log line). Known
        sessions (in memory, or stamped by this run) never take a token."""
        if self.sessions.get(sid) is not None or self.ctx.stamper.knows(sid):
            return False
        now = trio.current_time()
        if self.new_sessions.take(now):
            return False
        self.ctx.health.count("sessions_refused")
        self._refusals.note("new-sessions", now, "%s: new sessions arrive faster than %s; their "
                            "moments are not logged (answered with no decision, counted "
                            "sessions_refused)", self.profile.key,
                            self.profile.knob("NEW_SESSIONS_PER_S"))
        return True

    async def _map(self, st: SessionState, m: Moment, spooled: bool, at: int) -> Outcome:
        p, ev = self.profile, self.profile.event(m)
        posture = self.quiet if spooled else self.posture
        await self._settle(st, ev, m, at)
        await self.runs.moment(st, ev, m, at, self._in_turn)
        ask: Ask | None = None
        for em in p.map_hook(m, posture):
            em, size = fit(em)
            if size is not None:
                self.ctx.health.count("hooks_event_oversize")
                self.ctx.log.warning("%s: a %s of %d bytes went out without its largest "
                                     "members (x-truncated)", p.key, em["type"], size)
            got = await self._one(st, ev, m, self._once(st, ev, em, posture), spooled, at)
            ask = got or ask
        if ev in p.session_ends:
            await self._end(st, at)
        if ask is not None and ask.held:
            self.ctx.health.count("hooks_held")
            return Outcome({}, ask)
        if not spooled and ev in p.context_events and st.queue:
            return Outcome(await self._deliver(st, ev, at))
        return Outcome(p.neutral(ev))

    def _once(self, st: SessionState, ev: str, em: Emission, posture: Posture) -> Emission:
        """One ``session.ended`` per session (AEP-0002 §2): a resumed session
        (``claude --resume``, ``/compact``) ending again is the vendor's own
        ``x.<agent>.session.session_end``."""
        if em["type"] != "session.ended":
            return em
        if st.id in self.ended:
            self.ctx.health.count("hooks_session_reended")
            return fallback(posture, ev, em.get("data"))
        self.ended[st.id] = None
        if len(self.ended) > SEEN_MAX:
            self.ended.popitem(last=False)
        return em

    async def _one(self, st: SessionState, ev: str, m: Moment, em: Emission,
                   spooled: bool, at: int) -> Ask | None:
        """Emit one mapped emission with what state knows (run, cause); the
        ask it opened, if any."""
        p, t = self.profile, em["type"]
        if t == "run.started":
            out = await self._emit(st.id, em, run=st.run, at=at)
            st.run_started = out["id"] if out else None
            return None
        if t in ("run.finished", "run.failed", "run.cancelled"):
            await self.runs.close(st, em, at)
            return None
        out = await self._emit(st.id, em, run=st.run, cause=self._cause(st, em, m, at), at=at)
        if out is None:
            return None
        if t == "tool.requested":
            st.remember_tool(m, out["id"], at)
            if ev == p.gate_event and p.gate_ask is not None and not spooled \
                    and self.config.gated(m.get("tool_name")):
                return await self._gate(st, m, out["id"], at)
        elif t == "attention.requested":
            via = (em.get("data") or {}).get("respond_via")
            return await self._register(st, em, out["id"], m, at,
                                  held=self.config.control_open and not spooled
                                  and (ev in p.permission_events or ev in p.form_events)
                                  and isinstance(via, list) and "control" in via)
        return None

    def _cause(self, st: SessionState, em: Emission, m: Moment, at: int) -> str | None:
        t = em["type"]
        call = m.get("tool_use_id")
        if t in ("tool.completed", "tool.failed", "tool.denied") and isinstance(call, str):
            hit = st.tools.pop(bounded_key(call), None)
            if hit is not None:
                data = em.setdefault("data", {})
                data.setdefault("duration_ms", elapsed_ms(hit[1], at))
                return hit[0]
        if t == "attention.requested":
            if isinstance(call, str) and (key := bounded_key(call)) in st.tools:
                return st.tools[key][0]
            return st.requested_id(m)
        return None

    # -- asks ------------------------------------------------------------------------
    async def _register(self, st: SessionState, em: Emission, ask_id: str, m: Moment, at: int,
                        *, held: bool, gate: bool = False) -> Ask:
        data = em.get("data") or {}
        kind = str(data.get("kind", "permission"))
        tool = m.get("tool_name")
        call = m.get("tool_use_id")
        kept, form_input = reply_moment(m, form=kind == "form")
        ask = Ask(ask_id, st.id, st.run, kind, kept, event=self.profile.event(m)[:PRINT_KEY_MAX],
                  options=data.get("options") if kind != "form" else None,
                  fields=data.get("fields") if kind == "form" else None,
                  tool=bounded_key(tool) if isinstance(tool, str) else None,
                  call_id=bounded_key(call) if isinstance(call, str) else None,
                  printed=input_print(m.get("tool_input")), form_input=form_input,
                  held=held and form_input is not None, gate=gate, t0=at)
        self.sessions.forget_closed(st)
        st.asks[ask_id] = ask
        await self._cap_asks(st, at)
        return ask

    async def _cap_asks(self, st: SessionState, at: int) -> None:
        """At most :data:`ASKS_MAX` open asks in ``st`` and
        :data:`ASKS_TOTAL_MAX` in the bridge: the oldest past either is
        dismissed (its ``attention.resolved``, a held hook answers ``{}``)."""
        mine = st.open_asks()
        for ask in mine[:max(0, len(mine) - ASKS_MAX)]:
            await self._resolve(ask, "dismissed", at)
        every = [a for s in self.sessions.all() for a in s.open_asks()]
        if len(every) > ASKS_TOTAL_MAX:
            every.sort(key=lambda a: a.t0)
            for ask in every[:len(every) - ASKS_TOTAL_MAX]:
                await self._resolve(ask, "dismissed", at)

    async def _gate(self, st: SessionState, m: Moment, cause: str, at: int) -> Ask | None:
        assert self.profile.gate_ask is not None
        em = self.profile.gate_ask(m, self.posture)
        out = await self._emit(st.id, em, run=st.run, cause=cause, at=at)
        if out is None:
            return None
        return await self._register(st, em, out["id"], m, at, held=True, gate=True)

    async def _settle(self, st: SessionState, ev: str, m: Moment, at: int) -> None:
        """Settle open asks by what the vendor does next (answered ``via:
        oob``): the tool ran (allowed), was denied, the form was answered
        elsewhere; a new prompt, the run's end or the session's end
        dismisses what is still open."""
        p = self.profile
        asks = st.open_asks()
        printed = input_print(m.get("tool_input")) \
            if asks and (ev in p.tool_done or ev in p.tool_denied) else None  # once, not per ask
        for ask in asks:
            if ask.settling is not None or not ask.open:
                continue  # an answer from AEP is being applied
            if ev in p.tool_done and ask.matches(m, printed):
                if ask.kind == "form":
                    values = p.form_answer(ask.fields or [], m) if p.form_answer else None
                    if values:
                        await self._answered_oob(ask, {"values": values}, at)
                    else:
                        await self._resolve(ask, "dismissed", at)
                else:
                    await self._answered_oob(ask, {"option": "allow"}, at)
            elif ev in p.tool_denied and ask.matches(m, printed):
                await self._answered_oob(ask, {"option": "deny"}, at)
            elif ev in p.form_results and ask.kind == "form" and ask.tool is None:
                action = m.get("action")
                content = m.get("content")
                answer = {"values": content} if action == "accept" and isinstance(content, dict) \
                    else {"option": action if isinstance(action, str) and action else "cancel"}
                await self._answered_oob(ask, answer, at)
            elif ev in p.run_opens or ev in p.run_closes or ev in p.session_ends:
                await self._resolve(ask, "dismissed", at)

    async def _answered_oob(self, ask: Ask, answer: dict[str, Any], at: int) -> None:
        em: Emission = {"type": "attention.answered",
                        "data": {"answer": answer, "via": "oob"}, "subject": ask.id}
        if ask.fields is not None:
            em["gating"] = {"form_fields": ask.fields}
        out = await self._emit(ask.session, em, run=ask.run, cause=ask.id, at=at)
        ask.closed_as = "answered-oob"
        await self._resolve(ask, "answered", at, cause=out["id"] if out else ask.id)

    async def _resolve(self, ask: Ask, resolution: str, at: int, *,
                       cause: str | None = None) -> None:
        ask.state = "closed"
        ask.closed_as = ask.closed_as or resolution
        ask.done.set()  # a hook still held answers {}: the vendor has moved on
        latency = elapsed_ms(ask.t0, at)
        await self._emit(ask.session, {"type": "attention.resolved", "subject": ask.id,
                                       "data": {"resolution": resolution, "latency_ms": latency}},
                         run=ask.run, cause=cause or ask.id, at=at)

    async def answered(self, ask: Ask, decision: Decision, cmd_id: str) -> None:
        """The outcome of an accepted ``control.attention.respond`` (after its
        ack): ``attention.answered`` (the applied answer, ``via: control``,
        cause the command) and ``attention.resolved`` (cause the answer)."""
        em: Emission = {"type": "attention.answered", "subject": ask.id,
                        "data": {"answer": decision.applied, "via": "control"}}
        if ask.fields is not None:
            em["gating"] = {"form_fields": ask.fields}
        out = await self._emit(ask.session, em, run=ask.run, cause=cmd_id)
        latency = elapsed_ms(ask.t0, now_ms())
        await self._emit(ask.session, {"type": "attention.resolved", "subject": ask.id,
                                       "data": {"resolution": "answered", "latency_ms": latency}},
                         run=ask.run, cause=out["id"] if out else cmd_id)

    async def hold(self, ask: Ask, hangup: trio.Event | None = None) -> dict[str, Any]:
        """Wait for ``ask``'s decision, at most the hold limit; the vendor
        reply. On the limit: ``attention.timeout`` and ``{}``. ``hangup``
        set (the vendor closed the connection): the ask is no longer
        answerable here and stays open for the out-of-band settling."""
        limit = self.hold_limit(ask)
        deadline = trio.current_time() + limit
        with trio.move_on_after(limit):
            async with trio.open_nursery() as n:
                async def _wait_hangup() -> None:
                    if hangup is not None:
                        await hangup.wait()
                        n.cancel_scope.cancel()
                n.start_soon(_wait_hangup)
                await ask.done.wait()
                n.cancel_scope.cancel()
        if ask.decision is not None:
            return self._reply(ask, ask.decision)
        if ask.state != "open":
            return self._neutral(ask)  # settled by the vendor's next moment
        if hangup is not None and hangup.is_set():
            # open for the vendor's next moment (an answer at the terminal settles
            # it oob); unsettled when the hold would have ended, it times out: an
            # agent killed mid-ask sends no next moment (a user trial, issue 27)
            ask.held, ask.expires = False, deadline
            self.ctx.health.count("hooks_hangup")
            return self._neutral(ask)
        if ask.settling is not None:  # an accepted answer is being applied: let it land
            with trio.move_on_after(1.0):
                await ask.done.wait()
            if ask.decision is not None:
                return self._reply(ask, ask.decision)
        await self._time_out(ask, limit)
        return self._neutral(ask)

    async def _time_out(self, ask: Ask, limit: float) -> None:
        ask.state, ask.closed_as = "closed", "timed-out"
        ask.held = False
        self.ctx.health.count("hooks_timeout")
        await self._emit(ask.session, {"type": "attention.timeout", "subject": ask.id,
                                       "data": {"after_ms": round(limit * 1000)}},
                         run=ask.run, cause=ask.id)
        st = self.sessions.get(ask.session)
        if st is not None:
            self.sessions.forget_closed(st)

    async def expire(self) -> int:
        """Time out the asks whose hook hung up and that nothing settled by
        the time their hold would have ended (``attention.timeout``, counted
        ``hooks_timeout``); how many. Run by the bridge's sweep."""
        now, n = trio.current_time(), 0
        for st in self.sessions.all():
            for ask in st.open_asks():
                if ask.expires is not None and now >= ask.expires and not ask.held:
                    await self._time_out(ask, self.hold_limit(ask))
                    n += 1
        return n

    def _neutral(self, ask: Ask) -> dict[str, Any]:
        return self.profile.neutral(ask.event)

    def hold_limit(self, ask: Ask) -> float:
        """How long ``ask``'s hook is held, seconds: ``AEP_<AGENT>_HOLD_S``,
        and never past the vendor's own timeout for that event, less
        :data:`TIMEOUT_MARGIN_S` (``profile.vendor_timeout_s``: the hold
        always ends first, even where no installer wrote a longer one)."""
        vendor = self.profile.vendor_timeout_s.get(ask.event)
        if vendor is None:
            return self.config.hold_s
        return max(0.0, min(self.config.hold_s, vendor - TIMEOUT_MARGIN_S))

    def _reply(self, ask: Ask, decision: Decision) -> dict[str, Any]:
        return self.profile.reply(ask.reply_moment(), decision)

    def release(self) -> int:
        """At the run's end: every hook still held answers no decision now
        (the vendor's own flow), instead of waiting out its hold against a
        run that can no longer answer it, and every ask still open gets its
        terminal ``attention.resolved{resolution: "dismissed"}`` (AEP-0002
        section 7 rule 2: a restarted daemon knows nothing of it, so it
        would stay pending for every consumer). Synchronous (it runs in a
        ``finally`` during cancellation): an event the channel refuses is
        counted ``hooks_release_dropped``. Returns how many were released."""
        n = 0
        for st in list(self.sessions.all()):
            for ask in st.open_asks():
                if ask.held:
                    ask.held = False
                    n += 1
                ask.state, ask.closed_as = "closed", "dismissed"
                ask.done.set()
                latency = elapsed_ms(ask.t0, now_ms())
                em: Emission = {"type": "attention.resolved", "subject": ask.id,
                                "data": {"resolution": "dismissed", "latency_ms": latency}}
                try:
                    self.ctx.emit_nowait(ask.session, em, run=ask.run, cause=ask.id)
                except (Saturated, trio.ClosedResourceError, trio.BrokenResourceError,
                        ValueError):
                    self.ctx.health.count("hooks_release_dropped")
        return n

    # -- steering ----------------------------------------------------------------------
    def queue(self, session: str, cmd_id: str, text: str) -> None:
        """Queue ``text`` for ``session`` (the controller checked room)."""
        st, evicted = self.sessions.touch(session)
        if evicted is not None:  # forgotten: nothing of it is kept across a restart either
            self.runs.save(evicted, gone=True)
        st.queue.append(Instruction(cmd_id, text, now_ms()))

    async def _deliver(self, st: SessionState, ev: str, at: int) -> dict[str, Any]:
        items = list(st.queue)
        st.queue.clear()
        text = "\n\n".join(i.text for i in items)[: self.profile.context_max]
        for i in items:
            self.ctx.health.count("instructions_delivered")
            await self._emit(st.id, {"type": f"x.{self.profile.agent}.instruction.delivered",
                                     "data": {"queued_ms": elapsed_ms(i.t0, at), "hook": ev}},
                             run=st.run, cause=i.cmd_id, at=at)
        return self.profile.context_reply(ev, text)

    async def _drop_queue(self, st: SessionState, reason: str, at: int | None = None) -> None:
        while st.queue:
            i = st.queue.popleft()
            self.ctx.health.count("instructions_dropped")
            await self._emit(st.id, {"type": f"x.{self.profile.agent}.instruction.dropped",
                                     "data": {"reason": reason}}, cause=i.cmd_id, at=at)

    async def _end(self, st: SessionState, at: int) -> None:
        await self._drop_queue(st, "session-ended", at)
        st.ended = True
        self.sessions.drop(st.id)


class _Repeat(Exception):
    """A hook id already seen (:meth:`HookHub._claim`)."""
