"""Per-session state of the Kimi web bridge (no I/O): cursors and dedupe,
the open run, tool-name pairing, the open asks, the control notes, and the
REST rebuild after ``resync_required``.

Design record: ``shared/aep/docs/adapter-kimi-code-design.md`` ("The kimi
web channel"). The pure per-frame policy is :mod:`bridges.kimi_web.mapping`;
this module adds what needs memory:

- **Dedupe by (session, epoch, seq)**: a non-volatile frame at or below the
  session's cursor in the same epoch is a duplicate (a replay overlap after a
  reconnect) and is dropped; a new epoch (the server restarted) starts over.
  Volatile frames reuse the last persisted ``seq`` in 2.1.0 and never emit,
  so they never move the cursor.
- **Runs** (primary): the vendor's own ``turn.started`` / ``turn.ended``;
  the run id is the turn's ``promptId`` (2.1.0; the abort route needs it),
  ``turn-<turnId>`` when absent. A turn that starts while another is open
  closes the old one ``run.cancelled`` first (nothing dangles).
- **Asks** (primary): ``attention.requested`` remembered by vendor id with
  its envelope id; answers and resolutions name that envelope id as
  ``subject`` (the pinned vendor id only when the ask was never seen). An
  answer is ``attention.answered`` then ``attention.resolved`` answered
  (cause: the answered event). When the turn ends, asks still open resolve
  ``dismissed`` BEFORE the run's terminal (2.1.0 sends the decision-less
  ``event.approval.resolved`` after ``turn.ended``; it is then dropped as
  already settled).
- **Control notes**: ``control.attention.respond`` in flight marks the ask
  (its outcome is ``via: control``, cause the command id);
  ``control.cancel`` marks the run (``run.cancelled`` ``by: control``, cause
  the command id, and the asks dismissed at the abort are cause-linked too).
- **Rebuild** (:meth:`Tracker.resync`): from ``GET /sessions/{sid}``, the
  pending approvals and questions and ``GET .../prompts``, what the stream
  missed is closed or opened: a run we hold that is no longer active ends
  by the session's ``last_turn_reason`` (``run.failed`` ``lost`` when the
  server restarted since: that reason may be an earlier turn's); an active prompt we never saw
  opens its run; asks no longer pending resolve ``dismissed``; pending asks
  we never saw are requested.

All state is bounded (tool names and settled ids are LRU rings) and
round-trips through :meth:`Tracker.dump` / :meth:`Tracker.load` so a
restarted daemon resumes by cursor with no duplicate and no dangling run.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from bridges.core.bridge import Emission, keepable
from bridges.core.posture import Posture

from . import mapping as M

TOOLS_KEPT = 256
SETTLED_KEPT = 256
GLOBAL = "__global__"
STATE_VERSION = 1


@dataclass
class Out:
    """One emission to stamp: ``session``, ``emission``, envelope keywords
    ``run`` / ``cause`` / ``time``; ``cause_prev``: the cause is the
    envelope id of the previous :class:`Out` of the same batch."""

    session: str
    emission: Emission
    run: str | None = None
    cause: str | None = None
    time: str | None = None
    cause_prev: bool = False
    #: set after stamping when the receiver must learn the envelope id
    #: (an ask's ``attention.requested``): ``(session, vendor id)``
    ask_key: tuple[str, str] | None = None


@dataclass
class Ask:
    vendor_id: str
    kind: str  # "permission" | "form"
    run: str | None = None
    event_id: str | None = None
    fields: list[dict[str, Any]] = field(default_factory=list)
    settling: str | None = None  # command id
    applied: dict[str, Any] | None = None
    #: the stamped ``attention.requested`` (re-announced after a restart)
    envelope: dict[str, Any] | None = None

    def dump(self) -> dict[str, Any]:
        return {"vendor_id": self.vendor_id, "kind": self.kind, "run": self.run,
                "event_id": self.event_id, "fields": self.fields, "envelope": self.envelope}


@dataclass
class SessionState:
    id: str
    epoch: str | None = None
    seq: int | None = None
    run: str | None = None
    turn: Any = None
    tools: OrderedDict = field(default_factory=OrderedDict)
    asks: dict[str, Ask] = field(default_factory=dict)
    settled: OrderedDict = field(default_factory=OrderedDict)
    cancel_note: str | None = None
    #: the stamped ``run.started`` of the open run (re-announced after a restart)
    run_envelope: dict[str, Any] | None = None

    @property
    def cursor(self) -> dict[str, Any] | None:
        if self.seq is None or self.epoch is None:
            return None
        return {"seq": self.seq, "epoch": self.epoch}

    def settle(self, vid: str) -> None:
        self.settled[vid] = None
        while len(self.settled) > SETTLED_KEPT:
            self.settled.popitem(last=False)

    def dump(self) -> dict[str, Any]:
        return {"id": self.id, "epoch": self.epoch, "seq": self.seq, "run": self.run,
                "turn": self.turn if isinstance(self.turn, (int, str)) else None,
                "run_envelope": self.run_envelope if self.run else None,
                "tools": list(self.tools.items())[-64:],
                "asks": [a.dump() for a in self.asks.values()],
                "settled": list(self.settled)[-64:]}

    @classmethod
    def load(cls, body: Any) -> "SessionState | None":
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not body["id"]:
            return None

        def s(k: str) -> str | None:
            v = body.get(k)
            return v if isinstance(v, str) and v else None
        st = cls(body["id"], epoch=s("epoch"), run=s("run"))
        st.seq = body["seq"] if isinstance(body.get("seq"), int) and not isinstance(body["seq"], bool) \
            else None
        st.turn = body.get("turn") if isinstance(body.get("turn"), (int, str)) else None
        if st.run and isinstance(body.get("run_envelope"), dict):
            st.run_envelope = body["run_envelope"]
        for item in body.get("tools") or []:
            if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
                st.tools[item[0]] = item[1]
        for a in body.get("asks") or []:
            if isinstance(a, dict) and isinstance(a.get("vendor_id"), str) and \
                    a.get("kind") in ("permission", "form"):
                st.asks[a["vendor_id"]] = Ask(
                    a["vendor_id"], a["kind"], run=a["run"] if isinstance(a.get("run"), str) else None,
                    event_id=a["event_id"] if isinstance(a.get("event_id"), str) else None,
                    fields=[f for f in a.get("fields") or [] if isinstance(f, dict)],
                    envelope=a["envelope"] if isinstance(a.get("envelope"), dict) else None)
        for vid in body.get("settled") or []:
            if isinstance(vid, str):
                st.settle(vid)
        return st


class Tracker:
    """See the module docstring. ``posture``: the mapping posture;
    ``answerable``: the control gate is open (permission asks offer the
    vendor's options and ``respond_via: ["control"]``)."""

    def __init__(self, posture: Posture, *, answerable: bool = False) -> None:
        self.posture = posture
        self.answerable = answerable
        self.sessions: dict[str, SessionState] = {}
        self.counters: dict[str, int] = {}
        self.dirty = False

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def session(self, sid: str) -> SessionState:
        st = self.sessions.get(sid)
        if st is None:
            st = self.sessions[sid] = SessionState(sid)
            self.dirty = True
        return st

    # -- persistence --------------------------------------------------------
    def dump(self) -> dict[str, Any]:
        return {"v": STATE_VERSION, "sessions": [s.dump() for s in self.sessions.values()]}

    def load(self, body: Any) -> None:
        if not isinstance(body, dict) or body.get("v") != STATE_VERSION:
            return
        for item in body.get("sessions") or []:
            st = SessionState.load(item)
            if st is not None:
                self.sessions[st.id] = st

    def cursors(self) -> dict[str, dict[str, Any]]:
        return {sid: c for sid, st in self.sessions.items() if (c := st.cursor) is not None}

    # -- the cursor -----------------------------------------------------------
    def accept(self, frame: dict[str, Any]) -> bool:
        """Dedupe by ``(session, epoch, seq)`` and advance the cursor; False
        for a duplicate. Frames without a usable position are accepted."""
        sid, seq, epoch = frame.get("session_id"), frame.get("seq"), frame.get("epoch")
        if frame.get("volatile") is True or not isinstance(sid, str) or sid == GLOBAL:
            return True
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(epoch, str):
            return True
        st = self.session(sid)
        if st.epoch == epoch and st.seq is not None and seq <= st.seq:
            self.count("frames_duplicate")
            return False
        st.epoch, st.seq = epoch, seq
        self.dirty = True
        return True

    def set_cursor(self, sid: str, cursor: Any) -> None:
        """A cursor the server acked (``{seq, epoch}``); ignored when not one."""
        if isinstance(cursor, dict) and isinstance(cursor.get("seq"), int) and \
                isinstance(cursor.get("epoch"), str):
            st = self.session(sid)
            if st.epoch != cursor["epoch"] or st.seq is None or cursor["seq"] > st.seq:
                st.epoch, st.seq = cursor["epoch"], cursor["seq"]
                self.dirty = True

    def set_cursor_if_none(self, sid: str, cursor: Any) -> None:
        """The ack's cursor for a session we hold no position for (a fresh
        subscription: the server's present). A held cursor is kept: the
        replay that precedes the ack advanced it already."""
        st = self.sessions.get(sid)
        if st is None or st.cursor is None:
            self.set_cursor(sid, cursor)

    # -- one event frame -----------------------------------------------------
    def frame(self, frame: dict[str, Any]) -> list[Out]:
        """The emissions of one accepted event frame (see the module
        docstring). Never raises on garbage inside a frame."""
        sid = frame.get("session_id")
        if not isinstance(sid, str) or not sid or sid == GLOBAL:
            return []
        if M.silent(frame):
            return []
        t = frame.get("type")
        ts = frame.get("timestamp") if isinstance(frame.get("timestamp"), str) else None
        if not self.posture.primary:
            return [Out(sid, e, time=ts) for e in M.map_frame(frame, self.posture)]
        st = self.session(sid)
        p = M.payload(frame)
        try:
            if t == "turn.started":
                return self._turn_started(st, p, ts)
            if t == "turn.ended":
                return self._turn_ended(st, p, ts)
            if t == "tool.call.started":
                call, name = p.get("toolCallId"), p.get("name")
                if isinstance(call, str) and isinstance(name, str) and name:
                    st.tools[call] = name
                    while len(st.tools) > TOOLS_KEPT:
                        st.tools.popitem(last=False)
                    self.dirty = True
            if t == "tool.result":
                name = st.tools.pop(p.get("toolCallId"), None) if isinstance(p.get("toolCallId"), str) \
                    else None
                if name is None:
                    self.count("tool_results_unpaired")
                    return [Out(sid, M.channel(t), run=st.run, time=ts)]
                return [Out(sid, M.tool_result(p, name, self.posture), run=st.run, time=ts)]
            if t in ("event.approval.requested", "event.question.requested"):
                return self._asked(st, t, p, ts)
            if t in ("event.approval.resolved", "event.question.answered", "event.question.dismissed"):
                return self._settled(st, t, p, ts)
        except Exception:  # a garbage payload inside a known type
            self.count("frames_unmappable")
            return [Out(sid, M.channel(t), run=st.run, time=ts)]
        return [Out(sid, e, run=st.run, time=ts) for e in M.map_frame(frame, self.posture)]

    def _turn_started(self, st: SessionState, p: dict[str, Any], ts: str | None) -> list[Out]:
        out: list[Out] = []
        run = p.get("promptId") if isinstance(p.get("promptId"), str) and p["promptId"] else None
        run = run or f"turn-{p.get('turnId', 'unknown')}"
        if st.run == run:
            return []  # the same turn again (a rebuild already opened it)
        if st.run is not None:
            out += self._close_run(st, {"type": "run.cancelled", "data": {}}, ts)
        st.run, st.turn = run, p.get("turnId")
        self.dirty = True
        out.append(Out(st.id, M.run_started(p, self.posture), run=run, time=ts))
        return out

    def _turn_ended(self, st: SessionState, p: dict[str, Any], ts: str | None) -> list[Out]:
        if st.run is None:
            self.count("turn_ended_without_run")
            return [Out(st.id, M.channel("turn.ended"), time=ts)]
        return self._close_run(st, M.run_ended(p), ts)

    def _close_run(self, st: SessionState, terminal: Emission, ts: str | None) -> list[Out]:
        run, note = st.run, st.cancel_note
        out: list[Out] = []
        for ask in [a for a in st.asks.values() if a.run in (run, None)]:
            out += self._resolve(st, ask, "dismissed", ts, cause=note if note else ask.event_id)
        cause = None
        if note and terminal["type"] == "run.cancelled":
            terminal = {"type": "run.cancelled", "data": {"by": "control"}}
            cause = note
        st.run, st.turn, st.cancel_note, st.run_envelope = None, None, None, None
        self.dirty = True
        out.append(Out(st.id, terminal, run=run, cause=cause, time=ts))
        return out

    def _asked(self, st: SessionState, t: str, p: dict[str, Any], ts: str | None) -> list[Out]:
        vid = p.get("approval_id") if t == "event.approval.requested" else p.get("question_id")
        emissions = M.map_frame({"type": t, "payload": p}, self.posture)
        if not isinstance(vid, str) or not vid or not emissions:
            return [Out(st.id, e, run=st.run, time=ts) for e in emissions]
        if vid in st.asks or vid in st.settled:
            self.count("asks_repeated")
            return []
        e = emissions[0]
        kind = e["data"].get("kind", "permission")
        if self.answerable and kind == "permission":
            e = M.answerable(e)
        st.asks[vid] = Ask(vid, kind, run=st.run, fields=list(e["data"].get("fields") or []))
        self.dirty = True
        return [Out(st.id, e, run=st.run, time=ts, ask_key=(st.id, vid))]

    def bind(self, key: tuple[str, str], envelope: dict[str, Any]) -> None:
        """The receiver reports the envelope of an ask it emitted (its id
        names the ask; the whole envelope is kept for :meth:`open_envelopes`
        when :func:`bridges.core.bridge.keepable`)."""
        st = self.sessions.get(key[0])
        ask = st.asks.get(key[1]) if st else None
        if ask is not None:
            ask.event_id = envelope["id"]
            ask.envelope = keepable(envelope)
            self.dirty = True

    def bind_run(self, sid: str, envelope: dict[str, Any]) -> None:
        """The receiver reports the ``run.started`` it emitted for ``sid``'s open run."""
        st = self.sessions.get(sid)
        if st is not None and st.run is not None and envelope.get("run") == st.run:
            st.run_envelope = keepable(envelope)
            self.dirty = True

    def open_envelopes(self) -> list[dict[str, Any]]:
        """The stamped envelopes of every open run and open ask (restored
        from the state file after a restart): what the receiver re-announces
        (:meth:`bridges.core.bridge.BridgeContext.reannounce`)."""
        out: list[dict[str, Any]] = []
        for st in self.sessions.values():
            if st.run is not None and st.run_envelope is not None:
                out.append(st.run_envelope)
            out += [a.envelope for a in st.asks.values() if a.envelope is not None]
        return out

    def _settled(self, st: SessionState, t: str, p: dict[str, Any], ts: str | None) -> list[Out]:
        vid = p.get("approval_id") if t == "event.approval.resolved" else p.get("question_id")
        emission = M.map_frame({"type": t, "payload": p}, self.posture)[0]
        ask = st.asks.get(vid) if isinstance(vid, str) else None
        if ask is None:
            if isinstance(vid, str) and vid in st.settled:
                self.count("asks_already_settled")
                return []  # dismissed at the turn's end already: one moment, one carrier
            self.count("asks_unknown")  # never saw the ask: the pinned shape as is
            out = [Out(st.id, emission, run=st.run, time=ts)]
            if emission["type"] == "attention.answered":
                resolved: Emission = {"type": "attention.resolved",
                                      "data": {"resolution": "answered"}}
                if isinstance(vid, str):
                    resolved["subject"] = vid
                out.append(Out(st.id, resolved, run=st.run, time=ts, cause_prev=True))
            return out
        if emission["type"] == "attention.resolved":
            return self._resolve(st, ask, "dismissed", ts, cause=ask.event_id)
        answer = dict(emission["data"]["answer"])
        if "values" in answer:
            answer["values"] = M.aep_values(p.get("answers"), ask.fields)
        return self._answer(st, ask, answer, ts)

    def _answer(self, st: SessionState, ask: Ask, answer: dict[str, Any], ts: str | None) -> list[Out]:
        ours = ask.settling is not None and (
            ask.applied is None or ask.applied.get("option") == answer.get("option"))
        subject = ask.event_id or ask.vendor_id
        e: Emission = {"type": "attention.answered",
                             "data": {"answer": ask.applied if ours and ask.applied else answer,
                                      "via": "control" if ours else "oob"},
                             "subject": subject}
        if ask.kind == "form":
            e["gating"] = {"form_fields": ask.fields}
        cause = ask.settling if ours else ask.event_id
        st.asks.pop(ask.vendor_id, None)
        st.settle(ask.vendor_id)
        self.dirty = True
        return [Out(st.id, e, run=ask.run or st.run, cause=cause, time=ts),
                Out(st.id, {"type": "attention.resolved", "data": {"resolution": "answered"},
                            "subject": subject}, run=ask.run or st.run, time=ts, cause_prev=True)]

    def _resolve(self, st: SessionState, ask: Ask, resolution: str, ts: str | None, *,
                 cause: str | None) -> list[Out]:
        st.asks.pop(ask.vendor_id, None)
        st.settle(ask.vendor_id)
        self.dirty = True
        return [Out(st.id, {"type": "attention.resolved", "data": {"resolution": resolution},
                            "subject": ask.event_id or ask.vendor_id},
                    run=ask.run or st.run, cause=cause, time=ts)]

    # -- control notes -----------------------------------------------------------
    def find_ask(self, sid: str, subject: Any) -> Ask | None:
        """The open ask a command's ``subject`` names (its envelope id, or
        the vendor id)."""
        st = self.sessions.get(sid)
        if st is None or not isinstance(subject, str):
            return None
        if subject in st.asks:
            return st.asks[subject]
        return next((a for a in st.asks.values() if a.event_id == subject), None)

    # -- rebuild -------------------------------------------------------------------
    def resync(self, sid: str, snap: dict[str, Any], ts: str | None = None, *,
               restarted: bool = False) -> list[Out]:
        """Rebuild from REST after ``resync_required`` (or a restart).
        ``snap``: ``{"session": GET /sessions/{sid} data, "approvals":
        [pending items], "questions": [pending items], "prompts": GET
        .../prompts data}``; a missing part is not reconciled.
        ``restarted``: the server restarted since the run was seen (and the
        replay by cursor did not end it): the run was cut off, it ends
        ``run.failed`` ``lost`` whatever ``last_turn_reason`` says. That
        field is the session's last turn that ENDED, with no prompt id; 2.1.0
        clears it at a turn's start with an asynchronous metadata write (and
        the turn's own records), which a SIGKILL can lose, so after the
        restart it can still say ``completed`` for the turn BEFORE the cut one."""
        self.count("resyncs")
        if not self.posture.primary:
            return []
        st = self.session(sid)
        out: list[Out] = []
        prompts = snap.get("prompts")
        session = M.obj(snap.get("session"))
        if isinstance(prompts, dict):
            active = M.obj(prompts.get("active"))
            active_id = active["prompt_id"] if isinstance(active.get("prompt_id"), str) else None
            if st.run is not None and st.run != active_id:
                reason = None if restarted else session.get("last_turn_reason")
                terminal = M.run_ended({"reason": reason}) if isinstance(reason, str) and reason \
                    else {"type": "run.failed", "data": {"reason": "lost"}}
                out += self._close_run(st, terminal, ts)
            if active_id and st.run is None:
                st.run = active_id
                self.dirty = True
                out.append(Out(sid, {"type": "run.started", "data": {}}, run=active_id, time=ts))
        for key, t, idk in (("approvals", "event.approval.requested", "approval_id"),
                            ("questions", "event.question.requested", "question_id")):
            items = snap.get(key)
            if not isinstance(items, list):
                continue
            pending = {i.get(idk) for i in items if isinstance(i, dict)}
            kind = "permission" if key == "approvals" else "form"
            for ask in [a for a in st.asks.values() if a.kind == kind and a.vendor_id not in pending]:
                out += self._resolve(st, ask, "dismissed", ts, cause=ask.event_id)
            for item in items:
                if isinstance(item, dict) and item.get(idk) not in st.asks:
                    out += self._asked(st, t, item, ts)
        return out

    def forget(self, sid: str) -> None:
        """Drop ``sid``'s state without emitting (an evicted session with
        nothing open; a later frame starts it afresh)."""
        if self.sessions.pop(sid, None) is not None:
            self.dirty = True

    def gone(self, sid: str, ts: str | None = None) -> list[Out]:
        """The session no longer exists on the server (40401): its asks are
        dismissed, its run ends ``run.cancelled``, the state is forgotten."""
        st = self.sessions.pop(sid, None)
        self.dirty = True
        if st is None or not self.posture.primary:
            return []
        out: list[Out] = []
        if st.run is not None:
            out += self._close_run(st, {"type": "run.cancelled", "data": {}}, ts)
        for ask in list(st.asks.values()):
            out += self._resolve(st, ask, "dismissed", ts, cause=ask.event_id)
        return out
