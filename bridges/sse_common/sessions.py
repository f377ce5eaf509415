"""The SSE tracker's per-session state and what of it survives a daemon
restart (split from :mod:`bridges.sse_common.tracker` by issue 26; the
tracker re-exports :class:`Out` and :class:`Ask`): :class:`SessionState`
(the open run, the pending asks, the cancel note, the dedupe rings),
the items the tracker hands the receiver (:class:`Out`), and
:class:`SessionStore`, the tracker's persistent part: the JSON-shaped
:meth:`~SessionStore.snapshot` a restart reloads through
:meth:`~SessionStore.restore`, the incremental :meth:`~SessionStore.changes`
a save writes, and the envelopes re-announced after a restart. Pure: no
I/O, no clocks.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from bridges.core.bridge import Emission, keepable

from .mapping import _l


@dataclass(eq=False)
class Out:
    """One emission for the receiver to stamp, in order.

    ``cause``: a known id; ``cause_of``: an earlier :class:`Out` of the same
    batch whose envelope id is the cause (filled at emit time);
    ``envelope``: set by the receiver once stamped."""

    session: str
    emission: Emission
    run: str | None = None
    cause: str | None = None
    cause_of: "Out | None" = None
    envelope: dict[str, Any] | None = None

    @property
    def event_id(self) -> str | None:
        return self.envelope.get("id") if self.envelope else None

    def resolved_cause(self) -> str | None:
        if self.cause is not None:
            return self.cause
        return self.cause_of.event_id if self.cause_of is not None else None


@dataclass(eq=False)
class Ask:
    """A pending vendor ask (permission or question).

    ``surface``: which reply route answers it (``current``: the ask came as
    ``permission.asked``/``question.asked``; ``legacy``: the pinned
    ``permission.updated``, answered on ``/session/{id}/permissions/{id}``
    which carries no message); ``settling``: the id of the command whose
    reply is in flight, ``applied``: the answer it applies (recorded on
    ``attention.answered``)."""

    vendor_id: str
    session: str
    kind: str
    surface: str
    out: Out
    run: str | None = None
    call_id: str | None = None
    questions: list[Any] = field(default_factory=list)
    fields: list[dict[str, Any]] = field(default_factory=list)
    settling: str | None = None
    applied: dict[str, Any] | None = None

    @property
    def event_id(self) -> str | None:
        return self.out.event_id


@dataclass
class Cancel:
    command: str
    run: str


@dataclass(eq=False)
class SessionState:
    id: str
    directory: str | None = None
    started: bool = False
    run: str | None = None
    closed_runs: OrderedDict = field(default_factory=OrderedDict)
    status: str | None = None
    todos: list[Any] | None = None
    tools: dict[str, list[bool]] = field(default_factory=dict)  # callID -> [requested, terminal]
    asks: dict[str, Ask] = field(default_factory=dict)
    settled: OrderedDict = field(default_factory=OrderedDict)  # vendor ask ids already closed
    rejected: dict[str, str | None] = field(default_factory=dict)  # callID -> command id | None
    cancel: Cancel | None = None
    messages: OrderedDict = field(default_factory=OrderedDict)  # reduction keys seen
    parts: dict[str, str | None] = field(default_factory=dict)  # companion: callID -> last status
    #: the stamped ``run.started`` of the open run (re-announced after a restart)
    run_envelope: dict[str, Any] | None = None


CLOSED_RUNS_KEPT = 512
MESSAGE_KEYS_KEPT = 512


class SessionStore:
    """The persistent part of :class:`~bridges.sse_common.tracker.Tracker`
    (its base): the tracker owns the attributes below and :meth:`state`."""

    sessions: OrderedDict[str, SessionState]
    dirty: bool
    touched: set[str]
    #: the tracker's :meth:`Tracker.state <bridges.sse_common.tracker.Tracker.state>`
    state: Callable[[str, str | None], SessionState]

    def snapshot(self) -> dict[str, Any]:
        """The state a daemon restart must not lose (JSON-shaped): per
        session with an open run, a pending ask or a cancel note: the
        directory, the run, the asks with their ``attention.requested``
        envelope ids (the AEP subject of everything that follows), settling
        marks, the cancel note, and the recently settled/closed ids."""
        out: dict[str, Any] = {}
        for sid, st in self.sessions.items():
            entry = self._entry(st)
            if entry is not None:
                out[sid] = entry
        return {"version": 1, "sessions": out}

    def changes(self) -> dict[str, dict[str, Any] | None]:
        """The :meth:`snapshot` entries of the sessions touched since the
        last call (``None``: the session has no entry any more), and the
        touched set cleared: an incremental save costs what changed, not
        what is open (:meth:`bridges.core.statefile.StateFile.save_changes`)."""
        out: dict[str, dict[str, Any] | None] = {}
        for sid in self.touched:
            st = self.sessions.get(sid)
            out[sid] = self._entry(st) if st is not None else None
        self.touched.clear()
        return out

    @staticmethod
    def _entry(st: SessionState) -> dict[str, Any] | None:
        """One session's :meth:`snapshot` entry (``None``: nothing to keep)."""
        if st.run is None and not st.asks and st.cancel is None:
            return None
        return {
            "directory": st.directory, "run": st.run, "started": st.started,
            "closed_runs": list(st.closed_runs)[-32:],
            "settled": list(st.settled)[-32:],
            "cancel": [st.cancel.command, st.cancel.run] if st.cancel else None,
            "run_envelope": st.run_envelope if st.run else None,
            "asks": [{"vendor_id": a.vendor_id, "kind": a.kind, "surface": a.surface,
                      "event_id": a.event_id, "run": a.run, "call_id": a.call_id,
                      "questions": a.questions, "fields": a.fields,
                      "settling": a.settling, "applied": a.applied,
                      "envelope": keepable(a.out.envelope)
                      if a.out.envelope and "type" in a.out.envelope else None}
                     for a in st.asks.values() if a.event_id],
        }

    def restore(self, snap: object) -> int:
        """Load a :meth:`snapshot` (tolerant: anything malformed is skipped).
        Returns the number of sessions restored. Reconcile then settles them
        against the server as usual."""
        sessions = snap.get("sessions") if isinstance(snap, dict) else None
        n = 0
        for sid, d in (sessions.items() if isinstance(sessions, dict) else []):
            if not isinstance(sid, str) or not isinstance(d, dict):
                continue
            self._restore_session(self.state(sid, _str(d.get("directory"))), d)
            n += 1
        return n

    @staticmethod
    def _restore_session(st: SessionState, d: dict[str, Any]) -> None:
        st.started = bool(d.get("started"))
        if isinstance(d.get("run"), str):
            st.run = d["run"]
            if isinstance(d.get("run_envelope"), dict):
                st.run_envelope = d["run_envelope"]
        for r in d.get("closed_runs") or []:
            if isinstance(r, str):
                st.closed_runs[r] = None
        for v in d.get("settled") or []:
            if isinstance(v, str):
                st.settled[v] = None
        c = d.get("cancel")
        if isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c):
            st.cancel = Cancel(c[0], c[1])
        for a in d.get("asks") or []:
            ask = _restored_ask(st.id, a)
            if ask is not None:
                st.asks[ask.vendor_id] = ask

    def bind_run(self, sid: str, envelope: dict[str, Any]) -> None:
        """The receiver stamped the ``run.started`` of ``sid``'s open run."""
        st = self.sessions.get(sid)
        if st is not None and st.run is not None and envelope.get("run") == st.run:
            st.run_envelope = keepable(envelope)
            self.touched.add(sid)
            self.dirty = True

    def open_envelopes(self) -> list[dict[str, Any]]:
        """The stamped envelopes of every open run and pending ask (kept
        through :meth:`snapshot` / :meth:`restore`): what the receiver
        re-announces after a daemon restart
        (:meth:`bridges.core.bridge.BridgeContext.reannounce`)."""
        out: list[dict[str, Any]] = []
        for st in self.sessions.values():
            if st.run is not None and st.run_envelope is not None:
                out.append(st.run_envelope)
            out += [a.out.envelope for a in st.asks.values()
                    if a.out.envelope is not None and "type" in a.out.envelope]
        return out


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _restored_ask(sid: str, a: Any) -> Ask | None:
    """One persisted ask (:meth:`Tracker.snapshot`), or ``None`` when
    malformed; its ``attention.requested`` id is the envelope it keeps."""
    if not isinstance(a, dict) or not all(isinstance(a.get(k), str) for k in (
            "vendor_id", "kind", "surface", "event_id")):
        return None
    env = a.get("envelope")
    out = Out(sid, {"type": "attention.requested"},
              envelope=env if isinstance(env, dict) and env.get("id") == a["event_id"]
              else {"id": a["event_id"]})
    return Ask(a["vendor_id"], sid, a["kind"], a["surface"], out,
               run=_str(a.get("run")), call_id=_str(a.get("call_id")),
               questions=_l(a.get("questions")), fields=_l(a.get("fields")),
               settling=_str(a.get("settling")),
               applied=a["applied"] if isinstance(a.get("applied"), dict) else None)
