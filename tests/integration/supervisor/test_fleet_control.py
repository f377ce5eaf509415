"""Control through the embedded relay, end to end, with the protocol's own
SDK as the sender and consumer: ``ControlClient`` -> relay ``/socket`` ->
the fleet's in-process emitter connection -> the bridge's inbox -> the shared
command ledger -> ack envelope -> relay channel -> JSONL + relay -> back to
the client (AEP-0004 §3, §4.1).

The bridge is a minimal control-capable test bridge; the relay, fleet,
ledger, stamper, hypercorn and the SDK are the real ones."""
from __future__ import annotations

import pytest
import trio
from aep_sdk import ControlClient, NackError

from bridges.core.bridge import BridgeRun
from bridges.core.control import Refuse, WriteResult
from supervisor.config import Config
from supervisor.fleet import Fleet
from supervisor.relay.app import make_app
from supervisor.relay.core import Relay
from supervisor.web.http import serve_asgi
from tests.support.daemon import Collector
from tests.support.schema import validate_event

TOKEN = "fleet-control-token-0123456789"


class ToyBridge:
    """Owns session ``toy-1``; accepts ``control.cancel`` for runs it knows."""

    name = "toy"
    agent = "toy-agent"

    def __init__(self):
        self.writes: list[dict] = []

    def capabilities(self):
        return {"emits": ["session", "run"],
                "control": {"accepts": ["control.cancel"], "ack_window_ms": 10000}}

    def preflight(self):
        return []

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        ctx.health.source = True
        await ctx.emit("toy-1", {"type": "session.started", "data": {}})
        await ctx.emit("toy-1", {"type": "run.started", "data": {}}, run="r1")

        task_status.started(BridgeRun(controller=ToyController(self.writes)))
        await trio.sleep_forever()


class ToyController:
    """The toy's :class:`~bridges.core.control.Controller`: cancels run r1."""

    accepts = ("control.cancel",)
    ack_window_ms = 10000
    guard_ms = 8000

    def __init__(self, writes: list[dict]) -> None:
        self.writes = writes

    def check(self, cmd):
        if cmd.get("run") != "r1":
            raise Refuse("refused", "no such run")
        return cmd

    def note(self, plan):
        return None

    async def perform(self, plan):
        self.writes.append(plan)
        return WriteResult(200)


async def _serve(tmp_path, token):
    relay = Relay(token=token)
    bridge = ToyBridge()
    fleet = Fleet(Config(state_dir=tmp_path, token=token), [bridge], relay=relay, host="h")
    return relay, bridge, fleet


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-token"])
async def test_sdk_control_client_through_the_embedded_relay(tmp_path, token):
    relay, bridge, fleet = await _serve(tmp_path, token)
    stop = trio.Event()
    async with trio.open_nursery() as n:
        bound = await n.start(serve_asgi, make_app(relay, healthz=fleet.healthz), "127.0.0.1", 0, stop)
        url = bound[0]
        await n.start(fleet.run)
        col = Collector(url, token=token, filter={"session": "toy-1"}, from_="all")

        def drive():
            client = ControlClient(url, agent="operator", host="ops-laptop", token=token)
            client.connect()
            out = {}
            try:
                try:
                    out["ack"] = client.send("control.cancel", "toy-1", run="r1",
                                             data={"scope": "run"}, retries=0)
                except NackError as e:
                    out["nack"] = e
                try:
                    client.send("control.pause", "toy-1", data={}, retries=0)
                except NackError as e:
                    out["undeclared"] = e
                try:
                    client.send("control.cancel", "toy-1", run="r9", data={"scope": "run"},
                                retries=0)
                except NackError as e:
                    out["stale"] = e
                try:
                    client.send("control.cancel", "nobody-owns-this", data={"scope": "run"},
                                retries=0)
                except NackError as e:
                    out["no_route"] = e
            finally:
                client.close()
            return out

        with trio.fail_after(60):
            out = await trio.to_thread.run_sync(drive)
        events = await trio.to_thread.run_sync(col.drain, 1.0)
        col.close()
        stop.set()
        n.cancel_scope.cancel()

    for ev in events:
        validate_event(ev)
    if token is None:
        # watch-only: control never flows on an unauthenticated binding
        assert out["nack"].reason == "unauthorized"
        assert out["undeclared"].reason == "unauthorized"
        assert bridge.writes == []
        assert not [e for e in events if e["type"].startswith("control.")]
        return
    ack = out["ack"]
    assert ack["type"] == "control.accepted" and ack["session"] == "toy-1"
    assert ack["source"].endswith("/agent/toy-agent/session/toy-1") and ack["run"] == "r1"
    assert [w["id"] for w in bridge.writes] == [ack["cause"]]
    assert out["undeclared"].reason == "unsupported"
    assert out["stale"].reason == "refused"
    assert out["no_route"].reason in ("no-route", "invalid")
    # the acks are ordinary sequenced session events on the stream too
    seen = {e["id"]: e for e in events}
    assert ack["id"] in seen and seen[ack["id"]] == ack
    assert [e["type"] for e in events][:2] == ["session.started", "run.started"]
    assert len(bridge.writes) == 1  # refusals never reached the write path


@pytest.mark.parametrize("mode", ["embedded", "uplink"])
async def test_acks_are_counted_and_timed_in_both_modes(tmp_path, mode):
    """/metrics' ack figures: the fleet sees each command arrive (from the
    embedded relay, or from its uplink to a remote relay) and its ack leave."""
    bridge = ToyBridge()
    relay = Relay(token=TOKEN)
    stop = trio.Event()
    async with trio.open_nursery() as n:
        if mode == "embedded":
            fleet = Fleet(Config(state_dir=tmp_path, token=TOKEN), [bridge], relay=relay, host="h")
            app = make_app(relay, healthz=fleet.healthz)
        else:
            app = make_app(relay)
        url = (await n.start(serve_asgi, app, "127.0.0.1", 0, stop))[0]
        if mode == "uplink":
            fleet = Fleet(Config(state_dir=tmp_path, token=TOKEN, relay_url=url), [bridge],
                          host="h")
        await n.start(fleet.run)
        col = Collector(url, token=TOKEN, filter={"session": "toy-1"}, from_="all")
        await col.wait_for(lambda c: c.of("toy-1", "run.started"), what="run.started")

        def drive():
            client = ControlClient(url, agent="operator", host="ops-laptop", token=TOKEN)
            client.connect()
            try:
                client.send("control.cancel", "toy-1", run="r1", data={"scope": "run"}, retries=0)
                with pytest.raises(NackError):
                    client.send("control.cancel", "toy-1", run="r9", data={"scope": "run"},
                                retries=0)
            finally:
                client.close()

        with trio.fail_after(60):
            await trio.to_thread.run_sync(drive)
        col.close()
        await fleet.drain()
        stop.set()
        n.cancel_scope.cancel()
    assert fleet.acks == {("toy", "accepted", ""): 1, ("toy", "rejected", "refused"): 1}
    reg = fleet.metrics.registry
    assert reg.get_sample_value("aep_bridges_command_ack_latency_seconds_count") == 2
    assert reg.get_sample_value("aep_bridges_command_acks_total", {
        "bridge": "toy", "decision": "rejected", "reason": "refused"}) == 1
    assert reg.get_sample_value("aep_bridges_events_emitted_total", {
        "bridge": "toy", "family": "control"}) == 2
