"""Serving ASGI apps with hypercorn's trio worker: the one HTTP server every
listener here uses (the embedded relay, the daemon's health app, the
OTLP/HTTP receiver), with a per-connection abort handle, a fault barrier,
and HTTP/1.1 only.

Why not plain ``hypercorn.trio.serve``: hypercorn shields its socket writes
from cancellation, so a consumer that stops reading parks its handler in a
send forever; neither the relay's §8.4 "disconnect" of a slow consumer nor
a bounded shutdown can then be honored. :func:`serve_app` runs hypercorn's
own connection handler (``TCPServer``) with six additions:

- each connection's ASGI ``scope["state"]`` carries
  :data:`~bridges.core.asgi.ABORT_KEY`, a callable that closes that
  connection's socket (waking a stuck writer with ``ClosedResourceError``),
  and :data:`~bridges.core.asgi.LISTEN_KEY`, the listener's bound ``(host,
  port)`` (the DNS-rebinding guard applies to loopback binds only). An app
  works under stock hypercorn too, just without that last resort;
- a fault barrier: hypercorn's handler can raise out of a connection (h11
  ``LocalProtocolError`` on a WebSocket upgrade with bytes pipelined behind
  it, hypercorn#225), and under ``trio.serve_listeners`` that would cancel
  every other connection and reach the daemon's root nursery. Any
  ``Exception`` a connection raises closes that socket, is counted
  (``on_fault(kind)``) and logged once per kind (then at most once per
  :data:`FAULT_LOG_INTERVAL_S` with the count since), by exception type
  names only (:class:`FaultLog`): an h11 message can quote request bytes
  (a token);
- HTTP/1.1 only, per connection (:class:`Http2Refused`): hypercorn would
  switch a plaintext connection to HTTP/2 on the h2c preface or upgrade,
  and its HTTP/2 sends then buffer without limit behind a client's zero
  flow-control window, past slow-consumer shedding and any shutdown
  deadline (break-it review: 745 MB from ten such consumers). Every
  binding here is HTTP/1.1 (SSE, WS, OTLP/HTTP; OTLP/gRPC has its own
  server). The policy is part of the connection handler :func:`serve_app`
  builds; importing this module changes nothing in hypercorn;
- two connection budgets per listener (:class:`_Budgets`, issue 25):
  connections being served, and apart from them connections still sending
  their request headers (the one waiting longest is closed for a
  newcomer; a header timeout), so half-open requests never shed a
  ``/stream`` consumer or keep a well-formed request out. The phase comes
  from hypercorn's own idle signal (``Updated``), seen in the handler's
  ``protocol_send``;
- one write per whole response (:func:`_sized_head`): hypercorn writes a
  response's head and its body with two ``send`` calls, and on a loaded
  machine the first one wakes the client, which then waits for the second
  until the server gets the CPU back (issue 27: the hook round trip's
  tail). A head announcing a ``Content-Length`` body waits for that body's
  first bytes (up to :data:`JOIN_MAX`) and goes out with them; a streamed
  head (chunked: SSE, a held hook's ``AEP-Hold-Ms``) goes out at once;
- a connection ends as soon as its client closes it after an answer
  (hypercorn kept it, socket in CLOSE-WAIT, until its keep-alive timer
  ran out) and is freed by reference counting, no cycle through its
  handler (issue 27: the daemon's young collections on the hook path).

Shutdown order (:func:`serve_app`): stop accepting, close idle keep-alive
connections, await the caller's ``before_drain()`` (e.g. the relay's
orderly close), then give handlers ``graceful_timeout`` to finish."""
from __future__ import annotations

import errno
import logging
import math
import re
import resource
import socket
import time
import traceback
from functools import partial
from typing import Any, Awaitable, Callable, cast

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HyperConfig
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.h11 import H2CProtocolRequiredError, H2ProtocolAssumedError
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState

from .asgi import ABORT_KEY, LISTEN_KEY, App
from .errors import leaves, root_cause
from .settings import Address

__all__ = [
    "HyperConfig", "hyper_config", "bind_socket", "serve_app", "Http2Refused",
    "FaultLog", "fault_kind", "FAULT_LOG_INTERVAL_S", "JOIN_MAX",
]

log = logging.getLogger("aep.http.serve")

#: After the first log line of a fault kind, at most one more per this many seconds.
FAULT_LOG_INTERVAL_S = 60.0
_MAX_KINDS = 256


# -- faults -------------------------------------------------------------------------

