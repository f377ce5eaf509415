"""Per-session state of a hook bridge run: the open run, the open tool
calls (pairing), the open asks, the steering queue. No I/O; the hub
(:mod:`.hub`) reads and changes it under the session's lock.
"""
from __future__ import annotations

import heapq
import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import trio

from bridges.core.capture import digest

from .answers import Decision

__all__ = ["ASKS_MAX", "ASKS_TOTAL_MAX", "Ask", "FORM_INPUT_MAX", "GONE_CODES", "GONE_MAX", "Instruction", "KEY_MAX", "QUEUE_MAX", "REQUESTED_MAX",
           "SESSIONS_MAX", "SESSION_ID_MAX", "PRINT_KEYS", "PRINT_KEY_MAX", "SessionState", "Sessions", "TOOLS_MAX",
           "bounded_key", "input_print", "reply_moment", "same_call", "same_print"]

GONE_MAX = 4096
"""Forgotten asks whose closing a session list remembers (:meth:`Sessions.why_gone`)."""
GONE_CODES = ("answered", "answered-oob", "dismissed", "timed-out", "closed")
"""Why an ask is no longer open (:attr:`Ask.closed_as`; ``closed``: not said):
answered from AEP, answered at the agent (``via: oob``), dismissed (the
agent moved on, its run or session ended, the daemon stopped), timed out."""
QUEUE_MAX = 20
"""Instructions queued per session (``control-steering-design.md``)."""
SESSIONS_MAX = 1024
"""Sessions kept at once; the least recently seen is forgotten first."""


