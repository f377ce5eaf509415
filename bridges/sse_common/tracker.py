"""Runtime state of the SSE bridge: run synthesis, tool pairing, pending
attention, todo snapshots, control notes, event-id dedupe and reconcile.

Deterministic and I/O-free like the mapping (no sockets, no clocks, no
randomness), so it is unit-tested by replaying the real servers' captured
frames. The receiver feeds it :class:`~bridges.sse_common.frames.BusEvent`
objects and emits the :class:`Out` items it returns, in order, filling in
:attr:`Out.envelope` as each is stamped.

Rules (design record ``adapter-opencode-design.md``, the SSE bridge
section; AEP-0002 §2, §7; AEP-0004 §5):

- **Identity**: the vendor ``sessionID`` is the AEP session. Runs are
  synthesized: the first user ``message.updated`` while no run is open opens
  one (steering never double-opens), ``session.idle`` closes it. The run id
  is the vendor's user message id (``msg_...``): stable, so a reconnect or a
  daemon restart finds the same run again, and a closed run is never
  reopened (terminal exclusivity).
- **Dedupe**: by the vendor event id (the sync frame form repeats it).
  Repeated ``session.status`` values and repeated ``message.updated`` of one
  message are reduced (one event per status change; per message: user at
  first sight, assistant once completed).
- **Attention**: every lifecycle event after ``attention.requested`` takes
  the request's envelope id as ``subject`` (AEP-0002 §7.1). An ask still
  pending when its run closes (or the session ends) is resolved
  ``dismissed`` first. A settle that answers a command of ours becomes
  ``attention.answered`` (``via: control``, ``cause`` = the command) then
  ``attention.resolved`` (``cause`` = the answered event).
- **Tools**: one ``tool.requested`` and one terminal per ``callID``; a tool
  error after its permission was rejected is ``tool.denied`` (``by:
  policy`` when the reject was an operator's AEP command, ``runtime`` when
  it came from the vendor's own surface).
- **Cancel**: an armed cancel note turns the next close of that run into
  ``run.cancelled`` (``by: control``, ``cause`` = the command).
- **Reconcile** (after a reconnect): the REST snapshot of busy sessions,
  pending asks and the last messages closes runs that ended unseen
  (``run.finished``, or ``run.failed{reason: interrupted}`` when the server
  lost the run mid-step), re-opens busy runs unseen (``trigger: resume``),
  reports a busy status it had not reported (``progress.status``; after a
  daemon restart this is also what re-claims the session at the relay, so
  commands route to it again), raises asks unseen and resolves asks that
  vanished. Open runs and pending asks survive a daemon restart through
  :meth:`Tracker.snapshot` / :meth:`Tracker.restore`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterable

from bridges.core.bridge import Emission
from bridges.core.posture import Posture

from .frames import BusEvent
from .mapping import STREAMING, _d, _l, diff_todos, map_bus, map_tool_part, question_fields
from .sessions import (
    CLOSED_RUNS_KEPT,
    MESSAGE_KEYS_KEPT,
    Ask,
    Cancel,
    Out,
    SessionState,
    SessionStore,
)


class Tracker(SessionStore):
    """See the module docstring. ``posture``: the mapping posture;
    ``dedupe``: vendor event ids remembered; ``max_sessions``: tracked
    sessions (the least recently active without an open run or a pending ask
    are forgotten first). ``counters`` counts what was skipped."""

    def __init__(self, posture: Posture, *, dedupe: int = 8192, max_sessions: int = 5000) -> None:
        self.posture = posture
        self.dedupe = dedupe
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, SessionState] = OrderedDict()
        self.ended: OrderedDict[str, None] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.counters: dict[str, int] = {}
        #: what :meth:`count` counted since the caller last cleared it (the
        #: receiver clears it before each :meth:`feed` and forwards it to
        #: the bridge's health counters)
        self.fed: dict[str, int] = {}
        self.dirty = False  # the persistent part (snapshot()) changed
        #: sessions whose persistent entry may have changed since the last
        #: :meth:`changes` (every session :meth:`state` hands out, ended,
        #: evicted, armed or reconciled): what an incremental save rewrites
        self.touched: set[str] = set()

    # ------------------------------------------------------------ helpers
    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n
        self.fed[name] = self.fed.get(name, 0) + n

    @property
    def primary(self) -> bool:
        return self.posture.mode == "primary"

    def touch(self, sid: str) -> None:
        """Mark ``sid``'s persistent entry as possibly changed (the receiver
        calls it once an emission of ``sid`` is stamped: an ask's entry
        carries its envelope)."""
        self.touched.add(sid)

    def state(self, sid: str, directory: str | None = None) -> SessionState:
        self.touched.add(sid)
        st = self.sessions.get(sid)
        if st is None:
            st = self.sessions[sid] = SessionState(sid)
            self._evict()
        else:
            self.sessions.move_to_end(sid)
        if directory:
            st.directory = directory
        return st

    def _evict(self) -> None:
        excess = len(self.sessions) - self.max_sessions
        if excess <= 0:
            return
        for sid in [s for s, st in self.sessions.items() if st.run is None and not st.asks]:
            del self.sessions[sid]
            self.touched.add(sid)
            excess -= 1
            if excess <= 0:
                return

    def directories(self) -> set[str]:
        """Directories of the tracked sessions (reconcile queries each)."""
        return {st.directory for st in self.sessions.values() if st.directory}

    def open_runs(self) -> dict[str, str]:
        """``{session: run}`` for every open synthesized run."""
        return {sid: st.run for sid, st in self.sessions.items() if st.run}

    def find_ask(self, session: str, event_id: str) -> Ask | None:
        """The pending ask whose ``attention.requested`` envelope id is
        ``event_id`` in ``session`` (``None``: unknown or already settled)."""
        st = self.sessions.get(session)
        if st is None or not event_id:
            return None
        for ask in st.asks.values():
            if ask.event_id == event_id:
                return ask
        return None

    def open_run(self, session: str) -> str | None:
        st = self.sessions.get(session)
        return st.run if st else None

    def arm_answer(self, ask: Ask, command: str, applied: dict[str, Any]) -> Callable[[], None]:
        """Mark ``ask`` settling by ``command``; returns the disarm."""
        ask.settling, ask.applied = command, applied
        self.touched.add(ask.session)
        self.dirty = True

        def disarm() -> None:
            if ask.settling == command:
                ask.settling, ask.applied = None, None
                self.touched.add(ask.session)
                self.dirty = True
        return disarm

    def arm_cancel(self, session: str, command: str, run: str) -> Callable[[], None]:
        """Arm the pendingCancel note; returns the disarm."""
        st = self.state(session)
        note = st.cancel = Cancel(command, run)
        self.dirty = True

        def disarm() -> None:
            if st.cancel is note:
                st.cancel = None
                self.touched.add(st.id)
                self.dirty = True
        return disarm

    def _seen_id(self, ident: str | None) -> bool:
        if ident is None:
            return False
        if ident in self._seen:
            self._seen.move_to_end(ident)
            return True
        self._seen[ident] = None
        if len(self._seen) > self.dedupe:
            self._seen.popitem(last=False)
        return False

    # ------------------------------------------------------------ feeding
    def feed(self, ev: BusEvent) -> list[Out]:
        """Map one bus event with the runtime state; returns what to emit."""
        if self._seen_id(ev.id):
            self.count("duplicates")
            return []
        if ev.type in STREAMING:
            self.count("heartbeats" if ev.type == "server.heartbeat" else "deltas_skipped")
            return []
        if ev.type == "message.part.updated" and _d(ev.properties.get("part")).get("type") != "tool":
            self.count("deltas_skipped")
            return []
        sid = ev.session
        if sid is None:
            # AEP session-scoped events need a session; the vendor's
            # instance-level machinery (plugin.added, catalog.updated...) has none
            self.count("sessionless_skipped")
            return []
        if sid in self.ended and ev.type != "session.deleted":
            self.count("after_end_skipped")
            return []
        st = self.state(sid, ev.directory)
        if self.primary:
            return self._primary(st, ev)
        return self._companion(st, ev)

    def _out(self, st: SessionState, emissions: Iterable[Emission], **kw: Any) -> list[Out]:
        return [Out(st.id, e, **kw) for e in emissions]

    def _message_key(self, st: SessionState, info: dict[str, Any]) -> bool:
        """True the first time a message reaches its reportable state (user:
        first sight; assistant: completed or errored)."""
        mid = info.get("id")
        if not isinstance(mid, str):
            return True
        if info.get("role") == "assistant":
            t = _d(info.get("time"))
            if "completed" not in t and not info.get("error"):
                return False
        if mid in st.messages:
            return False
        st.messages[mid] = None
        if len(st.messages) > MESSAGE_KEYS_KEPT:
            st.messages.popitem(last=False)
        return True

    def _companion(self, st: SessionState, ev: BusEvent) -> list[Out]:
        p = ev.properties
        if ev.type == "message.updated":
            info = _d(p.get("info"))
            if not self._message_key(st, info):
                self.count("repeats_reduced")
                return []
        elif ev.type == "session.status":
            status = (p.get("status") or {}).get("type") if isinstance(p.get("status"), dict) else None
            if status == st.status:
                self.count("repeats_reduced")
                return []
            st.status = status
        elif ev.type == "message.part.updated":
            part = p["part"]
            call, status = part.get("callID"), _d(part.get("state")).get("status")
            if isinstance(call, str):
                if st.parts.get(call) == status:
                    self.count("repeats_reduced")
                    return []
                st.parts[call] = status
        outs = self._out(st, map_bus(ev.type, p, self.posture))
        if ev.type == "session.deleted":
            self._end(st.id)
        return outs

    def _end(self, sid: str) -> None:
        self.sessions.pop(sid, None)
        self.touched.add(sid)
        self.ended[sid] = None
        if len(self.ended) > self.max_sessions:
            self.ended.popitem(last=False)

    # ------------------------------------------------------------ primary
    def _primary(self, st: SessionState, ev: BusEvent) -> list[Out]:
        t, p = ev.type, ev.properties
        if t in ("session.created", "session.deleted"):
            return self._lifecycle(st, t, p)
        if t == "session.idle":
            return self._close_run(st)
        if t == "session.status":
            return self._status(st, p)
        if t == "message.updated":
            return self._message(st, p)
        if t == "message.part.updated":
            return self._tool(st, p["part"])
        if t in ("permission.updated", "permission.asked", "question.asked"):
            return self._ask(st, t, p)
        if t in ("permission.replied", "question.replied", "question.rejected"):
            return self._reply(st, t, p)
        if t == "todo.updated":
            todos = _l(p.get("todos"))
            outs = self._out(st, diff_todos(st.todos or [], todos, self.posture), run=st.run)
            st.todos = todos
            return outs
        return self._out(st, map_bus(t, p, self.posture), run=st.run)

    def _lifecycle(self, st: SessionState, t: str, p: dict[str, Any]) -> list[Out]:
        """``session.created`` (once per session) / ``session.deleted``
        (closes the open run as cancelled, then ends the session)."""
        if t == "session.created":
            if st.started:
                return []
            st.started = True
            return self._out(st, map_bus(t, p, self.posture))
        outs = self._close_run(st, cancelled_by_end=True)
        outs += self._out(st, map_bus(t, p, self.posture))
        self._end(st.id)
        return outs

    def _status(self, st: SessionState, p: dict[str, Any]) -> list[Out]:
        """``session.status``: only a change of status is emitted."""
        status = _d(p.get("status"))
        if status.get("type") == st.status:
            self.count("repeats_reduced")
            return []
        st.status = status.get("type")
        return self._out(st, map_bus("session.status", p, self.posture), run=st.run)

    def _message(self, st: SessionState, p: dict[str, Any]) -> list[Out]:
        """``message.updated``: a new user message opens the run (its id is
        the run id); repeats are reduced."""
        info = _d(p.get("info"))
        if not self._message_key(st, info):
            self.count("repeats_reduced")
            return []
        if info.get("role") != "user":
            return self._out(st, map_bus("message.updated", p, self.posture), run=st.run)
        mid = info.get("id")
        if st.run is not None or not isinstance(mid, str) or mid in st.closed_runs:
            return []
        st.run = mid
        self.dirty = True
        return self._out(st, map_bus("message.updated", p, self.posture), run=mid)

    def _reply(self, st: SessionState, t: str, p: dict[str, Any]) -> list[Out]:
        """A permission reply, a question reply or rejection settles its ask."""
        if t == "permission.replied":
            vid = p.get("permissionID") or p.get("requestID")
            reply = p.get("response") or p.get("reply")
            return self._settle(st, vid, "answered", reply=reply)
        return self._settle(st, p.get("requestID"),
                            "answered" if t == "question.replied" else "dismissed")

    def _ask(self, st: SessionState, t: str, p: dict[str, Any]) -> list[Out]:
        vid = p.get("id")
        if not isinstance(vid, str) or not vid:
            self.count("asks_without_id")
            return self._out(st, map_bus(t, p, self.posture), run=st.run)
        if vid in st.asks or vid in st.settled:
            return []  # a repeat, or a stale REST snapshot of an ask already closed
        emissions = map_bus(t, p, self.posture)
        if not emissions:
            return []
        out = Out(st.id, emissions[0], run=st.run)
        tool = _d(p.get("tool"))
        call = tool.get("callID") or p.get("callID")
        kind = "form" if t == "question.asked" else "permission"
        questions = _l(p.get("questions"))
        ask = Ask(vid, st.id, kind, "legacy" if t == "permission.updated" else "current", out,
                  run=st.run, call_id=call if isinstance(call, str) else None,
                  questions=questions,
                  fields=question_fields(questions, self.posture) if kind == "form" else [])
        st.asks[vid] = ask
        self.dirty = True
        return [out] + self._out(st, emissions[1:], run=st.run)

    def _settle(self, st: SessionState, vid: Any, resolution: str, *,
                reply: Any = None) -> list[Out]:
        ask = st.asks.pop(vid, None) if isinstance(vid, str) else None
        if ask is None:
            # never saw the ask (it predates us and reconcile missed it): the
            # pinned plain resolution, subject the vendor id
            self.count("unknown_settles")
            e: Emission = {"type": "attention.resolved", "data": {"resolution": resolution}}
            if isinstance(vid, str) and vid:
                e["subject"] = vid
            return [Out(st.id, e, run=st.run)]
        if reply == "reject" and ask.call_id:
            st.rejected[ask.call_id] = ask.settling
        return self._resolve(st, ask, resolution, reply=reply)

    def _resolve(self, st: SessionState, ask: Ask, resolution: str, *,
                 reply: Any = None) -> list[Out]:
        self.dirty = True
        st.settled[ask.vendor_id] = None
        if len(st.settled) > CLOSED_RUNS_KEPT:
            st.settled.popitem(last=False)
        subject = ask.event_id or ask.vendor_id
        run = ask.run or st.run
        ours = ask.settling is not None and resolution == "answered" and (
            reply is None or (ask.applied or {}).get("option") == reply)
        if ours:
            answered_e: Emission = {"type": "attention.answered",
                                    "data": {"answer": ask.applied, "via": "control"},
                                    "subject": subject}
            if ask.kind == "form":
                answered_e["gating"] = {"form_fields": ask.fields}
            answered = Out(st.id, answered_e, run=run, cause=ask.settling)
            resolved = Out(st.id, {"type": "attention.resolved",
                                   "data": {"resolution": "answered"}, "subject": subject},
                           run=run, cause_of=answered)
            return [answered, resolved]
        return [Out(st.id, {"type": "attention.resolved", "data": {"resolution": resolution},
                            "subject": subject}, run=run, cause=ask.event_id)]

    def _tool(self, st: SessionState, part: dict[str, Any]) -> list[Out]:
        call = part.get("callID")
        state = _d(part.get("state"))
        status = state.get("status")
        if not isinstance(call, str) or not call:
            self.count("tool_parts_without_call")
            return []
        rec = st.tools.setdefault(call, [False, False])
        outs: list[Out] = []
        if not rec[0]:
            rec[0] = True
            early = dict(part, state=dict(state, status="running"))
            outs += self._out(st, map_tool_part(early, self.posture), run=st.run)
        if status in ("completed", "error") and not rec[1]:
            rec[1] = True
            cause = None
            denied_by = None
            if status == "error" and call in st.rejected:
                cause = st.rejected.pop(call)
                denied_by = "policy" if cause else "runtime"
            outs += self._out(st, map_tool_part(part, self.posture, denied_by=denied_by),
                              run=st.run, cause=cause)
        if not outs:
            self.count("repeats_reduced")
        return outs

    def _close_run(self, st: SessionState, *, cancelled_by_end: bool = False,
                   terminal: Emission | None = None) -> list[Out]:
        """Dismiss asks left pending, then close the open run (if any) with
        ``run.cancelled`` when a cancel note for it is armed, else
        ``terminal`` (default ``run.finished``)."""
        outs: list[Out] = []
        for ask in list(st.asks.values()):
            outs += self._resolve(st, ask, "dismissed")
        st.asks.clear()
        run = st.run
        note, st.cancel = st.cancel, None
        if run is None:
            return outs
        if note is not None and note.run == run:
            outs.append(Out(st.id, {"type": "run.cancelled", "data": {"by": "control"}},
                            run=run, cause=note.command))
        elif cancelled_by_end:
            outs.append(Out(st.id, {"type": "run.cancelled", "data": {}}, run=run))
        else:
            outs.append(Out(st.id, terminal or {"type": "run.finished", "data": {}}, run=run))
        st.closed_runs[run] = None
        if len(st.closed_runs) > CLOSED_RUNS_KEPT:
            st.closed_runs.popitem(last=False)
        st.run = None
        st.run_envelope = None
        st.tools.clear()
        st.rejected.clear()
        self.dirty = True
        return outs

    # ------------------------------------------------------------ persistence
    # ------------------------------------------------------------ reconcile
    def reconcile(self, *, queried: set[str | None], busy: dict[str, str],
                  permissions: list[Any], questions: list[Any],
                  messages: dict[str, list[Any]], directory_of: dict[str, str] | None = None
                  ) -> list[Out]:
        """Bring the state in line with a REST snapshot taken after a
        (re)connect (the stream has no replay).

        ``queried``: the directories whose snapshot was read (``None`` = the
        server's default instance); ``busy``: ``{session: status type}`` of
        the non-idle sessions there; ``permissions``/``questions``: the
        pending asks (``GET /permission``, ``GET /question`` shapes);
        ``messages``: ``{session: [{info, parts}...]}`` for the sessions the
        receiver fetched (:meth:`needs_messages`); ``directory_of``: the
        directory each busy session was reported under. Only sessions in a
        queried directory are closed; nothing is emitted twice."""
        if not self.primary:
            return []
        pending_p, pending_q = _pending(permissions), _pending(questions)
        outs = self._reconcile_busy(busy, messages, directory_of or {})
        outs += self._reconcile_new_asks(pending_p, pending_q)
        for sid, st in list(self.sessions.items()):
            if _inside(st, queried):
                self.touched.add(sid)
                outs += self._reconcile_gone(sid, st, pending_p.keys() | pending_q.keys(),
                                             busy, messages)
        return outs

    def _reconcile_busy(self, busy: dict[str, str], messages: dict[str, list[Any]],
                        directory_of: dict[str, str]) -> list[Out]:
        """Busy sessions we have no open run for: re-open (resume); a status
        observed over REST is news, and it claims the session."""
        outs: list[Out] = []
        for sid, status in busy.items():
            if sid in self.ended:
                continue
            st = self.state(sid, directory_of.get(sid))
            if st.run is None:
                user = _last_user_message(messages.get(sid) or [])
                if user and user not in st.closed_runs:
                    st.run = user
                    self.dirty = True
                    outs.append(Out(sid, {"type": "run.started", "data": {"trigger": "resume"}},
                                    run=user))
            if st.status != status:
                st.status = status
                outs.append(Out(sid, {"type": "progress.status", "data": {}, "subject": status},
                                run=st.run))
        return outs

    def _reconcile_new_asks(self, pending_p: dict[str, Any], pending_q: dict[str, Any]
                            ) -> list[Out]:
        """Asks raised while we were away."""
        outs: list[Out] = []
        for vid, a in list(pending_p.items()) + list(pending_q.items()):
            sid = a["sessionID"]
            if sid in self.ended:
                continue
            st = self.state(sid)
            if vid not in st.asks:
                t = "question.asked" if vid in pending_q else "permission.asked"
                outs += self._ask(st, t, a)
        return outs

    def _reconcile_gone(self, sid: str, st: SessionState, pending: Any, busy: dict[str, str],
                        messages: dict[str, list[Any]]) -> list[Out]:
        """In a directory that was read: asks that vanished (answered if one
        of ours was settling, else dismissed), a run that ended."""
        outs: list[Out] = []
        for vid, ask in list(st.asks.items()):
            if vid not in pending:
                del st.asks[vid]
                outs += self._resolve(st, ask, "answered" if ask.settling else "dismissed")
        if st.run is not None and sid not in busy:
            outs += self._close_run(st, terminal=_terminal(st.run, messages.get(sid)))
            st.status = None  # the next live status is news again
        return outs

    def needs_messages(self, busy: dict[str, str], queried: set[str | None]) -> list[str]:
        """Sessions whose recent messages reconcile needs: busy ones without
        an open run (to find the run), open runs now idle (to tell a finished
        run from one the server lost)."""
        need = [sid for sid in busy if (st := self.sessions.get(sid)) is None or st.run is None]
        for sid, st in self.sessions.items():
            if st.run is not None and sid not in busy and _inside(st, queried):
                need.append(sid)
        return list(dict.fromkeys(need))


def _pending(asks: list[Any]) -> dict[str, Any]:
    """``{vendor id: ask}`` of a REST ask listing (malformed entries skipped)."""
    return {a["id"]: a for a in asks if isinstance(a, dict)
            and isinstance(a.get("id"), str) and isinstance(a.get("sessionID"), str)}


def _inside(st: SessionState, queried: set[str | None]) -> bool:
    """The session's directory was read by this reconcile (``None``: the
    server's default instance)."""
    return st.directory in queried or (st.directory is None and None in queried)


def _info(m: Any) -> dict[str, Any]:
    if isinstance(m, dict) and isinstance(m.get("info"), dict):
        return m["info"]
    return m if isinstance(m, dict) else {}


def _created(info: dict[str, Any]) -> Any:
    t = _d(info.get("time"))
    c = t.get("created")
    return c if isinstance(c, (int, float)) and not isinstance(c, bool) else 0


def _last_user_message(messages: list[Any]) -> str | None:
    users = [_info(m) for m in messages if _info(m).get("role") == "user"
             and isinstance(_info(m).get("id"), str)]
    if not users:
        return None
    return max(users, key=_created)["id"]


def _terminal(run: str, messages: list[Any] | None) -> Emission:
    """How a run that ended while we were away ended: ``run.failed``
    ``interrupted`` when an assistant message of the run never completed
    and carries no error (the server died mid-step), else ``run.finished``
    (the live rule: the idle boundary is a finish)."""
    for m in messages or []:
        info = _info(m)
        if info.get("role") != "assistant" or info.get("parentID") != run:
            continue
        t = _d(info.get("time"))
        if "completed" not in t and not info.get("error"):
            return {"type": "run.failed", "data": {"reason": "interrupted"}}
    return {"type": "run.finished", "data": {}}
