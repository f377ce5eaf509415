"""A hook bridge's runs (split from :mod:`.hub`): opening, adopting and
closing the run of a turn, and keeping what is open across a daemon
restart.

Runs per prompt (``shared/aep/docs/adapters.md``): a run opens at the
vendor's prompt moment (``UserPromptSubmit``; Codex's ``turn_id`` is the
run id, Claude Code's is synthesized), closes at its ``Stop`` (or
``StopFailure``), at the session's end (``run.cancelled``, ``session
ended``) or at the next prompt (the interrupt-drain rule, ``run.cancelled``,
``superseded by a new prompt``).

**Across a restart** (the SSE bridges' rule, :mod:`bridges.core.statefile`):
what a late moment of an open turn needs is kept in the bridge's state
document ``{AEP_STATE_DIR}/<bridge>/runs.json`` and its journal, one entry
per session with a run or a tool call open (:func:`entry`): the run id, its
``run.started`` id and start time, the open tool calls (``tool_use_id`` ->
``tool.requested`` id and time) and the recent calls' name and input print
(a ``PermissionRequest`` has no ``tool_use_id``), and the time of the
session's last moment. Written after each moment whose handling changed it
(one journal line), removed when nothing is open or the session ends.
:meth:`RunBook.restore` reads it back when the bridge starts, before the
spool is swept, so a ``Stop`` a shim spooled while the daemon was down (or
a live one after the restart) closes the run it opened, with its real
duration, and a late ``PostToolUse`` pairs with its ``tool.requested``.

A daemon stopping cleanly mid-turn closes no run: the agent's turn goes on
without it, its next moments are spooled by the shim (or arrive once the
daemon is back), and the run continues in the next daemon. A restored run
that never gets its ``Stop`` (the agent died meanwhile) closes at the
session's next prompt or its end as any stale run does, and, when its
session sends nothing at all, :data:`RESTORED_IDLE_S` after the later of
its last moment and the restart, ``run.failed{reason: "interrupted"}``
(:meth:`RunBook.sweep`; the SSE bridges' reason for a run the observer
lost): every run reaches one terminal (AEP-0002 §2 rule 5). Held asks are
not kept: a clean stop dismisses them (:meth:`.hub.HookHub.release`).

Counters: ``runs_restored`` (sessions read back at start),
``runs_interrupted`` (restored runs closed by the sweep),
``state_write_errors`` (the state file could not be written: logged once
by it; the bridge goes on without persistence).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Awaitable, Protocol

from bridges.core.bridge import BridgeContext, Emission, Envelope
from bridges.core.envelope import Ulids
from bridges.core.statefile import StateFile

from .mapping import elapsed_ms
from .profile import HookProfile, Moment
from .session import KEY_MAX, PRINT_KEY_MAX, PRINT_KEYS, Sessions, SessionState

__all__ = ["COUNTERS", "PERSIST_REQUESTED", "PERSIST_TOOLS", "RESTORED_IDLE_S", "RunBook",
           "STATE_NAME", "entry", "restore_entry",
           "state_file"]

STATE_NAME = "runs.json"
"""The state document's name under ``{AEP_STATE_DIR}/<bridge>/``."""
RESTORED_IDLE_S = 6 * 3600.0
"""A restored run whose session sent nothing for this long (seconds, from
the later of its last moment and the restart) is closed ``interrupted``."""
COUNTERS = ("runs_restored", "runs_interrupted", "state_write_errors")

PERSIST_TOOLS = 64
"""Open tool calls of a session written to its state entry (the newest)."""
PERSIST_REQUESTED = 16
"""Recent calls' prints of a session written to its state entry (the newest):
with :data:`PERSIST_TOOLS` and tool names/ids bounded at
:data:`~.session.KEY_MAX`, an entry is at most ~36 KiB (it was ~200 KiB:
256 ids of 256 characters and 64 prints, the tenth outside attack on issue
25), written at every moment."""

_ID_MAX = 128  # an event or run id kept from the state file (ours are 26-40 characters)


