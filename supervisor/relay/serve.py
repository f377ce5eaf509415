"""Serving the relay with hypercorn's trio worker, with an orderly shutdown
and a per-connection abort handle.

Why not plain ``hypercorn.trio.serve``: hypercorn shields its socket writes
from cancellation, so a consumer that stops reading parks its handler in a
send forever; neither the §8.4 "disconnect" of a slow consumer nor a
bounded shutdown can then be honored. This module runs hypercorn's own
connection handler (``TCPServer``) with one addition: each connection's
ASGI ``scope["state"]`` carries :data:`supervisor.relay.app.ABORT_KEY`, a
callable that closes that connection's socket, which wakes a stuck writer
with ``ClosedResourceError``. The app works under stock hypercorn too,
just without that last resort. The state also carries
:data:`supervisor.relay.app.LISTEN_KEY`, the listener's bound ``(host,
port)`` (the relay's DNS-rebinding guard applies to loopback binds only).

Shutdown order (``docs/relay.md`` "Shutdown: drain, don't drop"): stop
accepting, close idle keep-alive connections, :meth:`Relay.close` (``:
shutting-down`` + clean end on every SSE stream, ``closing`` + close 1001 on
every WebSocket, stragglers aborted), then give handlers
``graceful_timeout`` to finish.

Per-connection faults stay with the connection: hypercorn's handler can
raise out of a connection (h11 ``LocalProtocolError`` on a WebSocket
upgrade with bytes pipelined behind it, hypercorn#225), and under
``trio.serve_listeners`` that would cancel every other connection and
reach the daemon's root nursery. :class:`_AbortableTCPServer` catches any
``Exception`` a connection raises, closes that socket, counts it
(``on_fault(kind)``) and logs it once per kind (then at most once per
:data:`~supervisor.relay.faults.FAULT_LOG_INTERVAL_S` with the count since), by exception type
names only: an h11 message can quote request bytes (a token)."""
from __future__ import annotations

import logging
import socket
from functools import partial
from typing import Any, Awaitable, Callable

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HyperConfig
import hypercorn.trio.tcp_server as _hyper_tcp
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H2CProtocolRequiredError, H2ProtocolAssumedError
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from .app import ABORT_KEY, LISTEN_KEY, make_app
from .core import Relay
from .faults import FaultLog, fault_kind

log = logging.getLogger("aep.relay.serve")

_FAULTS = FaultLog(log)


class Http2Refused(ConnectionError):
    """A plaintext client asked for HTTP/2 (prior-knowledge preface or an
    ``Upgrade: h2c``); only HTTP/1.1 is served."""


class _Http11Only(ProtocolWrapper):
    """hypercorn switches a plaintext connection to HTTP/2 on the h2c
    preface or upgrade, and its HTTP/2 sends then buffer without limit
    behind a client's zero flow-control window, past the relay's slow-
    consumer shedding and its shutdown deadline (break-it review: 745 MB
    from ten such consumers). Every binding here is HTTP/1.1 (SSE, WS,
    OTLP/HTTP; OTLP/gRPC has its own server), so the switch is refused:
    the connection ends as a counted fault."""

    async def handle(self, event: Any) -> None:
        try:
            return await self.protocol.handle(event)
        except (H2ProtocolAssumedError, H2CProtocolRequiredError):
            raise Http2Refused("HTTP/2 is not served here") from None


# hypercorn's TCPServer builds its ProtocolWrapper by this module-level name;
# every server in this process goes through serve_app, so it is set once here.
_hyper_tcp.ProtocolWrapper = _Http11Only


class _AbortableTCPServer(TCPServer):
    """hypercorn's connection handler plus an abort handle in the connection
    state (shallow-copied into every request's ``scope["state"]``), and a
    fault barrier: an ``Exception`` out of the connection is counted,
    logged (rate-limited) and closes that connection only."""

    def __init__(self, app: Any, config: HyperConfig, context: WorkerContext,
                 state: ConnectionState, stream: Any, *,
                 on_fault: Callable[[str], None] | None = None, where: str = "http") -> None:
        state = ConnectionState({**state, ABORT_KEY: self._abort})
        super().__init__(app, config, context, state, stream)
        self._on_fault = on_fault
        self._where = where

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

    def _abort(self) -> None:
        stream = self.stream
        sock = getattr(stream, "socket", None) or getattr(stream.transport_stream, "socket", None)
        if sock is not None:
            sock.close()  # trio: wakes any task blocked on it with ClosedResourceError


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