def fault_kind(exc: BaseException) -> str:
    """A short, secret-free name for a fault: the sorted, de-duplicated type
    names of its leaf exceptions (``"LocalProtocolError"``,
    ``"KeyError+LocalProtocolError"``); never an exception message."""
    return "+".join(sorted({type(e).__name__ for e in leaves(exc)})) or type(exc).__name__


class FaultLog:
    """Rate-limited fault logging on ``logger``: the first fault of each
    kind at each place (``where``) is logged at WARNING; later ones at most
    once per ``interval`` seconds (monotonic clock), with how many were
    suppressed in between. At most ``_MAX_KINDS`` kinds are remembered
    (oldest forgotten). A hostile client can make a connection fail on
    purpose, as often as it likes: one line per kind, never a traceback per
    request. Only exception *type names* are logged at WARNING; the stack
    frames of each logged occurrence (no message, no values) go to DEBUG."""

    def __init__(self, logger: logging.Logger, interval: float = FAULT_LOG_INTERVAL_S) -> None:
        self.log = logger
        self.interval = interval
        self._kinds: dict[str, list[float]] = {}  # where+kind -> [last logged at, suppressed since]

    def record(self, kind: str, where: str, exc: BaseException | None = None) -> bool:
        """Note one fault of ``kind`` at ``where`` (a listener or handler
        name); returns whether a line was logged."""
        now = time.monotonic()
        slot = f"{where}\0{kind}"
        seen = self._kinds.get(slot)
        if seen is None:
            if len(self._kinds) >= _MAX_KINDS:
                self._kinds.pop(next(iter(self._kinds)))
            self._kinds[slot] = [now, 0]
            suppressed = None
        elif now - seen[0] >= self.interval:
            suppressed = int(seen[1])
            seen[0], seen[1] = now, 0
        else:
            seen[1] += 1
            return False
        tail = "" if suppressed is None else f" ({suppressed} more of this kind since the last report)"
        self.log.warning("%s: a connection failed (%s); closed it, serving on%s", where, kind, tail)
        if exc is not None and self.log.isEnabledFor(logging.DEBUG):
            # where it failed, without any exception message (they can quote request bytes)
            self.log.debug("%s: %s raised at:\n%s", where, kind,
                           "".join(traceback.format_tb(root_cause(exc).__traceback__)))
        return True


_FAULTS = FaultLog(log)


# -- the connection handler ----------------------------------------------------------

class Http2Refused(ConnectionError):
    """A plaintext client asked for HTTP/2 (prior-knowledge preface or an
    ``Upgrade: h2c``); only HTTP/1.1 is served."""


