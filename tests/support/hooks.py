"""Test rig for the hook bridges: a :class:`HookBridge` run through
``supervisor.fleet.run_bridge`` (the real ledger), its mounted ASGI app
called in process, and the envelopes it put on the relay channel."""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Iterator

import trio

from bridges.core.bridge import BridgeContext, BridgeHealth, Outbound
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.hooks_common.bridge import HookBridge, HookRun
from bridges.hooks_common.config import HookConfig
from bridges.hooks_common.profile import HookProfile
from supervisor.fleet import run_bridge


class FakeMounts:
    """``ctx.mounts`` without a listener: the app is kept for the test to call."""

    def __init__(self) -> None:
        self.apps: dict[str, Any] = {}

    @contextlib.contextmanager
    def mount(self, path: str, app: Any) -> Iterator[None]:
        self.apps[path] = app
        try:
            yield
        finally:
            del self.apps[path]


class Rig:
    """One bridge run: ``post(moment)`` -> ``(status, headers, reply)``;
    ``events()`` drains the relay channel; ``command(...)`` sends a command
    through the fleet's ledger and returns its ack."""

    def __init__(self, profile: HookProfile, config: HookConfig,
                 policy: CapturePolicy | None = None) -> None:
        self.profile = profile
        self.bridge = HookBridge(profile, config, policy or CapturePolicy(),
                                 spool_interval_s=0.05)
        self.out_s, self.out_r = trio.open_memory_channel[Outbound](10_000)
        self.cmd_s, cmd_r = trio.open_memory_channel[dict](100)
        self.mounts = FakeMounts()
        self.ctx = BridgeContext(profile.key, Stamper(profile.agent, epoch=1, host="h",
                                                      policy=policy or CapturePolicy()),
                                 self.out_s, cmd_r, BridgeHealth(), logging.getLogger("t.hooks"),
                                 self.mounts)
        self.seen: list[dict[str, Any]] = []
        self.run: HookRun | None = None

    async def start(self, nursery: trio.Nursery) -> HookRun:
        self.run = await nursery.start(run_bridge, self.bridge, self.ctx)
        return self.run

    @property
    def app(self) -> Any:
        return self.mounts.apps[f"/hooks/{self.profile.agent}"]

    async def post(self, moment: Any, *, headers: dict[str, str] | None = None,
                   raw: bytes | None = None, hangup: trio.Event | None = None
                   ) -> tuple[int, dict[str, str], Any]:
        body = raw if raw is not None else json.dumps(moment).encode()
        sent: list[dict[str, Any]] = []
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            if hangup is not None:
                await hangup.wait()
                return {"type": "http.disconnect"}
            await trio.sleep_forever()
            raise AssertionError

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        hs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        await self.app({"type": "http", "method": "POST", "path": "/", "headers": hs},
                       receive, send)
        start = sent[0]
        h = {k.decode(): v.decode() for k, v in start["headers"]}
        data = b"".join(m.get("body", b"") for m in sent[1:])
        return start["status"], h, (json.loads(data) if data else None)

    def events(self) -> list[dict[str, Any]]:
        while True:
            try:
                self.seen.append(self.out_r.receive_nowait().event)
            except trio.WouldBlock:
                return self.seen

    def types(self) -> list[str]:
        return [e["type"] for e in self.events()]

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["type"] == type_]

    async def command(self, type_: str, session: str, data: dict[str, Any], *,
                      subject: str | None = None, cid: str = "cmd1") -> dict[str, Any]:
        cmd = {"aep": "0.1", "id": cid, "type": type_, "time": "2026-01-01T00:00:00Z",
               "source": "aep://ops/agent/op", "agent": "op", "session": session, "data": data}
        if subject:
            cmd["subject"] = subject
        await self.cmd_s.send(cmd)
        for _ in range(2000):
            for e in self.events():
                if e["type"] in ("control.accepted", "control.rejected") and e.get("cause") == cid:
                    return e
            await trio.sleep(0.001)
        raise AssertionError(f"no ack for {cid}")

    async def wait_for(self, type_: str, n: int = 1) -> list[dict[str, Any]]:
        for _ in range(5000):
            hits = self.of(type_)
            if len(hits) >= n:
                return hits
            await trio.sleep(0.001)
        raise AssertionError(f"no {type_} in {self.types()}")


def captured_moments(real: Path, scenario: str) -> list[dict[str, Any]]:
    """One capture scenario's real hook payloads (``real/<scenario>/*.json``), in order."""
    return [json.loads(p.read_text()) for p in sorted((real / scenario).glob("*.json"))]


async def replay_capture(profile: HookProfile, real: Path, scenario: str) -> Rig:
    """A :class:`Rig` of ``profile`` fed every moment of a capture scenario,
    each answered 200 ``{}`` (no decision: nothing is held)."""
    rig = Rig(profile, HookConfig())
    async with trio.open_nursery() as n:
        await rig.start(n)
        for mo in captured_moments(real, scenario):
            status, _, reply = await rig.post(mo)
            assert (status, reply) == (200, {})
        n.cancel_scope.cancel()
    return rig
