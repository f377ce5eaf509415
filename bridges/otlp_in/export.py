"""The export path, in two steps (trio side of both transports).

1. **Planning** (:func:`plan`, pure: no I/O, no clocks, no channel): the
   decoded records of one export request -> the emissions to stamp, each
   with its session and moment, plus the anomaly notes, the mapper failures
   and, per reason, how many LogRecords are refused (not a LogRecord, no
   session key, mapping failed). Profile seams: :mod:`bridges.otlp_in.profiles`.
2. **Admission** (:class:`Admission`, one per run): stamping the planned
   emissions onto the relay channel through the run's ``BridgeContext``,
   with backpressure. AEP-0003 §8.4 (never a silent drop at ``notice``+): a
   request arriving while the relay channel is full waits up to
   ``emit_grace`` seconds for room, and only then is refused retryably
   (:class:`~bridges.otlp_in.status.Unavailable`: 503 / UNAVAILABLE with
   ``Retry-After``), before anything is emitted, so the exporter's retry
   cannot duplicate. The wait comes first because the real Codex exporter
   (0.171, OTel Rust SDK 0.31) never retries: its one export at exit carries
   the whole run, and a 503 loses it (``tests/fixtures/codex_otel_real/README.md``,
   "Delivery"). Once a request is admitted its emissions go out in order; if
   the channel fills mid-request admission again waits up to ``emit_grace``,
   and the LogRecords still unsent then are reported to the sender in
   ``partial_success`` (rejected, counted, logged), not dropped silently.

The transports (:mod:`bridges.otlp_in.http`, :mod:`bridges.otlp_in.grpc`)
call :meth:`Admission.export`, an :data:`Export`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, NamedTuple, Sequence

import trio

from bridges.core.bridge import BridgeContext, Emission, Saturated
from bridges.core.posture import Posture

from .common import Moments, payload, session_id
from .flatten import FlatRecord
from .profiles import Profile
from .status import Accepted, Unavailable

Export = Callable[[list[FlatRecord | None], list[str]], Awaitable[Accepted]]
"""``await export(records, notes)``: one request's decoded records (``None``
for an entry that is not a LogRecord) and its decoding notes -> the
``partial_success`` figures, or :class:`~bridges.otlp_in.status.Unavailable`."""

OnProblem = Callable[[str, str], None]
"""``on_problem(counter, line)``: a transport refused a request (the
``BridgeHealth`` counter and one human line, never body content)."""

STOP_VERDICT_S = 0.8
"""Seconds an export waits for the session log's verdict once the run is
stopping: within the servers' grace for what is in flight (1 s), so it is
answered (503, counted ``otlp.log_unconfirmed_at_stop``), not cut off."""

# partial_success reasons (error_message: "<n> LogRecords rejected: <reason>")
NOT_A_RECORD = "not a LogRecord"
NO_SESSION = "no session key"
MAPPING_FAILED = "mapping failed"
SATURATED = "relay channel saturated"
STOPPING = "receiver stopping"
STAMP_FAILED = "stamping failed"
TOO_MANY_SESSIONS = "too many new sessions"


class Planned(NamedTuple):
    """One emission to stamp: the index of its LogRecord in the request,
    its AEP ``session``, the emission (with the profile's gating hint) and
    the moment it describes (``None``: the stamper uses the receive time; a
    string: already in the stamper's form,
    :func:`~bridges.otlp_in.common.record_moment`).
    A named tuple: one is made per record (a frozen dataclass costs a
    ``__setattr__`` per field)."""

    record: int
    session: str
    emission: Emission
    time: datetime | str | None


@dataclass(frozen=True)
class Plan:
    """What one export request becomes. ``emissions`` in request order;
    ``refused``: LogRecords refused per reason (first occurrence order);
    ``notes``: counter names of anomalies (``otlp.no_session``,
    ``otlp.unknown_event``...); ``failures``: the exceptions of mapper bugs
    (the admission step logs them; each is also a ``refused`` record)."""

    emissions: tuple[Planned, ...] = ()
    refused: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    failures: tuple[Exception, ...] = ()


def plan(records: Sequence[FlatRecord | None], profile: Profile, posture: Posture,
         now: datetime | None = None) -> Plan:
    """Map one request's records (pure). Never raises: a record the mapper
    chokes on is refused as ``mapping failed`` (noted ``otlp.mapping_error``)
    and the exception kept in :attr:`Plan.failures`. ``now``: the receive
    time (the caller reads the clock); a vendor time out of range around it
    falls back to the next candidate, noted ``otlp.time_out_of_range``
    (:func:`~bridges.otlp_in.common.record_moment`).

    A record of an event whose mapping at ``posture`` is its gated payload
    takes the profile's compiled :class:`~bridges.otlp_in.common.Recipe`
    (:meth:`Profile.recipes <bridges.otlp_in.profiles.Profile.recipes>`)
    instead of ``map_record`` and the hint, and every record's moment comes
    from one :class:`~bridges.otlp_in.common.Moments`: the same plan
    (``tests/unit/otlp_in/test_otlp_recipes.py`` holds it to the plain
    loop over ``session_key``, ``map_record``, ``record_moment`` and the
    hint)."""
    refused: Counter[str] = Counter()
    notes: list[str] = []
    failures: list[Exception] = []
    planned: list[Planned] = []
    # raw session key -> (session, its notes): a request's records share a
    # few sessions, each checked against the id grammar once
    sessions: dict[object, tuple[str | None, list[str]]] = {}
    # the profile's seams read once per request, not once per record
    # map_record's emissions are its own, fresh: the gating hint goes in in place
    session_key, map_record, stampable = profile.session_key, profile.map_record, \
        profile.hint
    recipes = profile.recipes(posture)
    by_attribute = profile.session_attribute
    # raw session key -> its session, for the keys whose check noted nothing
    clean: dict[str, str] = {}
    moment = Moments(now)
    texts = moment.texts
    append = planned.append
    for idx, rec in enumerate(records):
        if rec is None:
            refused[NOT_A_RECORD] += 1
            continue
        try:
            a: Any = rec.get("attributes") if rec.__class__ is dict else None
            if a.__class__ is dict:
                raw = a.get(by_attribute) if by_attribute is not None else session_key(rec)
                name = a.get("event.name")
            else:
                raw, name = session_key(rec), None
            sess = clean.get(raw) if raw.__class__ is str else None
            if sess is None:
                known = sessions.get(raw) if raw.__class__ is str else None
                if known is None:
                    said: list[str] = []
                    known = (session_id(raw, said), said)
                    if raw.__class__ is str:
                        sessions[raw] = known
                        if known[0] is not None and not said:
                            clean[raw] = known[0]
                sess = known[0]
                if known[1]:
                    notes.extend(known[1])
                if sess is None:
                    notes.append("otlp.no_session")
                    refused[NO_SESSION] += 1
                    continue
            recipe = recipes.get(name) if name.__class__ is str else None
            if recipe is not None:
                type_, grades, red_ok, full_ok, policy, gating = recipe
                em: Emission = {"type": type_,
                                "data": payload(grades, a, notes, red_ok, full_ok, policy),
                                "gating": gating}
                # the moment: Moments' own first look, inline (the texts it took)
                ts = a.get("event.timestamp")
                when = ts if ts.__class__ is str and texts.get(ts) and \
                    rec.get("time_unix_nano") is None else moment(rec, notes)
                # Planned(...) without the named tuple's Python-level __new__ (what it calls)
                append(_new_tuple(Planned, (idx, sess, em, when)))
                continue
            emissions = map_record(rec, posture, notes)
            when = moment(rec, notes)
        except Exception as e:  # a mapper bug must not take the receiver down
            notes.append("otlp.mapping_error")
            refused[MAPPING_FAILED] += 1
            failures.append(e)
            continue
        for em in emissions:
            append(_new_tuple(Planned, (idx, sess, stampable(em), when)))
    return Plan(tuple(planned), dict(refused), tuple(notes), tuple(failures))


_new_tuple = tuple.__new__


class Admission:
    """The admission step of one run: stamps planned emissions onto the
    relay channel of ``ctx`` (its only way out). ``profile`` / ``posture``:
    the mapping seams and capture posture of the run; ``emit_grace``: the
    longest wait for room, in seconds, before admission and again
    mid-request; ``retry_after``: seconds suggested on a retryable refusal.
    :attr:`closing` (set by the run on its way out) answers every waiting
    export at once."""

    def __init__(self, ctx: BridgeContext, profile: Profile, posture: Posture, *,
                 emit_grace: float, retry_after: int, max_new_sessions: int = 100,
                 new_sessions_per_s: float = 50.0) -> None:
        self.ctx = ctx
        self.profile = profile
        self.posture = posture
        self.emit_grace = emit_grace
        self.retry_after = retry_after
        self._closing = False
        self._waits: set[trio.CancelScope] = set()  # exports waiting for room
        self._verdicts: set[trio.CancelScope] = set()  # exports waiting on the log's verdict
        self.max_new_sessions = max_new_sessions
        self.new_sessions_per_s = new_sessions_per_s
        self._tokens = float(max_new_sessions)  # new sessions admissible now (token bucket)
        self._tokens_at: float | None = None

    @property
    def closing(self) -> bool:
        """The run is stopping: no more admissions (setting it answers
        every waiting export at once)."""
        return self._closing

    @closing.setter
    def closing(self, value: bool) -> None:
        self._closing = value
        if value:
            for scope in self._waits:
                scope.cancel()
            # the drain logs what went out, but the servers give what is in
            # flight a grace of ~1 s: answer within it, not be cut off
            deadline = trio.current_time() + STOP_VERDICT_S
            for scope in self._verdicts:
                scope.deadline = min(scope.deadline, deadline)

    async def export(self, records: list[FlatRecord | None], notes: list[str]) -> Accepted:
        """One request (an :data:`Export`): count it, wait for room
        (:class:`~bridges.otlp_in.status.Unavailable` when none comes), plan
        it, admit the plan. Returns the ``partial_success`` figures."""
        health = self.ctx.health
        health.count("otlp.requests")
        health.count("otlp.records", len(records))
        for n in notes:
            health.count(n)
        await self.gate()
        p = plan(records, self.profile, self.posture, datetime.now(timezone.utc))
        for n in p.notes:
            health.count(n)
        for exc in p.failures:
            self.ctx.log.error("%s: mapping a LogRecord failed", self.ctx.name, exc_info=exc)
        return await self.admit(p)

    async def gate(self) -> None:
        """Return once the relay channel has room (within ``emit_grace``);
        raise :class:`~bridges.otlp_in.status.Unavailable` when it has none
        (counted ``otlp.saturated``) or the run is stopping."""
        if await self.room():
            if not self.ctx.log_writable():  # never acknowledge what the log cannot write
                self.ctx.health.count("otlp.log_unwritable")
                raise Unavailable("session log cannot write (disk full?); retry later",
                                  self.retry_after)
            return
        if self.closing:
            raise Unavailable("receiver is stopping; retry later", self.retry_after)
        self.ctx.health.count("otlp.saturated")
        raise Unavailable("relay channel saturated; retry later", self.retry_after)

    async def admit(self, p: Plan) -> Accepted:
        """Stamp and send ``p``'s emissions in order, each after room is
        there. Raises :class:`~bridges.otlp_in.status.Unavailable` only
        while nothing of the request has been sent (a retry then cannot
        duplicate); afterwards what cannot be sent (the channel saturated
        past ``emit_grace``, or closed by the run's stop) is rejected in the
        result instead. The one exception: what was sent did not reach the
        session log within 10 s (``otlp.log_unwritten``, issue 10 #9), or
        within :data:`STOP_VERDICT_S` of the run's stop
        (``otlp.log_unconfirmed_at_stop``)."""
        reasons: Counter[str] = Counter(p.refused)
        emitted = 0
        mark = self.ctx.log_mark()
        todo = self._session_cap(p.emissions, reasons)
        ctx = self.ctx
        emit, emit_run = ctx.emit_nowait, ctx.emit_run
        # each run of one session is stamped and sent in one call (as many
        # as the channel has room for); the emission a run stops at gets
        # its own answer from emit_nowait (_refused sorts it out)
        emissions = [item.emission for item in todo]
        times = [item.time for item in todo]
        n = len(todo)
        # sends are counted against room() until the next wait, and closing
        # is looked at again only then: neither changes without a checkpoint
        free = 0 if self._closing else ctx.room()
        pos = 0
        while pos < n:
            if free < 1:
                if not await self.room():
                    if emitted == 0:  # nothing admitted yet: a retry cannot duplicate
                        raise Unavailable("receiver is stopping; retry later" if self.closing
                                          else "relay channel saturated; retry later",
                                          self.retry_after)
                    self._cut_short(todo[pos:], reasons)
                    break
                free = ctx.room()
            session = todo[pos].session
            limit = n if free >= n - pos else pos + int(free)
            end = pos + 1
            while end < limit and todo[end].session == session:
                end += 1
            sent = emit_run(session, emissions, times, pos, end)
            emitted += sent - pos
            free -= sent - pos
            pos = sent
            if sent < end:  # the run stopped here: this one's own answer
                item = todo[pos]
                try:
                    emit(item.session, item.emission, time=item.time, room_seen=True)
                    emitted += 1
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    # the run is stopping (the fleet's drain closed the channel)
                    if emitted == 0:  # nothing admitted yet: a retry cannot duplicate
                        raise Unavailable("relay channel closed; retry later",
                                          self.retry_after) from None
                    # what went out stays acknowledged (the drain logs it); the rest
                    # is rejected, so a retry of it duplicates nothing
                    self._cut_short(todo[pos:], reasons, STOPPING)
                    break
                except Exception as e:  # noqa: BLE001 -- sorted out (or re-raised) by _refused
                    emitted += self._refused(item, e, reasons)
                free -= 1
                pos += 1
        health = self.ctx.health
        health.count("otlp.emitted", emitted)
        if emitted and not await self._logged(mark):
            # the relay got them, the durable session log did not: not
            # acknowledged (issue 10 #9); the retry may duplicate on the relay
            if self._closing:
                health.count("otlp.log_unconfirmed_at_stop")
                raise Unavailable("receiver stopped before the session log confirmed this "
                                  "export's events, which went out to the relay; retry later",
                                  self.retry_after)
            health.count("otlp.log_unwritten")
            raise Unavailable("the session log did not confirm this export's events, which "
                              "went out to the relay (disk full?); retry later",
                              self.retry_after)
        rejected = sum(reasons.values())
        if rejected:
            health.count("otlp.rejected", rejected)
        msg = "; ".join(f"{n} LogRecord{'s' if n > 1 else ''} rejected: {why}"
                        for why, n in reasons.items())
        return Accepted(rejected=rejected, error_message=msg)

    async def _logged(self, mark: int) -> bool:
        """:meth:`BridgeContext.logged_since` ``mark``, cut to
        :data:`STOP_VERDICT_S` once the run is stopping (``False`` then)."""
        with trio.CancelScope() as scope:
            if self._closing:
                scope.deadline = trio.current_time() + STOP_VERDICT_S
            self._verdicts.add(scope)
            try:
                return await self.ctx.logged_since(mark)
            finally:
                self._verdicts.discard(scope)
        return False

    def _session_cap(self, emissions: Sequence[Planned], reasons: Counter[str]
                     ) -> list[Planned]:
        """``emissions`` without those of new sessions past the caps (issue 10
        #10: one request of 20,000 conversations made 20,000 session files):
        at most ``max_new_sessions`` sessions this stamper has not seen per
        request, and ``new_sessions_per_s`` over all requests (bursts up to
        ``max_new_sessions``). Their LogRecords are rejected, counted
        ``otlp.sessions_refused``."""
        now = trio.current_time()
        if self._tokens_at is not None:
            self._tokens = min(float(self.max_new_sessions),
                               self._tokens + (now - self._tokens_at) * self.new_sessions_per_s)
        self._tokens_at = now
        fresh: set[str] = set()
        refused: set[str] = set()
        kept: list[Planned] = []
        lost: set[int] = set()
        known: set[str] = set()  # sessions the stamper knows (asked once per session)
        knows = self.ctx.stamper.knows
        for item in emissions:
            s = item.session
            if s in known:
                kept.append(item)
                continue
            if s in refused:
                lost.add(item.record)
                continue
            if s not in fresh and knows(s):
                known.add(s)
            elif s not in fresh:
                if len(fresh) >= self.max_new_sessions or self._tokens < 1:
                    refused.add(s)
                    lost.add(item.record)
                    continue
                fresh.add(s)
                self._tokens -= 1
            kept.append(item)
        if lost:
            lost -= {item.record for item in kept}
            reasons[TOO_MANY_SESSIONS] += len(lost)
            self.ctx.health.count("otlp.sessions_refused", len(lost))
        return kept

    def _cut_short(self, rest: Sequence[Planned], reasons: Counter[str],
                   why: str | None = None) -> None:
        """Reject the LogRecords of ``rest`` (in ``partial_success``, counted,
        logged): ``why`` (default: stopping when :attr:`closing`, else
        saturated)."""
        lost = len({item.record for item in rest})
        if why is None:
            why = STOPPING if self.closing else SATURATED
        reasons[why] += lost
        self.ctx.health.count("otlp.rejected_stopping" if why == STOPPING else
                              "otlp.rejected_saturated", lost)
        self.ctx.log.warning("%s: %s; %d LogRecords rejected via partial_success",
                             self.ctx.name, why, lost)

    def _refused(self, item: Planned, e: Exception, reasons: Counter[str]) -> int:
        """0, the reason counted, for ``e``, raised by ``emit_nowait`` of
        ``item``: the channel full (an unbuffered one, after room()) or a
        stamping refusal; anything else raises ``e`` (a closed channel is
        :meth:`admit`'s own)."""
        if isinstance(e, Saturated):
            reasons[SATURATED] += 1
        elif isinstance(e, ValueError):
            self.ctx.log.warning("%s: cannot stamp %s: %s", self.ctx.name,
                                 item.emission.get("type"), e)
            self.ctx.health.count("otlp.stamp_error")
            reasons[STAMP_FAILED] += 1
        else:
            raise e
        return 0

    async def room(self) -> bool:
        """Wait (at most ``emit_grace`` s, and not past the run's stop)
        until the relay channel has room: woken by the channel's consumer
        (:meth:`BridgeContext.wait_room`), not a timer; stamping before
        the wait would burn a ``seq`` on timeout."""
        if not self.closing and self.ctx.saturated():
            with trio.move_on_after(self.emit_grace) as scope:
                self._waits.add(scope)
                try:
                    await self.ctx.wait_room()
                finally:
                    self._waits.discard(scope)
        return not self.ctx.saturated() and not self.closing
