"""Issue 25 across hosts: a daemon's fleet binds its sessions in KV
``AEP_bindings`` (``supervisor/jetstream/presence.py``), so a remote emitter
on any JetStream relay of the same NATS can neither claim one over
``/socket`` (before: both claims landed in ``AEP_claims`` and every command
to the fleet's session was refused ``ambiguous``) nor post into it.

The real Fleet (a burst bridge, the JetStream sink and presence) and a
real :class:`JetStreamRelay` on one real ``nats-server``; the relay's
emitter is the SDK duplex."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import trio

from bridges.core.bridge import BridgeRun
from supervisor.jetstream.link import aio, open_link
from supervisor.jetstream.subjects import parse_value, token
from tests.support.hardening import event
from tests.support.js_relay_harness import TOKEN, SocketEmitter, running_js_relay
from tests.support.nats import NatsCluster, stream_messages

from .fleet_support import BurstBridge, decoded, nats_config, running_fleet, wait_published

POST = {"authorization": f"Bearer {TOKEN}", "aep-version": "0.1",
        "content-type": "application/json"}


async def _wait(pred, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


async def test_a_fleet_session_cannot_be_claimed_or_posted_into_on_a_relay(tmp_path) -> None:
    with NatsCluster(1, tmp_path / "nats") as c:
        bridge = BurstBridge(2, sessions=1, prefix="fleet")
        async with running_fleet(tmp_path, [bridge], c.url, token=TOKEN) as fleet, \
                running_js_relay(c.url, token=TOKEN) as (relay, base):
            await wait_published(fleet, 2)
            await _wait(lambda: fleet.jetstream.presence.counters["claims_put"] >= 1)
            session = bridge.emitted[0]["session"]
            em = await trio.to_thread.run_sync(lambda: SocketEmitter(
                base, token=TOKEN, agent="toy", host="elsewhere", accepts=["control.cancel"]))
            try:
                em.session(session).emit("run.started", severity="notice")
                await _wait(lambda: relay.counters["refused_owned_session"] >= 1)
                errors = [f for f in em.frames if f.get("type") == "error"]
                assert [f["code"] for f in errors] == ["invalid-event"], em.frames
                assert "bridge of this daemon" in errors[0]["detail"], errors
            finally:
                em.close()
            ev = event(99, session, agent="toy", source=bridge.emitted[0]["source"], id="forged")
            async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
                r = await client.post(base + "/events", headers=POST, json=ev)
            assert r.status_code == 400 and r.json()["error"] == "invalid-event", r.text
            assert relay.counters["refused_owned_session"] == 2, (r.text, relay.counters)
            assert relay.counters["published"] == 0


async def test_a_fleet_bridge_never_takes_a_credentials_session_in_the_bucket(tmp_path) -> None:
    """Outside review of issue 25, across hosts: the daemon's presence *put*
    the fleet's binding over whatever the bucket held, so a bridge made to
    emit into a per-emitter credential's session (an OTLP export naming it)
    took the session on every relay; the credential lost its claim at the
    next refresh. Now the fleet creates its binding or takes back a
    shared-token one, never a credential's: its claim is not put, and its
    events in the session are dropped from then on (not logged, not
    published, counted ``refused_fleet_into_owned``). The stated limit: what
    the fleet emitted before the bucket answered its first claim (here the
    first bridge's one event) is logged and published."""
    with NatsCluster(1, tmp_path / "nats") as c:
        later = trio.Event()
        first = BurstBridge(1, sessions=1, prefix="cred", name="first")
        second = BurstBridge(5, sessions=1, prefix="cred", name="second", start=later)
        session = "cred-0"
        async with running_js_relay(c.url, token=TOKEN,
                                    emitter_tokens={"alice": "alice-tok-7f"}) as (relay, base):
            em = await trio.to_thread.run_sync(lambda: SocketEmitter(
                base, token="alice-tok-7f", agent="alice", host="elsewhere",
                accepts=["control.cancel"]))
            try:
                em.session(session).emit("run.started", severity="notice")
                await _wait(lambda: relay.counters["published"] >= 1)
                async with running_fleet(tmp_path, [first, second], c.url, token=TOKEN) as fleet:
                    presence = fleet.jetstream.presence
                    await _wait(lambda: session in presence.lost)
                    later.set()
                    await _wait(lambda: presence.counters["refused_fleet_into_owned"] >= 5)
                    await wait_published(fleet, 1)
                    assert all(s != session for (_, _, s) in presence.claims.items())
                    entry = await aio(relay._kv_bindings.get)(token(session))
                    assert parse_value(entry.value)["principal"] == "emitter:alice"
                    logged = [json.loads(line) for f in (tmp_path / "state").rglob("*.jsonl")
                              for line in f.read_text().splitlines() if line.strip()]
                    dropped = {e["id"] for e in second.emitted}
                    assert len(dropped) == 5 and first.emitted[0]["id"] in \
                        {e.get("id") for e in logged}
                    assert not [e for e in logged if e.get("id") in dropped], logged
                    assert fleet.jetstream.publisher.stats()["acked"] == 1
                # the credential goes on in its session, never refused
                em.session(session).emit("run.completed", severity="notice")
                await _wait(lambda: relay.counters["published"] >= 2)
                assert not [f for f in em.frames if f.get("type") == "error"], em.frames
                assert relay.counters["fleet_reclaimed"] == 0
            finally:
                em.close()


#: the test's ``AEP_CLAIM_GRACE`` and ``AEP_NATS_CLAIM_TTL`` (a refresh each
#: ``TTL / 3`` s): a shared-token binding is idle for the fleet once its
#: ``at`` is older than ``GRACE + TTL / 3`` (``presence.py`` ``_bind``)
GRACE, CLAIM_TTL = 2.0, 6.0
IDLE_MS = (GRACE + CLAIM_TTL / 3) * 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _binding(relay, session: str) -> dict[str, Any]:
    entry = await aio(relay._kv_bindings.get)(token(session))
    return parse_value(entry.value) or {}


async def test_a_fleet_bridge_takes_a_shared_token_session_only_once_its_binding_is_stale(
        tmp_path) -> None:
    """Outside review of issue 25, across hosts: the daemon's presence took
    any shared-token binding back (compare-and-set), so an unauthenticated
    OTLP export naming a live shared-token emitter's session made the fleet
    take it on every relay (the emitter lost its claim at the next
    refresh). Now the fleet takes a shared or anonymous binding only once
    its ``at`` (re-put by its relay each claim refresh while a claimant is
    connected, and when it leaves) is older than ``AEP_CLAIM_GRACE`` plus
    one refresh. ``sh-0``: its emitter is connected, so the fleet's events
    there are dropped (not logged, not published, counted
    ``refused_fleet_into_owned``; the stated limit: the one event emitted
    before the bucket answered the first claim is published) and the
    binding stays the emitter's. ``sh-1``: its emitter left and the binding
    went stale first, so the fleet takes it and publishes there."""
    with NatsCluster(1, tmp_path / "nats") as c:
        env = {"AEP_NATS_CLAIM_TTL": str(CLAIM_TTL)}
        later = trio.Event()
        first = BurstBridge(2, sessions=2, prefix="sh", name="first")
        second = BurstBridge(6, sessions=2, prefix="sh", name="second", start=later)
        async with running_js_relay(c.url, token=TOKEN, env=env,
                                    claim_grace_s=GRACE) as (relay, base):
            gone = await trio.to_thread.run_sync(lambda: SocketEmitter(
                base, token=TOKEN, agent="plain", host="elsewhere"))
            try:
                gone.session("sh-1").emit("run.started", severity="notice")
                await _wait(lambda: relay.counters["published"] >= 1)
            finally:
                gone.close()
            await _wait(lambda: not relay.claims.holders("sh-1"))
            # the binding's "at" is re-put as the emitter leaves; wait until
            # the last one is older than the fleet's idle rule (bounded)
            with trio.fail_after(60):
                while _now_ms() - (await _binding(relay, "sh-1"))["at"] < IDLE_MS + 1000:
                    await trio.sleep(0.2)
            assert (await _binding(relay, "sh-1"))["principal"] == "token"
            live = await trio.to_thread.run_sync(lambda: SocketEmitter(
                base, token=TOKEN, agent="plain", host="elsewhere", accepts=["control.cancel"]))
            try:
                live.session("sh-0").emit("run.started", severity="notice")
                await _wait(lambda: relay.counters["published"] >= 2)
                async with running_fleet(tmp_path, [first, second], c.url, token=TOKEN,
                                         claim_grace=GRACE, **env) as fleet:
                    presence = fleet.jetstream.presence
                    await _wait(lambda: "sh-0" in presence.lost)
                    with trio.fail_after(30):
                        while (await _binding(relay, "sh-1"))["principal"] != "fleet":
                            await trio.sleep(0.1)
                    later.set()
                    await _wait(lambda: presence.counters["refused_fleet_into_owned"] >= 3)
                    await _wait(second.done.is_set)
                    # first: one event in each session; second: three in sh-1
                    await wait_published(fleet, 5)
                    assert "sh-1" not in presence.lost
                    claimed = {s for (_, _, s) in presence.claims.items()}
                    assert "sh-1" in claimed and "sh-0" not in claimed, claimed
                    held = await _binding(relay, "sh-0")
                    assert held["principal"] == "token", held
                    logged = {json.loads(line).get("id")
                              for f in (tmp_path / "state").rglob("*.jsonl")
                              for line in f.read_text().splitlines() if line.strip()}
                    dropped = {e["id"] for e in second.emitted if e["session"] == "sh-0"}
                    taken = {e["id"] for e in second.emitted if e["session"] == "sh-1"}
                    assert len(dropped) == 3 and not dropped & logged, dropped & logged
                    assert len(taken) == 3 and taken <= logged, taken - logged
                    assert fleet.jetstream.publisher.stats()["acked"] == 5
                # the live emitter goes on in its session, never refused
                live.session("sh-0").emit("run.completed", severity="notice")
                await _wait(lambda: relay.counters["published"] >= 3)
                assert not [f for f in live.frames if f.get("type") == "error"], live.frames
                assert relay.counters["fleet_reclaimed"] == 0
            finally:
                live.close()


class _UntilStopped(BurstBridge):
    """Emits into ``<prefix>-0`` every ``pace`` s from ``start`` until
    ``stop`` (at most ``n``); ``done`` once it stopped."""

    def __init__(self, stop: trio.Event, **kw: Any) -> None:
        super().__init__(2000, sessions=1, **kw)
        self.stop = stop

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        ctx.health.source = True
        task_status.started(BridgeRun())
        assert self.start is not None
        await self.start.wait()
        for i in range(self.n):
            if self.stop.is_set():
                break
            self.emitted.append(await ctx.emit(f"{self.prefix}-0", {
                "type": "x.toy.tick", "data": {"i": i}}, severity="info"))
            await trio.sleep(self.pace)
        self.done.set()
        await trio.sleep_forever()


def _logged_ids(state) -> set[Any]:
    return {json.loads(line).get("id") for f in state.rglob("*.jsonl")
            for line in f.read_text().splitlines() if line.strip()}


async def test_a_fleet_bridge_takes_a_lost_shared_token_session_back_once_free(tmp_path) -> None:
    """Issue 25, hardening round two: a shared-token emitter on relay A
    claims ``sh-0``; a bridge of the daemon emits into it while it is held,
    so the session is lost for the fleet (its events dropped, counted
    ``refused_fleet_into_owned``). Before, it stayed lost until the daemon
    restarted. Now, once the emitter left and ``AEP_CLAIM_GRACE`` plus one
    claim refresh passed, the fleet's next due check takes the binding back
    by compare-and-set (counted ``fleet_reclaimed``) and its later events
    are logged and on the stream; those refused while it was held stay
    refused (none logged or published)."""
    with NatsCluster(1, tmp_path / "nats") as c:
        env = {"AEP_NATS_CLAIM_TTL": "3"}  # a claim refresh each second
        grace = 2.0  # (twice the refresh: a connected emitter's "at" never looks idle)
        later, stop = trio.Event(), trio.Event()
        first = BurstBridge(1, sessions=1, prefix="sh", name="first")
        second = _UntilStopped(stop, prefix="sh", name="second", pace=0.1, start=later)
        async with running_js_relay(c.url, token=TOKEN, env=env,
                                    claim_grace_s=grace) as (relay, base):
            em = await trio.to_thread.run_sync(lambda: SocketEmitter(
                base, token=TOKEN, agent="plain", host="elsewhere"))
            try:
                em.session("sh-0").emit("run.started", severity="notice")
                await _wait(lambda: relay.counters["published"] >= 1)
                async with running_fleet(tmp_path, [first, second], c.url, token=TOKEN,
                                         claim_grace=grace, **env) as fleet:
                    presence = fleet.jetstream.presence
                    await _wait(lambda: "sh-0" in presence.lost)
                    later.set()
                    # held while the emitter is connected: refused, the binding its own
                    await _wait(lambda: presence.counters["refused_fleet_into_owned"] >= 5)
                    assert (await _binding(relay, "sh-0"))["principal"] == "token"
                    await trio.to_thread.run_sync(em.close)
                    await _wait(lambda: presence.counters.get("fleet_reclaimed", 0) >= 1, timeout=60)
                    await _wait(lambda: "sh-0" not in presence.lost)
                    # its later events flow: a few of them, then stop
                    await _wait(lambda: len(_logged_ids(tmp_path / "state")
                                            & {e["id"] for e in second.emitted}) >= 5)
                    stop.set()
                    await _wait(second.done.is_set)
                    state = tmp_path / "state"
                    await _wait(lambda: len(_logged_ids(state) & {e["id"] for e in second.emitted})
                                + presence.counters["refused_fleet_into_owned"]
                                >= len(second.emitted))
                    logged = _logged_ids(state)
                    await wait_published(fleet, 1 + len(logged & {e["id"] for e in second.emitted}))
                    assert presence.counters["fleet_reclaimed"] == 1
                    assert (await _binding(relay, "sh-0"))["principal"] == "fleet"
                    assert "sh-0" in {s for (_, _, s) in presence.claims.items()}
                    counted = presence.counters["refused_fleet_into_owned"]
            finally:
                em.close()
        ids = [e["id"] for e in second.emitted]
        got = [i in logged for i in ids]
        k = got.index(True)
        # the refused ones are the first k (while held), every later one flowed
        assert k >= 5 and got == [False] * k + [True] * (len(ids) - k), got
        assert counted == k, (counted, k)
        assert first.emitted[0]["id"] in logged  # (the stated limit: before the first answer)
        async with open_link(nats_config(c.url)) as link:
            on_stream = [(e["source"], e["id"]) for e in decoded(await stream_messages(link, "AEP"))
                         if e.get("source") == first.emitted[0]["source"]
                         or e.get("source") == second.emitted[0]["source"]]
        want = [(first.emitted[0]["source"], first.emitted[0]["id"])] + \
            [(e["source"], e["id"]) for e in second.emitted[k:]]
        assert sorted(on_stream) == sorted(want), (len(on_stream), len(want))
