"""The tee's runtime state, pure: lines -> moments -> emissions with identity.

- :func:`parse_line`: one newline-framed line (bytes, no ``\\n``) -> the
  JSON-RPC frames it carries (a batch array gives several), or ``None``.
- :class:`Joiner`: request <-> response per **(direction, id)**. Each
  direction has its own id space (the client numbers its requests from 0,
  so does the agent: ``initialize`` and the first
  ``session/request_permission`` both carry id 0); a response travelling
  in one direction answers the request that travelled the other way.
- :class:`Story`: one tee's identity state over the joiner: the session of
  each moment, the run (the ``session/prompt`` turn, id qualified by the
  tee's instance id so two tees or a restarted tee never re-mint a run id),
  remembered tool titles, the ``attention.resolved`` follow-up of an
  answered permission, and the close-out when the agent exits.

No I/O, no clocks; memory bounded (pending requests and remembered tools
are capped, oldest evicted and counted). Design record:
``shared/aep/docs/bridge-acp-design.md`` ("Id joins and identity").
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bridges.core.aep import check_json

from .mapping import Emission, Posture, fallback, map_moment, map_update, resolution, session_of
from .wire import AGENT, CLIENT  # a line the agent sent / the client (editor) sent

DIRECTIONS = (CLIENT, AGENT)
MAX_ID = 512
"""The longest JSON-RPC id and ACP ``sessionId`` (characters) a story keeps:
a frame with a longer one is ``malformed`` (ids are kept per pending
request, run and session: their length bounds what a tee costs)."""
MAX_TITLE = 1024
"""Characters of a tool title remembered for its later updates."""
MAX_BATCH = 1024
"""Most members of one JSON-RPC batch array a line may carry: a longer one
is one ``malformed`` line, never walked (six 16 MiB lines of ``[{},...]``,
5.6 million members each, held the daemon's loop 1.6-2.2 s a line: an
eleventh outside attack on issue 25, finding 3). Real agents send one
frame a line."""


def _short_id(rpc_id: Any) -> bool:
    if rpc_id is None or isinstance(rpc_id, bool):
        return True
    if isinstance(rpc_id, str):
        return len(rpc_id) <= MAX_ID
    return isinstance(rpc_id, (int, float)) and len(repr(rpc_id)) <= 64


def other(direction: str) -> str:
    return AGENT if direction == CLIENT else CLIENT


def parse_line(line: bytes) -> list[dict[str, Any]] | None:
    """The JSON-RPC frames of one line, or ``None`` when it holds none.

    Tolerates what real agents put before a frame on stdout (terminal
    escape sequences, a stray banner): when the line does not parse, it is
    parsed again from its first ``{``. Invalid UTF-8 is replaced (the
    pass-through itself never decodes anything). A JSON-RPC batch array
    yields its object members. A line past the bounds (:func:`refused`)
    holds none."""
    frames = _frames(line)
    return None if frames is REFUSED else frames


REFUSED: list[dict[str, Any]] = []
""":func:`_frames` of a line past the bounds (not a list of frames: a marker)."""


def _frames(line: bytes) -> list[dict[str, Any]] | None:
    """:func:`parse_line`, but :data:`REFUSED` for a line past the bounds:
    over the JSON bounds of :func:`bridges.core.aep.check_json` (arrays
    and objects, values, floats: not parsed) or a batch array of over
    :data:`MAX_BATCH` members (not walked)."""
    try:
        check_json(line)  # before the parse: its cost is bounded by these counts
    except ValueError:
        return REFUSED
    text = line.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        start = text.find("{")
        if start <= 0:
            return None
        try:
            obj = json.loads(text[start:])
        except (ValueError, RecursionError):
            return None
    if isinstance(obj, dict):
        return [obj]
    if isinstance(obj, list):
        if len(obj) > MAX_BATCH:
            return REFUSED
        frames = [f for f in obj if isinstance(f, dict)]
        return frames or None
    return None


def id_key(rpc_id: Any) -> str:
    """A hashable, type-preserving key for a JSON-RPC id (``1`` and ``"1"``
    are different ids)."""
    try:
        return json.dumps(rpc_id, sort_keys=True)
    except (TypeError, ValueError):
        return repr(rpc_id)


class Joiner:
    """Joins responses to their requests per (direction, id).

    :meth:`feed` turns one frame into a moment (``None`` for a frame that
    is no JSON-RPC message): requests are remembered under
    ``(direction, id)``; a response on ``direction`` takes the request
    pending from the other direction and carries its ``method`` and
    ``params`` (as ``request``); a response nobody asked for is a moment
    with ``method: None`` and ``unmatched: True``. At most ``max_pending``
    requests are remembered, whose lines came to at most ``max_pending_bytes``
    (the ``size`` given to :meth:`feed`; oldest evicted, counted in
    ``evicted``): a tee's unanswered requests cost bounded memory."""

    def __init__(self, max_pending: int = 4096, max_pending_bytes: int = 8 << 20) -> None:
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.pending: OrderedDict[tuple[str, str], tuple[str, dict[str, Any], int]] = OrderedDict()
        self.pending_bytes = 0
        self.evicted = 0

    def feed(self, direction: str, frame: dict[str, Any], size: int = 0) -> dict[str, Any] | None:
        method = frame.get("method")
        has_id = "id" in frame and frame["id"] is not None
        if isinstance(method, str):
            raw = frame.get("params")
            params: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if not has_id:
                return {"kind": "notification", "method": method, "params": params,
                        "direction": direction}
            key = (direction, id_key(frame["id"]))
            old = self.pending.pop(key, None)
            if old is not None:
                self.pending_bytes -= old[2]
            self.pending[key] = (method, params, size)
            self.pending_bytes += size
            while len(self.pending) > self.max_pending or (
                    self.pending_bytes > self.max_pending_bytes and len(self.pending) > 1):
                self.pending_bytes -= self.pending.popitem(last=False)[1][2]
                self.evicted += 1
            return {"kind": "request", "method": method, "params": params, "id": frame["id"],
                    "direction": direction}
        if "id" in frame and ("result" in frame or "error" in frame):
            moment: dict[str, Any] = {"kind": "response", "id": frame.get("id"),
                                      "direction": direction}
            if "error" in frame:
                moment["error"] = frame["error"] if isinstance(frame["error"], dict) else {}
            else:
                moment["result"] = frame.get("result")
            asked = self.pending.pop((other(direction), id_key(frame.get("id"))), None)
            if asked is not None:
                self.pending_bytes -= asked[2]
            if asked is None:
                moment.update(method=None, unmatched=True)
            else:
                moment.update(method=asked[0], request=asked[1])
            return moment
        return None


class Out(NamedTuple):
    """One emission with its identity: stamp it for ``session`` (and
    ``run`` when not ``None``) after :meth:`Story.envelope`, then tell the
    story with :meth:`Story.stamped`. ``attention``: ``(step, key)`` for
    the permission lifecycle (``open`` / ``answer`` / ``resolve``; ``key``
    the request's JSON-RPC id), which needs the stamped ids (AEP-0002 §7)."""

    session: str
    emission: Emission
    run: str | None = None
    attention: tuple[str, str] | None = None


@dataclass
class Counters:
    lines: int = 0
    frames: int = 0
    malformed: int = 0
    refused: int = 0
    """Lines past the bounds (:func:`_frames`), each counted ``malformed`` too."""
    unmatched: int = 0
    mapping_errors: int = 0


@dataclass
class Story:
    """One tee's state (see the module docstring).

    ``tee``: the tee's instance id (unique per tee process: a ULID it mints
    at start); it qualifies run ids and names the tee's own connection
    session, where connection-level moments (``initialize``,
    ``authenticate``, unmatched responses) ride. ``posture``: mapping
    posture. Feed each observed line with :meth:`feed`; call :meth:`close`
    when the agent exits."""

    tee: str
    posture: Posture = field(default_factory=Posture)
    max_tools: int = 4096
    joiner: Joiner = field(default_factory=Joiner)
    counters: Counters = field(default_factory=Counters)
    runs: dict[str, str] = field(default_factory=dict)
    titles: OrderedDict[str, str] = field(default_factory=OrderedDict)
    sessions: OrderedDict[str, None] = field(default_factory=OrderedDict)
    ended: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """Sessions already ended (``session/close``): never ended twice."""
    asks: OrderedDict[str, list[Any]] = field(default_factory=OrderedDict)
    """Open permission asks: key -> ``[session, requested id, last id]``."""

    @property
    def connection_session(self) -> str:
        return f"tee-{self.tee}"

    def run_id(self, rpc_id: Any) -> str:
        """``{tee}.{rpc id}``: the prompt request's real wire id, qualified."""
        rid = rpc_id if isinstance(rpc_id, str) else id_key(rpc_id)
        return f"{self.tee}.{rid}"

    def feed(self, direction: str, line: bytes) -> list[Out]:
        """Every emission one observed line yields (``[]`` for a line that
        carries no JSON-RPC frame: counted ``malformed``, once a line; one
        past the bounds is counted ``refused`` too). Never raises."""
        self.counters.lines += 1
        frames = _frames(line)
        if not frames:  # None, or REFUSED
            self.counters.malformed += 1
            if frames is REFUSED:
                self.counters.refused += 1
            return []
        out: list[Out] = []
        for frame in frames:
            self.counters.frames += 1
            if not _short_id(frame.get("id")):
                self.counters.malformed += 1
                continue
            try:
                moment = self.joiner.feed(direction, frame, len(line))
                if moment is None or len(session_of(moment) or "") > MAX_ID:
                    self.counters.malformed += 1
                    continue
                out.extend(self.moment(moment))
            except Exception:  # noqa: BLE001 -- a mapping bug costs one frame, never the tee
                self.counters.mapping_errors += 1
        return out

    def moment(self, m: dict[str, Any]) -> list[Out]:
        """The emissions of one joined moment, with session and run."""
        if m.get("unmatched"):
            self.counters.unmatched += 1
            where = session_of(m) or self.connection_session
            data = {"error": True} if "error" in m else {}
            return [Out(where, fallback("rpc/unmatched", data), self.runs.get(where))]
        session = session_of(m)
        method = m.get("method")
        if m["kind"] == "notification" and method == "session/update":
            update = m["params"].get("update") if isinstance(m["params"].get("update"), dict) else {}
            emissions = self._tool_update(update)
        else:
            emissions = map_moment(m, self.posture)
            follow = resolution(m)
            if follow is not None:
                emissions.append(follow)
        if session is None:
            return [Out(self.connection_session, e) for e in emissions]
        self._seen(session)
        if method == "session/request_permission":
            key = id_key(m.get("id"))
            if m["kind"] == "request":
                self.asks[key] = [session, None, None]
                while len(self.asks) > self.max_tools:
                    self.asks.popitem(last=False)
                return [Out(session, e, self.runs.get(session), ("open", key)) for e in emissions]
            if m["kind"] == "response":
                return [Out(session, e, self.runs.get(session),
                            ("resolve" if e["type"] == "attention.resolved" else "answer", key))
                        for e in emissions]
        if m["kind"] == "request" and method == "session/prompt":
            self.runs[session] = self.run_id(m.get("id"))
            return [Out(session, e, self.runs[session]) for e in emissions]
        run = self.runs.get(session)
        if m["kind"] == "response" and method == "session/prompt":
            if run is not None and run == self.run_id(m.get("id")):
                del self.runs[session]
            else:
                run = self.run_id(m.get("id"))
        if method in ("session/close", "session/delete") and m["kind"] == "request":
            if session in self.ended:
                return []
            self.runs.pop(session, None)
            self.sessions.pop(session, None)
            self.ended[session] = None
            while len(self.ended) > self.max_tools:
                self.ended.popitem(last=False)
            return self._dismiss(session) + [Out(session, e, run) for e in emissions]
        return [Out(session, e, run) for e in emissions]

    # -- the attention lifecycle needs the stamped ids (AEP-0002 §7.1) ---------
    def envelope(self, o: Out) -> tuple[Emission, dict[str, Any]]:
        """The emission and envelope keywords (``run``, ``cause``) to stamp
        ``o`` with. A lifecycle event after ``attention.requested`` gets
        ``subject`` = that request's event id and ``cause`` = its immediate
        predecessor (AEP-0002 §7 rule 1); a request this story never saw
        keeps the tool call id as subject."""
        env: dict[str, Any] = {"run": o.run} if o.run is not None else {}
        if o.attention is None or o.attention[0] == "open":
            return o.emission, env
        ask = self.asks.get(o.attention[1])
        if ask is None or ask[1] is None:
            return o.emission, env
        em = dict(o.emission)
        em["subject"] = ask[1]
        env["cause"] = ask[2]
        return em, env

    def stamped(self, o: Out, event: dict[str, Any]) -> None:
        """Record the stamped envelope of ``o`` (its ``id``)."""
        if o.attention is None:
            return
        step, key = o.attention
        if step == "open" and key in self.asks:
            self.asks[key][1:] = [event.get("id"), event.get("id")]
        elif step == "answer" and key in self.asks:
            self.asks[key][2] = event.get("id")
        elif step == "resolve":
            self.asks.pop(key, None)

    def _dismiss(self, session: str) -> list[Out]:
        """``attention.resolved`` (dismissed) for every ask of ``session``
        still open: a session never ends with one pending (AEP-0002 §7 rule 2)."""
        return [Out(session, {"type": "attention.resolved", "data": {"resolution": "dismissed"}},
                    self.runs.get(session), ("resolve", key))
                for key, ask in list(self.asks.items()) if ask[0] == session]

    def _tool_update(self, update: dict[str, Any]) -> list[Emission]:
        call_id = update.get("toolCallId") if isinstance(update.get("toolCallId"), str) else None
        title = update.get("title") if isinstance(update.get("title"), str) else None
        if call_id and title and len(call_id) <= MAX_ID:
            self.titles[call_id] = title[:MAX_TITLE]
            self.titles.move_to_end(call_id)
            while len(self.titles) > self.max_tools:
                self.titles.popitem(last=False)
        remembered = self.titles.get(call_id) if call_id else None
        if call_id and update.get("status") in ("completed", "failed"):
            self.titles.pop(call_id, None)
        return map_update(update, self.posture, title=remembered)

    def _seen(self, session: str) -> None:
        if session in self.ended:
            return
        self.sessions[session] = None
        self.sessions.move_to_end(session)
        while len(self.sessions) > self.max_tools:
            self.sessions.popitem(last=False)

    def close(self, exit_status: int | None) -> list[Out]:
        """The agent exited (``exit_status``: the tee's status, 128+N for a
        signal; ``None``: unknown). Every ask still open is dismissed,
        every turn still open fails (reason
        ``agent_exited``) and every session the agent served ends
        (``normal`` for status 0, ``killed`` for a signal, ``error``
        otherwise): the process that held them is gone."""
        out = [o for s in self.sessions for o in self._dismiss(s)]
        out += [Out(s, {"type": "run.failed", "data": {"reason": "agent_exited"}}, run)
                for s, run in self.runs.items()]
        reason = ("normal" if exit_status == 0 else
                  "killed" if exit_status is not None and exit_status > 128 else "error")
        out += [Out(s, {"type": "session.ended", "data": {"reason": reason}})
                for s in self.sessions]
        self.runs.clear()
        self.sessions.clear()
        return out