def hyper_config(*, graceful_timeout: float = 3.0, max_message: int = 16 << 20) -> HyperConfig:
    """hypercorn settings for the relay: no access log (a query string may
    carry ``access_token``, AEP-0003 §8.1), WebSocket messages bounded like
    POST bodies, hypercorn's own WS pings off (the relay pings in-protocol)."""
    cfg = HyperConfig()
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("aep.relay.hypercorn")
    cfg.graceful_timeout = graceful_timeout
    cfg.keep_alive_timeout = 75
    cfg.websocket_max_message_size = max_message
    cfg.websocket_ping_interval = None
    return cfg


async def serve_app(app: Any, sock: socket.socket, shutdown: trio.Event, *,
                    config: HyperConfig | None = None,
                    before_drain: Callable[[], Awaitable[None]] | None = None,
                    on_fault: Callable[[str], None] | None = None, where: str | None = None,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the ASGI ``app`` on the listening ``sock`` until ``shutdown`` is
    set, then: stop accepting, let idle keep-alive connections close, await
    ``before_drain()`` (the relay's orderly close), and give open handlers
    ``config.graceful_timeout`` seconds before cancelling them. Reports the
    bound ``(host, port)`` through ``task_status.started``.

    A connection that raises is closed, counted through ``on_fault(kind)``
    (default: the app's own ``connection_fault`` method when it has one,
    e.g. :class:`~supervisor.relay.app.RelayApp`) and logged once per kind
    under ``where`` (default ``"http host:port"``); it never reaches the
    caller. Raises only for the listener itself."""
    config = config or hyper_config()
    context = WorkerContext(None)
    host, port = sock.getsockname()[:2]
    if on_fault is None:
        on_fault = getattr(app, "connection_fault", None)
    handler = partial(_AbortableTCPServer, ASGIWrapper(app), config, context,
                      ConnectionState({LISTEN_KEY: (host, port)}), on_fault=on_fault,
                      where=where or f"http {host}:{port}")
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    async with trio.open_nursery() as handlers:
        async with trio.open_nursery() as acceptor:
            await acceptor.start(partial(trio.serve_listeners, handler, [listener],
                                         handler_nursery=handlers))
            task_status.started((host, port))
            await shutdown.wait()
            acceptor.cancel_scope.cancel()  # closes the listener
        await context.terminated.set()  # idle keep-alive connections close now
        if before_drain is not None:
            await before_drain()
        handlers.cancel_scope.deadline = trio.current_time() + config.graceful_timeout


async def serve_relay(relay: Relay, listen: tuple[str, int] | socket.socket, *,
                      healthz: Callable[[bool], dict[str, Any]] | None = None,
                      shutdown: trio.Event | None = None, reason: str = "shutting down",
                      graceful_timeout: float = 3.0,
                      task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``relay`` (``make_app(relay, healthz=healthz)``) on ``listen``
    (``(host, port)`` or a socket from :func:`bind_socket`) until
    ``shutdown`` is set; then :meth:`Relay.close(reason) <Relay.close>` and
    return. ``task_status.started((host, port))`` reports the bound address
    (useful with port 0). Without ``shutdown`` it serves until cancelled."""
    sock = listen if isinstance(listen, socket.socket) else bind_socket(*listen)
    shutdown = shutdown if shutdown is not None else trio.Event()
    await serve_app(make_app(relay, healthz=healthz), sock, shutdown,
                    config=hyper_config(graceful_timeout=graceful_timeout,
                                        max_message=relay.max_body),
                    before_drain=lambda: relay.close(reason), task_status=task_status)