class _Http11Only:
    """Stands in for a connection's hypercorn ``ProtocolWrapper``: events go
    straight to its HTTP/1.1 protocol, and the wrapper's switch to HTTP/2
    (the two h11 exceptions that trigger it) becomes :class:`Http2Refused`,
    which ends the connection as a counted fault."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper

    async def initiate(self) -> None:
        await self._wrapper.initiate()

    async def handle(self, event: Any) -> None:
        try:
            return await self._wrapper.protocol.handle(event)
        except (H2ProtocolAssumedError, H2CProtocolRequiredError):
            raise Http2Refused("HTTP/2 is not served here") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)


JOIN_MAX = 64 * 1024
"""Largest body a held response head is joined to (one write; a copy of
the body): a larger one goes out after the head, as hypercorn sends it."""

_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*0*[1-9]", re.IGNORECASE)


def _sized_head(data: bytes) -> bool:
    """Whether ``data`` (one write hypercorn's h11 protocol asks for) is a
    whole HTTP/1.x response head announcing a body (``Content-Length`` >
    0): its next write is that body (or the end of a ``HEAD`` answer), so
    the head can wait for it. A head without a length (chunked: a stream,
    a held hook) or with ``0`` is the answer's first byte a client may be
    waiting for: never held."""
    return data.startswith(b"HTTP/1.") and data.endswith(b"\r\n\r\n") \
        and _LENGTH.search(data) is not None


class _AbortableTCPServer(TCPServer):
    """hypercorn's connection handler plus an abort handle in the connection
    state (shallow-copied into every request's ``scope["state"]``), HTTP/1.1
    only (:class:`_Http11Only` wraps the protocol hypercorn builds), and a
    fault barrier: an ``Exception`` out of the connection is counted,
    logged (rate-limited) and closes that connection only."""

    def __init__(self, app: Any, config: HyperConfig, context: WorkerContext,
                 state: ConnectionState, stream: Any, phase: "_Phase | None" = None, *,
                 on_fault: Callable[[str], None] | None = None, where: str = "http") -> None:
        # the abort handle holds the stream, not this handler: no reference
        # cycle through every request's scope (see :meth:`run`)
        state = ConnectionState({**state, ABORT_KEY: partial(_abort, stream)})
        super().__init__(app, config, context, state, stream)
        self._protocol: Any = None
        self._on_fault = on_fault
        self._where = where
        self._phase = phase
        self._head: bytes | None = None  # a response head waiting for its body

    async def protocol_send(self, event: Any) -> None:
        if isinstance(event, RawData):
            head, self._head = self._head, None
            if head is not None:  # the body (or the end of a HEAD answer): one write
                if len(event.data) <= JOIN_MAX:
                    event = RawData(data=head + event.data)
                else:
                    await super().protocol_send(RawData(data=head))
            elif _sized_head(event.data):
                self._head = event.data
                return
        elif isinstance(event, Closed):
            self._head = None  # the connection ends before its body: nothing to answer
        # hypercorn's own idle signal: not idle = a request's headers are in
        # (the app is being called); idle = waiting for the next request's
        if isinstance(event, Updated) and self._phase is not None:
            if event.idle:
                self._phase.idle()
            else:
                self._phase.request()
        await super().protocol_send(event)

    @property
    def protocol(self) -> Any:
        return self._protocol

    @protocol.setter
    def protocol(self, wrapper: Any) -> None:
        # TCPServer.run assigns the ProtocolWrapper it builds for the connection
        self._protocol = _Http11Only(wrapper)

    async def _read_data(self) -> None:
        await super()._read_data()
        # the client is gone (end of file, a broken or aborted socket) and its
        # last answer is out (hypercorn reads on only once it is): hypercorn
        # keeps the connection's keep-alive timer (75 s), and the connection
        # (its socket in CLOSE-WAIT, its tasks, h11 state, budget place) with
        # it; a vendor hook or the shim closes after each answer, so a third
        # of the daemon's connections lingered so (issue 27: ~50 live objects
        # a hook that set its young collections off)
        await self.idle_task.stop()

    async def run(self) -> None:
        try:
            await super().run()
        except* Exception as eg:  # trio.Cancelled (a BaseException) still propagates
            kind = fault_kind(eg)
            _FAULTS.record(kind, self._where, eg)
            if self._on_fault is not None:
                try:
                    self._on_fault(kind)
                except Exception:  # noqa: BLE001 -- a counting bug must not re-raise the fault
                    pass
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)
        finally:
            # hypercorn's protocol holds this handler's bound protocol_send: a
            # cycle the ended connection's whole graph (h11 state, task group,
            # locks: ~30 objects) waited in for the cyclic collector, and that
            # garbage was half of what set the daemon's young collections off
            # (issue 27); cut here, it is freed now
            self._protocol = None


def _abort(stream: Any) -> None:
    """Close ``stream``'s socket (the connection's abort handle)."""
    sock = getattr(stream, "socket", None) or getattr(stream.transport_stream, "socket", None)
    if sock is not None:
        sock.close()  # trio: wakes any task blocked on it with ClosedResourceError


# -- serving ------------------------------------------------------------------------

def bind_socket(host: str, port: int, *, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0 picks a free one).
    Raises ``OSError`` (e.g. address in use) before anything is served."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = info[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


# accept() failing for want of a descriptor (or kernel memory): wait, retry
_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

_OVERFLOW_S = 2.0
"""Seconds a connection accepted past a listener's cap may live: enough for
``GET /healthz``, not for holding a slot (issue 10 #6)."""


def _default_max_connections() -> int:
    """Connections per listener when ``AEP_MAX_CONNECTIONS`` is unset: a
    third of the open-files limit left after 256 for everything else (the
    relay, OTLP/HTTP and OTLP/gRPC share it), between 64 and 4096."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ValueError, OSError):
        soft = 1024
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, min(4096, (soft - 256) // 3))


class _Spell:
    """Logs a condition once when it starts and once when it ends (with the
    count in between), never once per occurrence (issue 10 #6: EMFILE at
    40 KB/s of tracebacks)."""

    def __init__(self, what: str, where: str) -> None:
        self.what, self.where = what, where
        self.count = 0
        self.on = False

    def hit(self, detail: str = "") -> None:
        self.count += 1
        if not self.on:
            self.on = True
            log.error("%s: %s%s (logged once until it clears)", self.where, self.what,
                      f" ({detail})" if detail else "")

    def clear(self) -> None:
        if self.on:
            self.on = False
            log.warning("%s: %s cleared after %d occurrences", self.where, self.what, self.count)
            self.count = 0


_HEADER_TIMEOUT_S = 10.0
"""Seconds a new connection has to send its first request's headers (issue
25: headers trickled one byte per 10 s held a slot for the keep-alive
timeout, 75 s on the relay)."""


class _Budgets:
    """A listener's two connection budgets (issue 25: 300 connections
    trickling their headers held the one shared cap and cut ``/stream``):

    - **serving** (a request's headers are in: the app runs, a stream or a
      WebSocket included): ``cap``, then an overflow of ``cap // 8`` (at
      least 8) served :data:`_OVERFLOW_S` seconds each (a health probe
      still gets its answer), then closed;
    - **waiting for request headers** (new connections, and idle keep-alive
      ones between requests): ``header_cap`` (default ``cap // 4``, at
      least 8) apart from the first; when it is full, the connection that
      has waited longest is closed for the newcomer, so half-open requests
      evict each other, never a consumer or a well-formed request (whose
      headers arrive at once). A new connection has ``header_timeout``
      seconds for its headers; an idle one ``idle_timeout`` (hypercorn
      closes an idle one at its keep-alive timeout; this is the backstop
      for one trickling its next request).

    Each limit reached is logged once per spell (:class:`_Spell`)."""

    def __init__(self, cap: int, where: str, *, header_cap: int | None = None,
                 header_timeout: float = _HEADER_TIMEOUT_S,
                 idle_timeout: float = 75.0 + _HEADER_TIMEOUT_S) -> None:
        self.cap = cap
        self.overflow = max(8, cap // 8)
        self.header_cap = header_cap or max(8, cap // 4)
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.serving = 0
        self.waiting: dict[_Phase, None] = {}  # insertion order: the longest waiting first
        self.full = _Spell(f"connection cap reached ({cap} + {self.overflow}), new requests "
                           "closed", where)
        self.crowded = _Spell(f"connections waiting for request headers at the cap "
                              f"({self.header_cap}), the longest waiting closed", where)

    def settle(self) -> None:
        """Clear a spell once its pool has room again (at half: no flapping)."""
        if self.serving < self.cap:
            self.full.clear()
        if len(self.waiting) <= self.header_cap // 2:
            self.crowded.clear()


class _Phase:
    """One connection's place in its listener's :class:`_Budgets`; its
    ``scope`` wraps the connection's handler (deadlines, eviction).
    :meth:`request` / :meth:`idle` are called on hypercorn's idle signal."""

    def __init__(self, budgets: _Budgets) -> None:
        self.budgets = budgets
        self.scope = trio.CancelScope()
        self.serving = False
        self.gone = False
        self._wait(budgets.header_timeout)

    def _wait(self, timeout: float) -> None:
        b = self.budgets
        if len(b.waiting) >= b.header_cap:
            b.crowded.hit()
            next(iter(b.waiting)).close()
        b.waiting[self] = None
        self.scope.deadline = trio.current_time() + timeout

    def request(self) -> None:
        """A request's headers are in: serving, unbounded within the cap."""
        b = self.budgets
        b.waiting.pop(self, None)
        if self.gone:
            return
        if not self.serving:
            self.serving = True
            b.serving += 1
        if b.serving > b.cap + b.overflow:
            b.full.hit()
            self.close()
        elif b.serving > b.cap:
            b.full.hit()
            self.scope.deadline = trio.current_time() + _OVERFLOW_S
        else:
            self.scope.deadline = math.inf

    def idle(self) -> None:
        """The response is done; waiting for the next request's headers."""
        self._stop_serving()
        if not self.gone:
            self._wait(self.budgets.idle_timeout)
        self.budgets.settle()

    def close(self) -> None:
        self.gone = True
        self.budgets.waiting.pop(self, None)
        self.scope.cancel()

    def leave(self) -> None:
        """The connection ended (however)."""
        self.gone = True
        self.budgets.waiting.pop(self, None)
        self._stop_serving()
        self.budgets.settle()

    def _stop_serving(self) -> None:
        if self.serving:
            self.serving = False
            self.budgets.serving -= 1


