"""The uplink: one bridge identity as its own AEP emitter on a remote relay's
WebSocket binding (AEP-0003 §3.5, §4, §8; AEP-0004 §4.1; DESIGN.md
"Identity", "Delivery"; issue 2 §4 "The uplink").

One :class:`Uplink` per bridge, used by the fleet when ``AEP_RELAY_URL`` is
set::

    up = Uplink(cfg.relay_url, cfg.token, hello, member.inbox)
    await nursery.start(up.run)         # returns at once; connects in the background
    await up.put(event)                 # from the fleet's pump, after the JSONL log
    up.connected, up.counters           # /healthz
    await up.close("shutdown")          # flush (bounded), `closing` frame, WS close 1001

The connection, per attempt:

1. WebSocket to ``{url}/socket`` (``http``->``ws``, ``https``->``wss``),
   ``Authorization: Bearer {AEP_TOKEN}`` when a token is set (never logged).
2. Our ``hello`` first (role ``emitter``; the fleet builds it from the
   bridge's ``capabilities()``); then the relay's ``hello`` within
   ``hello_timeout`` selecting exactly one version we offered. An ``error``
   frame (``version-unsupported``, ``unauthorized``, ...) or any other answer
   ends the attempt (logged once per code, counted).
3. Events flow from the :class:`supervisor.delivery.outbox.Outbox` in order, never
   before ``hello`` completed. A written event leaves the outbox only when
   a ``pong`` answers a ``ping`` sent after it; on reconnect the
   unconfirmed ones are sent again first (at-least-once; the relay's and
   consumers' ``(source, id)`` dedupe collapses the copies).
4. Inbound: ``ping`` -> ``pong`` (echoing ``t``); ``pong`` -> confirmation;
   commands (:func:`bridges.core.aep.is_command_type`: the AEP-0004 §5
   set and ``x.{vendor}.control.*``; any other Event is counted
   ``malformed_frames``) -> the bridge's control inbox with ``send_nowait`` (a full inbox
   drops the command, counted; the sender's retry with the same ``id`` is
   the recovery, AEP-0004 §2.3); ``error`` / ``closing`` frames logged and
   counted; anything else ignored (unknown frames MUST be ignored, §2).
5. Liveness: a ``ping`` every ``ping_interval`` s (and one after every burst
   of events, for confirmation); a ping unanswered for ``ping_timeout`` s
   means a dead peer. Whichever comes first of a send/receive error, a
   close, or a dead peer ends the connection; the next attempt waits a
   capped exponential backoff with full jitter (reset after a connection
   that lived ``stable_after`` s).

Backpressure (AEP-0003 §8.4): the outbox is bounded (``outbox_size``);
under pressure it sheds ``debug`` then ``info`` (counted in
``counters["dropped_debug"|"dropped_info"|"dropped"]``); when only
``notice``+ events remain, :meth:`Uplink.put` waits for room, which stops
the fleet's pump and so pushes back on every bridge (OTLP answers 503).
"""
from __future__ import annotations

import json
import logging
from collections import deque
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from bridges.core.aep import SUPPORTED_VERSIONS, dumps, is_command
from bridges.core.backoff import backoff_delay

from .outbox import Outbox

__all__ = ["Uplink", "UplinkError", "socket_url", "redact_url", "encode", "is_command"]

log = logging.getLogger("aep.uplink")


