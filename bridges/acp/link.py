"""The tee's side of the wire (:mod:`bridges.acp.wire`): the bounded
:class:`ObservationQueue` the pumps push copies into, and the
:class:`DaemonLink` that carries them over one WebSocket to the daemon,
fail-open (see :mod:`bridges.acp.tee`, which runs both)."""
from __future__ import annotations

import json
import os
from collections import deque
from typing import Any, Callable

import trio

from bridges.core.backoff import backoff_delay

from . import wire

__all__ = ["DEFAULT_QUEUE_BYTES", "DaemonLink", "ObservationQueue", "Piece", "to_stderr"]

DEFAULT_QUEUE_BYTES = 8 << 20
"""Observation queue bound in bytes (oldest dropped beyond it)."""

BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 10.0


Piece = tuple[bytes, bytes]
_GAP = {wire.TAGS[d][0]: wire.control({"gap": d}) for d in wire.DIRECTIONS}
_DIR_OF = {wire.TAGS[d][0]: d for d in wire.DIRECTIONS}


class ObservationQueue:
    """Bounded FIFO of wire records, each ``(header, payload)`` (see
    :func:`bridges.acp.wire.piece`; a control record is ``(record, b"")``),
    so a record dropped unsent never cost a copy: at most ``max_bytes``
    held; pushing beyond drops the oldest and counts them in ``drops``.
    :meth:`push` never waits."""

    OVERHEAD = 64  # per-record bookkeeping, so empty records count too

    def __init__(self, max_bytes: int = DEFAULT_QUEUE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._q: deque[Piece] = deque()
        self.bytes = 0
        self.drops = 0
        self._gaps: set[int] = set()  # record tags with a dropped record before the next
        self._ready = trio.Event()

    def __len__(self) -> int:
        return len(self._q)

    @classmethod
    def _size(cls, rec: Piece) -> int:
        return len(rec[0]) + len(rec[1]) + cls.OVERHEAD

    def push(self, record: Piece) -> None:
        self._q.append(record)
        self.bytes += self._size(record)
        self._trim()
        self._ready.set()

    def _trim(self) -> None:
        while self.bytes > self.max_bytes and len(self._q) > 1:
            old = self._q.popleft()
            self.bytes -= self._size(old)
            self.drops += 1
            self._gaps.add(old[0][0])

    def take(self, limit: int) -> list[Piece]:
        """Oldest records up to ``limit`` bytes (at least one if any); a
        direction that lost records since its last taken one gets a
        ``gap`` control record in front of its next (``wire``)."""
        out: list[Piece] = []
        size = 0
        while self._q and (not out or size + self._size(self._q[0]) <= limit):
            rec = self._q.popleft()
            self.bytes -= self._size(rec)
            size += self._size(rec)
            tag = rec[0][0]
            if tag in self._gaps:
                self._gaps.discard(tag)
                if tag in _GAP:
                    out.append((_GAP[tag], b""))
            out.append(rec)
        if not self._q:
            self._ready = trio.Event()
        return out

    def requeue(self, records: list[Piece]) -> None:
        """Put records a broken connection did not deliver back in front
        (the bound still holds: the oldest are dropped first)."""
        for rec in reversed(records):
            self._q.appendleft(rec)
            self.bytes += self._size(rec)
        self._trim()
        if self._q:
            self._ready.set()

    async def wait(self) -> None:
        await self._ready.wait()


# --------------------------------------------------------------------------- the daemon link


class DaemonLink:
    """The tee's one connection to the daemon (fail-open).

    :meth:`run` connects to ``wire.tee_url(daemon, name)``, says hello, then
    sends what the queue holds in batches (lingering :data:`LINGER` after a
    wake-up, paced to ``observe_rate``); on any failure it waits the shared
    backoff (:func:`bridges.core.backoff.backoff_delay`) and reconnects
    (queued records survive; a batch whose send failed goes back in front
    of the queue). It never raises (a note goes to stderr once per kind of
    failure). :meth:`finish` queues the exit record; :meth:`flushed` waits
    until the queue is empty and sent."""

    BATCH = 256 << 10
    LINGER = 0.1
    """Seconds the sender waits after waking to gather a batch."""

    def __init__(self, opts: Any, queue: ObservationQueue,
                 stats: Callable[[], dict[str, int]], *,
                 note: Callable[[str], None] | None = None) -> None:
        self.opts = opts
        self.queue = queue
        self.stats = stats
        self.connected = False
        self.connections = 0
        self.line_ended = {d: True for d in wire.DIRECTIONS}
        self.finishing = False
        self.tee_id = opts.tee_id
        self.resume: str | None = None  # the daemon's key for tee_id (its welcome)
        self._note = note or to_stderr
        self._said: set[str] = set()
        self._idle = trio.Event()
        self._idle.set()
        self._waiting = trio.CancelScope()  # the sender's wait for records

    def say(self, kind: str, line: str) -> None:
        if kind not in self._said or self.opts.verbose:
            self._said.add(kind)
            self._note(f"aep-bridges acp: {line}")

    async def run(self) -> None:
        from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, open_websocket_url
        url = wire.tee_url(self.opts.daemon, self.opts.name)
        headers = ([(b"authorization", f"Bearer {self.opts.token}".encode())]
                   if self.opts.token else [])
        attempt = 0
        while True:
            try:
                async with open_websocket_url(url, extra_headers=headers, connect_timeout=5,
                                              disconnect_timeout=0.5,
                                              max_message_size=1 << 20) as ws:
                    await ws.send_message(json.dumps(wire.hello(
                        self.tee_id, self.opts.name, self.opts.command, os.getpid(),
                        self.stats(), max_line=self.opts.max_line,
                        mid_line=[d for d in wire.DIRECTIONS if not self.line_ended[d]],
                        resume=self.resume)))
                    self.connected = True
                    self.connections += 1
                    attempt = 0
                    if self.connections > 1 or "connect" in self._said:
                        self.say("connected", f"observing again through {self.opts.daemon}")
                    closed: BaseException | None = None
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._read_loop, ws)
                        try:
                            await self._send_loop(ws)
                        except (ConnectionClosed, trio.BrokenResourceError, OSError) as e:
                            closed = e
                        nursery.cancel_scope.cancel()
                    if closed is not None:
                        if ws.closed is not None and ws.closed.code == wire.CLAIMED:
                            # the daemon binds our id to another connection (or forgot
                            # our key): a new id, a new story; the old one is the daemon's
                            self.tee_id, self.resume = wire.new_tee_id(), None
                        raise closed
            except ConnectionRejected as e:
                status = e.status_code
                why = ("AEP_TOKEN: pass --token-file or set AEP_TOKEN" if status == 401 else
                       f"is AEP_BRIDGE_ACP=1 set there and {self.opts.name!r} in AEP_ACP_AGENTS?")
                self.say(f"refused-{status}", f"the daemon at {self.opts.daemon} refused the tee "
                         f"(HTTP {status}; {why}); the session is unaffected, retrying")
            except (OSError, HandshakeError, ConnectionClosed, trio.BrokenResourceError) as e:
                self.say("connect", f"daemon at {self.opts.daemon} not reachable "
                         f"({type(e).__name__}); the session is unaffected, retrying")
            finally:
                self.connected = False
                self._idle.set()
            await trio.sleep(backoff_delay(attempt, BACKOFF_INITIAL, BACKOFF_MAX))
            attempt += 1

    async def _read_loop(self, ws: Any) -> None:
        """Keep the welcome's resume key (the daemon sends nothing else);
        at a close, wake the sender if it waits for records (it reconnects
        now, not at its next record: a refused tee id, 4409, gets a new one)."""
        from trio_websocket import ConnectionClosed
        try:
            while True:
                key = wire.parse_welcome(await ws.get_message())
                if key is not None:
                    self.resume = key
        except ConnectionClosed:
            self._waiting.cancel()

    async def _send_loop(self, ws: Any) -> None:
        from trio_websocket import ConnectionClosed
        last_stats: dict[str, int] = {}
        while not ws.closed:
            if not len(self.queue):
                self._idle.set()
                with trio.CancelScope() as self._waiting:  # the reader ends it at a close
                    if ws.closed is None:
                        await self.queue.wait()
                        # linger: gather more before a send, so the sender wakes seldom
                        # between the pumps' copies (latency of observations is cheap)
                        if self.queue.bytes < self.BATCH and not self.finishing:
                            await trio.sleep(self.LINGER)
                if ws.closed:  # the daemon went away while we waited: keep the records
                    break
            if self._idle.is_set():  # unset already (finish()): flushed() waits on that one
                self._idle = trio.Event()
            batch = self.queue.take(self.BATCH)
            stats = self.stats()
            if stats != last_stats:
                batch.append((wire.control({"stats": stats}), b""))
                last_stats = stats
            message = b"".join([part for rec in batch for part in rec])
            started = trio.current_time()
            try:
                await ws.send_message(message)
                for head, data in batch:  # where a daemon meeting this tee anew would start
                    if head[0] in _DIR_OF:
                        self.line_ended[_DIR_OF[head[0]]] = data.endswith(b"\n")
            except (ConnectionClosed, trio.BrokenResourceError, OSError):
                # not delivered as far as we know: the next connection resends
                # it (a daemon that did read it may see a few lines twice)
                self.queue.requeue(batch)
                raise
            # pace: at most observe_rate MB/s (transparency outranks delivery)
            await trio.sleep(max(0.0, len(message) / (self.opts.observe_rate * 1e6)
                                 - (trio.current_time() - started)))
        raise ConnectionClosed(ws.closed)

    def finish(self, status: int) -> None:
        self.finishing = True
        if self._idle.is_set():  # an Event is replaced only once set: see flushed()
            self._idle = trio.Event()
        self.queue.push((wire.control({"exit": status, "stats": self.stats()}), b""))

    async def flushed(self) -> None:
        """Wait until a connected link has sent everything queued (the send
        loop sets ``_idle`` when the queue ran empty, or on disconnect)."""
        while self.connected:
            idle = self._idle
            if idle.is_set():
                return
            await idle.wait()


def to_stderr(line: str) -> None:
    """One line on fd 2, never anywhere else: with fd 2 closed at start
    Python's ``sys.stderr`` is ``None`` and ``print`` would write to stdout,
    the editor's protocol channel."""
    try:
        os.write(2, line.encode("utf-8", "replace") + b"\n")
    except OSError:
        pass