async def _accept_loop(listener: trio.SocketListener,
                       handler: Callable[[Any, _Phase], Awaitable[None]],
                       nursery: trio.Nursery, *, cap: int, where: str,
                       idle_timeout: float = 75.0 + _HEADER_TIMEOUT_S,
                       task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections until cancelled, each served by ``handler(stream,
    phase)`` in ``nursery`` and closed when it ends (as
    ``trio.serve_listeners`` does), within the listener's :class:`_Budgets`
    (``cap`` serving; a separate pool for connections still sending their
    request headers). Running out of descriptors pauses accepting for 100
    ms, logged once per spell, never a traceback per attempt
    (``trio.serve_listeners`` logs one each time)."""
    budgets = _Budgets(cap, where, idle_timeout=idle_timeout)
    fds = _Spell("out of file descriptors, accept paused", where)

    async def run(stream: Any, phase: _Phase) -> None:
        try:
            with phase.scope:
                await handler(stream, phase)
        finally:
            phase.leave()
            # a cancelled handler (shutdown, a deadline, an eviction) may not
            # have closed its socket
            await trio.aclose_forcefully(stream)

    task_status.started()
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in _CAPACITY_ERRNOS:
                    raise
                fds.hit(e.strerror or "")
                await trio.sleep(0.1)
                continue
            fds.clear()
            nursery.start_soon(run, stream, _Phase(budgets))


def hyper_config(*, graceful_timeout: float = 3.0, keep_alive_timeout: float = 75.0,
                 max_message: int = 16 << 20,
                 errorlog: logging.Logger | str = "aep.http.hypercorn") -> HyperConfig:
    """hypercorn settings for a listener here: no access log (a query string
    may carry ``access_token``, AEP-0003 §8.1), ``errorlog`` (a logger or
    its name), ``graceful_timeout`` (seconds handlers get at shutdown),
    ``keep_alive_timeout`` (seconds an idle connection is kept),
    ``max_message`` (bytes per WebSocket message, bounded like POST
    bodies), hypercorn's own WebSocket pings off (the relay pings
    in-protocol). The bind address is not part of it: :func:`serve_app`
    serves a socket from :func:`bind_socket`."""
    cfg = HyperConfig()
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger(errorlog) if isinstance(errorlog, str) else errorlog
    cfg.graceful_timeout = graceful_timeout
    cfg.keep_alive_timeout = keep_alive_timeout
    cfg.websocket_max_message_size = max_message
    cfg.websocket_ping_interval = None
    return cfg


async def serve_app(app: App, sock: socket.socket, shutdown: trio.Event, *,
                    config: HyperConfig | None = None,
                    before_drain: Callable[[], Awaitable[None]] | None = None,
                    on_fault: Callable[[str], None] | None = None, where: str | None = None,
                    max_connections: int | None = None,
                    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the ASGI ``app`` on the listening ``sock`` until ``shutdown`` is
    set, then: stop accepting, let idle keep-alive connections close, await
    ``before_drain()``, and give open handlers ``config.graceful_timeout``
    seconds before cancelling them. Reports the bound ``(host, port)``
    through ``task_status.started``. ``config`` defaults to
    :func:`hyper_config`.

    A connection that raises is closed, counted through ``on_fault(kind)``
    (default: the app's own ``connection_fault`` method when it has one,
    e.g. the relay's app) and logged once per kind under ``where`` (default
    ``"http host:port"``); it never reaches the caller. At most
    ``max_connections`` (default :func:`_default_max_connections`) are
    served at once, and connections still sending their request headers
    have a budget of their own (:class:`_Budgets`). Raises only for the
    listener itself."""
    config = config or hyper_config()
    context = WorkerContext(None)
    host, port = sock.getsockname()[:2]
    if on_fault is None:
        on_fault = getattr(app, "connection_fault", None)
    # hypercorn's ASGI TypedDicts are the plain dicts App speaks
    handler = partial(_AbortableTCPServer, ASGIWrapper(cast(ASGIFramework, app)), config, context,
                      ConnectionState({LISTEN_KEY: (host, port)}), on_fault=on_fault,
                      where=where or f"http {host}:{port}")
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    cap = max_connections or _default_max_connections()
    async with trio.open_nursery() as handlers:
        async with trio.open_nursery() as acceptor:
            await acceptor.start(partial(_accept_loop, listener, handler, handlers, cap=cap,
                                         where=where or f"http {host}:{port}",
                                         idle_timeout=config.keep_alive_timeout
                                         + _HEADER_TIMEOUT_S))
            task_status.started((host, port))
            await shutdown.wait()
            acceptor.cancel_scope.cancel()  # closes the listener
        await context.terminated.set()  # idle keep-alive connections close now
        if before_drain is not None:
            await before_drain()
        handlers.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
