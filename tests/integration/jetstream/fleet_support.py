"""In-process fleets publishing into a real nats-server (issue 14): the
real Fleet, stamper, ledger, embedded relay and JetStream sink, with small
test bridges (a burst emitter; a control-capable bridge) standing in for a
vendor, as tests/integration/supervisor/test_fleet_control.py does (its
``ToyBridge`` is the control-capable one here too)."""
from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator

import trio

from bridges.core.bridge import BridgeRun
from supervisor.config import Config
from supervisor.fleet import Fleet
from supervisor.jetstream.config import from_env
from supervisor.relay.core import Relay

SEVERITIES = ("debug", "info", "notice", "warning")


class BurstBridge:
    """Emits ``n`` events round-robin over ``sessions`` sessions named
    ``<prefix>-<k>``, severity cycling debug/info/notice/warning, ``pace``
    seconds apart (0: as fast as the channel takes them), once ``start`` is
    set (when given); ``done`` once all are stamped."""

    agent = "toy"

    def __init__(self, n: int, sessions: int = 4, *, pace: float = 0.0, name: str = "burst",
                 start: trio.Event | None = None, prefix: str = "ses") -> None:
        self.name = name
        self.prefix = prefix
        self.n = n
        self.sessions = sessions
        self.pace = pace
        self.start = start
        self.done = trio.Event()
        self.emitted: list[dict[str, Any]] = []

    def capabilities(self) -> dict[str, Any]:
        return {"emits": ["x.toy.*"]}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        return []

    def listeners(self) -> dict[str, Any]:
        return {}

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        ctx.health.source = True
        task_status.started(BridgeRun())
        if self.start is not None:
            await self.start.wait()
        for i in range(self.n):
            ev = await ctx.emit(f"{self.prefix}-{i % self.sessions}", {"type": "x.toy.tick", "data": {"i": i}},
                                severity=SEVERITIES[i % len(SEVERITIES)])
            self.emitted.append(ev)
            if self.pace:
                await trio.sleep(self.pace)
        self.done.set()
        await trio.sleep_forever()


def nats_config(url: str, **env: str):
    cfg, problems = from_env({"AEP_NATS_URL": url, **env})
    assert cfg is not None and not problems, problems
    return cfg


@contextlib.asynccontextmanager
async def running_fleet(tmp_path, bridges, url: str, *, token: str | None = "t" * 32,
                        claim_grace: float = 120.0, **env: str) -> AsyncIterator[Fleet]:
    """A Fleet (embedded relay, JetStream sink on ``url``) running in a
    nursery; cancelled (after a bounded drain) on exit. ``env``: the
    ``AEP_NATS_*`` settings; ``claim_grace``: ``AEP_CLAIM_GRACE``."""
    cfg = Config(state_dir=tmp_path / "state", token=token, nats=nats_config(url, **env),
                 claim_grace=claim_grace)
    fleet = Fleet(cfg, list(bridges), relay=Relay(token=token), host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        try:
            yield fleet
        finally:
            with trio.move_on_after(5):
                await fleet.drain()
            n.cancel_scope.cancel()


async def wait_published(fleet: Fleet, count: int, timeout: float = 60.0) -> None:
    """Until the JetStream sink has ``count`` events acknowledged and an
    empty outbox. Duplicate acks count: an event whose first PubAck timed
    out under load (stored all the same) is acknowledged by its resend as a
    duplicate (seen in a parallel run: ``acked - duplicates`` then never
    reached ``count``); the callers read the stream itself for what it holds."""
    pub = fleet.jetstream.publisher
    with trio.fail_after(timeout):
        while pub.stats()["acked"] < count or pub.depth:
            await trio.sleep(0.05)


def decoded(msgs) -> list[dict[str, Any]]:
    return [json.loads(m.data) for m in msgs]
