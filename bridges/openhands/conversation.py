"""One OpenHands conversation's receiver state (split from
:mod:`bridges.openhands.receiver` by issue 26): :class:`Conversation` (status,
the open run, the pending attention, the replay anchor, a ring of
:data:`SEEN_IDS` recent vendor ids; what of it is persisted and how it is
restored), :class:`Settling` (a respond in flight) and the vendor timestamps
(:func:`_parse_ts`). Pure: no I/O.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import trio

SEEN_IDS = 128
"""Recent vendor event ids remembered per conversation (the dedupe window:
the ``since`` overlap and live/replay interleaving are a handful of events)."""
STATE_VERSION = 1


def _parse_ts(value: Any) -> datetime | None:
    """A vendor timestamp as a comparable naive datetime (aware ones are
    converted to naive UTC), or ``None``. A frame's timestamp is compared
    again as the anchor, the held snapshot's and the last status's time:
    parsed once, then memoized (:func:`_parse_text`)."""
    if not isinstance(value, str) or not value:
        return None
    return _parse_text(value)


@functools.lru_cache(maxsize=256)
def _parse_text(value: str) -> datetime | None:
    """:func:`_parse_ts` of a non-empty string, memoized (a pure function of
    the text: equal by a property test; 256 recent timestamps, a fixed
    ~60 KiB at most, not per conversation)."""
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt


@dataclass
class Settling:
    """A ``control.attention.respond`` in flight: when the status leaves
    ``waiting_for_confirmation`` the answer and the resolution are emitted
    cause-linked to ``cmd_id``."""

    cmd_id: str
    answer: dict[str, Any]


@dataclass(slots=True)
class Conversation:
    """Per-conversation receiver state (bounded: a few scalars and a ring
    of :data:`SEEN_IDS` ids). Slotted: a thousand attached conversations
    carry no per-instance ``__dict__``."""

    id: str
    status: str | None = None
    status_ts: str | None = None
    run_n: int = 0
    run_id: str | None = None
    attention_id: str | None = None
    anchor: str | None = None
    started: bool = False
    ended: bool = False
    #: the recent vendor ids, oldest first (a plain dict as an ordered set:
    #: a third smaller than an ``OrderedDict`` when the ring is full)
    seen: dict[str, None] = field(default_factory=dict)
    #: the stamped ``run.started`` / ``attention.requested`` still open
    #: (re-announced after a daemon restart, :meth:`BridgeContext.reannounce`)
    run_envelope: dict[str, Any] | None = None
    attention_envelope: dict[str, Any] | None = None
    # runtime only
    reannounce_due: bool = False
    pending_snap: tuple[str | None, str, str | None] | None = None  # (vendor ts, status, envelope id)
    #: the newest persisted event id when the snapshot came (REST), "" when
    #: there is none, None when unknown: the held snapshot applies once the
    #: replay has delivered it (the replay is then past the snapshot)
    replay_marker: str | None = None
    marker_due: bool = False
    notes: dict[str, str] = field(default_factory=dict)  # pause/resume/interrupt -> cmd id
    settling: Settling | None = None
    attention_t0: float | None = None
    frames_in_conn: int = 0
    in_frame: bool = False  # handle_raw has a frame in hand
    frame_deadline: float | None = None  # set at the frame's first wait for channel room
    dirty: bool = False
    last_flush: float = 0.0
    scope: trio.CancelScope | None = None  # the current connection attempt's (its nursery's)
    #: the task ended or is being stopped (:meth:`Receiver._detach`)
    detached: bool = False
    #: set when the task ends; made only when :meth:`Receiver._detach` waits
    #: for it (an Event per idle conversation costs ~0.2 KiB)
    done: trio.Event | None = None
    #: the vendor time of the newest ``full_state`` snapshot the socket
    #: delivered (the connect snapshot, and the one the server publishes once
    #: a run's task is over): :meth:`run_wound_down`
    snap_ts: str | None = None
    #: made only while an approval waits for :meth:`run_wound_down`; set and
    #: dropped by the next snapshot or the end of the task (:meth:`wake`)
    wound: trio.Event | None = None
    snaps: int = 0  # snapshots the socket delivered (an approval's re-check counts them)

    def remember(self, eid: str) -> bool:
        """Record a vendor id; ``False`` when it was already seen."""
        if eid in self.seen:
            return False
        seen = self.seen
        seen[eid] = None
        while len(seen) > SEEN_IDS:
            del seen[next(iter(seen))]
        return True

    def advance_anchor(self, ts: str | None, tdt: datetime | None) -> None:
        """A persisted event stamped ``ts`` (parsed: ``tdt``) was handled: the
        ``since`` anchor moves to it unless it is older."""
        if tdt is not None:
            adt = _parse_ts(self.anchor)
            if adt is None or tdt >= adt:
                self.anchor = ts

    def snapshot_seen(self, ts: str | None) -> None:
        """A ``full_state`` snapshot stamped ``ts`` (vendor time) came over the
        socket: the newest one is kept and a waiting approval re-checks."""
        self.snaps += 1
        sdt = _parse_ts(ts)
        if sdt is not None:
            cur = _parse_ts(self.snap_ts)
            if cur is None or sdt > cur:
                self.snap_ts = ts
        self.wake()

    def wake(self) -> None:
        """Wake whatever waits on :attr:`wound` (a snapshot, a status change,
        the task's end)."""
        if self.wound is not None:
            self.wound.set()
            self.wound = None

    def run_wound_down(self) -> bool:
        """Whether the vendor's last run task is over as far as the socket
        shows: a snapshot at or after the last applied status fact. The real
        server flips the status (``waiting_for_confirmation``) inside its run
        task, then waits for its callbacks, clears the task and publishes a
        ``full_state`` snapshot; an approval posted before that is dropped
        by the vendor (``respond_to_confirmation`` takes the still-live task
        for "already running" and answers 200). A status fact replayed from
        before the connect snapshot is older than it (wound down)."""
        snap = _parse_ts(self.snap_ts)
        if snap is None:
            return False
        last = _parse_ts(self.status_ts)
        return last is None or snap >= last

    def persisted(self) -> dict[str, Any]:
        return {"v": STATE_VERSION, "id": self.id, "status": self.status, "status_ts": self.status_ts,
                "run_n": self.run_n, "run_id": self.run_id, "attention_id": self.attention_id,
                "anchor": self.anchor, "started": self.started, "ended": self.ended,
                "seen": list(self.seen)[-32:],
                "run_envelope": self.run_envelope if self.run_id else None,
                "attention_envelope": self.attention_envelope if self.attention_id else None}

    @classmethod
    def restore(cls, body: object, cid: str) -> "Conversation":
        c = cls(cid)
        if not isinstance(body, dict) or body.get("v") != STATE_VERSION or body.get("id") != cid:
            return c

        def s(k: str) -> str | None:
            v = body.get(k)
            return v if isinstance(v, str) and v else None
        c.status, c.status_ts, c.run_id = s("status"), s("status_ts"), s("run_id")
        c.attention_id, c.anchor = s("attention_id"), s("anchor")
        c.run_n = body["run_n"] if isinstance(body.get("run_n"), int) and body["run_n"] >= 0 else 0
        c.started, c.ended = body.get("started") is True, body.get("ended") is True
        for eid in body.get("seen") or []:
            if isinstance(eid, str):
                c.remember(eid)
        run_env, ask_env = body.get("run_envelope"), body.get("attention_envelope")
        if c.run_id and isinstance(run_env, dict) and run_env.get("run") == c.run_id:
            c.run_envelope = run_env
        if c.attention_id and isinstance(ask_env, dict) and ask_env.get("id") == c.attention_id:
            c.attention_envelope = ask_env
        c.reannounce_due = c.run_envelope is not None or c.attention_envelope is not None
        return c

    def open_envelopes(self) -> list[dict[str, Any]]:
        """What is still open, as stamped (see :attr:`run_envelope`)."""
        return [e for e in (self.run_envelope, self.attention_envelope) if e is not None]
