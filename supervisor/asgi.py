"""The few ASGI chores every HTTP surface here repeats (the relay, the OTLP
receiver, the health app, the test doubles of vendor servers), written once.
Hypercorn does the protocol; these are just the app-side conventions."""
from __future__ import annotations

import json
from typing import Any, Iterable

Scope = dict[str, Any]


async def lifespan(receive: Any, send: Any) -> None:
    """Answer the ASGI lifespan protocol: nothing to start or stop."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Any, limit: int | None = None) -> bytes | None:
    """The whole request body, or ``None`` if the client disconnected first.
    Raises ``OverflowError`` past ``limit`` bytes (the caller answers 413)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise OverflowError(f"body over {limit} bytes")
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


def headers(scope: Scope) -> dict[str, str]:
    """Request headers as a lower-cased ``str`` dict (last one wins)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def send_bytes(send: Any, status: int, body: bytes, content_type: str,
                     extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """One complete response."""
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Any, status: int, obj: Any,
                    extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """One complete JSON response."""
    await send_bytes(send, status, json.dumps(obj).encode(), "application/json", extra)
