"""The embedded AEP relay: ingest, attr-match fan-out, bounded replay, token
auth, command routing, and the roster (AEP-0003, AEP-0004 §4; the reference
relay's frozen ceiling, ``docs/relay.md``).

Transport-free: :mod:`supervisor.relay.app` is the ASGI face (HTTP POST,
SSE, WebSocket) and feeds this module; the fleet's own bridges attach
in-process through :meth:`Relay.attach_emitter`, which is the same
:class:`Connection` family a remote WebSocket emitter gets, so routing,
claims and refusals are one code path.

Shapes:

- Every consumer connection owns an :class:`Outlet`: a bounded outbound
  queue the fan-out offers to without ever blocking (AEP-0003 §8.4). Past
  ``queue_soft_bytes`` queued, ``debug``/``info`` events are dropped and
  counted; a ``notice``+ event that would pass ``queue_hard_bytes`` first
  evicts queued ``debug``/``info`` and, if that is not enough, terminates the
  stream (SSE: end; WS: ``closing`` frame then close 1013) so the consumer
  resumes exactly. ``notice``+ is never dropped silently.
- Each event is serialized once at ingest (compact JSON) and rendered once
  per ``(event, capture ceiling)`` per fan-out; the bytes are shared by
  every subscriber that receives them.
- Replay is pulled by the connection's writer chunk by chunk (never
  materialized whole): a subscription registers for live delivery and
  records the admission counter at that instant, replay serves buffered
  entries admitted up to it, live serves the rest; no gap, no duplicate.
"""
from __future__ import annotations

import hmac
import json
import logging
import re
import time
import urllib.parse
from collections import OrderedDict, deque
from typing import Any, Awaitable, Callable, Iterable

import trio

from .attrmatch import CAPTURE_RANK, CAPTURES, SEVERITY_RANK, Filter, InvalidFilter
from .buffer import BufKey, Entry, Position, SessionBuffers
from .capcheck import exceeds as capture_exceeds
from .envelope import AEP_VERSION, InvalidEvent, encode, is_command_type, is_foreign, validate

log = logging.getLogger("aep.relay")

MiB = 1 << 20
NOTICE = SEVERITY_RANK["notice"]
ROLES = ("emitter", "consumer", "both")
RELAY_AGENT = "aep-bridges-relay"


class RelayClosed(RuntimeError):
    """The relay (or this in-process connection) is closed; nothing was ingested."""


