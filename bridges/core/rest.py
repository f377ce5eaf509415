"""Vendor REST answers read within bounds, for every bridge that calls a
vendor's REST API (OpenHands, the OpenCode family, Kimi web): an answer is
read streamed, :data:`MAX_BODY` bytes at most, whole within
:data:`DEADLINE` seconds, and its JSON passes
:func:`bridges.core.aep.check_json` before the parse.

Why (round 15 of issue 25, finding 2): ``httpx`` reads a plain ``get``'s
body whole, and its timeout is per read, so a server (hostile, or squatting
a vendor's port) answering 400 MB of JSON grew the daemon to 2.4 GB and held
the loop until gated hooks failed open, one answering an endless body grew it
~95 MB/s without end, and 200,000 ``[`` crashed the bridge with a
``RecursionError`` on every poll.

Every refusal is one :class:`BadAnswer` (a ``ValueError``): the callers
already count a ``ValueError`` as a malformed vendor answer and degrade or
back off, never crash. Transport failures stay ``httpx.HTTPError``."""
from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from .aep import check_json, loads
from .pacing import YIELD_BYTES

__all__ = ["DEADLINE", "MAX_BODY", "BadAnswer", "fetch", "parse_json"]

MAX_BODY = 16 * 1024 * 1024
"""Most bytes of one vendor REST answer read (decoded, as they arrive):
past it the answer is refused and the rest is never read. A page of 100
sessions or conversations is tens of KiB; a socket frame's cap is the same
16 MiB."""
DEADLINE = 30.0
"""Seconds one REST exchange (request, headers, the whole body) may take:
``httpx``'s own timeouts are per read, so a body that keeps coming, however
slowly, would never end them."""

_DROPPED = ("content-encoding", "content-length", "transfer-encoding")


class BadAnswer(ValueError):
    """A vendor REST answer refused: its body over the byte cap, not whole
    within the deadline, or not JSON within
    :func:`~bridges.core.aep.check_json`'s caps (nested too deep
    included). ``status``: the answer's HTTP status when its headers came,
    else ``None``. The message is short and secret-free."""

    def __init__(self, status: int | None, why: str) -> None:
        super().__init__(f"HTTP {status}: {why}" if status is not None else why)
        self.status = status


async def fetch(client: httpx.AsyncClient, method: str, url: str, *,
                max_bytes: int = MAX_BODY, deadline: float = DEADLINE,
                status_only: bool = False, **kw: Any) -> httpx.Response:
    """``client``'s answer to ``method url`` (``kw`` as for
    ``client.stream``: ``params``, ``json``, ``headers``, ``timeout``), its
    body read streamed, ``max_bytes`` bytes at most (an announced
    ``Content-Length`` over it is refused before reading), the whole
    exchange within ``deadline`` seconds. Returns a response with the
    status, the headers (less the transfer ones) and the body read; a body
    of over :data:`~bridges.core.pacing.YIELD_BYTES` is followed by one more
    checkpoint, so its check and parse (:func:`parse_json`, at most ~0.15 s
    of CPU at the caps) start a fresh step of the event loop.

    Raises :class:`BadAnswer` for a body over the cap or an exchange past
    the deadline (the connection is closed, the rest unread), ``httpx``'s
    errors for the transport. ``status_only`` (a write, whose status is its
    answer): a refused body is dropped instead (an empty body, the status
    kept); only a deadline passed before the headers raises."""
    out: httpx.Response | None = None  # the status alone, once the headers are in
    body: bytes | None = None
    with trio.move_on_after(deadline):
        async with client.stream(method, url, **kw) as r:
            out = httpx.Response(r.status_code, request=r.request, headers=[
                (k, v) for k, v in r.headers.multi_items() if k.lower() not in _DROPPED])
            announced = r.headers.get("content-length", "")
            if announced.isdigit() and int(announced) > max_bytes:
                return _refused(out, status_only, f"answer of {announced} bytes, over {max_bytes}")
            chunks: list[bytes] = []
            n = 0
            async for chunk in r.aiter_bytes():
                n += len(chunk)
                if n > max_bytes:
                    return _refused(out, status_only, f"answer over {max_bytes} bytes")
                chunks.append(chunk)
            body = b"".join(chunks)
    if body is None or out is None:
        if status_only and out is not None:
            return out
        raise BadAnswer(None if out is None else out.status_code,
                        f"answer not whole within {deadline:g}s")
    if len(body) > YIELD_BYTES:
        await trio.lowlevel.checkpoint()
    return httpx.Response(out.status_code, headers=out.headers, content=body, request=out.request)


def _refused(out: httpx.Response, status_only: bool, why: str) -> httpx.Response:
    if status_only:
        return out
    raise BadAnswer(out.status_code, why)


def parse_json(raw: bytes, status: int | None = None) -> Any:
    """The JSON value of a vendor answer's body ``raw``, exactly
    ``json.loads(raw)`` (``NaN`` and ``Infinity`` included) for a body
    within :func:`~bridges.core.aep.check_json`'s caps, read with the
    project's reader :func:`bridges.core.aep.loads` first. Raises
    :class:`BadAnswer` (with ``status``) for a body over the caps (refused
    before the parse), not JSON, or nested too deep for the parser (never a
    ``RecursionError``)."""
    try:
        check_json(raw)
    except ValueError as e:
        raise BadAnswer(status, f"not JSON within the caps ({e})") from None
    try:
        return loads(raw)
    except ValueError:
        pass
    try:
        return json.loads(raw)  # NaN/Infinity, which a vendor may send; or json's refusal
    except (ValueError, RecursionError):
        raise BadAnswer(status, "not JSON") from None
