"""Loopback plumbing for the tests: a free port number for processes that need
one up front (the daemon's listeners, a vendor server's ``--port``), and
hypercorn serving a test double's ASGI app on 127.0.0.1 and the start of
such an app (:func:`http_body`). The app-side ASGI chores themselves
(lifespan, body, headers, JSON responses) are ``bridges.core.asgi``'s."""
from __future__ import annotations

import os
import socket
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from bridges.core.asgi import lifespan, read_body

# Under pytest-xdist each worker takes its ports from its own slice of
# [_RANGE_START, _RANGE_END): below Linux's ephemeral range (32768-60999,
# where bind(0) and every outgoing connection's source port come from), so
# no worker is handed a port another worker just picked and released, and
# no connection's source port lands on a port a test is about to bind.
_RANGE_START, _RANGE_END = 20000, 32000
_cursor: int | None = None


def _worker_slice() -> tuple[int, int] | None:
    """``(start, end)`` of this xdist worker's ports, ``None`` outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0), int(worker[2:]) + 1)
    span = (_RANGE_END - _RANGE_START) // count
    start = _RANGE_START + int(worker[2:]) * span
    return start, start + span


def _bindable(port: int) -> socket.socket | None:
    """A socket bound to 127.0.0.1:``port`` (no SO_REUSEADDR: a port still in
    TIME_WAIT counts as taken), or ``None`` when it cannot be bound."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s
    except OSError:
        s.close()
        return None


def _from_slice(n: int, lo: int, hi: int) -> list[socket.socket]:
    """``n`` sockets bound to the next bindable ports of ``[lo, hi)``, walking
    on from where the last call stopped (a random start per process, so two
    checkouts' runs on one machine seldom walk the same ports together)."""
    global _cursor
    if _cursor is None or not lo <= _cursor < hi:
        _cursor = lo + (os.getpid() * 7919) % (hi - lo)
    socks: list[socket.socket] = []
    for _ in range(hi - lo):
        port = _cursor
        _cursor = lo if _cursor + 1 >= hi else _cursor + 1
        s = _bindable(port)
        if s is not None:
            socks.append(s)
            if len(socks) == n:
                return socks
    for s in socks:
        s.close()
    raise OSError(f"no {n} free ports in {lo}-{hi - 1}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (:func:`free_ports`)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` DISTINCT free TCP ports on 127.0.0.1: all bound at once before any
    is released, since successive kernel-chosen ports may repeat (a daemon
    given one port for two listeners refuses to start). Under pytest-xdist
    they come from the worker's own range (module comment), so parallel
    workers never share one; another process may still take a port before
    ours binds: :class:`tests.support.daemon.DaemonProcess` retries that race."""
    bounds = _worker_slice()
    if bounds is not None:
        socks = _from_slice(n, *bounds)
    else:
        socks = [socket.socket() for _ in range(n)]
    try:
        if bounds is None:
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