class CommandRefused(Exception):
    """A command sent on an in-process connection was refused by the relay
    (AEP-0004 §4.2 codes: ``unauthorized``, ``unsupported``, ``ambiguous``,
    ``no-route``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


# -- JSON ---------------------------------------------------------------------

def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def loads(text: str | bytes) -> Any:
    """Strict JSON: ``NaN``/``Infinity`` refused. Raises ``ValueError`` (incl.
    ``RecursionError`` for absurd nesting, re-raised as ``ValueError``)."""
    try:
        return json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON. Strings with lone surrogates (legal in JSON text,
    not in UTF-8) fall back to ``\\u`` escapes. Raises ``TypeError`` /
    ``ValueError`` for values JSON cannot carry."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":"),
                          allow_nan=False).encode("ascii")


def _sse_safe(s: str) -> bool:
    return "\n" not in s and "\r" not in s and "\0" not in s


def _comment_safe(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A").replace("\0", "%00")


def frame_text(obj: dict[str, Any]) -> str:
    return dumps(obj).decode("utf-8")


# -- rendered views -------------------------------------------------------------

class View:
    """One event rendered at one capture ceiling: ``raw`` (compact JSON bytes),
    ``sse()`` (the whole SSE message, AEP-0003 §3.3.2) and ``text()`` (the WS
    frame); each computed once and shared by every subscriber."""

    __slots__ = ("entry", "raw", "_sse", "_text")

    def __init__(self, entry: Entry, raw: bytes) -> None:
        self.entry = entry
        self.raw = raw
        self._sse: bytes | None = None
        self._text: str | None = None

    def sse(self) -> bytes:
        if self._sse is None:
            e = self.entry
            parts = [b"event: ", e.attrs["type"].encode(), b"\ndata: ", self.raw, b"\n"]
            session = e.attrs.get("session")
            # agent-scoped and seq-less events carry no id: they are not
            # resumable positions; a session name that would break SSE
            # framing is never written into a field
            if e.pos is not None and isinstance(session, str) and _sse_safe(session):
                parts.append(f"id: {session}:{e.pos[0]}:{e.pos[1]}\n".encode())
            parts.append(b"\n")
            self._sse = b"".join(parts)
        return self._sse

    def text(self) -> str:
        if self._text is None:
            self._text = self.raw.decode("utf-8")
        return self._text


# -- outlets (one per consumer connection) ----------------------------------------

_EV, _FRAME, _REPLAY, _END = 0, 1, 2, 3
OPEN, FINISHING, TERMINATED, CLOSED = "open", "finishing", "terminated", "closed"


class Outlet:
    """The bounded outbound queue of one SSE stream or one WebSocket (§8.4).

    The fan-out calls :meth:`offer_event` (never blocks); the connection's
    writer task calls :meth:`next_batch`. ``abort`` (set by the ASGI layer
    when the server provides one) closes the underlying socket: the only way
    to shed a consumer whose writer is stuck in a send to a peer that
    stopped reading."""

    def __init__(self, relay: Relay, kind: str) -> None:
        self.relay = relay
        self.kind = kind  # "sse" | "ws"
        self.state = OPEN
        self.in_send = False
        self.abort: Callable[[], None] | None = None
        self._killed = False
        self.subs: list[Subscriber] = []
        self.dropped = 0
        #: ws only: sub id -> session -> last delivered (epoch, seq)
        self.delivered: dict[Any, dict[str, Position]] = {}
        self._q: deque[tuple[int, Any, int, int, Any]] = deque()
        self._bytes = 0
        self._wake = trio.Event()
        self.done = trio.Event()

    # producer side --------------------------------------------------------
    def _push(self, item: tuple[int, Any, int, int, Any]) -> None:
        self._q.append(item)
        self._bytes += item[2]
        self._wake.set()

    def offer_event(self, payload: Any, size: int, sev: int, meta: Any = None) -> None:
        if self.state != OPEN:
            return
        if self._q:
            if sev < NOTICE and self._bytes + size > self.relay.queue_soft_bytes:
                self._drop_low(1)
                return
            if self._bytes + size > self.relay.queue_hard_bytes and \
                    not self._evict_low(self._bytes + size - self.relay.queue_hard_bytes):
                self.terminate("slow-consumer")
                return
        self._push((_EV, payload, size, sev, meta))

    def push_frame(self, payload: Any) -> None:
        """A connection frame (``subscribed``, ``error``, ``pong``...): never
        dropped; a peer that lets them pile past the hard bound is shed."""
        if self.state != OPEN:
            return
        size = len(payload)
        if self._q and self._bytes + size > self.relay.queue_hard_bytes:
            self.terminate("slow-consumer")
            return
        self._push((_FRAME, payload, size, NOTICE, None))

    def push_replay(self, job: ReplayJob) -> None:
        if self.state == OPEN:
            self._push((_REPLAY, job, 0, NOTICE, None))

    def _drop_low(self, n: int) -> None:
        self.dropped += n
        self.relay.counters["dropped_low_severity"] += n

    def _evict_low(self, need: int) -> bool:
        freed, kept, dropped = 0, deque(), 0
        for item in self._q:
            if freed < need and item[0] == _EV and item[3] < NOTICE:
                freed += item[2]
                dropped += 1
            else:
                kept.append(item)
        if dropped:
            self._q = kept
            self._bytes -= freed
            self._drop_low(dropped)
        return freed >= need

    def _goodbye(self, reason: str, *, code: int) -> list[tuple[int, Any, int, int, Any]]:
        if self.kind == "sse":
            comment = ": shutting-down\n\n" if code == 1001 else f": terminated {reason}\n\n"
            return [(_FRAME, comment.encode(), 0, NOTICE, None), (_END, None, 0, NOTICE, None)]
        # rendered when written, so it carries the positions actually delivered
        def closing() -> str:
            return frame_text({"type": "closing", "reason": reason,
                               "delivered": self.delivered_positions()})
        return [(_FRAME, closing, 0, NOTICE, None), (_END, (code, reason), 0, NOTICE, None)]

    def terminate(self, reason: str, *, code: int = 1013) -> None:
        """Shed this consumer now: queued items are discarded, a goodbye
        (SSE comment / WS ``closing`` + close ``code``) is queued, and if the
        writer is stuck mid-send the socket is aborted (§8.4 disconnect)."""
        if self.state in (TERMINATED, CLOSED):
            return
        self.relay._unregister_outlet_subs(self)
        self.state = TERMINATED
        self.relay.counters["streams_terminated"] += 1
        log.info("relay: shedding %s consumer (%s)", self.kind, reason)
        self._q.clear()
        self._bytes = 0
        for item in self._goodbye(reason, code=code):
            self._q.append(item)
        self._wake.set()
        if self.in_send:
            self.kill()

    def finish(self, reason: str) -> None:
        """Orderly end (shutdown): stop offers, flush what is queued, then
        the goodbye (SSE ``: shutting-down``; WS ``closing`` + close 1001)."""
        if self.state != OPEN:
            return
        self.relay._unregister_outlet_subs(self)
        self.state = FINISHING
        for item in self._goodbye(reason, code=1001):
            self._push(item)

    def kill(self) -> None:
        """Abort the socket (if the server gave us the means)."""
        if self.abort is not None and not self._killed:
            self._killed = True
            self.relay.counters["connections_aborted"] += 1
            try:
                self.abort()
            except Exception:  # noqa: BLE001 -- already gone
                pass

    def closed(self) -> None:
        """The connection is gone (called by the ASGI layer on exit)."""
        if self.state != CLOSED:
            self.relay._unregister_outlet_subs(self)
            self.state = CLOSED
            self._q.clear()
            self._bytes = 0
            self.relay._outlets.discard(self)
            if self.kind == "sse":
                self.relay._sse_streams -= 1
            self.done.set()

    # consumer (writer) side ------------------------------------------------
    def mark_delivered(self, sid: Any, session: str, pos: Position) -> None:
        """Track the last delivered position per (subscription, session) for
        the ``closing`` frame; bounded like the buffers (``max_sessions``)."""
        per = self.delivered.setdefault(sid, {})
        per.pop(session, None)  # re-insert: most recent last
        per[session] = pos
        if len(per) > self.relay.max_sessions:
            del per[next(iter(per))]

    def delivered_positions(self) -> list[dict[str, Any]]:
        return [{"sub": sid, "session": s, "epoch": p[0], "seq": p[1]}
                for sid, per in self.delivered.items() for s, p in per.items()]

    async def next_batch(self, max_bytes: int = 256 * 1024, linger: float = 0.0
                         ) -> tuple[list[Any], Any]:
        """Wait for output; returns ``(payloads, end)``: payloads to write in
        order, and ``end`` (not ``None``) when the stream must end after
        them (SSE: ``True``; WS: ``(code, reason)``). ``linger`` (seconds):
        once output is pending, wait that long before collecting it, so a
        writer makes at most one write per ``linger`` and a burst leaves in
        one write instead of one per event (replay is not delayed)."""
        while not self._q:
            if self.state == CLOSED:
                return [], True if self.kind == "sse" else (1001, "closed")
            await self._wake.wait()
            self._wake = trio.Event()
        if linger > 0 and self.state == OPEN and self._q[0][0] != _REPLAY:
            await trio.sleep(linger)
        out: list[Any] = []
        size = 0
        while self._q and size < max_bytes:
            kind, payload, n, _sev, meta = self._q[0]
            if kind == _REPLAY:
                if out:
                    break
                chunk = payload.next_chunk()
                if chunk is None:
                    self._q.popleft()
                    continue
                if not chunk:  # a slice scanned, nothing matched: let others run
                    await trio.lowlevel.checkpoint()
                    continue
                return chunk, None
            self._q.popleft()
            self._bytes -= n
            if kind == _END:
                return out, payload if payload is not None else True
            if meta is not None:
                self.mark_delivered(*meta)
            elif callable(payload):
                payload = payload()
            out.append(payload)
            size += n
        return out, None


class Subscriber:
    """One live subscription: an SSE stream, or one ``subscribe`` of a WS
    connection (``sid`` set). ``ceiling`` is the capture ceiling or ``None``."""

    __slots__ = ("filter", "ceiling", "outlet", "sid")

    def __init__(self, flt: Filter, ceiling: str | None, outlet: Outlet, sid: Any = None) -> None:
        self.filter = flt
        self.ceiling = ceiling
        self.outlet = outlet
        self.sid = sid

    def offer(self, view: View) -> None:
        e = view.entry
        if self.outlet.kind == "sse":
            payload = view.sse()
            self.outlet.offer_event(payload, len(payload), e.sev)
        else:
            text = view.text()
            meta = (self.sid, e.attrs["session"], e.pos) if e.pos is not None else None
            self.outlet.offer_event(text, len(view.raw), e.sev, meta)


class ReplayJob:
    """Buffered replay for one subscription, rendered lazily in chunks.

    ``plan``: ``[(buffer key, after, mark)]`` (key ``(source, session)``);
    ``after`` is the position to
    resume strictly after (``None``: from the earliest held), ``mark`` whether
    an exhausted buffer gets a ``replay-exhausted`` marker (never for
    replay-all). Only entries admitted at or before ``cutoff`` are served;
    later ones reach the subscriber live. ``tail`` is rendered after the
    last chunk (SSE ``: replay-complete`` for ``live=0``)."""

    CHUNK = 256  # rendered events per chunk
    SCAN = 4096  # entries examined per chunk (a narrow filter over a big buffer)

    def __init__(self, relay: Relay, sub: Subscriber, plan: list[tuple[BufKey, Position | None, bool]],
                 cutoff: int, tail: list[Any] | None = None) -> None:
        self.relay = relay
        self.sub = sub
        self.plan = deque(plan)
        self.cutoff = cutoff
        self.tail = tail
        self._cur: deque[Entry] = deque()

    def _marker(self, session: str, earliest: Position) -> Any:
        if self.sub.outlet.kind == "sse":
            return f": replay-exhausted {_comment_safe(session)} {earliest[0]}:{earliest[1]}\n\n".encode()
        return frame_text({"type": "replay-exhausted", "sub": self.sub.sid, "session": session,
                           "earliest": {"epoch": earliest[0], "seq": earliest[1]}})

    def next_chunk(self) -> list[Any] | None:
        out: list[Any] = []
        outlet = self.sub.outlet
        scanned = 0
        while len(out) < self.CHUNK and scanned < self.SCAN:
            if not self._cur:
                if not self.plan:
                    break
                key, after, mark = self.plan.popleft()
                entries, exhausted, earliest = self.relay.buffers.replay_after(key, after)
                if exhausted and mark and earliest is not None:
                    out.append(self._marker(key[1], earliest))
                self._cur = deque(entries)
                continue
            e = self._cur.popleft()
            scanned += 1
            if e.n > self.cutoff or not self.sub.filter.matches(e.attrs):
                continue
            view = self.relay.view(e, self.sub.ceiling, {})
            if outlet.kind == "sse":
                out.append(view.sse())
            else:
                out.append(view.text())
                outlet.mark_delivered(self.sub.sid, e.attrs["session"], e.pos)  # type: ignore[arg-type]
        if not out:
            if self._cur or self.plan:
                return out  # budget spent on non-matching entries; more to scan
            if self.tail is not None:
                tail, self.tail = self.tail, None
                return tail
            return None
        return out


# -- connections ------------------------------------------------------------------

class Connection:
    """A party attached to the relay that may claim sessions and receive
    commands: the base of :class:`LocalEmitter` (the fleet's in-process
    bridges) and :class:`SocketConnection` (remote WebSocket parties).

    ``role``: ``emitter``/``consumer``/``both`` (``None`` before ``hello``);
    ``identity``/``capabilities``: from the party's ``hello``, verbatim;
    ``agent``: ``identity.agent`` when declared (the connection's own
    events, sequenced and ``agent.*``, carrying another envelope ``agent``
    are invalid, AEP-0003 §4 rule 3; commands and ``attention.routed``
    are exempt: they speak for their sender);
    ``authenticated``: whether this binding is authenticated (commands
    from an unauthenticated binding are refused, AEP-0004 §4.1);
    ``claims``: sessions this connection owns (it sent their sequenced
    events), bounded to ``max_sessions``, least recently used first."""

    def __init__(self, relay: Relay, authenticated: bool) -> None:
        self.relay = relay
        self.authenticated = authenticated
        self.role: str | None = None
        self.identity: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.accepts: frozenset[str] = frozenset()
        #: the hello's ``identity.agent``: every event this connection sends
        #: must carry it as its envelope ``agent`` (AEP-0003 §4 rule 3)
        self.agent: str | None = None
        self.claims: OrderedDict[str, None] = OrderedDict()
        self.open = True

    @property
    def can_claim(self) -> bool:
        return self.role in ("emitter", "both")

    def _adopt_hello(self, hello: dict[str, Any]) -> None:
        ident = hello.get("identity")
        caps = hello.get("capabilities")
        self.identity = ident if isinstance(ident, dict) else {}
        self.capabilities = caps if isinstance(caps, dict) else {}
        agent = self.identity.get("agent")
        self.agent = agent if isinstance(agent, str) and agent else None
        ctl = self.capabilities.get("control")
        acc = ctl.get("accepts") if isinstance(ctl, dict) else None
        # control.accepts is authoritative (AEP-0003 §4 rule 5): none declared
        # means nothing is accepted
        self.accepts = frozenset(a for a in acc if isinstance(a, str)) \
            if isinstance(acc, list) else frozenset()

    def roster_entries(self) -> list[dict[str, Any]]:
        """One entry per live claim, declarations verbatim (AEP-0003 §4.1)."""
        if not self.open or not self.can_claim:
            return []
        base: dict[str, Any] = {}
        if isinstance(self.identity.get("agent"), str):
            base["agent"] = self.identity["agent"]
        if isinstance(self.identity.get("instance"), str):
            base["instance"] = self.identity["instance"]
        if "control" in self.capabilities:
            base["control"] = self.capabilities["control"]
        if "emits" in self.capabilities:
            base["emits"] = self.capabilities["emits"]
        return [{"session": s, **base} for s in self.claims]

    async def deliver_command(self, cmd: dict[str, Any], raw: str | None) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        if self.open:
            self.open = False
            self.relay._drop_claims(self)
            self.relay._conns.discard(self)


class LocalEmitter(Connection):
    """An in-process emitter connection (one per fleet bridge identity).

    Built by :meth:`Relay.attach_emitter`. ``await ingest(event)`` validates,
    claims the event's session for this connection, buffers and fans out
    (raises :class:`InvalidEvent`, :class:`RelayClosed`, or
    :class:`CommandRefused` for a command it is not allowed to route).
    Commands routed to its sessions are handed to ``deliver`` (awaited in
    the sender's connection task: it should hand off promptly, e.g. into a
    bounded trio channel). ``close()`` drops its claims."""

    def __init__(self, relay: Relay, hello: dict[str, Any],
                 deliver: Callable[[dict[str, Any]], Awaitable[Any]]) -> None:
        super().__init__(relay, authenticated=relay.has_token)
        if not isinstance(hello, dict):
            raise ValueError("hello must be an object")
        role = hello.get("role", "emitter")
        if role not in ("emitter", "both"):
            raise ValueError(f"an in-process emitter connection needs role emitter/both, not {role!r}")
        versions = hello.get("versions", [AEP_VERSION])
        if not isinstance(versions, list) or AEP_VERSION not in versions:
            raise ValueError(f"hello.versions must include {AEP_VERSION!r}")
        self.role = role
        self._adopt_hello(hello)
        if not isinstance(self.identity.get("agent"), str) or not self.identity["agent"]:
            raise ValueError("hello.identity.agent is required for emitters (AEP-0003 §4 rule 3)")
        self._deliver = deliver

    async def ingest(self, event: dict[str, Any]) -> None:
        if not self.open or self.relay.closing:
            raise RelayClosed("connection closed")
        refusal = await self.relay._ingest(event, self)
        if refusal is not None:
            raise CommandRefused(*refusal)
        # a checkpoint per event: a tight ingest loop never starves the writers
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        self._release()

    async def deliver_command(self, cmd: dict[str, Any], raw: str | None) -> None:
        await self._deliver(cmd)


class SocketConnection(Connection):
    """The protocol state of one ``/socket`` WebSocket (AEP-0003 §3.5, §4,
    §6.5; AEP-0004 §4). The ASGI layer feeds :meth:`handle_text` /
    :meth:`handle_binary` and writes what :attr:`outlet` yields."""

    def __init__(self, relay: Relay, authenticated: bool) -> None:
        super().__init__(relay, authenticated)
        self.outlet = Outlet(relay, "ws")
        self.hello_done = False
        self.subs: dict[Any, Subscriber] = {}

    # -- output ------------------------------------------------------------
    def send(self, frame: dict[str, Any]) -> None:
        self.outlet.push_frame(frame_text(frame))

    def _fatal(self, frame: dict[str, Any], code: int, reason: str) -> None:
        """An error frame, then close (hello failures, binary frames)."""
        if self.outlet.state != OPEN:
            return
        self.send(frame)
        self.relay._unregister_outlet_subs(self.outlet)
        self.outlet._push((_END, (code, reason), 0, NOTICE, None))
        self.outlet.state = FINISHING
        self._release()

    def error(self, code: str, detail: str | None = None, **extra: Any) -> None:
        frame: dict[str, Any] = {"type": "error", "code": code}
        frame.update(extra)
        if detail:
            frame["detail"] = detail
        self.send(frame)

    # -- input -------------------------------------------------------------
    def handle_binary(self) -> None:
        self.relay.counters["bad_frames"] += 1
        self._fatal({"type": "error", "code": "binary-unsupported",
                     "detail": "binary frames are reserved in AEP 0.1 (AEP-0003 §3.5)"},
                    1003, "binary frames unsupported")

    async def handle_text(self, text: str) -> None:
        if self.outlet.state != OPEN:
            return
        try:
            msg = loads(text)
        except ValueError:
            msg = None
            if self.hello_done:
                self.relay.counters["bad_frames"] += 1
                self.error("bad-json", "frame is not valid JSON")
                return
        if not isinstance(msg, dict):
            if self.hello_done:
                self.relay.counters["bad_frames"] += 1
                self.error("bad-frame", "frame must be a JSON object")
                return
        mtype = msg.get("type") if isinstance(msg, dict) else None
        if not self.hello_done:
            if mtype != "hello":
                self._fatal({"type": "error", "code": "hello-required",
                             "detail": "the first frame must be hello (AEP-0003 §3.5)"},
                            1002, "hello required")
                return
            self._hello(msg)  # type: ignore[arg-type]
            return
        assert isinstance(msg, dict)
        if isinstance(mtype, str) and "." in mtype:
            await self._event(msg, text)
            return
        handler = self._FRAMES.get(mtype) if isinstance(mtype, str) else None
        if handler is not None:
            handler(self, msg)
        # unknown frame types are ignored (AEP-0003 §2)

    def _hello(self, msg: dict[str, Any]) -> None:
        versions = msg.get("versions")
        if not isinstance(versions, list) or AEP_VERSION not in versions:
            self._fatal({"type": "error", "code": "version-unsupported", "versions": [AEP_VERSION],
                         "detail": f"this relay speaks AEP {AEP_VERSION}"},
                        1002, "version unsupported")
            return
        role = msg.get("role", "both")
        if role not in ROLES:
            self._fatal({"type": "error", "code": "invalid-hello",
                         "detail": "role must be emitter, consumer or both"}, 1002, "invalid hello")
            return
        self._adopt_hello(msg)
        if role == "emitter" and not (isinstance(self.identity.get("agent"), str)
                                      and self.identity["agent"]):
            self._fatal({"type": "error", "code": "invalid-hello",
                         "detail": "identity.agent is required for emitters (AEP-0003 §4 rule 3)"},
                        1002, "invalid hello")
            return
        self.role = role
        self.hello_done = True
        self.send(self.relay.hello_frame())

    async def _event(self, ev: dict[str, Any], text: str) -> None:
        cause = ev.get("id") if isinstance(ev.get("id"), str) else None
        try:
            refusal = await self.relay._ingest(ev, self, raw=text)
        except InvalidEvent as e:
            self.relay.counters["invalid_events"] += 1
            extra = {"cause": cause} if cause else {}
            self.error("invalid-event", str(e), **extra)
            return
        if refusal is not None:
            code, detail = refusal
            self.send({"type": "error", "cause": ev["id"], "code": code, "detail": detail})

    def _subscribe(self, msg: dict[str, Any]) -> None:
        sid = msg.get("id")
        if not (isinstance(sid, str) or (isinstance(sid, int) and not isinstance(sid, bool))):
            self.error("invalid-filter", "subscribe needs an id (string)")
            return
        if self.role == "emitter":
            self.error("unauthorized", "subscribe is answered on consumer/both connections", id=sid)
            return
        try:
            flt = Filter(msg.get("filter", {}))
            ceiling = parse_capture(msg.get("capture"))
            plan_all, positions = parse_from(msg.get("from"))
        except InvalidFilter as e:
            self.error("invalid-filter", str(e), id=sid)
            return
        if positions is not None and len(positions) > self.relay.max_from:
            self.error("limit-exceeded",
                       f"from exceeds AEP_MAX_FROM={self.relay.max_from} resume positions", id=sid)
            return
        if sid not in self.subs and len(self.subs) >= self.relay.max_subscriptions:
            self.error("limit-exceeded",
                       f"more than {self.relay.max_subscriptions} concurrent subscriptions", id=sid)
            return
        old = self.subs.pop(sid, None)
        if old is not None:
            self.relay._unsubscribe(old)
        sub = Subscriber(flt, ceiling, self.outlet, sid)
        self.subs[sid] = sub
        self.send({"type": "subscribed", "id": sid})
        self.relay._subscribe(sub, plan_all=plan_all, positions=positions, live=True)

    def _unsubscribe(self, msg: dict[str, Any]) -> None:
        sid = msg.get("id")
        sub = self.subs.pop(sid, None) if isinstance(sid, (str, int)) else None
        if sub is not None:
            self.relay._unsubscribe(sub)
            self.outlet.delivered.pop(sid, None)
        self.send({"type": "unsubscribed", "id": sid})

    def _roster(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        if not isinstance(rid, str):
            self.error("invalid-request", "roster needs an id (string)")
            return
        if self.role == "emitter":
            self.error("unauthorized", "roster is answered on consumer/both connections", id=rid)
            return
        self.send({"type": "roster", "id": rid, "entries": self.relay.roster()})

    def _ping(self, msg: dict[str, Any]) -> None:
        self.send({"type": "pong", "t": msg.get("t")})

    def _ignore(self, msg: dict[str, Any]) -> None:
        pass

    _FRAMES: dict[str, Callable[[SocketConnection, dict[str, Any]], None]] = {
        "subscribe": _subscribe,
        "unsubscribe": _unsubscribe,
        "roster": _roster,
        "ping": _ping,
        "pong": _ignore,
    }

    def ping(self, t: int) -> None:
        if self.hello_done:
            self.send({"type": "ping", "t": t})

    async def deliver_command(self, cmd: dict[str, Any], raw: str | None) -> None:
        # byte-identical forwarding (AEP-0004 §4.4): the frame as received
        self.outlet.push_frame(raw if raw is not None else frame_text(cmd))
        if self.outlet.state != OPEN:
            raise RelayClosed("target connection is closing")

    def close(self) -> None:
        """The socket is gone: drop subscriptions and claims."""
        for sub in self.subs.values():
            self.relay._unsubscribe(sub)
        self.subs.clear()
        self._release()
        self.outlet.closed()


# -- request parsing shared by SSE and WS -------------------------------------------

def parse_capture(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in CAPTURE_RANK:
        raise InvalidFilter(f"capture must be one of {', '.join(CAPTURES)}")
    return value


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_from(value: Any) -> tuple[bool, list[tuple[str, Position | None]] | None]:
    """``from``: absent, ``"all"``, or ``[{session, epoch?, seq}]`` (AEP-0003
    §3.3, §6.5). Returns ``(replay_all, positions)``; raises
    :class:`InvalidFilter` for anything else (fail closed)."""
    if value is None:
        return False, None
    if value == "all":
        return True, None
    if not isinstance(value, list):
        raise InvalidFilter('from must be an array of resume positions or the string "all"')
    out: list[tuple[str, Position | None]] = []
    for p in value:
        if not isinstance(p, dict):
            raise InvalidFilter("from entries must be {session, epoch, seq} objects")
        session, epoch, seq = p.get("session"), p.get("epoch", 0), p.get("seq")
        if not isinstance(session, str) or not session:
            raise InvalidFilter("from entry needs a session (string)")
        if not _utf8(session):
            raise InvalidFilter("from entry session has no UTF-8 form (lone surrogate)")
        for v in (epoch, seq):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidFilter("from entry epoch/seq must be integers >= 0")
        out.append((session, (epoch, seq)))
    return False, out


_DIGITS = re.compile(r"[0-9]+\Z")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def normalize_origin(value: str, *, strict: bool = False) -> str:
    """An origin (RFC 6454) in comparable form: ``scheme://host[:port]``,
    lower-cased, default port and trailing ``/`` dropped; ``null`` stays
    ``null``. ``strict`` (configuration): raises ``ValueError`` for
    anything that is not an origin (a path, a query, ``*``, no scheme);
    otherwise (a request's ``Origin`` header) returns the input lower-cased
    so it simply matches nothing."""
    v = value.strip()
    if v.lower() == "null":
        return "null"
    try:
        u = urllib.parse.urlsplit(v)
        port = u.port
    except ValueError:
        u, port = None, None
    if u is None or not u.scheme or not u.hostname or u.path not in ("", "/") \
            or u.query or u.fragment or u.username or u.password:
        if strict:
            raise ValueError(f"{value!r} is not an origin (scheme://host[:port], e.g. "
                             "https://dash.example:8443); '*' is not accepted")
        return v.lower()
    scheme, host = u.scheme.lower(), u.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}"


def parse_last_event_id(value: str) -> tuple[str, Position] | None:
    """``{session}:{epoch}:{seq}`` (session names may contain ``:``);
    ``None`` when malformed (browsers resend whatever they saw last): epoch
    and seq must be ASCII digits (``str.isdigit`` also passes ``"²"``) that
    ``int`` accepts (Python refuses more than 4300 digits)."""
    session, sep1, rest = value.rpartition(":")
    session, sep2, epoch = session.rpartition(":")
    if not (sep1 and sep2 and session and _DIGITS.match(epoch) and _DIGITS.match(rest)):
        return None
    try:
        return session, (int(epoch), int(rest))
    except ValueError:
        return None


# -- the relay ----------------------------------------------------------------------

class Relay:
    """The embedded relay (AEP-0003 bindings, AEP-0004 §4 routing).

    Parameters: ``token`` (``AEP_TOKEN``; ``None`` = watch-only: every
    binding is unauthenticated, observation is open and every command is
    refused ``unauthorized``), ``buffer`` (``AEP_BUFFER``, events per
    session), ``max_sessions`` (``AEP_MAX_SESSIONS``), ``max_body``
    (``AEP_MAX_BODY``, bytes per POST body and per WS message),
    ``max_batch`` (``AEP_MAX_BATCH``, events per NDJSON POST), ``max_from``
    (``AEP_MAX_FROM``, resume positions per request; default
    ``max_sessions``). Keyword-only tuning: ``heartbeat_s`` (SSE ``: ping``
    interval), ``ws_ping_s`` / ``ws_timeout_s`` (WS liveness, AEP-0003 §3.5
    rule 5), ``queue_soft_bytes`` / ``queue_hard_bytes`` (per consumer,
    §8.4), ``max_subscriptions`` (per WS connection), ``sse_linger_s`` (the
    least time an SSE writer lets a burst gather before one write; see
    :meth:`sse_linger`), ``cors_origins`` (``AEP_CORS_ORIGINS``: browser
    origins, ``scheme://host[:port]``, allowed to use the relay; see
    :mod:`supervisor.relay.app` "Browsers"; raises ``ValueError`` for an
    entry that is not an origin, ``*`` included), ``buffer_bytes``
    (``AEP_BUFFER_BYTES``, accounted bytes held per session buffer, default
    8 MiB) and ``total_bytes`` (``AEP_BUFFER_TOTAL_BYTES``, all buffers
    together, default 256 MiB; must be >= ``buffer_bytes``): replay memory
    is bounded in bytes as well as in events (see :mod:`.buffer`). Raises
    ``ValueError`` for sizes below 1."""

    def __init__(self, token: str | None = None, buffer: int = 10_000, max_sessions: int = 500,
                 max_body: int = 16 * MiB, max_batch: int = 10_000, max_from: int | None = None,
                 *, heartbeat_s: float = 15.0, ws_ping_s: float = 30.0, ws_timeout_s: float = 90.0,
                 queue_soft_bytes: int = 1 * MiB, queue_hard_bytes: int = 8 * MiB,
                 max_subscriptions: int = 64, sse_linger_s: float = 0.005,
                 instance: str | None = None, cors_origins: Iterable[str] | None = None,
                 buffer_bytes: int = 8 * MiB, total_bytes: int = 256 * MiB) -> None:
        self._token = token.encode("utf-8") if token else None
        self.cors_origins: frozenset[str] = frozenset(
            normalize_origin(o, strict=True) for o in (cors_origins or ()) if o.strip())
        self.buffer_depth = buffer
        self.max_sessions = max_sessions
        self.max_body = max_body
        self.max_batch = max_batch
        self.max_from = max_from if max_from is not None else max_sessions
        self.heartbeat_s = heartbeat_s
        self.ws_ping_s = ws_ping_s
        self.ws_timeout_s = ws_timeout_s
        self.queue_soft_bytes = queue_soft_bytes
        self.queue_hard_bytes = max(queue_hard_bytes, queue_soft_bytes)
        self.max_subscriptions = max_subscriptions
        self.sse_linger_s = sse_linger_s
        self.instance = instance
        self.buffers = SessionBuffers(buffer, max_sessions, buffer_bytes=buffer_bytes,
                                      total_bytes=total_bytes)
        self.closing = False
        self._subs: set[Subscriber] = set()
        self._subs_t: tuple[Subscriber, ...] = ()
        self._outlets: set[Outlet] = set()
        self._sse_streams = 0
        self._conns: set[Connection] = set()
        self._claims: dict[str, dict[Connection, None]] = {}
        self._admitted = 0
        self._started = time.monotonic()
        self.counters: dict[str, int] = {
            "events": 0, "invalid_events": 0, "bad_frames": 0, "dropped_low_severity": 0,
            "streams_terminated": 0, "connections_aborted": 0, "downlevel_errors": 0, "commands_routed": 0,
            "commands_refused": 0, "connection_errors": 0, "handler_errors": 0, "fanout_errors": 0,
            "refused_origin": 0, "refused_host": 0,
        }

    def __repr__(self) -> str:  # never the token
        return (f"<Relay buffer={self.buffer_depth} max_sessions={self.max_sessions} "
                f"auth={'on' if self._token else 'off'}>")

    # -- auth ----------------------------------------------------------------
    @property
    def has_token(self) -> bool:
        """Whether a token is configured (the value itself is never exposed)."""
        return self._token is not None

    def check_token(self, presented: str | None) -> bool:
        """Constant-time comparison against the configured token."""
        if self._token is None or presented is None:
            return False
        return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), self._token)

    def authorized(self, headers: Iterable[tuple[bytes, bytes]], query_string: bytes = b"") -> bool:
        """AEP-0003 §8.1: ``Authorization: Bearer <token>`` or
        ``?access_token=<token>``. Always true without a configured token
        (observation is open; control is refused regardless)."""
        if self._token is None:
            return True
        return self.authenticated(headers, query_string)

    def authenticated(self, headers: Iterable[tuple[bytes, bytes]], query_string: bytes = b"") -> bool:
        """True only when a token is configured and presented."""
        if self._token is None:
            return False
        for k, v in headers:
            if k.lower() == b"authorization":
                scheme, _, cred = v.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and self.check_token(cred.strip()):
                    return True
        if query_string and b"access_token" in query_string:
            for k, v in urllib.parse.parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
                if k == "access_token" and self.check_token(v):
                    return True
        return False

    # -- declarations ----------------------------------------------------------
    def capabilities(self) -> dict[str, Any]:
        """The relay's capability block (``hello`` §4 and discovery §3.4)."""
        return {
            "filters": ["attr-match"],
            "replay": {"buffer": self.buffer_depth, "all": True},
            "capture": list(CAPTURES),
            "control": {"accepts": []},
            "roster": {},
            "experimental": {},
        }

    def discovery(self) -> dict[str, Any]:
        """The discovery document (AEP-0003 §3.4) served at ``GET /events``
        and ``GET /.well-known/aep``. ``replay.buffer`` counts events per
        session."""
        return {
            "aep": [AEP_VERSION],
            "role": "collector",
            "endpoints": {"events": "/events", "stream": "/stream", "socket": "/socket"},
            "capabilities": self.capabilities(),
        }

    def hello_frame(self) -> dict[str, Any]:
        ident: dict[str, Any] = {"agent": RELAY_AGENT}
        if self.instance:
            ident["instance"] = self.instance
        return {"type": "hello", "versions": [AEP_VERSION], "role": "both",
                "identity": ident, "capabilities": self.capabilities()}

    def sse_linger(self) -> float:
        """How long an SSE writer lets output gather before one write:
        ``sse_linger_s`` at least, 0.5 ms per open stream, at most 100 ms.
        Each write costs the same fixed overhead whatever its size, so with
        many streams fewer, larger writes keep fan-out from starving ingest
        (measured: 100 streams, 5 ms -> ~37k deliveries/s, 50 ms -> ~300k)."""
        return min(max(self.sse_linger_s, self._sse_streams * 0.0005), 0.1)

    def stats(self) -> dict[str, Any]:
        """Counts for an authorized ``/healthz`` (topology stays behind auth)."""
        return {
            "sessions": len(self.buffers),
            "buffered_bytes": self.buffers.bytes,
            "subscribers": len(self._subs),
            "connections": len(self._conns),
            "uptime_s": int(time.monotonic() - self._started),
            "counters": {**self.counters, **self.buffers.counters},
        }

    # -- connections -------------------------------------------------------------
    def attach_emitter(self, hello: dict[str, Any],
                       deliver: Callable[[dict[str, Any]], Awaitable[Any]]) -> LocalEmitter:
        """Attach an in-process emitter (a fleet bridge): ``hello`` is the
        AEP-0003 §4 hello object (role ``emitter``/``both``,
        ``identity.agent``, ``identity.instance``, ``capabilities.emits``,
        ``capabilities.control {accepts, ack_window_ms}``); ``deliver`` is
        awaited with each command envelope routed to this connection's
        sessions. Raises ``ValueError`` for a bad hello, :class:`RelayClosed`
        after :meth:`close`."""
        if self.closing:
            raise RelayClosed("relay is shutting down")
        conn = LocalEmitter(self, hello, deliver)
        self._conns.add(conn)
        return conn

    def open_socket(self, authenticated: bool) -> SocketConnection:
        """A new WebSocket connection's protocol state (ASGI layer)."""
        conn = SocketConnection(self, authenticated)
        self._conns.add(conn)
        self._outlets.add(conn.outlet)
        return conn

    def _claim(self, conn: Connection, session: str) -> None:
        if session in conn.claims:
            conn.claims.move_to_end(session)
            return
        conn.claims[session] = None
        self._claims.setdefault(session, {})[conn] = None
        if len(conn.claims) > self.max_sessions:
            old, _ = conn.claims.popitem(last=False)
            self._unclaim(conn, old)

    def _unclaim(self, conn: Connection, session: str) -> None:
        holders = self._claims.get(session)
        if holders is not None:
            holders.pop(conn, None)
            if not holders:
                del self._claims[session]

    def _drop_claims(self, conn: Connection) -> None:
        for s in conn.claims:
            self._unclaim(conn, s)
        conn.claims.clear()

    def roster(self) -> list[dict[str, Any]]:
        """Every live (connection, claimed session) pair (AEP-0003 §4.1)."""
        out: list[dict[str, Any]] = []
        for c in list(self._conns):
            out.extend(c.roster_entries())
        return out

    # -- ingest --------------------------------------------------------------------
    def entry(self, ev: Any) -> Entry:
        """Validate and serialize one event (raises :class:`InvalidEvent`):
        the envelope (:func:`.envelope.validate`), its UTF-8 form, and its
        ``data`` against its declared ``capture`` (:mod:`.capcheck`; a
        command is not refused for it, its audit copy is rendered at the
        level it carries)."""
        validate(ev)
        raw = encode(ev)  # also refuses lone surrogates (no UTF-8 form)
        attrs = {k: v for k, v in ev.items() if k != "data"}
        pos = (ev.get("epoch", 0), ev["seq"]) if "seq" in ev else None
        declared = ev.get("capture", "metadata")
        cap = CAPTURE_RANK[declared]
        if cap < 3 and "data" in ev:
            shown = capture_exceeds(ev["type"], ev["data"], declared)
            if shown is not None:
                if not is_command_type(ev["type"]):
                    raise InvalidEvent(f"data exceeds its declared capture {declared}: it carries "
                                       f"{shown}-level fields (AEP-0001 §8.2(a))")
                # a command is forwarded verbatim to its target (AEP-0004 §4.4);
                # observers get its audit copy down-leveled from what it carries
                cap = CAPTURE_RANK[shown]
        return Entry(attrs, raw, pos, SEVERITY_RANK[ev.get("severity", "info")], cap)

    def check_position(self, e: Entry) -> None:
        """Raise :class:`InvalidEvent` when a different event of the same
        emitter session already holds ``e``'s ``(epoch, seq)`` (AEP-0001 §7
        rule 2: one position, one event; an emitter fault). A redelivery of
        the same ``(source, id)`` is not refused."""
        if e.pos is not None and self.buffers.conflict(e):
            raise InvalidEvent(_POSITION_TAKEN)

    def check_batch(self, entries: list[Entry]) -> tuple[int, str] | None:
        """Everything :meth:`ingest_http` would refuse, checked before any of
        ``entries`` is ingested (a batch is accepted or rejected whole):
        ``(index, detail)`` of the first problem, or ``None``. Positions are
        checked against the buffers and against earlier entries of the batch."""
        seen: dict[tuple[BufKey, Position], tuple[str, str]] = {}
        for i, e in enumerate(entries):
            if e.pos is None:
                continue
            slot = (e.bkey, e.pos)
            held = seen.get(slot)
            if (held is not None and held != e.key) or (held is None and self.buffers.conflict(e)):
                return i, _POSITION_TAKEN
            seen[slot] = e.key
        return None

    def ingest_http(self, entries: list[Entry]) -> None:
        """Ingest validated, non-command entries from ``POST /events``
        (no connection: HTTP emitters claim nothing) that passed
        :meth:`check_batch`."""
        for e in entries:
            self._admit(e, None)

    async def _ingest(self, ev: Any, conn: Connection | None,
                      raw: str | None = None) -> tuple[str, str] | None:
        """One event from a connection. Returns a command refusal
        ``(code, detail)`` or ``None``; raises :class:`InvalidEvent`."""
        e = self.entry(ev)
        self.check_position(e)
        if conn is not None and conn.agent is not None and ev["agent"] != conn.agent \
                and not is_foreign(e.attrs["type"]):
            # the connection's own events (sequenced and agent.*); commands and
            # attention.routed speak for their sender, not a declared emitter
            raise InvalidEvent("event agent does not match this connection's hello "
                               "identity.agent (AEP-0003 §4 rule 3)")
        if is_command_type(e.attrs["type"]):
            if raw is not None and _has_duplicate_keys(raw):
                raise InvalidEvent("duplicate attribute names in command")
            return await self._route(ev, e, conn, raw)
        self._admit(e, conn)
        return None

    def _admit(self, e: Entry, conn: Connection | None) -> None:
        self.counters["events"] += 1
        if e.pos is not None:
            if conn is not None and conn.can_claim:
                self._claim(conn, e.attrs["session"])
            self._admitted += 1
            e.n = self._admitted
            self.buffers.admit(e)
        # agent.* and seq-less foreign events are live-only; every event is
        # fanned out as received, duplicates included (AEP-0003 §5)
        self._fan_out(e)

    async def _route(self, ev: dict[str, Any], e: Entry, sender: Connection | None,
                     raw: str | None) -> tuple[str, str] | None:
        """AEP-0004 §4: deliver to exactly one live claimant or refuse."""
        refusal = self._route_check(ev, sender)
        if refusal is None:
            target = next(iter(self._claims[ev["session"]]))
            try:
                await target.deliver_command(ev, raw)
            except Exception as exc:  # noqa: BLE001 -- a dead target is no route
                log.warning("relay: command delivery failed: %s", type(exc).__name__)
                refusal = ("no-route", "the owning connection is going away")
        if refusal is not None:
            self.counters["commands_refused"] += 1
            return refusal
        self.counters["commands_routed"] += 1
        self._fan_out(e)  # audit visibility, live only: commands carry no seq
        return None

    def _route_check(self, ev: dict[str, Any], sender: Connection | None) -> tuple[str, str] | None:
        if sender is None or not sender.authenticated:
            if self._token is None:
                return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1); "
                        "this relay runs without AEP_TOKEN (watch-only)")
            return ("unauthorized", "control requires an authenticated binding (AEP-0004 §4.1)")
        session = ev["session"]
        holders = self._claims.get(session)
        if not holders:
            return ("no-route", f"no connected emitter owns session {session}")
        if len(holders) > 1:
            return ("ambiguous", f"{len(holders)} connected emitters claim session {session}")
        target = next(iter(holders))
        if ev["type"] not in target.accepts:
            return ("unsupported", f"the target does not accept {ev['type']}")
        return None

    # -- fan-out ----------------------------------------------------------------------
    def view(self, e: Entry, ceiling: str | None, cache: dict[str | None, View]) -> View:
        """``e`` rendered at ``ceiling`` (mechanical down-level, AEP-0003
        §6.4); ``cache`` holds this event's views for one fan-out."""
        if ceiling is None or CAPTURE_RANK[ceiling] >= e.cap:
            ceiling = None
        v = cache.get(ceiling)
        if v is None:
            v = cache[ceiling] = View(e, e.raw if ceiling is None else self._downlevel(e, ceiling))
        return v

    def _downlevel(self, e: Entry, ceiling: str) -> bytes:
        from bridges.core.capture import downlevel
        ev = json.loads(e.raw)
        if CAPTURE_RANK[ev.get("capture", "metadata")] < e.cap:
            ev["capture"] = CAPTURES[e.cap]  # a command carrying more than it declares
        try:
            out = downlevel(ev, ceiling)
            return dumps(out)
        except Exception as exc:  # noqa: BLE001 -- fail closed: never above the ceiling
            self.counters["downlevel_errors"] += 1
            log.error("relay: downlevel failed (%s); delivering the envelope without data",
                      type(exc).__name__)
            ev.pop("data", None)
            ev["capture"] = "metadata" if ceiling == "redacted" else ceiling
            return dumps(ev)

    def _fan_out(self, e: Entry) -> None:
        cache: dict[str | None, View] = {}
        attrs = e.attrs
        for sub in self._subs_t:
            if sub.filter.matches(attrs):
                try:
                    sub.offer(self.view(e, sub.ceiling, cache))
                except Exception as exc:  # noqa: BLE001 -- never abort an ingest half-way
                    # (a batch is accepted whole): that subscriber is shed instead
                    self.counters["fanout_errors"] += 1
                    log.error("relay: fan-out to a %s subscriber failed (%s); shedding it",
                              sub.outlet.kind, type(exc).__name__)
                    sub.outlet.terminate("internal-error")

    # -- subscriptions --------------------------------------------------------------
    def _set_subs(self) -> None:
        self._subs_t = tuple(self._subs)

    def _unsubscribe(self, sub: Subscriber) -> None:
        if sub in self._subs:
            self._subs.discard(sub)
            self._set_subs()
        try:
            sub.outlet.subs.remove(sub)
        except ValueError:
            pass

    def _unregister_outlet_subs(self, outlet: Outlet) -> None:
        if outlet.subs:
            for sub in outlet.subs:
                self._subs.discard(sub)
            outlet.subs = []
            self._set_subs()

    def _subscribe(self, sub: Subscriber, *, plan_all: bool,
                   positions: list[tuple[str, Position | None]] | None, live: bool,
                   tail: list[Any] | None = None) -> None:
        """Register ``sub`` for live delivery (when ``live``) and queue its
        replay, atomically (no checkpoint in between)."""
        plan: list[tuple[BufKey, Position | None, bool]] = []
        buffers = self.buffers
        if plan_all:
            plan = [(k, None, False) for k in buffers.sessions()]
        elif positions:
            # a position names a bare session: every emitter's buffer of that
            # name resumes from it (AEP-0001 §5.2, the residual ambiguity of
            # resume tokens); each gets its own exhausted verdict
            plan = [(k, pos, True) for s, pos in positions for k in buffers.keys_for(s, gone=True)]
        if not live and not plan_all:
            # replay-only also serves the buffers of sessions the filter pins
            named = {s for s, _ in positions or ()}
            plan += [(k, None, False) for s in sub.filter.sessions if s not in named
                     for k in buffers.keys_for(s)]
        if live:
            self._subs.add(sub)
            self._set_subs()
            sub.outlet.subs.append(sub)
        if plan or tail:
            sub.outlet.push_replay(ReplayJob(self, sub, plan, self._admitted, tail))

    def open_stream(self, flt: Filter, ceiling: str | None, *, plan_all: bool,
                    positions: list[tuple[str, Position | None]] | None,
                    live: bool) -> Outlet:
        """An SSE stream's outlet with its subscription registered and replay
        queued (AEP-0003 §3.3). ``live=False`` ends after the replay with
        ``: replay-complete``."""
        outlet = Outlet(self, "sse")
        self._outlets.add(outlet)
        self._sse_streams += 1
        sub = Subscriber(flt, ceiling, outlet)
        tail = None if live else [b": replay-complete\n\n"]
        self._subscribe(sub, plan_all=plan_all, positions=positions, live=live, tail=tail)
        if not live:
            outlet._push((_END, None, 0, NOTICE, None))
            outlet.state = FINISHING
        return outlet

    # -- shutdown ---------------------------------------------------------------------
    async def close(self, reason: str = "shutting down", *, grace: float = 2.0) -> None:
        """Orderly shutdown: every SSE stream gets ``: shutting-down`` and a
        clean end, every WebSocket a ``closing`` frame (with delivered
        positions) then close 1001; in-process connections are closed.
        Waits up to ``grace`` seconds for the streams to drain, then aborts
        whatever is still stuck (a peer that stopped reading)."""
        self.closing = True
        for c in list(self._conns):
            if isinstance(c, LocalEmitter):
                c.close()
        outlets = list(self._outlets)
        for o in outlets:
            o.finish(reason)
        with trio.move_on_after(grace):
            for o in outlets:
                await o.done.wait()
        for o in outlets:
            if not o.done.is_set():
                o.kill()
        # give aborted writers a moment to unwind
        with trio.move_on_after(0.5):
            for o in outlets:
                await o.done.wait()


_POSITION_TAKEN = ("another event of this emitter session already holds this (epoch, seq) "
                   "position (AEP-0001 §7 rule 2)")


def _pairs_no_dup(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise KeyError("duplicate")
    return dict(pairs)


def _has_duplicate_keys(raw: str) -> bool:
    """Whether the top-level object repeats a key (a command is forwarded
    verbatim, so what the target parses must be what the relay routed on)."""
    try:
        json.loads(raw, object_pairs_hook=_pairs_no_dup)
    except KeyError:
        return True
    except ValueError:
        return False
    return False
