"""The Kimi web receiver: discovery, the observer socket, REST reads, and
the per-run state (:class:`Receiver` is built by the bridge's ``run()`` and
lives exactly as long as that run).

Design record: ``shared/aep/docs/adapter-kimi-code-design.md`` ("The kimi
web channel"); the 2.1.0 drifts: ``tests/fixtures/kimi_web_real/README.md``.

- **Attach**: :func:`bridges.kimi_web.discovery.resolve` before every
  connect (so a restarted server on a new port and a rotated token are
  followed without a daemon restart); ``/api/v1/ws`` with the subprotocol
  ``kimi-code.bearer.<token>`` (the token is never in a URL);
  ``server_hello`` -> ``client_hello`` -> ``GET /api/v1/sessions`` (paged)
  -> ``subscribe {session_ids, cursors}``; each ``event.session.created``
  on the global channel subscribes its session (with the announcing frame's
  position as the cursor, so nothing between the announcement and the
  subscription is lost). While attached, a watcher re-resolves every
  :data:`WATCH_S` seconds and reconnects when the instance or the token
  changed.
- **Liveness**: every ``ping {nonce}`` is answered ``pong {nonce}`` at once
  (2.1.0 closes a socket after two missed 10 s heartbeats); a socket silent
  for :data:`SILENT_HEARTBEATS` heartbeats is dropped and reattached
  (health ``degraded`` meanwhile); the announced ``heartbeat_ms`` is clamped
  to 1 s .. 5 min (:func:`heartbeat_s`). The backoff resets only after an
  attachment stayed up :data:`STABLE_S` seconds: a server that accepts and
  drops the socket at once is retried ever more slowly, not every 0.5 s.
- **Resume**: the per-session cursors ``{seq, epoch}`` (acked by the server,
  advanced by every persisted frame) ride the next ``subscribe``; the server
  replays what was missed, the tracker drops the overlap by ``(session,
  epoch, seq)``. ``resync_required`` (or a ``resync_required`` list in an
  ack) rebuilds from REST (:meth:`Tracker.resync`). Sessions subscribed
  without a cursor that are busy or waiting on an interaction are rebuilt
  too, so a run or an ask that predates the attach is seen; so is one woken
  by a later global frame (not its creation) and, once the attach's
  subscribes are acked, one the listing again finds working or new (the
  first listing precedes the socket: :meth:`VendorRest._relist`).
- **State** and **REST**: :mod:`bridges.kimi_web.rest` (the receiver's base,
  :class:`~bridges.kimi_web.rest.VendorRest`).

Counters (``ctx.health.counters``): ``frames``, ``frames_not_json``,
``frames_malformed``, ``frames_volatile``, ``frames_global``,
``frames_duplicate``, ``frames_unknown``, ``socket_connects``,
``socket_errors``, ``socket_auth_failed``, ``socket_silent``,
``socket_too_large``, ``sessions_subscribed``, ``sessions_dormant``, ``rest_errors``,
``sessions_evicted``, ``sessions_wake_refused`` (:data:`MAX_WOKEN`),
``frames_held_overflow`` (:data:`MAX_HELD`, :data:`MAX_HELD_BYTES`, :data:`MAX_HELD_TOTAL`),
``reannounced``, ``reannounce_skipped``, ``sessions_moved_while_attaching``,
``sessions_made_while_attaching``,
``discovery_failed``, ``reattach_endpoint_changed``, ``state_write_errors``; and
the tracker's (:mod:`bridges.kimi_web.tracker`): ``frames_duplicate``,
``resyncs``, ``tool_results_unpaired``, ``turn_ended_without_run``,
``asks_repeated``, ``asks_already_settled``, ``asks_unknown``,
``frames_unmappable``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import httpx
import trio
import trio_websocket

from bridges.core.backoff import backoff_delay
from bridges.core.bridge import BridgeContext
from bridges.core.ledger import Unreachable

from . import discovery
from . import mapping as M
from .config import KimiWebConfig
from .mapping import DEFAULT_HEARTBEAT_S, heartbeat_s  # noqa: F401 - DEFAULT_HEARTBEAT_S re-exported
from .rest import AuthRefused, VendorError, VendorRest, state_path, working
from .tracker import GLOBAL, Out, Tracker

log = logging.getLogger("aep.bridge.kimi_web")

WATCH_S = 1.0
SILENT_HEARTBEATS = 3
HELLO_TIMEOUT = 10.0
REST_TIMEOUT = 10.0
MAX_FRAME = 16 * 1024 * 1024
MAX_HELD = 2000
#: bytes of frames held for one session between its subscribe and the ack,
#: and for all sessions together (frames are up to :data:`MAX_FRAME`)
MAX_HELD_BYTES, MAX_HELD_TOTAL = 32 * 1024 * 1024, 64 * 1024 * 1024
#: sessions subscribed because a frame named them (not in the REST listing):
#: beyond this the least recently woken one without an open run or ask is
#: unsubscribed and forgotten (``sessions_evicted``); when none can be, the
#: new one is not subscribed (``sessions_wake_refused``)
MAX_WOKEN = 500
BACKOFF_INITIAL, BACKOFF_CAP = 0.5, 30.0
#: an attachment that stayed up this long resets the backoff (one that the
#: server accepts and drops at once keeps backing off)
STABLE_S = 30.0
CLIENT_ID = "aep-bridges"


class Silent(Exception):
    """No frame for :data:`SILENT_HEARTBEATS` heartbeats."""


class Receiver(VendorRest):
    """One bridge run's receiver (see the module docstring). ``tracker``
    holds the mapping state; ``ctx`` is the bridge context; ``client`` the
    REST client (its own when ``None``)."""

    def __init__(self, config: KimiWebConfig, tracker: Tracker, ctx: BridgeContext, *,
                 client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.tracker = tracker
        self.ctx = ctx
        self._client = client
        self.endpoint: discovery.Endpoint | None = None
        self.ws: trio_websocket.WebSocketConnection | None = None
        self.subscribed: set[str] = set()
        #: listed by REST but ``not_found`` at subscribe (2.1.0: not loaded yet)
        self.dormant: set[str] = set()
        self.attached = trio.Event()
        self._attached_at: float | None = None
        self._n = 0
        #: subscribes awaiting their ack: frame id -> the sessions it still
        #: answers for (an eviction takes its session out), and the reverse
        self._pending_subs: dict[str, list[str]] = {}
        self._pending_of: dict[str, str] = {}
        #: frames of a session between its subscribe and the ack (the replay
        #: and global-channel copies interleave; sorted by seq at the ack)
        self._held: dict[str, list[dict[str, Any]]] = {}
        self._held_bytes: dict[str, int] = {}
        self._held_total = 0
        self._held_cut: set[str] = set()  # sessions whose held frames overflowed
        self._listed: set[str] = set()
        self._woken: dict[str, None] = {}  # insertion order = LRU
        self._no_cursor: set[str] = set()
        self._recheck: set[str] = set()
        #: the attach's own subscribes still awaiting their ack (the
        #: re-listing waits for all of them: :meth:`VendorRest._relist`)
        self._first_acks: set[str] = set()
        self._restarted: set[str] = set()
        self._state_path = state_path(config)
        # one set of counters: the tracker's (duplicates, unpaired results,
        # settled asks...) show in /healthz beside the receiver's
        tracker.counters = ctx.health.counters
        self._restore()
        #: what the state file restored as open, re-announced at the first
        #: attach of this run (a restarted daemon's fresh relay learns the claims)
        self._reannounce = tracker.open_envelopes()

    # -- the loop ----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Attach, follow, reattach with the shared backoff, until cancelled."""
        own = self._client is None
        client = self._client or httpx.AsyncClient(trust_env=False, timeout=REST_TIMEOUT)
        self._client = client
        health = self.ctx.health
        attempt = 0
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._flusher)
                while True:
                    try:
                        self.endpoint = discovery.resolve(self.config)
                    except discovery.NotFound as e:
                        health.source, health.detail = False, str(e)
                        health.count("discovery_failed")
                    else:
                        outcome = await self._attach_once(self.endpoint)
                        if outcome == "reattach":
                            self.ws, self.attached, attempt = None, trio.Event(), 0
                            continue
                        if outcome == "ok" and self._attached_at is not None \
                                and trio.current_time() - self._attached_at >= STABLE_S:
                            attempt = 0
                    self.ws = None
                    self.attached = trio.Event()
                    await trio.sleep(backoff_delay(attempt, BACKOFF_INITIAL, BACKOFF_CAP))
                    attempt += 1
        finally:
            self.flush_state()
            if own:
                with trio.CancelScope(shield=True):
                    await client.aclose()

    async def _attach_once(self, ep: discovery.Endpoint) -> str:
        """One attachment; ``"reattach"`` (the endpoint changed), ``"ok"``
        (it ended after attaching) or ``"failed"``. Every failure is counted
        and shown in health, never raised (cancellation is)."""
        health = self.ctx.health
        try:
            await self._attach(ep)
            return "ok"
        except Exception as exc:  # noqa: BLE001 - classified below, nothing escapes
            e = root_cause(exc)
        if isinstance(e, _Reattach):
            health.count("reattach_endpoint_changed")
            return "reattach"
        if isinstance(e, AuthRefused):
            health.count("socket_auth_failed")
            health.source, health.detail = False, "kimi web refused the token"
        elif isinstance(e, Silent):
            health.count("socket_silent")
            health.source, health.detail = "degraded", "kimi web socket went silent"
        elif isinstance(e, trio_websocket.ConnectionClosed):
            code = getattr(e.reason, "code", None)
            if code == 1009:
                health.count("socket_too_large")
            health.count("socket_errors")
            health.source, health.detail = False, f"kimi web socket closed ({code})"
        elif isinstance(e, (trio_websocket.HandshakeError, OSError, httpx.TransportError, Unreachable,
                            VendorError, trio.TooSlowError)):
            health.count("socket_errors")
            health.source, health.detail = False, f"kimi web: {type(e).__name__}"
        else:
            health.count("socket_errors")
            log.warning("%s: attachment failed: %s", self.ctx.name, type(e).__name__)
            health.source, health.detail = False, f"kimi web: {type(e).__name__}"
        was = self.attached.is_set()
        return "ok" if was else "failed"

    def _adopt_secret(self, token: str) -> None:
        """A discovered token is a secret value like ``AEP_KIMI_WEB_TOKEN``:
        content that quotes it (a tool printing ``server.token``) is redacted
        by value at ``redacted``+ (AEP-0003 §9.4 b), in this bridge's stamper
        and mapping posture."""
        def plus(policy: Any) -> Any:
            if token in policy.secret_values:
                return policy
            return dataclasses.replace(policy, secret_values=(*policy.secret_values, token))
        stamper = getattr(self.ctx, "stamper", None)
        if stamper is not None:
            stamper.policy = plus(stamper.policy)
        posture = self.tracker.posture
        self.tracker.posture = dataclasses.replace(posture, policy=plus(posture.policy))

    async def _attach(self, ep: discovery.Endpoint) -> None:
        self._adopt_secret(ep.token)
        ws_url = ep.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/api/v1/ws"
        # REST first: 2.1.0 answers a wrong token on REST with 401 at once but
        # leaves a WS upgrade with one hanging (the connect timeout)
        listing = await self.list_sessions()
        try:
            cm = trio_websocket.open_websocket_url(
                ws_url, subprotocols=[f"kimi-code.bearer.{ep.token}"], max_message_size=MAX_FRAME,
                connect_timeout=HELLO_TIMEOUT, disconnect_timeout=2)
            async with cm as ws:
                self.ctx.health.count("socket_connects")
                self.ws = ws
                await self._serve_socket(ws, listing)
        except trio_websocket.HandshakeError as e:
            status = getattr(e, "status_code", None)
            if status in (401, 403):
                raise AuthRefused(f"WS upgrade {status}") from None
            raise

    async def _serve_socket(self, ws: trio_websocket.WebSocketConnection,
                            listing: tuple[list[dict[str, Any]], bool]) -> None:
        with trio.fail_after(HELLO_TIMEOUT):
            hello = M.parse_frame(await ws.get_message())
        if not isinstance(hello, dict) or hello.get("type") != "server_hello":
            raise VendorError(0, "no server_hello")
        heartbeat = heartbeat_s(M.obj(hello.get("payload")).get("heartbeat_ms"))
        await self._send(ws, "client_hello", {"client_id": CLIENT_ID})
        if self._reannounce:
            restored, self._reannounce = self._reannounce, []
            await self.ctx.reannounce(restored)
        sessions, complete = listing
        ep = self.endpoint
        assert ep is not None
        self.subscribed, self.dormant = set(), set()
        # a new socket: nothing of the old one is pending
        self._held, self._pending_subs, self._pending_of = {}, {}, {}
        self._held_bytes, self._held_total, self._held_cut = {}, 0, set()
        ids = [s["id"] for s in sessions]
        self._listed, self._woken = set(ids), {}
        cursors = self.tracker.cursors()
        busy = {s["id"] for s in sessions if working(s)}
        self._no_cursor = {sid for sid in ids if sid not in cursors and sid in busy}
        # idle at the listing, no cursor (no replay): the listing again after
        # the acks rebuilds those that moved before the subscribe
        self._recheck = {sid for sid in ids if sid not in cursors and sid not in busy}
        known = set(ids)
        if complete:  # a session missing from a complete listing is gone (deleted or archived)
            for sid in [s for s in list(self.tracker.sessions) if s not in known]:
                await self._emit(self.tracker.gone(sid))
        await self.subscribe(ids)
        self._first_acks = set(self._pending_subs)
        self.ctx.health.source, self.ctx.health.detail = True, None
        self._attached_at = trio.current_time()
        self.attached.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, ep)
            if not self._first_acks:  # nothing listed: nothing to ack first
                self._start_relist(nursery)
            try:
                while True:
                    with trio.move_on_after(heartbeat * SILENT_HEARTBEATS) as cs:
                        raw = await ws.get_message()
                    if cs.cancelled_caught:
                        raise Silent()
                    await self._on_raw(ws, raw, nursery)
            finally:
                nursery.cancel_scope.cancel()

    async def _watch(self, ep: discovery.Endpoint) -> None:
        """Reattach when discovery says another instance or another token.
        Discovery failing while attached (the token file made 0644 or
        unreadable, the instance file gone) keeps the socket but says so in
        ``health.detail`` (the message names the file, never the token;
        counted ``discovery_failed_attached``): the next reattach would fail."""
        health = self.ctx.health
        warned: str | None = None
        while True:
            await trio.sleep(WATCH_S)
            try:
                now = discovery.resolve(self.config)
            except discovery.NotFound as e:
                # the socket itself will tell when the server is gone
                if warned is None:
                    health.count("discovery_failed_attached")
                warned = f"attached, but discovery fails now: {e}"
                health.detail = warned
                continue
            if warned is not None:
                if health.detail == warned:
                    health.detail = None
                warned = None
            if now.key != ep.key or now.token != ep.token:
                raise _Reattach()

    def _frame_id(self) -> str:
        self._n += 1
        return f"aep-{self._n}"

    async def _send(self, ws: Any, type_: str, payload: dict[str, Any], fid: str | None = None) -> str:
        fid = fid or self._frame_id()
        await ws.send_message(json.dumps({"type": type_, "id": fid, "payload": payload}))
        return fid

    async def subscribe(self, sids: list[str], cursors: dict[str, Any] | None = None) -> None:
        """``subscribe`` (in chunks of 100) with the cursors we hold."""
        ws = self.ws
        if ws is None:
            return
        known = self.tracker.cursors()
        for i in range(0, len(sids), 100):
            chunk = [s for s in sids[i:i + 100] if s not in self.subscribed]
            if not chunk:
                continue
            cur = {s: (cursors or {}).get(s) or known[s] for s in chunk
                   if (cursors or {}).get(s) or s in known}
            payload: dict[str, Any] = {"session_ids": chunk}
            if cur:
                payload["cursors"] = cur
            self.subscribed.update(chunk)
            # pending before the send: the ack can be read (and an eviction
            # happen) before this task runs again
            fid = self._frame_id()
            self._pending_subs[fid] = chunk
            for sid in chunk:
                self._held.setdefault(sid, [])
                self._pending_of[sid] = fid
            await self._send(ws, "subscribe", payload, fid)

    async def _on_raw(self, ws: Any, raw: Any, nursery: trio.Nursery) -> None:
        """One text frame off the socket (see the module docstring)."""
        h = self.ctx.health
        h.count("frames")
        frame = M.parse_frame(raw)
        if frame is M.NOT_JSON:
            h.count("frames_not_json")
        elif not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            h.count("frames_malformed")
        elif frame["type"] in M.PROTOCOL_TYPES:
            await self._on_protocol(ws, frame, nursery)
        elif M.silent(frame):
            h.count("frames_volatile")
        else:
            await self._on_event(frame, len(raw) if isinstance(raw, (str, bytes)) else 0)

    async def _on_protocol(self, ws: Any, frame: dict[str, Any], nursery: trio.Nursery) -> None:
        t, p = frame["type"], M.obj(frame.get("payload"))
        if t == "ping":
            await ws.send_message(json.dumps({"type": "pong", "payload": {"nonce": p.get("nonce")}}))
        elif t == "ack":
            await self._on_ack(frame, nursery)
        elif t == "resync_required":
            sid = p.get("session_id")
            if isinstance(sid, str) and sid in self.subscribed:  # only what we follow
                self._drop_held(sid)
                nursery.start_soon(self._resync, sid, {"seq": p.get("current_seq"), "epoch": p.get("epoch")})
        elif t == "error":
            self.ctx.health.count("frames_error")
            if p.get("fatal") is True:
                code = p.get("code")
                raise VendorError(code if isinstance(code, int) else 0, "fatal WS error")

    async def _on_event(self, frame: dict[str, Any], size: int = 0) -> None:
        h = self.ctx.health
        sid = frame.get("session_id")
        if not isinstance(sid, str) or not sid:
            h.count("frames_malformed")
            return
        if sid == GLOBAL:
            h.count("frames_global")
            return
        if sid not in self.subscribed:
            await self._wake(sid, frame)
            return
        held = self._held.get(sid)
        if held is not None:
            mine = self._held_bytes.get(sid, 0)
            if len(held) < MAX_HELD and mine + size <= MAX_HELD_BYTES \
                    and self._held_total + size <= MAX_HELD_TOTAL:
                held.append(frame)
                self._held_bytes[sid] = mine + size
                self._held_total += size
            else:
                self._held_cut.add(sid)
                h.count("frames_held_overflow")  # the rebuild at the ack covers them
            return
        await self._process(frame)

    async def _wake(self, sid: str, frame: dict[str, Any]) -> None:
        """A frame for a session we are not subscribed to (announced on the
        global channel: a new session, or one 2.1.0 reported not_found at
        subscribe because it was not loaded yet). It is not mapped here:
        subscribing from our cursor (or from just before this frame) makes
        the server replay it and what follows, in order."""
        seq, epoch = frame.get("seq"), frame.get("epoch")
        st = self.tracker.sessions.get(sid)
        cur = st.cursor if st is not None else None
        if cur is None and frame.get("type") != "event.session.created":
            # never followed, woken by a later global frame (2.1.0's work_changed
            # goes to every socket): what preceded it is rebuilt from REST
            self._no_cursor.add(sid)
        if cur is None and isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 \
                and isinstance(epoch, str):
            cur = {"seq": seq - 1, "epoch": epoch}
        if sid not in self._listed and sid not in self._woken:
            room, evicted = self._room_to_wake()
            if not room:
                self.ctx.health.count("sessions_wake_refused")
                return
            if evicted is not None and self.ws is not None:
                # 2.1.0's protocol has unsubscribe (same payload as subscribe)
                await self._send(self.ws, "unsubscribe", {"session_ids": [evicted]})
        if sid not in self._listed:
            self._woken.pop(sid, None)
            self._woken[sid] = None
        if sid in self.dormant:
            self.dormant.discard(sid)
            self._no_cursor.add(sid)  # rebuilt once accepted: its turn may predate the load
        await self.subscribe([sid], {sid: cur} if cur else None)

    def _room_to_wake(self) -> tuple[bool, str | None]:
        """Room for one more woken session (:data:`MAX_WOKEN`), and the
        session evicted to make it (the least recently woken one without an
        open run or ask), if one was."""
        if len(self._woken) < MAX_WOKEN:
            return True, None
        for old in self._woken:
            st = self.tracker.sessions.get(old)
            if st is None or (st.run is None and not st.asks):
                self._evict(old)
                return True, old
        return False, None

    def _evict(self, sid: str) -> None:
        """Forget a woken session in every per-session structure, its
        subscribe still awaiting an ack included (that ack, when it comes,
        no longer answers for it: nothing it says can bring the session
        back past :data:`MAX_WOKEN`)."""
        del self._woken[sid]
        self.subscribed.discard(sid)
        self.dormant.discard(sid)
        self._no_cursor.discard(sid)
        self._restarted.discard(sid)
        self._held_cut.discard(sid)
        self._drop_held(sid)
        fid = self._pending_of.pop(sid, None)
        chunk = self._pending_subs.get(fid) if fid is not None else None
        if chunk is not None:
            chunk.remove(sid)
            if not chunk:
                del self._pending_subs[fid]  # type: ignore[arg-type]
        self.tracker.forget(sid)
        self.ctx.health.count("sessions_evicted")

    def _follows(self, sid: str) -> bool:
        """``sid`` is still ours (listed, woken or held in the tracker): a
        REST answer that comes back after its eviction is dropped."""
        return sid in self._listed or sid in self._woken or sid in self.tracker.sessions

    def _drop_held(self, sid: str) -> None:
        self._held.pop(sid, None)
        self._held_total -= self._held_bytes.pop(sid, 0)

    async def _process(self, frame: dict[str, Any]) -> None:
        if not self.tracker.accept(frame):
            return  # counted frames_duplicate by the tracker
        outs = self.tracker.frame(frame)
        if not outs and self.tracker.posture.primary is False:
            self.ctx.health.count("frames_unknown")
        await self._emit(outs)

    async def _release(self, sid: str) -> bool:
        """Process the frames held for ``sid`` in ``seq`` order; True when
        some had to be dropped (a rebuild is due)."""
        held = self._held.get(sid) or []
        self._drop_held(sid)
        cut = sid in self._held_cut
        self._held_cut.discard(sid)
        for f in sorted(held, key=M.seq_of):
            await self._process(f)
        return cut

    async def _on_ack(self, frame: dict[str, Any], nursery: trio.Nursery) -> None:
        await self._take_ack(frame, nursery)
        fid = frame.get("id")
        if isinstance(fid, str) and fid in self._first_acks:
            self._first_acks.discard(fid)
            if not self._first_acks:
                self._start_relist(nursery)

    def _start_relist(self, nursery: trio.Nursery) -> None:
        recheck, self._recheck = self._recheck, set()
        nursery.start_soon(self._relist, recheck)

    async def _take_ack(self, frame: dict[str, Any], nursery: trio.Nursery) -> None:
        fid = frame.get("id")
        chunk = self._pending_subs.pop(fid, None) if isinstance(fid, str) else None
        p = M.obj(frame.get("payload"))
        if chunk is None:
            return
        for sid in chunk:
            if self._pending_of.get(sid) == fid:
                del self._pending_of[sid]
        # the ack answers only for the sessions this subscribe still stands
        # for (not one evicted meanwhile, nor one it never named)
        mine = set(chunk)
        if frame.get("code") not in (0, None):
            self.ctx.health.count("subscribe_refused")
            self.subscribed.difference_update(chunk)
            for sid in chunk:
                self._drop_held(sid)
            return
        cursors = M.obj(p.get("cursors"))
        resync = set(x for x in p.get("resync_required") or [] if x in mine)
        not_found = [x for x in p.get("not_found") or [] if x in mine]
        for sid in not_found:
            if isinstance(sid, str):
                # 2.1.0 says not_found for a session that exists but is not
                # loaded (after a restart): REST decides whether it is gone
                self.subscribed.discard(sid)
                nursery.start_soon(self._check_exists, sid)
        for sid in not_found:
            self._drop_held(sid)
        for sid in p.get("accepted") or []:
            if sid not in mine:
                continue
            self.ctx.health.count("sessions_subscribed")
            if sid in resync:
                continue
            overflow = await self._release(sid)
            self.tracker.set_cursor_if_none(sid, cursors.get(sid))
            if sid in self._no_cursor or overflow:
                self._no_cursor.discard(sid)
                nursery.start_soon(self._resync, sid, None)
        for sid in resync:
            self._drop_held(sid)
            nursery.start_soon(self._resync, sid, cursors.get(sid))

    async def _emit(self, outs: list[Out]) -> None:
        prev: dict[str, Any] | None = None
        for o in outs:
            cause = prev["id"] if o.cause_prev and prev is not None else o.cause
            try:
                ev = await self.ctx.emit(o.session, o.emission, run=o.run, cause=cause, time=o.time)
            except ValueError:
                self.ctx.health.count("emit_errors")
                continue
            if o.ask_key is not None:
                self.tracker.bind(o.ask_key, ev)
            elif ev["type"] == "run.started":
                self.tracker.bind_run(o.session, ev)
            prev = ev


class _Reattach(Exception):
    """The watcher saw another instance or token."""


def root_cause(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (a
    nursery wraps what its tasks raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
