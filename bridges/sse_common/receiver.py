"""The SSE receiver: owns the vendor stream, liveness, reconnects, reconcile
and the degraded-stream watchdog. All state decisions live in the pure
:class:`~bridges.sse_common.tracker.Tracker`; this module only does I/O.

**Which stream** (verified on both real servers,
``tests/fixtures/opencode_real/README.md``): the per-instance ``GET /event``
is scoped to ONE project directory, so a session started in another
directory never appears on it. ``GET /global/event`` carries every
instance's events (each wrapped with its ``directory``), so the bridge reads
the global stream only and remembers each session's directory for the REST
calls that concern it (``?directory=``).

**Liveness**: the servers send ``server.heartbeat`` every 10 s; a stream
silent for ``heartbeat_timeout`` (default 30 s, three intervals) is dropped
and reconnected. Any error (connect, HTTP status, framing, auth) reconnects
with capped exponential backoff and jitter (never a hot loop, a wrong
password included); each distinct problem is logged once, at the moment it
starts, and ``health.source`` is ``False`` while it lasts.

**Reconcile**: the stream has no replay (no SSE ids), so after every
(re)connect the REST surface is read (busy sessions, pending permissions and
questions, the last messages of the sessions concerned) and
:meth:`Tracker.reconcile` closes or reopens what changed unseen.

**Degraded**: a stream that stays connected but carries only heartbeats
while a busy session visibly progresses over REST (its latest message
changes between two checks) is a known vendor failure; it is reported once
in the log and as ``health.source = "degraded"`` until session events flow
again.

Bad input never kills the task: frames that are not JSON, not objects, or
have no ``type`` are counted (``frames_not_json``...) and skipped; frames
larger than :data:`~bridges.sse_common.frames.MAX_FRAME` are skipped
(``frames_oversize``); an event that grows past twice that without ending
drops the connection (``stream_overflow``) and reconnects.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import httpx
import trio
from httpx_sse import EventSource, SSEError

from bridges.core.backoff import backoff_delay
from bridges.core.bridge import BridgeContext, Saturated
from bridges.core.rest import parse_json

from .control import ReadOnlyClient
from .frames import MAX_FRAME, FrameError, parse_frame
from .mapping import _d, _l
from .profile import SseProfile
from .tracker import Out, Tracker

log = logging.getLogger("aep.sse.receiver")


@dataclass
class ReceiverSettings:
    """Timing knobs (seconds). ``heartbeat_timeout``: silence before a
    reconnect; ``backoff_initial``/``backoff_max``: reconnect delays (full
    jitter in ``[0.5, 1] * delay``); ``stable_after``: a connection that lived
    this long resets the backoff; ``degraded_interval``: how often a quiet
    stream is checked against REST; ``recent_sessions``: on reconcile,
    directories of sessions updated this recently are read too;
    ``reconcile_retry``: delay before re-running a partial reconcile;
    ``max_frame``: largest event data parsed (characters)."""

    heartbeat_timeout: float = 30.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    stable_after: float = 30.0
    degraded_interval: float = 15.0
    recent_sessions: float = 3600.0
    request_timeout: float = 10.0
    reconcile_retry: float = 2.0
    max_frame: int = MAX_FRAME


class AuthFailed(Exception):
    pass


class NoResponse(Exception):
    """The stream request was accepted but no response headers came within
    ``request_timeout`` (a server mid-restart)."""


class HttpStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class StreamOverflow(Exception):
    pass


class StreamSilent(Exception):
    pass


def safe_url(url: str) -> str:
    """``url`` without any userinfo (credentials never reach a log line)."""
    p = urllib.parse.urlsplit(url)
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return urllib.parse.urlunsplit((p.scheme, host, p.path, "", ""))


class _Bounded:
    """A response view for :class:`httpx_sse.EventSource` that refuses to
    buffer one SSE event beyond ``limit`` characters (memory bound against a
    never-ending line or data block)."""

    def __init__(self, response: httpx.Response, limit: int,
                 on_read: Callable[[], None] | None = None) -> None:
        self._r = response
        self._limit = limit
        self._on_read = on_read or (lambda: None)
        self.headers = response.headers

    async def aiter_text(self) -> AsyncIterator[str]:
        pending = 0
        tail = ""
        async for text in self._r.aiter_text():
            joined = tail + text
            cut = max(joined.rfind("\n\n"), joined.rfind("\r\r"), joined.rfind("\n\r\n"))
            pending = len(joined) - cut if cut >= 0 else pending + len(text)
            if pending > self._limit:
                raise StreamOverflow()
            tail = joined[-3:]
            self._on_read()  # the read that brought it may have let other tasks run
            yield text


class SseReceiver:
    """Reads one vendor server's global event stream into the tracker and
    emits what it returns. ``reader`` is the GET-only client; ``ctx`` the
    bridge context (emit + health)."""

    def __init__(self, profile: SseProfile, reader: ReadOnlyClient, tracker: Tracker,
                 ctx: BridgeContext, *, url: str, settings: ReceiverSettings | None = None,
                 rng=random.random, persist: Callable[[], None] | None = None) -> None:
        self.profile = profile
        self.reader = reader
        self.tracker = tracker
        self.ctx = ctx
        self.url = url
        self.settings = settings or ReceiverSettings()
        self.rng = rng
        self.persist = persist or (lambda: None)
        self.connected = False
        self.degraded = False
        self.session_frames = 0
        self._problem: str | None = None
        self.connects = 0
        self.reconcile_pending = False
        #: what the state file restored as open, re-announced at the first
        #: connect (a restarted daemon's fresh relay learns the claims)
        self._reannounce = tracker.open_envelopes()
        #: the stream being read (its scope: :meth:`_silence_watch` cancels
        #: it) and since when it has been waiting for a frame (``inf``: not
        #: waiting, e.g. while a frame is handled)
        self._read_scope: trio.CancelScope | None = None
        self._waiting_since = math.inf
        #: the relay channel's room as :meth:`emit` last counted it for the
        #: stream's frames (``None``: unknown). Valid until the reading task
        #: lets others run: only in a network read (each new chunk of the
        #: stream forgets it) or waiting for room (``emit`` forgets it)
        self._room: int | float | None = None

    # -------------------------------------------------------------- running
    async def run(self) -> None:
        """Forever: connect, reconcile, read; on any failure back off and
        reconnect. Returns only when cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watchdog)
            nursery.start_soon(self._silence_watch)
            nursery.start_soon(self._reconcile_retry)
            attempt = 0
            while True:
                t0 = trio.current_time()
                try:
                    await self._connect_and_read()
                    self._trouble("ended", f"{self.profile.agent} closed the event stream",
                                  logging.INFO)
                except AuthFailed:
                    self._trouble("auth", f"{self.profile.agent} refused the credentials "
                                  f"(HTTP 401) at {safe_url(self.url)}: check "
                                  f"{self.profile.env}_USERNAME / {self.profile.env}_PASSWORD",
                                  logging.ERROR)
                    self.ctx.health.count("auth_failures")
                except HttpStatus as e:
                    self._trouble(f"http{e.status}", f"{self.profile.agent} answered the event "
                                  f"stream with HTTP {e.status} at {safe_url(self.url)}",
                                  logging.WARNING)
                except StreamSilent:
                    self.ctx.health.count("stream_silent")
                    self._trouble("silent", f"{self.profile.agent} event stream silent for "
                                  f"{self.settings.heartbeat_timeout:g}s (no heartbeat); "
                                  "reconnecting", logging.WARNING)
                except NoResponse:
                    self.ctx.health.count("stream_no_response")
                    self._trouble("noresponse", f"{self.profile.agent} event stream at "
                                  f"{safe_url(self.url)} sent no response within "
                                  f"{self.settings.request_timeout:g}s; reconnecting",
                                  logging.WARNING)
                except StreamOverflow:
                    self.ctx.health.count("stream_overflow")
                    self._trouble("overflow", f"{self.profile.agent} sent an event larger than "
                                  f"{2 * self.settings.max_frame} characters; reconnecting",
                                  logging.WARNING)
                except SSEError as e:
                    self._trouble("sse", f"{self.profile.agent} event stream at "
                                  f"{safe_url(self.url)} is not SSE (SSEError: {e})",
                                  logging.WARNING)
                except (httpx.HTTPError, OSError) as e:
                    # nothing listening is the usual first-run cause: say what to start
                    hint = (f" (nothing answers there: is `{self.profile.serve_command}` running "
                            f"at {safe_url(self.url)}? {self.profile.env}_URL names it)"
                            if isinstance(e, (httpx.ConnectError, ConnectionRefusedError)) else "")
                    self._trouble(f"net:{type(e).__name__}", f"{self.profile.agent} event stream "
                                  f"at {safe_url(self.url)} failed: {type(e).__name__}{hint}",
                                  logging.WARNING)
                self._set_disconnected()
                if trio.current_time() - t0 >= self.settings.stable_after:
                    attempt = 0
                delay = backoff_delay(attempt, self.settings.backoff_initial,
                                      self.settings.backoff_max, self.rng)
                attempt += 1
                self.ctx.health.count("reconnects")
                await trio.sleep(delay)

    def _trouble(self, key: str, line: str, level: int) -> None:
        """Log a problem once per episode (repeats go to debug)."""
        self.ctx.health.detail = line
        if key != self._problem:
            self._problem = key
            log.log(level, "%s: %s", self.ctx.name, line)
        else:
            log.debug("%s: %s", self.ctx.name, line)

    def _set_disconnected(self) -> None:
        self.connected = False
        self.ctx.health.source = False

    async def _connect_and_read(self) -> None:
        path = self.profile.route("global_events")
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        timeout = httpx.Timeout(self.settings.request_timeout, read=None)
        async with contextlib.AsyncExitStack() as stack:
            # read=None keeps a quiet stream open; the response headers still
            # get a deadline (a server mid-restart can accept and never answer)
            with trio.move_on_after(self.settings.request_timeout) as opening:
                response = await stack.enter_async_context(
                    self.reader.stream_get(path, headers=headers, timeout=timeout))
            if opening.cancelled_caught:
                raise NoResponse()
            if response.status_code in (401, 403):
                raise AuthFailed()
            if response.status_code != 200:
                raise HttpStatus(response.status_code)
            ctype = response.headers.get("content-type", "").partition(";")[0].strip()
            if ctype != "text/event-stream":
                raise SSEError(f"content-type {ctype or 'missing'}, not text/event-stream")
            source = EventSource(_Bounded(response, 2 * self.settings.max_frame,  # type: ignore[arg-type]
                                          self._forget_room))
            events = source.aiter_sse()
            self.connected = True
            self.connects += 1
            if self._problem is not None or self.connects == 1:
                log.info("%s: connected to %s%s", self.ctx.name, safe_url(self.url), path)
            self._problem = None
            self.ctx.health.detail = None
            self.ctx.health.source = "degraded" if self.degraded else True
            if self._reannounce:
                restored, self._reannounce = self._reannounce, []
                await self.ctx.reannounce(restored)
            await self.reconcile()
            try:
                await self._read(events)
            finally:
                await events.aclose()

    async def _read(self, events: AsyncIterator[Any]) -> None:
        """Handle the stream's frames until it ends; :class:`StreamSilent`
        when no frame came for ``heartbeat_timeout`` seconds of waiting
        (the time a frame's handling takes, emitting included, which may
        wait for room on the relay channel, does not count)."""
        with trio.CancelScope() as cs:
            self._read_scope = cs
            try:
                self._waiting_since = trio.current_time()
                while True:
                    try:
                        sse = await events.__anext__()
                    except StopAsyncIteration:
                        return
                    self._waiting_since = math.inf
                    await self.handle_data(sse.data, stream=True)
                    self._waiting_since = trio.current_time()
            finally:
                self._read_scope = None
                self._waiting_since = math.inf
        if cs.cancelled_caught:
            raise StreamSilent()

    async def _silence_watch(self) -> None:
        """The heartbeat deadline of :meth:`_read`: cancels the read once it
        has waited ``heartbeat_timeout`` for a frame. A task of its own, so
        a frame costs two attribute writes and a clock read instead of
        moving a cancel scope's deadline twice (trio re-files the deadline
        each time: that was ~5% of the whole path, issue 11)."""
        timeout = self.settings.heartbeat_timeout
        while True:
            now = trio.current_time()
            due = self._waiting_since + timeout
            if now >= due and self._read_scope is not None:
                self._read_scope.cancel()
                self._waiting_since = math.inf
                due = math.inf
            await trio.sleep_until(min(due, now + timeout))

    async def handle_data(self, data: str, *, stream: bool = False) -> None:
        """One SSE ``data`` payload: parse, feed, emit (counting what is
        skipped). ``stream``: the payload is a frame :meth:`_read` took off
        the stream (see :meth:`emit`)."""
        counters = self.ctx.health.counters
        counters["frames"] = counters.get("frames", 0) + 1
        if not data:
            self.ctx.health.count("frames_empty")
            return
        try:
            ev = parse_frame(data, wrapped=True, max_frame=self.settings.max_frame)
        except FrameError as e:
            self.ctx.health.count(f"frames_{e.reason}")
            log.debug("%s: skipped a frame (%s)", self.ctx.name, e.reason)
            return
        if ev.malformed:
            self.ctx.health.count("frames_no_properties")
        if ev.session is not None:
            self.session_frames += 1
            if self.degraded:
                self.degraded = False
                self.ctx.health.source = True
                log.info("%s: session events flow again; stream no longer degraded",
                         self.ctx.name)
        fed = self.tracker.fed  # what this feed counts (no copy of every counter per frame)
        fed.clear()
        try:
            outs = self.tracker.feed(ev)
        except (RecursionError, ValueError, TypeError) as e:
            # a hostile or broken frame (e.g. ~1000-deep tool input blowing
            # the digest's recursion) is skipped and counted, never a crash
            # loop of the whole bridge
            self.ctx.health.count("frames_unmappable")
            log.warning("%s: skipped a frame the mapping could not handle (%s)",
                        self.ctx.name, type(e).__name__)
            return
        if fed:
            for k, v in fed.items():
                self.ctx.health.count(k, v)
        if outs:
            await self.emit(outs, stream=stream)
        else:
            self.persist()

    def _forget_room(self) -> None:
        self._room = None

    async def emit(self, outs: list[Out], *, stream: bool = False) -> None:
        """Stamp and send ``outs`` in order, then persist what changed.

        While the relay channel has room the envelopes go on it without a
        checkpoint (:meth:`BridgeContext.emit_nowait`): the fleet's pump
        then takes what the frames of one network read produced as one
        batch (one JSONL ``write`` per session) instead of waking per
        event; the next read of the stream is the checkpoint. A full
        channel waits for room (:meth:`BridgeContext.emit`), as before.
        The room is not asked for up front: ``emit_nowait`` is tried (a
        refusal stamps nothing, :class:`~bridges.core.bridge.Saturated`),
        and only once the channel was found full is its room counted
        (:meth:`BridgeContext.room`, once per wait), so a trickle of one
        event per read asks trio's channel statistics never (issue 11).
        ``stream``: ``outs`` come from a frame of the stream being read
        (:meth:`handle_data`): the room counted for the frames before it in
        the same chunk still holds (no other task ran since)."""
        ctx = self.ctx
        # None: not counted (try, and count once refused); a number: counted
        room = self._room if stream else None
        self._room = None
        for o in outs:
            try:
                envelope = None
                if room is None or room > 0:
                    try:
                        envelope = ctx.emit_nowait(o.session, o.emission, run=o.run,
                                                   cause=o.resolved_cause(),
                                                   room_seen=room is not None)
                    except Saturated:
                        room = 0
                    else:
                        if room is not None:
                            room -= 1
                if envelope is None:
                    envelope = await ctx.emit(o.session, o.emission, run=o.run,
                                              cause=o.resolved_cause())
                    room = ctx.room()
                    stream = False  # other tasks ran: nothing counted before holds
                o.envelope = envelope
                self.tracker.touch(o.session)  # its entry may carry this envelope (an ask)
                if envelope["type"] == "run.started":
                    self.tracker.bind_run(o.session, envelope)
            except ValueError as e:  # an envelope the stamper refuses: count, go on
                self.ctx.health.count("emit_errors")
                log.warning("%s: could not stamp %s: %s", self.ctx.name,
                            o.emission.get("type"), e)
        if stream:
            self._room = room
        self.persist()

    # -------------------------------------------------------------- REST reads
    async def _get_json(self, path: str, directory: str | None = None,
                        params: dict[str, Any] | None = None) -> Any:
        q = dict(params or {})
        if directory:
            q["directory"] = directory
        r = await self.reader.get(path, params=q, timeout=self.settings.request_timeout)
        if r.status_code in (401, 403):
            raise AuthFailed()
        if r.status_code != 200:
            raise HttpStatus(r.status_code)
        return parse_json(r.content, r.status_code)  # past the bounds: BadAnswer, a ValueError

    async def _recent_directories(self) -> set[str]:
        try:
            sessions = await self._get_json(self.profile.route("sessions"),
                                            params={"limit": 50})
        except (httpx.HTTPError, HttpStatus, ValueError):
            return set()
        horizon = (time.time() - self.settings.recent_sessions) * 1000
        out = set()
        for s in sessions if isinstance(sessions, list) else []:
            if not isinstance(s, dict) or not isinstance(s.get("directory"), str):
                continue
            updated = (s.get("time") or {}).get("updated") if isinstance(s.get("time"), dict) else 0
            if isinstance(updated, (int, float)) and updated >= horizon:
                out.add(s["directory"])
        return out

    async def _status(self, directory: str | None) -> dict[str, str]:
        status = await self._get_json(self.profile.route("status"), directory)
        busy = {}
        for sid, s in (status.items() if isinstance(status, dict) else []):
            t = s.get("type") if isinstance(s, dict) else None
            if isinstance(sid, str) and t not in (None, "idle"):
                busy[sid] = t
        return busy

    async def _messages(self, sid: str, directory: str | None, limit: int = 20) -> list[Any]:
        msgs = await self._get_json(self.profile.route("messages", session=sid), directory,
                                    {"limit": limit})
        return msgs if isinstance(msgs, list) else []

    async def _reconcile_retry(self) -> None:
        """A reconcile that could not read every directory (the server was
        still starting, a read timed out) is retried while connected."""
        while True:
            await trio.sleep(self.settings.reconcile_retry)
            if self.connected and self.reconcile_pending:
                try:
                    await self.reconcile()
                except (httpx.HTTPError, HttpStatus, AuthFailed, ValueError):
                    self.ctx.health.count("reconcile_errors")

    async def reconcile(self) -> None:
        """Read the REST snapshot and let the tracker settle what changed
        while the stream was away (primary mode only; companion owns no
        runs or asks). Directories that could not be read are left as they
        are (counted) and the whole reconcile is retried shortly
        (:attr:`reconcile_pending`); the tracker never emits a thing twice."""
        if not self.tracker.primary:
            return
        dirs: set[str | None] = {None} | self.tracker.directories()
        dirs |= await self._recent_directories()
        queried: set[str | None] = set()
        busy: dict[str, str] = {}
        directory_of: dict[str, str] = {}
        perms: list[Any] = []
        questions: list[Any] = []
        for d in dirs:
            try:
                b = await self._status(d)
                p = await self._get_json(self.profile.route("permissions"), d)
                q = await self._get_json(self.profile.route("questions"), d)
            except (httpx.HTTPError, HttpStatus, ValueError) as e:
                self.ctx.health.count("reconcile_errors")
                log.debug("%s: reconcile read failed for a directory: %s", self.ctx.name,
                          type(e).__name__)
                continue
            queried.add(d)
            for sid, t in b.items():
                busy[sid] = t
                if d:
                    directory_of[sid] = d
            perms += p if isinstance(p, list) else []
            questions += q if isinstance(q, list) else []
        messages: dict[str, list[Any]] = {}
        complete = queried == dirs
        for sid in self.tracker.needs_messages(busy, queried):
            st = self.tracker.sessions.get(sid)
            d = directory_of.get(sid) or (st.directory if st else None)
            try:
                messages[sid] = await self._messages(sid, d)
            except (httpx.HTTPError, HttpStatus, ValueError):
                self.ctx.health.count("reconcile_errors")
                complete = False
                # without its messages a run's end cannot be told apart: keep
                # the session's directory out of this pass
                if st is not None and st.run is not None and sid not in busy:
                    queried.discard(st.directory)
        outs = self.tracker.reconcile(queried=queried, busy=busy, permissions=perms,
                                      questions=questions, messages=messages,
                                      directory_of=directory_of)
        self.ctx.health.count("reconciles")
        self.reconcile_pending = not complete
        await self.emit(outs)

    # -------------------------------------------------------------- degraded
    async def _fingerprints(self) -> dict[str, str]:
        dirs: set[str | None] = {None} | self.tracker.directories()
        fps: dict[str, str] = {}
        for d in dirs:
            for sid in await self._status(d):
                msgs = await self._messages(sid, d, limit=1)
                fps[sid] = json.dumps([_fingerprint(m) for m in msgs], sort_keys=True)
        return fps

    async def _watchdog(self) -> None:
        """Every ``degraded_interval``: if no session event arrived since
        the last check while connected, compare busy sessions' latest
        messages over REST; a change the stream did not carry means the
        stream is degraded."""
        prev: dict[str, str] = {}
        seen = self.session_frames
        while True:
            await trio.sleep(self.settings.degraded_interval)
            if not self.connected or self.session_frames != seen:
                seen = self.session_frames
                prev = {}
                continue
            try:
                fps = await self._fingerprints()
            except (httpx.HTTPError, HttpStatus, AuthFailed, ValueError):
                prev = {}
                continue
            if self.session_frames != seen:  # events arrived while we looked
                seen = self.session_frames
                prev = {}
                continue
            changed = [sid for sid, fp in fps.items() if sid in prev and prev[sid] != fp]
            prev = fps
            if changed and not self.degraded and self.connected:
                self.degraded = True
                self.ctx.health.source = "degraded"
                self.ctx.health.count("degraded")
                log.warning("%s: the %s event stream is connected but silent while session "
                            "%s progresses over REST: stream degraded (vendor side); "
                            "events are being missed", self.ctx.name, self.profile.agent,
                            changed[0])


def _fingerprint(m: Any) -> Any:
    if not isinstance(m, dict):
        return None
    info = _d(m.get("info"))
    parts = _l(m.get("parts"))
    return [info.get("id"), info.get("time"), info.get("finish"),
            [(p.get("id"), (p.get("state") or {}).get("status")
              if isinstance(p.get("state"), dict) else None,
              len(p.get("text") or "") if isinstance(p.get("text"), str) else None)
             for p in parts if isinstance(p, dict)]]
