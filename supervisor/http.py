"""Serving ASGI apps with hypercorn's trio worker, and the daemon's bare
health app for uplink mode (no embedded relay on ``AEP_LISTEN``)."""
from __future__ import annotations

import hmac
import json
import logging
import urllib.parse
from typing import Any, Callable

import trio
from hypercorn.config import Config as HyperConfig
from supervisor.asgi import lifespan

log = logging.getLogger("aep.http")


def hyper_config(host: str, port: int, *, graceful_timeout: float = 1.0) -> HyperConfig:
    """A hypercorn config bound to one address, access log off (query strings
    may carry ``access_token``, AEP-0003 §8.1)."""
    hc = HyperConfig()
    hc.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.graceful_timeout = graceful_timeout
    hc.keep_alive_timeout = 75
    return hc


async def serve_asgi(app: Any, host: str, port: int, shutdown: trio.Event, *,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` until ``shutdown`` is set (graceful),
    reporting the bound addresses through ``task_status.started``.

    Runs hypercorn's trio worker through :func:`supervisor.relay.serve.serve_app`,
    which gives every connection an abort handle: hypercorn shields its
    socket writes, so an SSE consumer that stopped reading would otherwise
    hold the drain (and the process) forever."""
    from .relay.serve import bind_socket, serve_app

    class _Started:
        def started(self, addr: tuple[str, int]) -> None:
            h, p = addr
            task_status.started([f"http://[{h}]:{p}" if ":" in h else f"http://{h}:{p}"])

    await serve_app(app, bind_socket(host, port), shutdown, config=hyper_config(host, port),
                    task_status=_Started())


def bearer_ok(token: str | None, headers: list[tuple[bytes, bytes]], query: bytes) -> bool:
    """True when no token is configured or the request carries it in
    ``Authorization: Bearer`` or ``?access_token=`` (constant-time compare)."""
    if not token:
        return True
    for k, v in headers:
        if k.lower() == b"authorization":
            scheme, _, cred = v.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(cred.strip(), token):
                return True
    for k, v in urllib.parse.parse_qsl(query.decode("latin-1")):
        if k == "access_token" and hmac.compare_digest(v, token):
            return True
    return False


def health_app(token: str | None, healthz: Callable[[bool], dict[str, Any]]) -> Any:
    """An ASGI app answering only ``GET /healthz`` (everything else 404)."""

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["type"] != "http":
            return
        if scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
            # no token configured: counts are public, exactly as on the relay
            authed = bearer_ok(token, scope["headers"], scope["query_string"])
            body, status = json.dumps(healthz(authed)).encode(), 200
        else:
            body, status = b'{"error":"not-found"}', 404
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app
