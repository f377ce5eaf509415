"""Control across hosts, the daemon's side (issue 14), against a real
nats-server: the claims in KV carry the daemon id, the hello identity and
the control block; a command request on S.cmd.<daemon> reaches the owning
bridge through the ledger, its ack lands in the stream, and a retry of the
same command is acked once; no-route / unsupported / invalid replies."""
from __future__ import annotations

import json

import trio

from supervisor.jetstream import subjects as S
from supervisor.jetstream.link import aio, open_link
from tests.integration.jetstream.fleet_support import decoded, running_fleet
from tests.integration.supervisor.test_fleet_control import ToyBridge
from tests.support.nats import NatsCluster, stream_messages


def _cmd(id_: str, type_: str = "control.cancel", session: str = "toy-1", **kw) -> bytes:
    ev = {"aep": "0.1", "id": id_, "source": "aep://ops-laptop/tester", "type": type_,
          "time": "2026-12-01T12:00:00.000Z", "agent": "tester", "session": session,
          "data": {"scope": "run"}, **kw}
    return json.dumps(ev).encode()


async def _request(link, daemon: str, raw: bytes) -> tuple[str, str | None, str]:
    msg = await aio(link.nc.request)(S.command_subject("AEP", daemon), raw, timeout=5.0)
    return S.parse_command_reply(msg.data)


async def _acks_of(link, cause: str) -> list[dict]:
    evs = decoded(await stream_messages(link, "AEP"))
    return [e for e in evs if e["type"].startswith("control.") and e.get("cause") == cause]


async def test_claims_in_kv_and_a_command_through_the_listener_is_acked_once(tmp_path) -> None:
    with NatsCluster(1, tmp_path) as c:
        bridge = ToyBridge()
        async with running_fleet(tmp_path, [bridge], c.url) as fleet:
            daemon = fleet.jetstream.daemon
            assert (tmp_path / "state" / "daemon-id").read_text().strip() == daemon
            async with open_link(fleet.cfg.nats) as link:
                key = S.claim_key("toy-agent", "toy-1", daemon, "toy")
                with trio.fail_after(20):
                    while True:
                        try:
                            kv = await aio(link.js.key_value)("AEP_claims")
                            entry = await aio(kv.get)(key)
                            break
                        except Exception:  # noqa: BLE001 -- not put yet
                            await trio.sleep(0.1)
                claim = S.parse_value(entry.value)
                assert claim is not None
                assert claim["daemon"] == daemon and claim["bridge"] == "toy"
                assert claim["identity"]["agent"] == "toy-agent"
                assert claim["control"] == {"accepts": ["control.cancel"], "ack_window_ms": 10000}
                dkv = await aio(link.js.key_value)("AEP_daemons")
                dent = S.parse_value((await aio(dkv.get)(S.token(daemon))).value)
                assert dent is not None and dent["bridges"][0]["name"] == "toy"

                raw = _cmd("01JCMD00000000000000000001", run="r1")
                assert await _request(link, daemon, raw) == ("accepted", None, "")
                with trio.fail_after(20):
                    while not await _acks_of(link, "01JCMD00000000000000000001"):
                        await trio.sleep(0.1)
                # the relay's retry: the same envelope again
                assert await _request(link, daemon, raw) == ("accepted", None, "")
                pub = fleet.jetstream.publisher
                with trio.fail_after(20):
                    while pub.stats()["duplicates"] < 1:  # the byte-identical re-ack, deduped
                        await trio.sleep(0.05)
                acks = await _acks_of(link, "01JCMD00000000000000000001")
                assert [a["type"] for a in acks] == ["control.accepted"]
                assert bridge.writes and len(bridge.writes) == 1

                status, code, _ = await _request(link, daemon, _cmd("01JCMD2", session="nobody"))
                assert (status, code) == ("refused", "no-route")
                status, code, _ = await _request(link, daemon, _cmd("01JCMD3", "control.pause"))
                assert (status, code) == ("refused", "unsupported")
                status, code, _ = await _request(link, daemon, b"{not json")
                assert (status, code) == ("refused", "invalid")
                assert fleet.jetstream.presence.counters["commands_delivered"] == 2
            # a stopped daemon withdraws its claims at once
        async with open_link(fleet.cfg.nats) as link:
            kv = await aio(link.js.key_value)("AEP_claims")
            keys = []
            try:
                keys = await aio(kv.keys)()
            except Exception:  # noqa: BLE001 -- nats-py: NoKeysError when empty
                keys = []
            assert key not in keys


async def test_claims_are_refreshed_within_their_ttl(tmp_path) -> None:
    """AEP_NATS_CLAIM_TTL=1: the bucket forgets an entry a second after its
    last put; a running daemon's claim is still there after several TTLs."""
    with NatsCluster(1, tmp_path) as c:
        async with running_fleet(tmp_path, [ToyBridge()], c.url,
                                 AEP_NATS_CLAIM_TTL="1") as fleet:
            key = S.claim_key("toy-agent", "toy-1", fleet.jetstream.daemon, "toy")
            async with open_link(fleet.cfg.nats) as link:
                with trio.fail_after(20):
                    while fleet.jetstream.presence.counters["claims_put"] < 1:
                        await trio.sleep(0.05)
                kv = await aio(link.js.key_value)("AEP_claims")
                status = await aio(link.js.stream_info)("KV_AEP_claims")
                assert status.config.max_age == 1.0
                await trio.sleep(3.5)
                entry = await aio(kv.get)(key)
                assert S.parse_value(entry.value)["daemon"] == fleet.jetstream.daemon
                assert fleet.jetstream.presence.counters["claims_put"] >= 4
