"""Command routing through the relay with the SDK's ControlClient (sync and
asyncio) as the real sender and an in-process emitter connection (the path
the fleet's bridges use) as the target (AEP-0004 §4, AEP-0003 §4.1).

Refusals arrive as ``cause``-linked error frames, which the SDK surfaces as
``NackError``: ``unauthorized`` on a watch-only relay (no AEP_TOKEN),
``unsupported`` off the target's declared accepts, ``ambiguous`` for two
live claimants, ``no-route`` with none. Refusals never enter the session's
history."""
from __future__ import annotations

import asyncio
import json

import aep_sdk
import httpx
import pytest
import trio
from aep_sdk import NackError

from tests.support.relay_harness import TOKEN, emitter_hello, event, running_relay

WAIT = 20


class Target:
    """A fake control-capable bridge: acks every command it is handed with
    a sequenced ``control.accepted`` on the target session."""

    def __init__(self, relay, agent="codex", accepts=("control.cancel",), session="s1"):
        self.relay = relay
        self.session = session
        self.commands: list[dict] = []
        self.seq = 0
        self.conn = relay.attach_emitter(emitter_hello(agent, list(accepts)), self.deliver)
        self.agent = agent

    async def start(self):
        await self.conn.ingest(self.ev("session.started", severity="notice", data={}))

    def ev(self, type, **kw):
        e = event(self.seq, session=self.session, type=type, agent=self.agent, **kw)
        self.seq += 1
        return e

    async def deliver(self, cmd):
        self.commands.append(cmd)
        # acks are ordinary sequenced session events (AEP-0004 §3)
        await self.conn.ingest(self.ev("control.accepted", cause=cmd["id"], severity="notice", data={}))


def send_sync(base, token, type_, session, **kw):
    cc = aep_sdk.ControlClient(base, agent="mission-control", host="desk", token=token)
    cc.connect(connect_timeout_ms=WAIT * 1000)
    try:
        return cc.send(type_, session, ack_window_ms=WAIT * 1000, retries=0, **kw)
    except NackError as e:
        return e
    finally:
        cc.close()


async def send(base, token, type_, session, **kw):
    return await trio.to_thread.run_sync(lambda: send_sync(base, token, type_, session, **kw))


async def test_watch_only_relay_refuses_commands_unauthorized():
    async with running_relay(token=None) as (relay, base):
        target = Target(relay)
        await target.start()
        r = await send(base, None, "control.cancel", "s1", data={"scope": "run"})
        assert isinstance(r, NackError) and r.reason == "unauthorized"
        assert "AEP_TOKEN" in r.detail
        assert target.commands == []


async def test_routed_to_the_one_claimant_and_acked():
    async with running_relay(token=TOKEN) as (relay, base):
        target = Target(relay)
        await target.start()
        ack = await send(base, TOKEN, "control.cancel", "s1", data={"scope": "run"})
        assert not isinstance(ack, NackError), ack
        assert ack["type"] == "control.accepted"
        (cmd,) = target.commands
        assert ack["cause"] == cmd["id"] and cmd["data"] == {"scope": "run"}
        assert cmd["agent"] == "mission-control" and "seq" not in cmd


@pytest.mark.parametrize("case", ["unsupported", "no-route", "ambiguous"])
async def test_relay_behalf_refusals(case):
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as c:
        target = Target(relay)
        await target.start()
        session, type_ = "s1", "control.cancel"
        if case == "unsupported":
            type_ = "control.pause"
        elif case == "no-route":
            session = "nobody-owns-this"
        else:
            other = Target(relay, agent="kimi-code")
            await other.start()
        r = await send(base, TOKEN, type_, session, data={})
        assert isinstance(r, NackError)
        # the SDK keeps codes of the nack-reason set as the reason; other relay
        # codes become `invalid` with the wire code leading the detail
        if case == "unsupported":
            assert r.reason == "unsupported" and "control.pause" in r.detail
        else:
            assert r.reason == "invalid" and r.detail.startswith(f"{case}: ")
        assert target.commands == []
        # relay-behalf refusals never enter the addressed session's history
        hist = await c.get(base + "/stream", params={"from": "all", "live": "0",
                                                     "access_token": TOKEN})
        types = [json.loads(ln[6:])["type"] for ln in hist.text.splitlines() if ln.startswith("data: ")]
        assert all(t == "session.started" for t in types), types


def _aio_control(base, token):
    async def main():
        cc = aep_sdk.aio.ControlClient(base, agent="mc-aio", host="desk", token=token)
        await cc.connect(connect_timeout_ms=WAIT * 1000)
        try:
            roster = await cc.roster(timeout_ms=WAIT * 1000)
            ack = await cc.send("control.cancel", "s1", data={"scope": "session"},
                                ack_window_ms=WAIT * 1000, retries=0)
            return roster, ack
        finally:
            await cc.close()
    return asyncio.run(asyncio.wait_for(main(), WAIT * 2))


async def test_aio_control_client_roster_and_command():
    async with running_relay(token=TOKEN) as (relay, base):
        target = Target(relay)
        await target.start()
        roster, ack = await trio.to_thread.run_sync(_aio_control, base, TOKEN)
        assert roster == [{"session": "s1", "agent": "codex", "instance": "box/1/codex",
                           "control": {"accepts": ["control.cancel"], "ack_window_ms": 10000},
                           "emits": ["tool", "control"]}]
        assert ack["type"] == "control.accepted" and ack["cause"] == target.commands[0]["id"]


async def test_retry_with_the_same_id_is_forwarded_again_for_the_target_to_dedupe():
    # the relay is not a terminal consumer: at-least-once redelivery of a
    # command (and of its recorded ack) must traverse the hop (AEP-0003 §5)
    async with running_relay(token=TOKEN) as (relay, base):
        seen = []

        async def deliver(cmd):
            seen.append(cmd["id"])

        target = relay.attach_emitter(emitter_hello("codex", ["control.cancel"]), deliver)
        await target.ingest(event(0))

        def twice():
            cc = aep_sdk.ControlClient(base, agent="mc", host="desk", token=TOKEN)
            cc.connect(connect_timeout_ms=WAIT * 1000)
            try:
                cc.send("control.cancel", "s1", data={"scope": "run"}, ack_window_ms=300, retries=1)
            except NackError as e:
                return e
            finally:
                cc.close()

        r = await trio.to_thread.run_sync(twice)
        assert isinstance(r, NackError) and r.reason == "timeout"  # nobody acked
        assert len(seen) == 2 and seen[0] == seen[1]