class _Emit(Protocol):
    def __call__(self, session: str, em: Emission, *, run: str | None = None,
                 cause: str | None = None, at: int | None = None) -> Awaitable[Envelope | None]: ...


def state_file(state_dir: Path | None, bridge: str) -> StateFile:
    """The bridge's state document (``None`` path: no persistence)."""
    return StateFile(None if state_dir is None else Path(state_dir) / bridge / STATE_NAME)


def entry(st: SessionState) -> dict[str, Any] | None:
    """What ``st`` keeps across a restart (module docstring): its newest
    :data:`PERSIST_TOOLS` open tools and :data:`PERSIST_REQUESTED` prints,
    names and ids in their bounded form (:func:`~.session.bounded_key`, as
    the lookups make them); ``None`` when it has no run and no tool call
    open."""
    if st.run is None and not st.tools:
        return None
    return {"run": st.run, "started": st.run_started, "t0": st.run_t0, "last_run": st.last_run,
            "at": st.last_at,
            "tools": {k: [v[0], v[1]] for k, v in list(st.tools.items())[-PERSIST_TOOLS:]},
            "requested": [[n, p, i] for n, p, i in st.requested[-PERSIST_REQUESTED:]]}


def _id(v: object) -> str | None:
    return v if isinstance(v, str) and 0 < len(v) <= _ID_MAX else None


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _print(v: object) -> bool:
    """An input print as :func:`~.session.input_print` makes it (digests)."""
    if isinstance(v, dict):
        return len(v) <= PRINT_KEYS and all(isinstance(k, str) and len(k) <= PRINT_KEY_MAX
                                            and isinstance(d, str) and len(d) <= 128
                                            for k, d in v.items())
    return isinstance(v, str) and len(v) <= 128


def restore_entry(st: SessionState, raw: object) -> bool:
    """Set ``st`` from a state entry (untrusted JSON: anything of the wrong
    shape is left out; at most :data:`PERSIST_TOOLS` tools and
    :data:`PERSIST_REQUESTED` calls, what :func:`entry` writes); whether it held anything open."""
    if not isinstance(raw, dict):
        return False
    st.run = _id(raw.get("run"))
    st.run_started = _id(raw.get("started")) if st.run is not None else None
    st.run_t0 = _int(raw.get("t0"))
    st.last_run = _id(raw.get("last_run"))
    st.last_at = _int(raw.get("at"))
    tools = raw.get("tools")
    if isinstance(tools, dict):
        for k, v in list(tools.items())[-PERSIST_TOOLS:]:
            if isinstance(k, str) and len(k) <= KEY_MAX and isinstance(v, list) \
                    and len(v) == 2 and _id(v[0]) is not None:
                st.tools[k] = (v[0], _int(v[1]))
    req = raw.get("requested")
    if isinstance(req, list):
        for item in req[-PERSIST_REQUESTED:]:
            if isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) \
                    and len(item[0]) <= KEY_MAX and _print(item[1]) and _id(item[2]):
                st.requested.append((item[0], item[1], item[2]))
    return st.run is not None or bool(st.tools)


