"""The OpenHands receiver: discovery, one observer socket per conversation,
run synthesis and the attention loop (receiver state). Issue 26 split it
along its seams: the discovery loop is :mod:`bridges.openhands.discovery`,
the per-conversation state :mod:`bridges.openhands.conversation`, the state
document :mod:`bridges.openhands.store` (the first and last are the
:class:`Receiver`'s bases); the sockets, run synthesis and the attention
loop stay here.

Design record: ``shared/aep/docs/bridge-openhands-design.md`` ("Attach
shape", "Identity", "Run synthesis", "The attention loop", "Timestamps",
"Discovery", "The opt-in control gate" for the notes control sets).

- **Discovery**: ``GET /api/conversations/search`` (paged, ``limit=100``,
  at most :data:`MAX_PAGES` pages a poll) every ``poll`` seconds; failures
  back off exponentially (1 s doubling to :data:`MAX_BACKOFF`) with jitter.
  A conversation missing from a COMPLETE listing is confirmed gone with
  ``GET /api/conversations/{id}`` (404) before it is detached: the real
  server deletes without broadcasting ``deleting`` to observers, so the
  vanish is the observed fact and closes the session like the ``deleting``
  transition (attention dismissed, run cancelled, ``session.ended``
  ``killed``).
- **One socket per conversation** on ``/sockets/events/{id}``: the
  first-message auth frame (``{"type": "auth", "session_api_key": ...}``) is
  the ONLY frame this module ever writes (:meth:`Receiver._socket_once`
  is the one ``send_message`` call site, gate on or off); the key is never in
  a URL and never logged. First attach replays everything
  (``resend_mode=all``); a reconnect replays since the anchor
  (``resend_mode=since&after_timestamp=<the last persisted vendor
  timestamp seen>``), and the vendor event id dedupes the overlap. The
  anchor advances with every persisted event (never with the ephemeral
  ``full_state`` snapshot the server pushes first to every subscriber,
  which is newer than the history that follows it).
- **Run synthesis** from the server's own ``execution_status`` facts
  (:func:`bridges.openhands.mapping.status_moments` with the receiver's own
  ``run_open``). The connect snapshot states the PRESENT, then the replay
  states the PAST: the snapshot's status is held as pending and applied
  once a newer frame arrives or the replay delivered the newest persisted
  event (asked over REST right after the snapshot; the socket going quiet
  decides only when REST could not say), and a status fact older than the
  last one applied is never applied (still mapped).
- **Per-conversation bounded state** (:class:`Conversation`): status, the
  open run, the pending attention, the anchor and a ring of
  :data:`SEEN_IDS` recent vendor ids; persisted as one entry of the
  server's state document ``{AEP_STATE_DIR}/openhands/<server>.json`` and
  its journal (:mod:`bridges.core.statefile`, the SSE bridges' own) so a
  restarted daemon reattaches with ``since`` and emits no duplicates, no
  second ``session.started`` and no dangling run or attention. Written by
  one writer task (:meth:`Receiver.persist`): a status change queues its
  conversation, written :data:`STATE_LINGER` later with whatever else
  changed meanwhile, every conversation's in one journal ``write`` (one
  for a replay's burst, not one a change nor a file a conversation). The
  old layout (a file per conversation under ``.../openhands/<server>/``)
  is carried into the document at the first load.

Counters (``ctx.health.counters``): ``frames``, ``frames_not_json``,
``frames_malformed``, ``frames_duplicate``, ``search_errors``,
``search_pages_capped``, ``search_bad_items``, ``socket_connects``,
``socket_errors``, ``socket_auth_failed``, ``conversations_attached``,
``conversations_detached``, ``conversations_capped``, ``state_write_errors``,
``frames_timed_out``.
"""
from __future__ import annotations

import json
import logging
import urllib.parse
from datetime import datetime
from typing import Any, Callable

import httpx
import trio
import trio_websocket

from bridges.core import aep
from bridges.core.backoff import backoff_delay
from bridges.core.bridge import BridgeContext, Emission, Envelope, Saturated, keepable
from bridges.core.errors import leaves
from bridges.core.posture import Posture
from bridges.core.rest import MAX_BODY, fetch, parse_json
from bridges.core.statefile import StateFile, state_path

from . import mapping as M
from .config import OpenHandsConfig
from .conversation import Conversation, _parse_ts
from .discovery import MAX_BACKOFF, AuthRefused, Discovery, _why
from .store import ConversationStore, _server_key

log = logging.getLogger("aep.bridge.openhands")

