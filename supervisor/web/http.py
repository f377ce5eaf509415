"""The daemon's HTTP listener: serving an ASGI app on ``AEP_LISTEN``
(:func:`serve_asgi`, through :func:`bridges.core.http.serve_app`) and the
bare health app for uplink mode (no embedded relay on ``AEP_LISTEN``)."""
from __future__ import annotations

import json
import logging
from typing import Any, Callable

import trio

from bridges.core.asgi import App, Receive, Scope, Send, bearer_ok, lifespan, send_bytes, send_metrics
from bridges.core.http import bind_socket, hyper_config, serve_app

__all__ = ["serve_asgi", "health_app"]

log = logging.getLogger("aep.http")


async def serve_asgi(app: App, host: str, port: int, shutdown: trio.Event, *,
                     max_connections: int | None = None,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` until ``shutdown`` is set (graceful,
    1 s for open handlers), reporting the bound address as a one-element
    list of URLs through ``task_status.started``. Raises ``OSError`` when
    the address cannot be bound.

    Every connection gets an abort handle (:mod:`bridges.core.http`):
    hypercorn shields its socket writes, so an SSE consumer that stopped
    reading would otherwise hold the drain (and the process) forever."""

    class _Started(trio.TaskStatus[tuple[str, int]]):  # the bound address as a URL
        def started(self, value: tuple[str, int] | None = None) -> None:
            assert value is not None
            h, p = value
            task_status.started([f"http://[{h}]:{p}" if ":" in h else f"http://{h}:{p}"])

    await serve_app(app, bind_socket(host, port), shutdown,
                    config=hyper_config(graceful_timeout=1.0, errorlog="hypercorn.error"),
                    max_connections=max_connections, task_status=_Started())


def health_app(token: str | None, healthz: Callable[[bool], dict[str, Any]],
               metrics: Callable[[str], tuple[bytes, str]] | None = None) -> App:
    """An ASGI app answering only ``GET /healthz`` and, given ``metrics``,
    ``GET /metrics`` (:func:`bridges.core.asgi.send_metrics`; everything else
    404). ``healthz(authorized)`` gives the body; without a configured token every
    request counts as authorized (counts are public, exactly as on the relay)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["type"] != "http":
            return
        if scope["path"] == "/metrics" and metrics is not None:
            authed = not token or bearer_ok(token, scope["headers"], scope["query_string"])
            return await send_metrics(send, scope, authed, metrics)
        if scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
            authed = not token or bearer_ok(token, scope["headers"], scope["query_string"])
            body, status = json.dumps(healthz(authed)).encode(), 200
        else:
            body, status = b'{"error":"not-found"}', 404
        await send_bytes(send, status, body, "application/json")

    return app