class RunBook:
    """The runs of one hook bridge run and their state file (module
    docstring). ``emit``: the hub's stamping emit; ``idle_s``:
    :data:`RESTORED_IDLE_S` (tests shorten it)."""

    def __init__(self, profile: HookProfile, ctx: BridgeContext, sessions: Sessions,
                 emit: _Emit, state: StateFile, *, idle_s: float = RESTORED_IDLE_S) -> None:
        self.profile = profile
        self.ctx = ctx
        self.sessions = sessions
        self.emit = emit
        self.state = state
        self.idle_s = idle_s
        self._ids = Ulids()
        for c in COUNTERS:
            ctx.health.counters.setdefault(c, 0)

    # -- persistence ------------------------------------------------------------------
    def restore(self, now: int) -> int:
        """Read the state document into :attr:`sessions` (at start, before
        any moment); ``now``: the restart's time, Unix ms. Returns the
        sessions restored (counted ``runs_restored``)."""
        doc = self.state.load()
        sessions = doc.get("sessions") if isinstance(doc, dict) else None
        n = 0
        for sid, raw in (sessions.items() if isinstance(sessions, dict) else ()):
            if not isinstance(sid, str) or not sid:
                continue
            st, evicted = self.sessions.touch(sid)
            if evicted is not None:
                self.save(evicted, gone=True)
            if restore_entry(st, raw):
                st.restored_at = now
                n += 1
            else:
                self.sessions.drop(sid)
                self.save(st, gone=True)
        if n:
            self.ctx.health.count("runs_restored", n)
            self.ctx.log.info("%s: %d session(s) with an open run or tool call restored from %s",
                              self.profile.key, n, self.state.path)
        return n

    def save(self, st: SessionState, *, gone: bool = False) -> None:
        """Persist ``st``'s entry if it changed (one journal line; ``gone``:
        the session is forgotten). Never raises: a failure is counted
        ``state_write_errors`` and logged once by the state file."""
        if self.state.path is None:
            return
        errors = self.state.errors
        self.state.save_changes({st.id: None if gone else entry(st)})
        if self.state.errors != errors:
            self.ctx.health.count("state_write_errors")

    # -- runs ------------------------------------------------------------------------
    async def moment(self, st: SessionState, ev: str, m: Moment, at: int,
                     in_turn: frozenset[str] | set[str]) -> None:
        """Open, adopt or close the session's run before the moment's events
        (``in_turn``: the moments that only happen inside a turn)."""
        p = self.profile
        st.last_at, st.restored_at = at, None
        if ev in p.run_opens:
            await self.open(st, m, at)
        elif p.run_field and isinstance(m.get(p.run_field), str) and st.run is None \
                and m[p.run_field] != st.last_run and ev in in_turn:
            st.run = m[p.run_field]  # a turn seen mid-way (the daemon came up late)
            st.run_t0 = at
        if ev in p.session_ends and st.run is not None:
            await self.close(st, {"type": "run.cancelled",
                                  "data": {"by": "user", "reason": "session ended"}}, at)

    async def open(self, st: SessionState, m: Moment, at: int) -> None:
        p = self.profile
        rid = m.get(p.run_field) if p.run_field else None
        if st.run is not None and st.run == rid and st.run_started is None:
            return  # the turn was adopted mid-way (a moment before its prompt): it starts now
        if st.run is not None:  # the interrupt-drain rule: a stale run closes at the next prompt
            await self.close(st, {"type": "run.cancelled",
                                  "data": {"by": "user", "reason": "superseded by a new prompt"}},
                             at)
        st.run = rid if isinstance(rid, str) and rid else f"run_{self._ids()}"
        st.run_t0 = at

    async def close(self, st: SessionState, em: Emission, at: int) -> None:
        """Emit the run's terminal ``em`` (its ``duration_ms`` from the
        run's start) and forget the run's calls; nothing when none is open."""
        if st.run is None:
            return
        data = em.setdefault("data", {})
        data.setdefault("duration_ms", elapsed_ms(st.run_t0, at))
        await self.emit(st.id, em, run=st.run, cause=st.run_started, at=at)
        st.last_run, st.run, st.run_started = st.run, None, None
        st.tools.clear()
        st.requested.clear()

    async def sweep(self, now: int) -> int:
        """Close the restored runs whose session sent nothing for
        :attr:`idle_s` (``run.failed{reason: "interrupted"}``); ``now``:
        Unix ms. Returns how many were closed."""
        n = 0
        for st in self.sessions.all():
            if st.restored_at is None or st.run is None:
                continue
            if now - max(st.last_at, st.restored_at) < self.idle_s * 1000:
                continue
            async with st.lock:
                if st.restored_at is None or st.run is None:
                    continue  # a moment came meanwhile
                await self.close(st, {"type": "run.failed", "data": {"reason": "interrupted"}},
                                 now)
                st.restored_at = None
                st.tools.clear()
                self.save(st)
            self.ctx.health.count("runs_interrupted")
            n += 1
        return n