SNAPSHOT_QUIET = 0.5
"""Seconds of socket silence after which a held connect snapshot applies
when the replay's end is unknown (the REST read of the newest event failed)."""
MARKER_WAIT = 60.0
"""Seconds of socket silence after which a held snapshot applies although
the replay never delivered the newest event REST named (a last resort)."""
REST_TIMEOUT = 10.0
ATTACH_CONCURRENCY = 8
"""Socket handshakes (connect, HTTP upgrade) in flight at once, over all
conversations. A discovery that lists a thousand conversations used to start
a thousand handshakes together: their transient objects (h11 requests and
responses, header lists, the first replayed frames) filled new allocator
pools between the long-lived per-socket objects, and the holes stayed
resident once they were freed (36-37 KiB RSS per idle conversation at 1,000
over a 22 KiB Python heap; 25-26 KiB in waves of 8, attached in about half
the time on a loopback server). A handshake holds its slot for at most
:data:`REST_TIMEOUT`."""
CLOSE_TIMEOUT = 2.0
"""Seconds the close handshake of a socket may take before it is dropped."""
MAX_FRAME = 16 * 1024 * 1024
FRAME_DEADLINE = 10.0
"""Seconds one frame's emissions may wait for room on the relay channel."""


class Gone(Exception):
    """The conversation does not exist on the server (socket 4004)."""


class _FrameTimedOut(Exception):
    """A frame's emissions waited past its deadline for room on the relay
    channel (raised by :meth:`Receiver._emit`, caught by
    :meth:`Receiver.handle_raw`)."""


def _frame_json(raw: str | bytes) -> Any:
    """A socket frame's JSON value, exactly ``json.loads(raw)`` (same value,
    same exceptions: ``ValueError``, ``TypeError``, ``RecursionError``): read
    with the project's strict reader :func:`bridges.core.aep.loads` (the C
    scanner without ``json.loads``'s wrappers, and whatever faster reader
    that module adopts), and with ``json.loads`` again only when the strict
    reader refuses the text (``NaN``/``Infinity``, which a vendor frame may
    carry, or not JSON at all: then ``json.loads`` gives the answer). Equal
    to ``json.loads`` by a property test, for text within
    :func:`bridges.core.aep.check_json`'s caps: over them ``ValueError``
    before any parse (counted ``frames_not_json``)."""
    aep.check_json(raw)
    try:
        return aep.loads(raw)
    except ValueError:
        return json.loads(raw)


Settings = OpenHandsConfig
"""The receiver's configuration is the bridge's (:mod:`bridges.openhands.config`)."""


