"""Serving the relay: :func:`bridges.core.http.serve_app` (hypercorn's trio
worker with a per-connection abort handle, a fault barrier and HTTP/1.1
only) plus the relay's own shutdown order (``docs/relay.md`` "Shutdown:
drain, don't drop"): stop accepting, close idle keep-alive connections,
:meth:`Relay.close` (``: shutting-down`` + clean end on every SSE stream,
``closing`` + close 1001 on every WebSocket, stragglers aborted), then give
handlers ``graceful_timeout`` to finish."""
from __future__ import annotations

import socket
from typing import Any, Callable

import trio

from bridges.core.http import bind_socket, hyper_config, serve_app
from bridges.core.settings import Address

from .app import make_app
from .core import Relay

__all__ = ["serve_relay"]


async def serve_relay(relay: Relay, listen: tuple[str, int] | socket.socket, *,
                      healthz: Callable[[bool], dict[str, Any]] | None = None,
                      shutdown: trio.Event | None = None, reason: str = "shutting down",
                      graceful_timeout: float = 3.0,
                      task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``relay`` (``make_app(relay, healthz=healthz)``) on ``listen``
    (``(host, port)`` or a socket from :func:`~bridges.core.http.bind_socket`)
    until ``shutdown`` is set; then :meth:`Relay.close(reason) <Relay.close>`
    and return. ``task_status.started((host, port))`` reports the bound
    address (useful with port 0). Without ``shutdown`` it serves until
    cancelled."""
    sock = listen if isinstance(listen, socket.socket) else bind_socket(*listen)
    shutdown = shutdown if shutdown is not None else trio.Event()
    await serve_app(make_app(relay, healthz=healthz), sock, shutdown,
                    config=hyper_config(graceful_timeout=graceful_timeout,
                                        max_message=relay.max_body,
                                        errorlog="aep.relay.hypercorn"),
                    before_drain=lambda: relay.close(reason), task_status=task_status)
