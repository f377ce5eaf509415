"""The daemon side of the ACP tees: one emitter identity per agent id.

Each :class:`AcpBridge` mounts ``/bridges/acp/{agent}`` on the daemon's own
listener (``ctx.mounts``, see :class:`bridges.core.bridge.Mounts`; the wire
is :mod:`bridges.acp.wire`) and accepts any number of tees at once, each a
WebSocket that can come and go. The connection handlers (hypercorn's tasks)
only hand batches to a bounded channel; the mapping runs in the bridge's own
nursery under the supervisor (:class:`TeeHub`, the per-run object: a restart
starts clean). Each tee's :class:`~bridges.acp.join.Story` is keyed by the
tee's instance id, so a tee that reconnects (the daemon restarted its
bridge, or the network blipped) continues its story; a restarted tee is a
new id and never re-mints a run id. When a tee reports its agent's exit,
its open asks are dismissed, open turns fail and its sessions end.

Read-only (design record: the bridge never initiates, answers or injects):
``control.accepts`` is ``[]`` and the run hands the fleet no controller, so
the fleet's ledger refuses every command ``unsupported``.

Health (``/healthz``, counters behind the token when one is set):
``source`` is true while the path is mounted; counters ``tees_attached``
(now), ``tees_seen``, ``tee_connections``, ``tee_drops`` and
``tee_skipped_bytes`` (what the tees reported: pieces their bounded queue
dropped, bytes of over-cap lines not shipped), ``lines``, ``oversize``
(lines over the tee's parse cap: passed through, never parsed),
``malformed``, ``lines_refused`` (lines past the JSON bounds of
:func:`~bridges.core.aep.check_json` or holding a batch of over
:data:`~bridges.acp.join.MAX_BATCH` members: not parsed or not walked,
counted ``malformed`` too, logged rate-limited), ``unmatched``, ``refused`` (upgrades refused: bad hello,
wrong agent, too many tees, a tee id claimed by another connection).

Bounds (issue 25, hardening round two): every tee input is parsed depth-
and size-bounded (:func:`~bridges.acp.wire.parse_hello`,
:func:`~bridges.acp.wire.records`): a control record that does not parse
is refused, counted ``control_refused`` and logged once per tee; a batch
whose handling fails anyway costs that batch only (``tee_faults``), never
the bridge or another tee. Unfinished lines held over all tees are at most
``AEP_ACP_MAX_HELD_BYTES`` (gauge ``held_bytes``); a line that would pass
it is cut (``lines_cut``: not observed, the agent's pass-through is the
tee's and untouched), and a tee that is not attached holds none. A tee id
is bound to the connection that first used it: the daemon answers the
hello with a resume key (a TEXT message ``{"aep_acp_daemon": 1,
"resume": KEY}``) and a later connection speaks for that id only with it
and only while no other connection does (``tee_claims_refused``, close
code :data:`~bridges.acp.wire.CLAIMED`). New sessions go through a token bucket
(``AEP_ACP_NEW_SESSIONS_PER_S``, ``sessions_refused``). Lines about bad
input are rate-limited per peer (:class:`~bridges.core.limits.PeerLog`),
never a traceback."""
from __future__ import annotations

import hmac
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, cast

import trio

from bridges.core import capture as _capture
from bridges.core.aep import ACK_WINDOW_MS
from bridges.core.asgi import refuse_upgrade, respond
from bridges.core.bridge import BridgeContext, BridgeRun, Emission
from bridges.core.capture import CapturePolicy
from bridges.core.limits import BURST_S, PeerLog, SessionBucket
from bridges.core.pacing import Pacer

from . import wire
from .config import AcpConfig
from .join import Story
from .mapping import Posture

EMITS = ["session", "run", "tool", "attention", "x.acp"]
MAX_DETACHED = 256
"""Stories of tees that went away without an exit record, kept for their
reconnect (least recently seen evicted)."""
QUEUE = 16
"""Batches in flight between the connection handlers and the mapping."""
QUEUE_BYTES = 32 << 20
"""Bytes of batches in flight (over all tees): a handler waits for room past it."""
MAX_LINE = 16 << 20
"""The largest parse cap the daemon honors (a tee's hello ``max_line`` is
clamped to it): per tee the daemon holds at most this per direction."""