class UplinkError(Exception):
    """One connection attempt ended; ``code`` names why (counted)."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


def socket_url(base: str) -> str:
    """``{base}/socket`` with ``http``->``ws`` and ``https``->``wss``
    (``ws``/``wss`` kept). Raises ``ValueError`` for any other scheme or a
    missing host."""
    parts = urlsplit(base.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        raise ValueError(f"not an http(s)/ws(s) URL with a host: {redact_url(base)!r}")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/socket", parts.query, ""))


def redact_url(url: str) -> str:
    """The URL without userinfo, query or fragment (safe to log)."""
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        if p.port:
            host = f"{host}:{p.port}"
        return urlunsplit((p.scheme, host, p.path, "", ""))
    except ValueError:
        return "<unparsable url>"


def encode(event: dict[str, Any]) -> str:
    """The text frame for one Event or frame: its wire JSON
    (:func:`bridges.core.aep.dumps`; raises ``UnicodeEncodeError`` for a
    lone surrogate, ``ValueError`` for ``NaN``, ``TypeError`` for non-JSON)."""
    return dumps(event).decode("utf-8")


class Uplink:
    """One emitter connection to a remote relay, with its outbox. See the
    module docstring for the protocol.

    Parameters: ``url`` (``AEP_RELAY_URL``; ``ValueError`` if unusable),
    ``token`` (``AEP_TOKEN`` or ``None``), ``hello`` (the AEP-0003 §4 emitter
    hello, sent verbatim; ``type``/``versions``/``role`` filled in if
    absent), ``commands_send`` (the owning bridge's control inbox).
    Keywords: ``outbox_size`` (live events held, default 10000),
    ``window`` (written-but-unconfirmed events, default ``outbox_size //
    4``), ``backoff`` (``(initial, cap)`` seconds, default ``(0.5, 30)``),
    ``ping_interval`` (s, 30), ``ping_timeout`` (s, 90), ``hello_timeout``
    (s, 10), ``connect_timeout`` (s, 10), ``flush_deadline`` (s, 2: how long
    :meth:`close` waits for the outbox to drain), ``stable_after`` (s, 10),
    ``max_frame`` (characters per event frame, default 16 MiB like the
    relay's ``AEP_MAX_BODY``; a larger event is not sent, counted
    ``oversize`` and logged: a relay would close on it, and re-sending it
    would wedge the outbox).

    Public state: ``connected`` (``hello`` completed and the connection is
    up), ``counters`` (a snapshot dict for ``/healthz``), ``outbox``."""

    def __init__(self, url: str, token: str | None, hello: dict[str, Any],
                 commands_send: trio.MemorySendChannel, *, outbox_size: int = 10000,
                 window: int | None = None, backoff: tuple[float, float] = (0.5, 30.0),
                 ping_interval: float = 30.0, ping_timeout: float = 90.0,
                 hello_timeout: float = 10.0, connect_timeout: float = 10.0,
                 flush_deadline: float = 2.0, stable_after: float = 10.0,
                 max_frame: int = 16 << 20) -> None:
        self.url = socket_url(url)
        self._safe_url = redact_url(self.url)
        self._headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.hello = {"type": "hello", "versions": list(SUPPORTED_VERSIONS), "role": "emitter",
                      **hello}
        ident = self.hello.get("identity") or {}
        self.name = str(ident.get("agent") or "?")
        self.commands_send = commands_send
        self.outbox = Outbox(outbox_size, window)
        self.backoff = backoff
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.hello_timeout = hello_timeout
        self.connect_timeout = connect_timeout
        self.flush_deadline = flush_deadline
        self.stable_after = stable_after
        self.max_frame = max_frame
        self.connected = False
        self.version: str | None = None
        self._changed = trio.lowlevel.ParkingLot()  # any outbox/connection change
        self._outstanding: deque[tuple[int, float]] = deque()  # (ping n, sent at)
        self._last_ping = 0.0
        self._closing = False
        self._close_reason = "shutdown"
        self._wake = trio.Event()  # cuts a backoff sleep short on close()
        self._running = False
        self._stopped = trio.Event()
        self._run_scope: trio.CancelScope | None = None
        #: trio.current_time() of the relay's last refusal of one of our
        #: events (an ``error`` frame with a ``cause``): health turns red (#8)
        self.refused_at: float | None = None
        self._c: dict[str, int] = {
            "sent": 0, "connects": 0, "disconnects": 0, "connect_failures": 0,
            "commands": 0, "commands_dropped": 0, "relay_errors": 0, "malformed_frames": 0,
            "pings": 0, "dead_peer": 0, "put_waits": 0, "undelivered_at_close": 0,
            "oversize": 0,
        }
        self._logged_codes: set[str] = set()
        self._hello_done = False
        self._said_closing = False
        self._lost: list[BaseException] = []

    # -- public --------------------------------------------------------------
    @property
    def counters(self) -> dict[str, int]:
        """Monotonic counts plus the gauges ``outbox`` (live events) and
        ``unconfirmed``; the outbox's ``dropped*``/``confirmed``/``rewound``."""
        return {**self._c, **self.outbox.counters, "outbox": len(self.outbox),
                "unconfirmed": self.outbox.unconfirmed}

    async def put(self, event: dict[str, Any], redelivery: bool = False, *,
                  wire: str | None = None) -> None:
        """Queue one envelope for the relay (``redelivery``: a byte-identical
        re-send, AEP-0004 §3; queued like any event). Sheds debug/info under
        pressure (counted); waits while the outbox is full of ``notice``+.
        After :meth:`close` began, never waits: what does not fit is counted
        ``undelivered_at_close`` (it is in the JSONL log). ``wire``: the
        event's text frame when the caller already encoded it (the fleet's
        pump: encoded once, for the log and here)."""
        if wire is None:
            wire = encode(event)
        if len(wire) > self.max_frame:
            # a relay closes the socket on an oversized message (1009): queued,
            # it would be re-sent forever and wedge the outbox behind it
            self._c["oversize"] += 1
            log.error("uplink %s: event %s is %d chars, over the %d frame limit; not sent "
                      "(it is in the JSONL log)", self.name, event.get("id"), len(wire),
                      self.max_frame)
            return
        sev = event.get("severity")
        waited = False
        dropped = self.outbox.counters["dropped"]
        while True:
            r = self.outbox.offer(wire, sev, event.get("id"))
            if r != "full":
                if self.outbox.counters["dropped"] != dropped:
                    self._log_drop()
                break
            if self._closing:
                self._c["undelivered_at_close"] += 1
                return
            if not waited:
                self._c["put_waits"] += 1
                waited = True
            await self._changed.park()
        self._changed.unpark_all()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, stream, reconnect, until :meth:`close` (or cancellation).
        Calls ``task_status.started()`` at once: a relay that is down at
        start never holds the daemon up; the outbox holds events meanwhile."""
        self._running = True
        attempt = 0
        try:
            with trio.CancelScope() as self._run_scope:
                task_status.started()
                while True:
                    t0 = trio.current_time()
                    self._hello_done = False
                    try:
                        await self._connect_once()
                        if self._closing and self._said_closing:
                            return  # flushed and closed in order
                        raise UplinkError("closed", "relay closed the connection")
                    except (UplinkError, HandshakeError, ConnectionClosed, OSError,
                            trio.TooSlowError) as e:
                        self._note_failure(e, self._hello_done)
                    except Exception as e:  # noqa: BLE001 -- never crash the fleet
                        log.error("uplink %s: unexpected %s", self.name, type(e).__name__,
                                  exc_info=True)
                        self._c["disconnects" if self._hello_done else "connect_failures"] += 1
                    if self._closing:
                        return  # one last try happened above; the JSONL log has the rest
                    if self._hello_done and trio.current_time() - t0 >= self.stable_after:
                        attempt = 0
                    delay = backoff_delay(attempt, *self.backoff)
                    attempt += 1
                    with trio.move_on_after(delay):
                        await self._wake.wait()
        finally:
            self.connected = False
            self._running = False
            self._c["undelivered_at_close"] += len(self.outbox) if self._closing else 0
            self._stopped.set()
            self._changed.unpark_all()

    async def close(self, reason: str = "shutdown") -> None:
        """Orderly end: stop reconnecting, write what the outbox holds and see
        it confirmed (at most ``flush_deadline`` s; if disconnected, one
        immediate connection attempt within that time), send the ``closing``
        frame (AEP-0003 §3.5 item 4) and close the WebSocket with 1001. Then
        :meth:`run` returns. Whatever is left undelivered is counted
        (``undelivered_at_close``) and logged; it stays in the JSONL log.
        Idempotent."""
        self._close_reason = reason
        if not self._closing:
            self._closing = True
            self._wake.set()
            self._changed.unpark_all()
        if not self._running:
            return
        with trio.move_on_after(self.flush_deadline):
            await self._stopped.wait()
        if not self._stopped.is_set():
            left = len(self.outbox)
            log.warning("uplink %s: flush deadline passed with %d event(s) undelivered "
                        "(kept in the JSONL log)", self.name, left)
            if self._run_scope is not None:
                self._run_scope.cancel()
            await self._stopped.wait()

    # -- one connection --------------------------------------------------------
    async def _connect_once(self) -> None:
        """One attempt. Returns after the connection ended without an error
        (our orderly close: ``_said_closing``; or the relay's clean close);
        raises to report why it ended otherwise. ``_hello_done`` tells
        :meth:`run` whether the hello exchange completed."""
        async with open_websocket_url(self.url, extra_headers=self._headers,
                                      connect_timeout=self.connect_timeout,
                                      disconnect_timeout=1.0) as ws:
            await ws.send_message(encode(self.hello))
            with trio.fail_after(self.hello_timeout):
                await self._await_hello(ws)
            self._hello_done = True
            self.connected = True
            self._c["connects"] += 1
            self._logged_codes.clear()
            log.info("uplink %s: connected to %s (AEP %s)", self.name, self._safe_url, self.version)
            self._outstanding.clear()
            self._last_ping = trio.current_time()
            self._lost = []
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(self._guard, self._reader, ws, n)
                    n.start_soon(self._guard, self._keepalive, ws, n)
                    n.start_soon(self._guard, self._sender, ws, n)
            finally:
                self.connected = False
                self._outstanding.clear()
                rewound = self.outbox.rewind()
                self._changed.unpark_all()
                if rewound:
                    log.info("uplink %s: %d unconfirmed event(s) will be re-sent first",
                             self.name, rewound)
            if self._lost:
                raise self._lost[0]

    async def _guard(self, fn: Any, ws: WebSocketConnection, n: trio.Nursery, *,
                     ends: bool = True) -> None:
        """Run one connection task. The first error (send/receive failure,
        close, dead peer) ends the connection, and so does the return of a
        task with ``ends`` (the sender after its orderly close)."""
        try:
            await fn(ws, n)
        except (ConnectionClosed, UplinkError, OSError, trio.BrokenResourceError) as e:
            self._lost.append(e)
            n.cancel_scope.cancel()
            return
        if ends:
            n.cancel_scope.cancel()

    async def _await_hello(self, ws: WebSocketConnection) -> None:
        while True:
            msg = self._parse(await ws.get_message())
            if msg is None:
                continue
            kind = msg.get("type")
            if kind == "hello":
                versions = msg.get("versions")
                chosen = versions[0] if isinstance(versions, list) and len(versions) == 1 else None
                if chosen not in SUPPORTED_VERSIONS:
                    raise UplinkError("version-unsupported",
                                      f"relay selected {versions!r}; we speak {SUPPORTED_VERSIONS}")
                self.version = chosen
                return
            if kind == "error":
                self._c["relay_errors"] += 1
                code = str(msg.get("code") or "error")
                detail = str(msg.get("detail") or "")
                if code == "version-unsupported":
                    detail = f"relay speaks {msg.get('versions')!r}; we speak {SUPPORTED_VERSIONS}"
                raise UplinkError(code, detail)
            if kind == "ping":
                await ws.send_message(encode({"type": "pong", "t": msg.get("t")}))
            # anything else before hello is ignored (counted by _parse if junk)

    async def _reader(self, ws: WebSocketConnection, n: trio.Nursery) -> None:
        while True:
            msg = self._parse(await ws.get_message())
            if msg is None:
                continue
            kind = msg.get("type")
            if not isinstance(kind, str):
                self._c["malformed_frames"] += 1
            elif "." in kind:  # an Event
                if is_command(msg):
                    self._deliver_command(msg)
                else:
                    self._c["malformed_frames"] += 1  # emitters receive only commands
            elif kind == "ping":
                await ws.send_message(encode({"type": "pong", "t": msg.get("t")}))
            elif kind == "pong":
                self._on_pong(msg.get("t"))
            elif kind == "error":
                self._c["relay_errors"] += 1
                code = str(msg.get("code") or "error")
                if msg.get("cause") and code == "invalid-event":
                    self._c["relay_refused"] = self._c.get("relay_refused", 0) + 1
                    self.refused_at = trio.current_time()
                self._log_once(code, "uplink %s: relay error %s%s (cause %s)", self.name, code,
                               f": {msg.get('detail')}" if msg.get("detail") else "",
                               msg.get("cause"))
            elif kind == "closing":
                log.info("uplink %s: relay is closing (%s)", self.name, msg.get("reason"))
            # other frames: ignored (AEP-0003 §2)

    def _parse(self, raw: str | bytes) -> dict[str, Any] | None:
        if isinstance(raw, bytes):  # binary frames are reserved in 0.1 (§3.5)
            self._c["malformed_frames"] += 1
            return None
        try:
            msg = json.loads(raw)
        except ValueError:
            self._c["malformed_frames"] += 1
            return None
        if not isinstance(msg, dict):
            self._c["malformed_frames"] += 1
            return None
        return msg

    def _deliver_command(self, cmd: dict[str, Any]) -> None:
        self._c["commands"] += 1
        try:
            self.commands_send.send_nowait(cmd)
        except trio.WouldBlock:
            self._c["commands_dropped"] += 1
            log.warning("uplink %s: control inbox full; command %s dropped (a retry is safe)",
                        self.name, cmd.get("id"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._c["commands_dropped"] += 1
            log.warning("uplink %s: control inbox closed; command %s dropped",
                        self.name, cmd.get("id"))

    def _on_pong(self, t: Any) -> None:
        if not self._outstanding:
            return
        if isinstance(t, int) and any(n == t for n, _ in self._outstanding):
            n = t
        else:  # pongs come in ping order: an untagged one answers the oldest
            n = self._outstanding[0][0]
        while self._outstanding and self._outstanding[0][0] <= n:
            self._outstanding.popleft()
        if self.outbox.confirm(n):
            self._changed.unpark_all()

    async def _ping(self, ws: WebSocketConnection) -> None:
        n = self.outbox.ping()  # registered before its bytes go out: see Outbox
        now = trio.current_time()
        self._outstanding.append((n, now))
        self._last_ping = now
        self._c["pings"] += 1
        await ws.send_message(encode({"type": "ping", "t": n}))

    async def _keepalive(self, ws: WebSocketConnection, n: trio.Nursery) -> None:
        """Periodic pings, and the dead-peer watchdog. A ping is sent from
        its own task so a stalled socket cannot stall the watchdog."""
        tick = max(0.01, min(self.ping_interval, self.ping_timeout) / 4)
        while True:
            await trio.sleep(tick)
            now = trio.current_time()
            if self._outstanding and now - self._outstanding[0][1] > self.ping_timeout:
                self._c["dead_peer"] += 1
                raise UplinkError("dead-peer", f"no pong within {self.ping_timeout:g}s")
            if now - self._last_ping >= self.ping_interval:
                self._last_ping = now
                n.start_soon(partial(self._guard, self._ping_task, ws, n, ends=False))

    async def _ping_task(self, ws: WebSocketConnection, n: trio.Nursery) -> None:
        await self._ping(ws)

    async def _sender(self, ws: WebSocketConnection, n: trio.Nursery) -> None:
        since_ping = 0
        burst = max(1, self.outbox.window // 2)
        while True:
            e = self.outbox.peek()
            if e is None:
                if self.outbox.unpinged():
                    await self._ping(ws)  # caught up (or window full): ask for confirmation
                    since_ping = 0
                    continue
                if self._closing and len(self.outbox) == 0:
                    await self._say_closing(ws)
                    self._said_closing = True
                    return
                await self._changed.park()
                continue
            await ws.send_message(e.wire)
            self.outbox.sent(e)
            self._c["sent"] += 1
            self._changed.unpark_all()
            since_ping += 1
            if since_ping >= burst:
                await self._ping(ws)
                since_ping = 0

    async def _say_closing(self, ws: WebSocketConnection) -> None:
        try:
            await ws.send_message(encode({"type": "closing", "reason": self._close_reason,
                                          "delivered": []}))
            await ws.aclose(1001, self._close_reason[:120])
        except ConnectionClosed:
            pass
        log.info("uplink %s: closed (%s), outbox empty", self.name, self._close_reason)

    # -- logging helpers -------------------------------------------------------
    def _note_failure(self, e: BaseException, hello_done: bool) -> None:
        if hello_done:
            self._c["disconnects"] += 1
        else:
            self._c["connect_failures"] += 1
        if isinstance(e, UplinkError):
            code, detail = e.code, e.detail
        elif isinstance(e, ConnectionRejected):
            code, detail = f"http-{e.status_code}", "WebSocket upgrade refused"
        elif isinstance(e, ConnectionClosed):
            reason = e.reason
            code = f"closed-{getattr(reason, 'code', '?')}"
            detail = str(getattr(reason, "reason", "") or "")
        elif isinstance(e, trio.TooSlowError):
            code, detail = "hello-timeout", f"no hello within {self.hello_timeout:g}s"
        else:
            code, detail = type(e).__name__, str(e.__cause__ or e)
        self._log_once(code, "uplink %s: %s %s (%s%s); reconnecting with backoff", self.name,
                       "lost" if hello_done else "cannot connect to", self._safe_url, code,
                       f": {detail}" if detail else "")

    def _log_once(self, code: str, msg: str, *args: Any) -> None:
        """Warn the first time a failure code repeats in a row; then debug."""
        if code in self._logged_codes:
            log.debug(msg, *args)
        else:
            self._logged_codes.add(code)
            log.warning(msg, *args)

    def _log_drop(self) -> None:
        d = self.outbox.counters["dropped"]
        if d == 1 or d % 10000 == 0:
            log.warning("uplink %s: outbox full; shedding debug/info (%d dropped so far)",
                        self.name, d)
