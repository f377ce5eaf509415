"""Loopback plumbing for the tests: a free port number for processes that need
one up front (the daemon's listeners, a vendor server's ``--port``), and
hypercorn serving a test double's ASGI app on 127.0.0.1 and the start of
such an app (:func:`http_body`). The app-side ASGI chores themselves
(lifespan, body, headers, JSON responses) are ``bridges.core.asgi``'s."""
from __future__ import annotations

import socket
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from bridges.core.asgi import lifespan, read_body


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago. Another process may
    take it before ours binds: :class:`tests.support.daemon.DaemonProcess`
    retries that race."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` DISTINCT free TCP ports on 127.0.0.1: all bound at once before any
    is released, since successive :func:`free_port` calls may be handed the
    same port back (a daemon given one port for two listeners refuses to start)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


async def serve_loopback(app: Any, *, port: int = 0, graceful_timeout: float = 0.2,
                         websocket_max_message_size: int | None = None,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` with hypercorn (trio worker) on ``127.0.0.1:port`` (0: any
    free port), logs off, until cancelled; ``task_status.started`` reports the
    base URL (``http://127.0.0.1:P``, no trailing slash)."""
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = graceful_timeout
    if websocket_max_message_size is not None:
        config.websocket_max_message_size = websocket_max_message_size
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn_serve, app, config))
        task_status.started(binds[0].rstrip("/"))


async def http_body(scope: dict[str, Any], receive: Any, send: Any) -> bytes | None:
    """How a test double's ASGI app starts: answers the lifespan protocol,
    ignores anything but HTTP, and reads the whole request body. ``None``
    when there is no request to answer (lifespan, not HTTP, or the client
    left before the body was in)."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return None
    if scope["type"] != "http":
        return None
    return await read_body(receive)