@dataclass
class TeeState:
    """One tee (by instance id) as the daemon knows it."""

    tee: str
    story: Story
    command: str = ""
    pid: int | None = None
    attached: int = 0
    drops: int = 0
    skipped_bytes: int = 0
    exited: bool = False
    key: str = ""
    warned: bool = False
    seen: dict[str, int] = field(default_factory=dict)
    splitters: dict[str, wire.LineSplitter] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)

    def split(self, max_line: int) -> None:
        if not self.splitters:
            self.splitters = {d: wire.LineSplitter(max_line) for d in wire.DIRECTIONS}


class AcpBridge:
    """One agent id's tees (``Bridge`` protocol, :mod:`bridges.core.bridge`).

    ``agent``: the AEP agent id (``acp``, or a tee's ``--name``);
    ``config``: :class:`~bridges.acp.config.AcpConfig`; ``policy``: the
    capture posture (``capabilities``; mapping uses the stamper's);
    ``problems``: configuration problems for :meth:`preflight`."""

    def __init__(self, agent: str = "acp", config: AcpConfig | None = None, *,
                 policy: CapturePolicy | None = None, problems: list[str] | None = None) -> None:
        self.agent = agent
        self.name = "acp" if agent == "acp" else f"acp.{agent}"
        self.config = config or AcpConfig()
        self.policy = policy or CapturePolicy()
        self.path = wire.path_for(agent)
        self._problems = list(problems or [])

    def capabilities(self) -> dict[str, Any]:
        """The ``hello`` block: read-only, ``control.accepts: []``."""
        return {"emits": list(EMITS),
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1]),
                "control": {"accepts": [], "ack_window_ms": ACK_WINDOW_MS}}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        return list(self._problems)

    def listeners(self) -> dict[str, Any]:
        """No listener of its own: the tees come in on ``AEP_LISTEN``."""
        return {}

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[BridgeRun | None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Build this run's :class:`TeeHub`, mount the tee path, hand the
        fleet an :class:`AcpRun` (no controller: read-only), map until
        cancelled. Raises ``RuntimeError`` without a daemon listener
        (``ctx.mounts``)."""
        if ctx.mounts is None:
            raise RuntimeError("the ACP bridge needs the daemon's listener (ctx.mounts)")
        await TeeHub(self, ctx).serve(task_status=task_status)


@dataclass
class AcpRun(BridgeRun):
    """The per-run handle: no controller (read-only), the run's hub."""

    hub: "TeeHub | None" = None


class TeeHub:
    """One run of an :class:`AcpBridge`: the tees, their stories, the
    channel from the connection handlers to the mapping task."""

    def __init__(self, bridge: AcpBridge, ctx: BridgeContext) -> None:
        self.bridge = bridge
        self.ctx = ctx
        self.posture = Posture(policy=ctx.stamper.policy, deltas=bridge.config.deltas,
                               agent=ctx.agent)
        self.tees: OrderedDict[str, TeeState] = OrderedDict()
        self._retired: OrderedDict[str, None] = OrderedDict()
        self.attached = 0
        self._send, self._recv = trio.open_memory_channel[tuple[TeeState, bytes]](QUEUE)
        self._handlers: set[trio.CancelScope] = set()
        self.held = 0
        self._queued = 0
        self._room = trio.lowlevel.ParkingLot()
        self.peer_log = PeerLog(ctx.log)
        rate = bridge.config.new_sessions_per_s
        self.new_sessions = SessionBucket(rate, rate * BURST_S)
        for c in ("tees_attached", "tees_seen", "tee_connections", "tee_drops",
                  "tee_skipped_bytes", "lines", "oversize", "malformed", "unmatched", "refused",
                  "tee_claims_refused", "control_refused", "tee_faults", "lines_cut", "lines_refused",
                  "sessions_refused", "log_suppressed"):
            ctx.health.counters.setdefault(c, 0)
        ctx.health.counters["tees_attached"] = 0
        ctx.health.counters["held_bytes"] = 0

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        ctx = self.ctx
        with ctx.mounts.mount(self.bridge.path, self.asgi):  # type: ignore[union-attr]
            ctx.health.source = True
            ctx.health.detail = None
            ctx.log.info("%s: tees attach at %s on the daemon listener", self.bridge.name,
                         self.bridge.path)
            task_status.started(AcpRun(hub=self))
            try:
                await self._map()
            finally:
                ctx.health.source = False
                for scope in list(self._handlers):
                    scope.cancel()

    # -- mapping (the bridge's nursery) -----------------------------------------
    async def _map(self) -> None:
        async for tee, message in self._recv:
            try:
                await self._message(tee, message)
            except Exception as e:  # noqa: BLE001 -- one tee's batch, never the bridge or the other tees
                self.ctx.health.count("tee_faults")
                for splitter in tee.splitters.values():
                    splitter.resync()  # whatever the batch left half-read starts over at a line end
                self._warn(tee.tee, "%s: tee %s: a batch could not be handled (%s); skipped it",
                           self.bridge.name, tee.tee, type(e).__name__)
            finally:
                self._queued -= len(message)
                self._room.unpark_all()
                for direction in tee.splitters:
                    self._hold(tee, direction)
                if not tee.attached:
                    self._release(tee)

    async def _message(self, tee: TeeState, message: bytes) -> None:
        for direction, item in wire.records(message):
            if direction is None:
                if item is None:
                    self.ctx.health.count("control_refused")
                    if not tee.warned:  # once per tee: the count says how often
                        tee.warned = True
                        self.ctx.log.warning("%s: tee %s sent a control record that is not a "
                                             "small JSON object; refused it (counted "
                                             "control_refused)", self.bridge.name, tee.tee)
                    continue
                await self._control(tee, item)  # type: ignore[arg-type]
            else:
                lines = tee.splitters[direction].feed(item)  # type: ignore[arg-type]
                self._hold(tee, direction)
                await self._lines(tee, direction, lines)
        self._count(tee)

    def _hold(self, tee: TeeState, direction: str) -> None:
        """Account the unfinished line ``direction`` of ``tee`` holds; cut it
        when the total would pass ``max_held_bytes``."""
        splitter = tee.splitters[direction]
        now, before = splitter.held, tee.held.get(direction, 0)
        self.held += now - before
        if now > before and self.held > self.bridge.config.max_held_bytes:
            splitter.resync()
            self.held -= now
            now = 0
            self.ctx.health.count("lines_cut")
            self._warn(tee.tee, "%s: tee %s: an unfinished line passed the bytes held for all "
                       "tees (AEP_ACP_MAX_HELD_BYTES); cut it (not observed)",
                       self.bridge.name, tee.tee)
        tee.held[direction] = now
        self.ctx.health.counters["held_bytes"] = self.held

    def _release(self, tee: TeeState) -> None:
        """A tee that is not attached (or gone) holds no unfinished line: it
        is cut (counted ``lines_cut``), and a reconnect resumes at a line end."""
        for direction, splitter in tee.splitters.items():
            if splitter.held:
                self.ctx.health.count("lines_cut")
                splitter.resync()
            self._hold(tee, direction)

    def _warn(self, peer: str, msg: str, *args: object) -> None:
        if not self.peer_log.note(peer, trio.current_time(), msg, *args):
            self.ctx.health.count("log_suppressed")

    async def _lines(self, tee: TeeState, direction: str, lines: list[bytes | int]) -> None:
        """Feed ``lines`` to the tee's story, yielding by bytes parsed
        (:class:`~bridges.core.pacing.Pacer`: a batch holds up to
        :data:`QUEUE_BYTES` of lines, each parsed and walked on this loop)."""
        story = tee.story
        pace = Pacer()
        for line in lines:
            if isinstance(line, int):
                self.ctx.health.count("oversize")  # passed through, never parsed
                story.counters.lines += 1
                continue
            await pace.take(len(line))
            refused = story.counters.refused
            outs = story.feed(direction, line)
            if story.counters.refused > refused:
                self.ctx.health.count("lines_refused")
                self._warn(tee.tee, "%s: tee %s: a line of %d bytes holds more JSON arrays, "
                           "objects, values or batch members than a frame may; not parsed "
                           "(counted lines_refused and malformed)", self.bridge.name, tee.tee,
                           len(line))
            await self._emit(tee, outs)

    async def _emit(self, tee: TeeState, outs: list[Any]) -> None:
        for o in outs:
            if not self.ctx.stamper.knows(o.session) \
                    and not self.new_sessions.take(trio.current_time()):
                self.ctx.health.count("sessions_refused")  # each new session is a file
                self._warn(tee.tee, "%s: tee %s opens new sessions faster than "
                           "AEP_ACP_NEW_SESSIONS_PER_S; dropped their events (counted "
                           "sessions_refused)", self.bridge.name, tee.tee)
                continue
            em, env = tee.story.envelope(o)
            try:
                # the mapping's emissions are the pins' shape: the core Emission
                ev = await self.ctx.emit(o.session, cast(Emission, em), **env)
            except ValueError as e:  # an ill-formed envelope: a bridge bug, never fatal
                self.ctx.health.count("stamp_errors")
                self.ctx.log.warning("%s: cannot stamp %s: %s", self.bridge.name, em.get("type"), e)
                continue
            tee.story.stamped(o, ev)

    async def _control(self, tee: TeeState, obj: dict[str, Any]) -> None:
        health = self.ctx.health
        if obj.get("gap") in wire.DIRECTIONS:
            tee.splitters[obj["gap"]].resync()
        stats = obj.get("stats")
        if isinstance(stats, dict):
            for key, counter in (("drops", "tee_drops"), ("skipped_bytes", "tee_skipped_bytes")):
                n = stats.get(key)
                if isinstance(n, int) and not isinstance(n, bool) and n > getattr(tee, key):
                    health.count(counter, n - getattr(tee, key))
                    setattr(tee, key, n)
        if "exit" in obj:
            status = obj["exit"] if isinstance(obj["exit"], int) else None
            for direction, splitter in tee.splitters.items():  # a trailing partial line
                await self._lines(tee, direction, splitter.finish())
            await self._emit(tee, tee.story.close(status))
            tee.exited = True
            if self.tees.get(tee.tee) is tee:
                del self.tees[tee.tee]
                self._retire(tee.tee)  # its run ids are spent: nobody re-mints them
            self._release(tee)

    def _count(self, tee: TeeState) -> None:
        c = tee.story.counters
        for name in ("lines", "malformed", "unmatched"):
            now = getattr(c, name)
            if now > tee.seen.get(name, 0):
                self.ctx.health.count(name, now - tee.seen.get(name, 0))
                tee.seen[name] = now

    # -- connections (hypercorn's tasks) ------------------------------------------
    def _claim(self, hello: dict[str, Any]) -> TeeState | None:
        """The state a (normalized) hello may speak for, or ``None`` when its
        tee id belongs to another connection: attached now, or detached and
        the hello lacks the id's resume key. A tee id this run never saw is
        new (a restarted daemon meets its tees anew)."""
        tee = self.tees.get(hello["tee"])
        if tee is None:
            return None if hello["tee"] in self._retired else self._new_tee(hello)
        if tee.attached or not hmac.compare_digest(hello["resume"] or "", tee.key):
            return None
        return tee

    def _new_tee(self, hello: dict[str, Any]) -> TeeState:
        tid = hello["tee"]
        tee = TeeState(tid, Story(tid, self.posture), key=wire.new_tee_id())
        max_line = hello["max_line"]
        tee.split(min(max_line, MAX_LINE) if max_line is not None and max_line >= 1024
                  else wire.DEFAULT_MAX_LINE)
        for direction in hello["mid_line"]:  # a line began on a connection we never saw
            tee.splitters[direction].resync()
        self.ctx.health.count("tees_seen")
        return tee

    def _attach(self, tee: TeeState, hello: dict[str, Any]) -> TeeState:
        tid = tee.tee
        self.tees[tid] = tee
        self.tees.move_to_end(tid)
        detached = [t for t in self.tees.values() if not t.attached and t is not tee]
        for old in detached[:max(0, len(detached) - MAX_DETACHED)]:
            self.tees.pop(old.tee, None)
            self._retire(old.tee)
        tee.command = hello["command"]
        tee.pid = hello["pid"]
        tee.attached += 1
        self.attached += 1
        health = self.ctx.health
        health.count("tee_connections")
        health.counters["tees_attached"] = self.attached
        health.detail = self._detail()
        return tee

    def _retire(self, tid: str) -> None:
        """Remember an evicted tee id: nobody speaks for it again this run
        (an eviction must not free the id for a forger)."""
        self._retired[tid] = None
        while len(self._retired) > 64 * MAX_DETACHED:
            self._retired.popitem(last=False)

    def _detach(self, tee: TeeState) -> None:
        tee.attached -= 1
        self.attached -= 1
        if not tee.attached:
            self._release(tee)
        self.ctx.health.counters["tees_attached"] = self.attached
        self.ctx.health.detail = self._detail()

    def _detail(self) -> str:
        live = [t for t in self.tees.values() if t.attached]
        names = ", ".join(f"{t.command or '?'} (pid {t.pid})" for t in live[:8])
        return f"{len(live)} tee(s) attached" + (f": {names}" if names else "")

    async def asgi(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        """The mounted app: a WebSocket per tee (module docstring)."""
        if scope["type"] != "websocket":
            await respond(send, 426, {"error": "upgrade-required",
                                      "detail": "a WebSocket for aep-bridges acp tees"})
            return
        msg = await receive()
        if msg["type"] != "websocket.connect":
            return
        if self.attached >= self.bridge.config.max_tees:
            self.ctx.health.count("refused")
            await refuse_upgrade(scope, send, 503, {"error": "too-many-tees"})
            return
        await send({"type": "websocket.accept"})
        first = await receive()
        text = first.get("text") if first["type"] == "websocket.receive" else None
        hello = wire.parse_hello(text) if isinstance(text, str) else None
        peer = "%s" % ((scope.get("client") or ("?",))[0],)
        if hello is None or hello["agent"] != self.bridge.agent:
            self.ctx.health.count("refused")
            self._warn(peer, "%s: refused a tee connection from %s: not an aep_acp_tee hello "
                       "for this agent", self.bridge.name, peer)
            if first["type"] == "websocket.receive":
                await send({"type": "websocket.close", "code": 1008,
                            "reason": "expected an aep_acp_tee hello for this agent"})
            return
        claimed = self._claim(hello)
        if claimed is None:
            self.ctx.health.count("refused")
            self.ctx.health.count("tee_claims_refused")
            self._warn(peer, "%s: refused a tee connection from %s: its tee id belongs to "
                       "another connection", self.bridge.name, peer)
            await send({"type": "websocket.close", "code": wire.CLAIMED,
                        "reason": "tee id in use: mint a new one"})
            return
        tee = self._attach(claimed, hello)
        await send({"type": "websocket.send",
                    "text": json.dumps({"aep_acp_daemon": 1, "resume": tee.key})})
        await self._control(tee, {"stats": hello["stats"]})
        scope_ = trio.CancelScope()
        self._handlers.add(scope_)
        try:
            with scope_:
                while True:
                    msg = await receive()
                    if msg["type"] == "websocket.disconnect":
                        return
                    data = msg.get("bytes")
                    if data:
                        while self._queued > QUEUE_BYTES:
                            await self._room.park()
                        self._queued += len(data)
                        try:
                            await self._send.send((tee, data))
                        except BaseException:  # not queued after all (cancelled, closed)
                            self._queued -= len(data)
                            raise
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            self._handlers.discard(scope_)
            self._detach(tee)
        if scope_.cancelled_caught:  # the bridge stopped: tell the tee to come back later
            with trio.move_on_after(1):
                try:
                    await send({"type": "websocket.close", "code": 1012, "reason": "restarting"})
                except Exception:  # noqa: BLE001 -- the connection may be gone already
                    pass
