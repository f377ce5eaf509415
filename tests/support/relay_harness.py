"""A real relay on a loopback port for integration tests: ``Relay`` served
by ``serve_relay`` (hypercorn, trio worker) on 127.0.0.1 port 0, shut down
in order when the block exits. Plus small helpers shared by the relay
integration tests (event builders, an SSE reader over httpx-sse)."""
from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial
from typing import Any, AsyncIterator

import httpx
import trio

from supervisor.relay.core import Relay
from supervisor.relay.serve import serve_relay

TOKEN = "relay-test-token"


@asynccontextmanager
async def running_relay(*, healthz=None, **relay_kw: Any) -> AsyncIterator[tuple[Relay, str]]:
    """``async with running_relay(token=...) as (relay, base_url): ...``"""
    relay = Relay(**relay_kw)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(partial(serve_relay, relay, ("127.0.0.1", 0),
                                                 shutdown=stop, healthz=healthz))
        try:
            yield relay, f"http://{host}:{port}"
        finally:
            stop.set()


def event(seq: int, session: str = "s1", type: str = "tool.completed", **kw: Any) -> dict[str, Any]:
    agent = kw.pop("agent", "codex")
    ev = {"aep": "0.1", "id": kw.pop("id", f"{agent}-{session}-{kw.get('epoch', 0)}-{seq}"),
          "type": type, "time": "2026-11-30T12:00:00.000Z",
          "source": f"aep://box/agent/{agent}/session/{session}", "agent": agent,
          "session": session, "seq": seq}
    ev.update(kw)
    return ev


def emitter_hello(agent: str = "codex", accepts: list[str] | None = None, **caps: Any) -> dict[str, Any]:
    h: dict[str, Any] = {"type": "hello", "versions": ["0.1"], "role": "emitter",
                         "identity": {"agent": agent, "instance": f"box/1/{agent}"},
                         "capabilities": {"emits": ["tool", "control"], **caps}}
    if accepts is not None:
        h["capabilities"]["control"] = {"accepts": accepts, "ack_window_ms": 10000}
    return h


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def wait_until(pred, *, timeout: float = 15.0, step: float = 0.02) -> None:
    """Poll ``pred()`` (sync) until true; fail after a generous timeout."""
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(step)


class SSE:
    """A raw SSE reader (httpx stream): records every message and comment."""

    def __init__(self) -> None:
        self.messages: list[dict[str, str]] = []
        self.comments: list[str] = []
        self.status: int | None = None
        self.ended = trio.Event()

    async def run(self, client: httpx.AsyncClient, url: str, headers=None, params=None, *,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with client.stream("GET", url, headers=headers, params=params) as r:
                self.status = r.status_code
                task_status.started(self)
                fields: dict[str, str] = {}
                async for line in r.aiter_lines():
                    if line == "":
                        if fields:
                            self.messages.append(fields)
                            fields = {}
                    elif line.startswith(":"):
                        self.comments.append(line[1:].strip())
                    else:
                        k, _, v = line.partition(":")
                        fields[k] = v[1:] if v.startswith(" ") else v
        finally:
            self.ended.set()