class ReadOnlyRest:
    """The receiver's REST client: GET only (the read-only posture is a
    property of this class: there is no other method). The session key
    rides the ``X-Session-API-Key`` header, never the URL."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def get(self, path: str, params: dict[str, Any] | None = None, *,
                  max_bytes: int = MAX_BODY) -> httpx.Response:
        """``GET path``, read within :func:`bridges.core.rest.fetch`'s bounds,
        ``max_bytes`` at most (raises its ``BadAnswer``, a ``ValueError``;
        ``httpx.HTTPError``)."""
        return await fetch(self._client, "GET", path, params=params, max_bytes=max_bytes)


def rest_client(settings: Settings, **kw: Any) -> httpx.AsyncClient:
    headers = {"X-Session-API-Key": settings.key} if settings.key else {}
    return httpx.AsyncClient(base_url=settings.url, headers=headers,
                             timeout=kw.pop("timeout", REST_TIMEOUT), trust_env=False, **kw)



class Receiver(Discovery, ConversationStore):
    """Runs discovery and the per-conversation sockets for one server.

    ``ctx``: the bridge's :class:`bridges.core.bridge.BridgeContext`;
    ``rest``: a :class:`ReadOnlyRest`; ``decorate``: called with each
    ``attention.requested`` emission before it is stamped (the control gate
    adds options and the respond path; ``None`` gated off)."""

    def __init__(self, settings: Settings, posture: Posture, ctx: BridgeContext,
                 rest: ReadOnlyRest, *,
                 decorate: Callable[[Emission], None] | None = None,
                 ws_connect: Callable[..., Any] | None = None) -> None:
        self.settings = settings
        self.posture = posture
        self.ctx = ctx
        self.rest = rest
        self.decorate = decorate
        self._ws_connect = ws_connect or trio_websocket.connect_websocket_url
        self.conversations: dict[str, Conversation] = {}
        self._nursery: trio.Nursery | None = None
        self._auth_logged: set[str] = set()
        self._socket_refused: set[str] = set()
        self._rest_refused = False
        p = urllib.parse.urlsplit(settings.url)
        self._ws_base = ("wss" if p.scheme == "https" else "ws") + "://" + p.netloc + p.path.rstrip("/")
        self._host = p.netloc
        self._persisting = False  # persist() runs: state writes are queued for it
        self._state_due: dict[str, Conversation] = {}
        self._state_wake = trio.Event()
        #: one document + journal per server, ``{AEP_STATE_DIR}/openhands/{server}.json``
        #: (``_state_dir`` below: the old layout's directory, :meth:`_migrate`)
        self._state = (StateFile(state_path(settings.state_dir, "openhands", settings.url))
                       if settings.state_dir else None)
        self._state_open = False  # loaded (:meth:`_opened`)
        self._state_dir = (settings.state_dir / "openhands" / _server_key(settings.url)
                           if settings.state_dir else None)
        self._attaching = trio.CapacityLimiter(ATTACH_CONCURRENCY)

    # ------------------------------------------------------------------ health
    def _source(self, value: bool | str, detail: str | None = None) -> None:
        self.ctx.health.source = value
        if detail is not None:
            self.ctx.health.detail = detail

    def _auth_failed(self, where: str, conv: Conversation | None = None) -> None:
        """Latch an auth refusal: ``source`` false, ONE clear log line per
        episode and channel (``REST API`` / ``events socket``), no key."""
        if conv is not None:
            self._socket_refused.add(conv.id)
            self.ctx.health.count("socket_auth_failed")
        else:
            self._rest_refused = True
            self.ctx.health.count("search_errors")
        self._source(False, f"session API key refused ({where})")
        if where not in self._auth_logged:
            self._auth_logged.add(where)
            log.error("the OpenHands agent server at %s refused the session API key on the %s; "
                      "check AEP_OPENHANDS_SESSION_API_KEY (retrying with backoff)",
                      self.settings.url, where)

    def _socket_ok(self, conv: Conversation) -> None:
        if conv.id in self._socket_refused:
            self._socket_refused.discard(conv.id)
            if not self._socket_refused:
                self._auth_logged.discard("events socket")
                if not self._rest_refused and self.ctx.health.source is not True:
                    self._source(True)
                    self.ctx.health.detail = None

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self._state is not None:
                await nursery.start(self.persist)
            task_status.started()
            try:
                await self._discover_loop()
            finally:
                self._nursery = None

    async def _detach(self, conv: Conversation, *, vanished: bool) -> None:
        """Stop observing ``conv``. ``vanished``: the server no longer has it,
        so the deletion closes the session (attention dismissed, run
        cancelled, ``session.ended`` ``killed``) and its state file goes."""
        if not conv.detached:
            conv.detached = True  # the task does not reconnect
            if conv.scope is not None:
                conv.scope.cancel()
            if conv.done is None:
                conv.done = trio.Event()
            with trio.move_on_after(10):
                await conv.done.wait()
        self.conversations.pop(conv.id, None)
        self.ctx.health.count("conversations_detached")
        if vanished and not conv.ended:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self._transition(conv, M.DELETING, None, cause=None)
        if vanished:
            self._forget(conv.id)

    # ------------------------------------------------------------------ one conversation
    async def _conversation_task(self, conv: Conversation) -> None:
        """Observe ``conv`` until it ends or is detached: one connection at a
        time, reconnecting with backoff. Each attempt (its backoff wait
        included) runs in the nursery that owns the connection's reader
        task, whose cancel scope is ``conv.scope`` for :meth:`_detach`: no
        second scope per conversation."""
        failures = 0
        try:
            while not conv.ended and not conv.detached:
                conv.frames_in_conn = 0
                try:
                    async with trio.open_nursery() as nursery:
                        conv.scope = nursery.cancel_scope
                        if failures:
                            await trio.sleep(backoff_delay(failures, 0.5, MAX_BACKOFF))
                        elif conv.reannounce_due:  # a restarted daemon: the fresh relay learns the claim
                            conv.reannounce_due = False
                            await self.ctx.reannounce(conv.open_envelopes())
                        if not conv.started:
                            await self._emit(conv, {"type": "session.started", "data": {
                                "client": {"name": "openhands-agent-server"}, "server": self._host}})
                            conv.started = True
                            self._flush(conv, force=True)
                        await self._socket_once(conv, nursery)
                except Exception as e:  # noqa: BLE001 -- a socket fault never kills the task
                    causes = leaves(e)
                    if any(isinstance(x, AuthRefused) for x in causes):
                        self._auth_failed("events socket", conv)
                    else:
                        self.ctx.health.count("socket_errors")
                        if not any(isinstance(x, Gone) for x in causes):
                            log.info("OpenHands socket for %s dropped (%s); reconnecting",
                                     conv.id, _why(e))
                finally:
                    conv.scope = None
                if conv.frames_in_conn:
                    failures = 0  # the connection worked: reconnect soon
                failures += 1
        finally:
            self._flush(conv, force=True, now=True)
            conv.detached = True  # the task is over
            conv.wake()
            if conv.done is not None:
                conv.done.set()

    def _socket_url(self, conv: Conversation) -> str:
        if conv.anchor:
            q = urllib.parse.urlencode({"resend_mode": "since", "after_timestamp": conv.anchor})
        else:
            q = "resend_mode=all"
        return f"{self._ws_base}/sockets/events/{conv.id}?{q}"

    async def _socket_once(self, conv: Conversation, nursery: trio.Nursery) -> None:
        """One connection: connect, authenticate, read until it closes.
        Raises :class:`AuthRefused` (close 4001), :class:`Gone` (4004) or the
        transport's own error (``trio_websocket.HandshakeError`` subclasses
        for a refused or timed-out connect, as ``open_websocket_url``).

        The connection's reader task runs in the caller's ``nursery``
        (``connect_websocket_url``), not under ``open_websocket_url``'s
        context manager: that suspended async generator (its frame, three
        closures, an ``outcome``) and its own nursery stayed alive for as
        long as the socket was open, ~1.5 KiB per attached conversation.
        At most :data:`ATTACH_CONCURRENCY` handshakes run at once."""
        try:
            async with self._attaching:
                with trio.fail_after(REST_TIMEOUT):
                    # one message read ahead per connection: a replay storm over a
                    # thousand sockets holds one frame each in memory, not 16
                    ws = await self._ws_connect(nursery, self._socket_url(conv), max_message_size=MAX_FRAME,
                                                message_queue_size=1)
        except trio.TooSlowError:
            raise trio_websocket.ConnectionTimeout from None
        except OSError as e:
            raise trio_websocket.HandshakeError from e
        try:
            await self._read(conv, ws)
        finally:
            with trio.move_on_after(CLOSE_TIMEOUT) as closing:
                await ws.aclose()
            if closing.cancelled_caught:  # the peer never answered the close: drop the reader
                nursery.cancel_scope.cancel()

    async def _read(self, conv: Conversation, ws: trio_websocket.WebSocketConnection) -> None:
        """Authenticate, then hand each frame to :meth:`handle_raw` until the
        conversation ends or the socket closes (see :meth:`_socket_once`)."""
        self.ctx.health.count("socket_connects")
        # The one frame this bridge ever writes to the server's socket.
        await ws.send_message(json.dumps({"type": "auth", "session_api_key": self.settings.key or ""}))
        conv.pending_snap, conv.replay_marker, conv.marker_due = None, None, False
        while not conv.ended:
            raw: str | bytes | None = None
            quiet_s: float | None = None  # idle: no timer (a scope per socket costs memory)
            if conv.pending_snap is not None:
                quiet_s = SNAPSHOT_QUIET if conv.replay_marker is None else MARKER_WAIT
            try:
                if quiet_s is None:
                    raw = await ws.get_message()
                else:
                    with trio.move_on_after(quiet_s):
                        raw = await ws.get_message()
            except trio_websocket.ConnectionClosed as e:
                code = getattr(e.reason, "code", None)
                if code == 4001:
                    raise AuthRefused() from None
                if code == 4004:
                    raise Gone() from None
                raise
            if raw is None:  # None only when the quiet timer fired
                await self._apply_pending(conv)
                continue
            conv.frames_in_conn += 1
            if conv.frames_in_conn == 1:
                self._socket_ok(conv)
            await self.handle_raw(conv, raw)
            if conv.marker_due:
                await self._learn_replay_end(conv)

    async def _learn_replay_end(self, conv: Conversation) -> None:
        """A connect snapshot is held: ask REST for the newest persisted
        event (read AFTER the snapshot was made, so every event older than
        the snapshot is at or before it). The replay (or the live feed)
        delivering that id ends the hold, whatever the clock says: a loaded
        server that starts its replay late no longer gets its snapshot
        applied first (which made the replayed run's facts stale and lost
        run.started / run.failed). No events at all: it applies now."""
        conv.marker_due = False
        try:
            r = await self.rest.get(f"/api/conversations/{conv.id}/events/search",
                                    {"limit": 1, "sort_order": "TIMESTAMP_DESC"})
            items = parse_json(r.content).get("items") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            items = None
        if not isinstance(items, list):
            conv.replay_marker = None  # unknown: the quiet rule decides
            return
        newest = items[0].get("id") if items and isinstance(items[0], dict) else None
        conv.replay_marker = newest if isinstance(newest, str) and newest else ""
        if conv.replay_marker == "" or conv.replay_marker in conv.seen:
            await self._apply_pending(conv)

    # ------------------------------------------------------------------ frames
    async def handle_raw(self, conv: Conversation, raw: str | bytes) -> None:
        """Process one socket frame (shielded with a deadline, so a frame's
        emissions land whole even when the bridge is being stopped)."""
        self.ctx.health.count("frames")
        try:
            ev = _frame_json(raw)
        except (TypeError, ValueError, RecursionError):  # RecursionError: nested too deep
            self.ctx.health.count("frames_not_json")
            return
        if not isinstance(ev, dict) or not isinstance(ev.get("kind"), str) or not ev["kind"]:
            self.ctx.health.count("frames_malformed")
            return
        # No cancel scope per frame (it cost more than mapping the frame): a
        # frame only ever waits in _emit's slow path, which shields itself
        # with the frame's deadline (conv.in_frame says a frame is in hand).
        conv.in_frame = True
        try:
            await self.handle_event(conv, ev)
            self._flush(conv)
        except _FrameTimedOut:  # the relay channel stayed full: part of the frame is lost
            self.ctx.health.count("frames_timed_out")
            log.warning("OpenHands frame for %s not fully delivered within %ss (relay channel full)",
                        conv.id, FRAME_DEADLINE)
        finally:
            conv.in_frame = False
            conv.frame_deadline = None

    async def handle_event(self, conv: Conversation, ev: dict[str, Any]) -> None:
        eid = ev.get("id")
        reached = False
        if isinstance(eid, str) and eid:
            reached = conv.pending_snap is not None and eid == conv.replay_marker
            if not conv.remember(eid):
                self.ctx.health.count("frames_duplicate")
                if reached:
                    await self._apply_pending(conv)
                return
        ts = ev.get("timestamp")
        if not isinstance(ts, str):
            ts = None
        tdt = _parse_ts(ts)
        snap, status, ephemeral = M.frame_facts(ev)
        if snap:
            conv.snapshot_seen(ts)
        if conv.pending_snap is not None and not snap:
            pdt = _parse_ts(conv.pending_snap[0])
            if tdt is not None and (pdt is None or tdt >= pdt):
                await self._apply_pending(conv)
        fresh = status if status is not None and self._fresh(conv, tdt) else None
        cause = None
        if fresh is not None and not snap and fresh != conv.status:
            cause = self._note_cause(conv, fresh)
        conv.dirty = True
        env = None
        for emission in M.map_event(ev, self.posture):
            # _emit's fast path without its coroutine (one per emission,
            # every frame); a full channel takes _emit's waiting path
            try:
                env = self.ctx.emit_nowait(conv.id, emission, run=conv.run_id, cause=cause)
            except Saturated:
                env = await self._emit(conv, emission, cause=cause)
        if fresh is not None:
            if snap:
                conv.pending_snap = (ts, fresh, env["id"] if env else None)
                conv.replay_marker, conv.marker_due = None, True
            else:
                await self._transition(conv, fresh, ts, cause=env["id"] if env else None)
        if reached and conv.pending_snap is not None and not snap:
            await self._apply_pending(conv)  # the replay is past the snapshot
        if not ephemeral:
            conv.advance_anchor(ts, tdt)

    def _fresh(self, conv: Conversation, tdt: datetime | None) -> bool:
        """A status fact is applied unless it is older than the last one."""
        sdt = _parse_ts(conv.status_ts)
        return tdt is None or sdt is None or tdt >= sdt

    async def _apply_pending(self, conv: Conversation) -> None:
        pend, conv.pending_snap = conv.pending_snap, None
        if pend is None:
            return
        ts, status, env_id = pend
        if status != conv.status and self._fresh(conv, _parse_ts(ts)):
            await self._transition(conv, status, ts, cause=env_id)
            self._flush(conv)

    def _note_cause(self, conv: Conversation, new: str) -> str | None:
        """The command a status flip answers (the record's pending notes):
        pause/interrupt -> ``paused``, resume -> out of ``paused``, a settling
        respond -> out of ``waiting_for_confirmation``."""
        n = conv.notes
        if conv.status == M.WAITING and conv.settling is not None:
            return conv.settling.cmd_id
        if new == M.PAUSED and (n.get("pause") or n.get("interrupt")):
            return n.get("pause") or n.get("interrupt")
        if conv.status == M.PAUSED and new == M.RUNNING and n.get("resume"):
            return n["resume"]
        return None

    async def _transition(self, conv: Conversation, new: str, ts: str | None, *,
                          cause: str | None) -> None:
        """Apply one status change: emit its moments (runs, attention, session
        end), cause-linked to the status event or the settling command."""
        prev = conv.status
        if ts is not None:
            conv.status_ts = ts
        if new == prev:
            return
        settle = conv.settling if prev == M.WAITING else None
        moments = M.status_moments(prev, new, run_open=conv.run_id is not None)
        conv.status = new
        conv.wake()  # an approval waiting on the vendor re-checks
        conv.notes.clear()
        if prev == M.WAITING:
            conv.settling = None
        conv.dirty = True
        for m in moments:
            t = m["type"]
            if t == "attention.resolved":
                if conv.attention_id is None:
                    continue  # no request of ours is open: nothing to resolve
                subject = conv.attention_id
                data = dict(m["data"])
                if conv.attention_t0 is not None:
                    data["latency_ms"] = max(0, int((trio.current_time() - conv.attention_t0) * 1000))
                link = cause
                if settle is not None and data["resolution"] == "answered":
                    link = settle.cmd_id
                    await self._emit(conv, {"type": "attention.answered", "subject": subject,
                                            "data": {"answer": settle.answer, "via": "control"}},
                                     cause=link)
                await self._emit(conv, {"type": "attention.resolved", "subject": subject, "data": data},
                                 cause=link)
                conv.attention_id = None
                conv.attention_envelope = None
                conv.attention_t0 = None
            elif t == "attention.requested":
                em = m.copy()
                em["data"] = dict(m["data"])
                if self.decorate is not None:
                    self.decorate(em)
                env = await self._emit(conv, em, cause=cause)
                conv.attention_id = env["id"]
                conv.attention_envelope = keepable(env)
                conv.attention_t0 = trio.current_time()
            elif t == "run.started":
                conv.run_n += 1
                conv.run_id = f"run:{conv.id}:{conv.run_n}"
                conv.run_envelope = keepable(await self._emit(conv, m, cause=cause))
            elif t in ("run.finished", "run.failed", "run.cancelled"):
                await self._emit(conv, m, cause=cause)
                conv.run_id = None
                conv.run_envelope = None
            elif t == "session.ended":
                await self._emit(conv, m, cause=cause)
                conv.ended = True
            else:  # pragma: no cover - the table has no other moments
                await self._emit(conv, m, cause=cause)
        self._flush(conv, force=True)

    async def _emit(self, conv: Conversation, emission: Emission, *,
                    cause: str | None = None, framed: bool = True) -> Envelope:
        """Stamp and send one emission of ``conv``. No checkpoint while the
        channel has room (a frame's emissions stay together). When it is
        full inside :meth:`handle_raw` (``framed`` and ``conv.in_frame``) the
        wait is shielded from the bridge's own cancellation until the
        frame's deadline (:data:`FRAME_DEADLINE` from its first wait), past
        which :class:`_FrameTimedOut` abandons the rest of the frame."""
        try:
            return self.ctx.emit_nowait(conv.id, emission, run=conv.run_id, cause=cause)
        except Saturated:
            if not (framed and conv.in_frame):
                return await self.ctx.emit(conv.id, emission, run=conv.run_id, cause=cause)
        if conv.frame_deadline is None:
            conv.frame_deadline = trio.current_time() + FRAME_DEADLINE
        with trio.CancelScope(shield=True, deadline=conv.frame_deadline):
            return await self.ctx.emit(conv.id, emission, run=conv.run_id, cause=cause)
        raise _FrameTimedOut()

    async def emit_outcome(self, session: str, emission: Emission, cause: str) -> None:
        """For control: an outcome event in ``session`` (its open run)."""
        conv = self.conversations.get(session)
        if conv is None:
            await self.ctx.emit(session, emission, cause=cause)
        else:
            await self._emit(conv, emission, cause=cause, framed=False)