def same_call(a: object, b: object) -> bool:
    """Whether two ``tool_input`` objects are of one call: every key they
    share holds the same value, and they share one at least (a later moment
    may carry more: Claude Code's ``AskUserQuestion`` ``PostToolUse`` adds
    ``answers``; Codex's ``PermissionRequest`` adds ``description``)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a == b
    shared = a.keys() & b.keys()
    return bool(shared) and all(digest(a[k]) == digest(b[k]) for k in shared)


#: Longest tool name or ``tool_use_id`` kept as it is; a longer one is kept
#: as its digest (what a session remembers of its tools stays small: a
#: client's 3.9 MB ids grew the daemon 3.8 MB a hook, a fourth outside
#: attack on issue 25; 256-character ids made a state entry ~200 KiB, the
#: tenth: 64, the same form in memory and in the state file).
KEY_MAX = 64

#: Longest hook ``session_id`` kept as it is; a longer one is the session
#: ``"#"`` + its digest (:meth:`.profile.HookProfile.session`): 1 MiB ids
#: were stamped past the relay's own envelope bound (4,096), refused
#: upstream (the tenth outside attack on issue 25).
SESSION_ID_MAX = 256

#: Tool calls of a run remembered for linking a ``PermissionRequest``.
REQUESTED_MAX = 64

#: Open tool calls a session remembers (a ``PreToolUse`` whose
#: ``PostToolUse`` never came); the oldest is forgotten past it.
TOOLS_MAX = 256

#: Open asks a session keeps; past it the oldest is dismissed (each held
#: the whole vendor moment: 8 asks of 4 MiB bodies took 800 MiB, the tenth
#: outside attack on issue 25).
ASKS_MAX = 32

#: Open asks a bridge keeps over all its sessions; past it the oldest is
#: dismissed.
ASKS_TOTAL_MAX = 1024

#: Largest form ``tool_input`` (JSON characters) an ask keeps for its reply
#: (Claude Code's ``AskUserQuestion`` answer echoes the input); a larger
#: form is not held (answered at the agent).
FORM_INPUT_MAX = 64 * 1024


def bounded_key(value: object, limit: int = KEY_MAX) -> str:
    """``value`` itself when a string of at most ``limit`` characters
    (:data:`KEY_MAX` unless said), else ``"#"`` + its digest (33
    characters; never equal to a short one's digest form of another)."""
    if isinstance(value, str) and len(value) <= limit:
        return value
    return "#" + digest(value)


#: Keys of a ``tool_input`` object printed one by one: the first
#: :data:`PRINT_KEYS` in sorted order, a key over :data:`PRINT_KEY_MAX`
#: characters as ``"#"`` + its digest; the rest are not printed. A session
#: keeps :data:`REQUESTED_MAX` prints and writes them to its state file:
#: per key digests of every key of a 200,000-key input made each moment's
#: state line megabytes (the ninth outside attack on issue 25); one digest
#: for a large input lost the pairing of a 16-key input with its 17-key
#: ``PermissionRequest`` (the tenth).
PRINT_KEYS = 16
PRINT_KEY_MAX = 64


def input_print(value: object) -> object:
    """What a session keeps of a ``tool_input`` to pair a later moment with
    it (:func:`same_print`): for an object, the digests of the values of its
    first :data:`PRINT_KEYS` keys in sorted order (keys bounded by
    :func:`bounded_key` at :data:`PRINT_KEY_MAX`), so inputs that differ in
    a key still compare on the keys they share; the digest of anything
    else; never the input itself. At most ~1.7 KB whatever the input."""
    if isinstance(value, dict):
        keys = heapq.nsmallest(PRINT_KEYS, (k for k in value if isinstance(k, str)))
        return {bounded_key(k, PRINT_KEY_MAX): digest(value[k]) for k in keys}
    return digest(value)


def _prints_match(kept: object, printed: object) -> bool:
    if isinstance(kept, dict) and isinstance(printed, dict):
        shared = kept.keys() & printed.keys()
        return bool(shared) and all(kept[k] == printed[k] for k in shared)
    return kept == printed


def same_print(kept: object, value: object) -> bool:
    """:func:`same_call` of the input :func:`input_print` kept and ``value``
    (printed the same way: a small object key by key, else whole)."""
    return _prints_match(kept, input_print(value))


def reply_moment(moment: dict[str, Any], *, form: bool) -> tuple[dict[str, Any], str | None]:
    """What an ask keeps of its vendor ``moment`` for the reply
    (``profile.reply`` reads ``hook_event_name``, and a Claude Code
    ``AskUserQuestion`` form answer echoes ``tool_input``): the event name,
    and for a ``form`` the ``tool_input`` as JSON text (``None`` when over
    :data:`FORM_INPUT_MAX`: too large to keep, the form is not held). Never
    the rest of the moment."""
    kept: dict[str, Any] = {}
    ev = moment.get("hook_event_name")
    if isinstance(ev, str) and len(ev) <= PRINT_KEY_MAX:
        kept["hook_event_name"] = ev
    if not form or "tool_input" not in moment:
        return kept, ""
    text = json.dumps(moment["tool_input"], separators=(",", ":"), ensure_ascii=False, default=str)
    return kept, text if len(text) <= FORM_INPUT_MAX else None


@dataclass(eq=False)
class Ask:
    """One ``attention.requested``: ``id`` (its event id, the command's
    subject), ``kind`` (``permission`` / ``form``), ``reply_to`` (what the
    vendor reply reads of the moment: :func:`reply_moment`; never the whole
    moment), ``event`` (the moment's event name), ``options`` or ``fields``
    (the mapper's, before the capture gate), the tool it is about (``tool``:
    its bounded name, ``call_id``: its bounded ``tool_use_id``, ``printed``:
    its :func:`input_print`), ``form_input`` (a form's ``tool_input``, JSON
    text), ``held`` (a hook waits for the answer here), ``gate`` (the
    ``PreToolUse`` gate), ``state`` (``open`` / ``answered`` / ``closed``),
    ``settling`` (the command id whose answer is being applied),
    ``decision`` and ``done`` (set once the held hook may answer); ``t0``:
    its moment's time, Unix ms; ``closed_as``: why it is no longer open, the
    ``code`` a late command is nacked with (:data:`GONE_CODES`)."""

    id: str
    session: str
    run: str | None
    kind: str
    reply_to: dict[str, Any]
    event: str = ""
    options: list[dict[str, Any]] | None = None
    fields: list[dict[str, Any]] | None = None
    tool: str | None = None
    call_id: str | None = None
    printed: object = None
    form_input: str | None = ""
    held: bool = False
    gate: bool = False
    #: when the hook that held it hung up: the trio time its hold would have
    #: ended (then, still unsettled, it times out: :meth:`.hub.HookHub.expire`)
    expires: float | None = None
    t0: int = 0
    state: str = "open"
    settling: str | None = None
    decision: Decision | None = None
    done: trio.Event = field(default_factory=trio.Event)
    closed_as: str | None = None

    @property
    def open(self) -> bool:
        return self.state == "open"

    def reply_moment(self) -> dict[str, Any]:
        """The moment ``profile.reply`` is given: :attr:`reply_to` and, for a
        form, its ``tool_input`` read back."""
        if not self.form_input:
            return dict(self.reply_to)
        return {**self.reply_to, "tool_input": json.loads(self.form_input)}

    def matches(self, moment: dict[str, Any], printed: object = None) -> bool:
        """Whether ``moment`` is about this ask's tool call: the same
        ``tool_use_id`` when both have one, else the same tool name and
        matching :func:`input_print` (``printed``: the moment's, made once
        by the caller for every open ask; made here when ``None``)."""
        call = moment.get("tool_use_id")
        if self.call_id and isinstance(call, str):
            return bounded_key(call) == self.call_id
        if self.tool is None or bounded_key(moment.get("tool_name")) != self.tool:
            return False
        if printed is None:
            printed = input_print(moment.get("tool_input"))
        return _prints_match(self.printed, printed)


@dataclass
class Instruction:
    """One queued steering instruction: the command id, its text, when queued
    (Unix ms)."""

    cmd_id: str
    text: str
    t0: int


@dataclass(eq=False)
class SessionState:
    """One vendor session: ``run`` (the open AEP run id) and its
    ``run_started`` event id and start time (``run_t0``, Unix ms), ``last_run`` (the run closed
    last: a late moment naming it does not reopen it); ``tools``
    (``call_id`` -> ``(tool.requested id, t0 in Unix ms)``, bounded keys) and ``requested``
    (``(tool name, tool_input print, tool.requested id)`` of the run: a
    ``PermissionRequest`` has no ``tool_use_id``); ``asks`` (event id -> :class:`Ask`);
    ``queue`` (steering); ``lock`` (one moment mapped at a time); ``last_at``
    (the last moment's time, Unix ms) and ``restored_at`` (when read back
    from the state file after a restart, until the session's next moment;
    :mod:`.runs`))."""

    id: str
    run: str | None = None
    run_started: str | None = None
    run_t0: int = 0
    last_run: str | None = None
    tools: dict[str, tuple[str, int]] = field(default_factory=dict)
    requested: list[tuple[str, object, str]] = field(default_factory=list)
    asks: dict[str, Ask] = field(default_factory=dict)
    queue: deque[Instruction] = field(default_factory=deque)
    lock: trio.Lock = field(default_factory=trio.Lock)
    ended: bool = False
    last_at: int = 0
    restored_at: int | None = None

    def requested_id(self, moment: dict[str, Any]) -> str | None:
        """The ``tool.requested`` id of the latest call ``moment`` is about."""
        name = bounded_key(moment.get("tool_name"))
        printed = input_print(moment.get("tool_input"))  # once, not per kept call
        for n, kept, ev_id in reversed(self.requested):
            if n == name and _prints_match(kept, printed):
                return ev_id
        return None

    def remember_tool(self, moment: dict[str, Any], event_id: str, at: int) -> None:
        """A ``tool.requested`` (event ``event_id`` at ``at``, Unix ms): its
        call id (bounded, :data:`TOOLS_MAX` open at most) and its name and
        input print (the last :data:`REQUESTED_MAX`)."""
        call = moment.get("tool_use_id")
        if isinstance(call, str):
            self.tools[bounded_key(call)] = (event_id, at)
            while len(self.tools) > TOOLS_MAX:
                del self.tools[next(iter(self.tools))]
        self.requested.append((bounded_key(moment.get("tool_name")),
                               input_print(moment.get("tool_input")), event_id))
        del self.requested[:-REQUESTED_MAX]

    def open_asks(self) -> list[Ask]:
        """The asks still open, oldest first."""
        return [a for a in self.asks.values() if a.open]

    def forget_closed(self) -> list[Ask]:
        """Drop the asks that are settled (a late command then finds none
        here: :meth:`Sessions.why_gone` says why); the asks dropped."""
        gone = [a for a in self.asks.values() if not a.open]
        for a in gone:
            del self.asks[a.id]
        return gone


class Sessions:
    """The run's sessions, least recently seen first, at most
    :data:`SESSIONS_MAX` (a forgotten session's queue is counted dropped
    by the caller), and why the asks they forgot are closed (the last
    :data:`GONE_MAX`: a late command is told why, :meth:`why_gone`)."""

    def __init__(self, limit: int = SESSIONS_MAX) -> None:
        self._by_id: OrderedDict[str, SessionState] = OrderedDict()
        self.limit = limit
        self._gone: OrderedDict[tuple[str, str], str] = OrderedDict()

    def _note_gone(self, asks: list[Ask]) -> None:
        for a in asks:
            self._gone[(a.session, a.id)] = a.closed_as or "closed"
            while len(self._gone) > GONE_MAX:
                self._gone.popitem(last=False)

    def forget_closed(self, st: SessionState) -> None:
        """:meth:`SessionState.forget_closed`, remembering why each was closed."""
        self._note_gone(st.forget_closed())

    def why_gone(self, ask_id: object, session: object) -> str | None:
        """Why the forgotten ask ``ask_id`` of ``session`` closed (its
        :attr:`Ask.closed_as`), or ``None`` when none such is remembered."""
        if not isinstance(ask_id, str) or not isinstance(session, str):
            return None
        return self._gone.get((session, ask_id))

    def get(self, sid: str) -> SessionState | None:
        """The session ``sid`` if it is known (never made here)."""
        return self._by_id.get(sid)

    def touch(self, sid: str) -> tuple[SessionState, SessionState | None]:
        """The session ``sid`` (made on first sight), and the one forgotten
        to make room (or ``None``)."""
        st = self._by_id.get(sid)
        if st is not None:
            self._by_id.move_to_end(sid)
            return st, None
        st = self._by_id[sid] = SessionState(sid)
        evicted = None
        if len(self._by_id) > self.limit:
            _, evicted = self._by_id.popitem(last=False)
            self._note_gone(list(evicted.asks.values()))
        return st, evicted

    def all(self) -> list[SessionState]:
        """Every known session (a copy of the list)."""
        return list(self._by_id.values())

    def drop(self, sid: str) -> None:
        """Forget ``sid`` (its session ended)."""
        st = self._by_id.pop(sid, None)
        if st is not None:
            self._note_gone(list(st.asks.values()))

    def find_ask(self, ask_id: object) -> Ask | None:
        """The ask whose ``attention.requested`` id is ``ask_id`` (a
        command's subject: untrusted), or ``None``."""
        if not isinstance(ask_id, str):
            return None
        for st in self._by_id.values():
            a = st.asks.get(ask_id)
            if a is not None:
                return a
        return None

    def __len__(self) -> int:
        return len(self._by_id)
