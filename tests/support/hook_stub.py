"""A stub of the daemon's hook endpoint (``POST /hooks/<agent>``, the wire
contract's section 1) for fault injection around the command shim: it
answers, holds (``AEP-Hold-Ms``), stays silent, fails with a 5xx or answers
a body that is not JSON, as :attr:`HookStub.mode` says. Real hypercorn on
loopback (:func:`tests.support.net.serve_loopback`). Every request it saw is
kept in :attr:`HookStub.requests`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from bridges.core.asgi import headers
from bridges.core.signed import SignedAnswer
from tests.support.net import http_body, serve_loopback

#: what the stub does with a request
MODES = ("answer", "hold", "silent", "5xx", "400", "404", "not-json", "hold-forever",
         "401", "403")


@dataclass
class Seen:
    """One request: its path, lower-cased headers, body and arrival (``trio.current_time()``)."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0


@dataclass
class HookStub:
    """``mode``: one of :data:`MODES`; ``decision``: the 200 body;
    ``hold_ms``: the ``AEP-Hold-Ms`` it announces; ``hold_s``: how long
    it holds before the body; ``silent_s``: how long it says nothing;
    ``token``: the daemon's ``AEP_TOKEN``, with which it proves itself
    (``AEP-Proof``, :mod:`bridges.core.signed`); ``None``: it cannot (a
    process squatting the daemon's port)."""

    mode: str = "answer"
    decision: bytes = b"{}"
    hold_ms: int = 5000
    hold_s: float = 1.3
    silent_s: float = 30.0
    requests: list[Seen] = field(default_factory=list)
    finished: int = 0  # handlers that ran to their end (a silent one not before silent_s)
    url: str = ""
    token: str | None = None
    #: a listener between the shim and the daemon: the daemon's proofs, its own body / hold
    forged_body: bytes | None = None
    forged_hold_ms: int | None = None

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        self.requests.append(Seen(scope["path"], headers(scope), body, trio.current_time()))
        ctype = [(b"content-type", b"application/json")]
        signed = None if self.token is None else SignedAnswer(
            self.token, self.requests[-1].headers.get("x-aep-hook-id", ""))
        if self.mode == "silent":
            await trio.sleep(self.silent_s)
        if self.mode in ("hold", "hold-forever"):
            hold = str(self.hold_ms)
            proof = [signed.head(200, hold)] if signed else []
            if self.forged_hold_ms is not None:
                hold = str(self.forged_hold_ms)
            await send({"type": "http.response.start", "status": 200,
                        "headers": ctype + [(b"aep-hold-ms", hold.encode()), *proof]})
            await trio.sleep(self.hold_s if self.mode == "hold" else 3600)
            await send({"type": "http.response.body",
                        "body": signed.body(self.decision) if signed else self.decision})
            self.finished += 1
            return
        status = {"5xx": 503, "400": 400, "404": 404, "401": 401, "403": 403}.get(self.mode, 200)
        if status in (401, 403):  # the daemon's guard: it cannot prove (the tokens differ)
            signed = None
        out = {"5xx": b'{"error":"busy"}', "400": b'{"error":"not a JSON object"}',
               "401": b'{"error":"unauthorized"}', "403": b'{"error":"origin-not-allowed"}',
               "404": b"not found", "not-json": b"<html>oops</html>"}.get(self.mode,
                                                                       self.decision)
        if signed is not None:
            ctype.append(signed.head(status))
            out = signed.body(out) if status == 200 else out
            if self.forged_body is not None:
                out = out.partition(b"\n")[0] + b"\n" + self.forged_body
        await send({"type": "http.response.start", "status": status,
                    "headers": ctype + [(b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})
        self.finished += 1

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started`` after :attr:`url` is set."""
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(serve_loopback, self.app)
            task_status.started(self.url)


async def _serve_forever(mode: str, token: str | None = None) -> None:
    stub = HookStub(mode=mode, token=token)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(stub.serve)
        print(url, flush=True)


if __name__ == "__main__":  # a stub in its own process (the shim benchmark)
    import sys
    trio.run(_serve_forever, sys.argv[1] if len(sys.argv) > 1 else "answer",
             sys.argv[2] if len(sys.argv) > 2 else None)
