"""The WebSocket duplex on a real listener (AEP-0003 §3.5, §4, §4.1, §6.5;
AEP-0004 §4), driven with trio-websocket for exact frames and refusals, and
with the SDK's ControlClient against a remote WebSocket emitter."""
from __future__ import annotations

import json

import aep_sdk
import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.support.relay_harness import TOKEN, event, running_relay, wait_until

WAIT = 20


def ws_url(base: str, token: str | None = None) -> str:
    url = base.replace("http://", "ws://") + "/socket"
    return url + (f"?access_token={token}" if token else "")


def hello(role="consumer", **kw):
    h = {"type": "hello", "versions": ["0.1"], "role": role,
         "identity": {"agent": kw.pop("agent", "tester"), "instance": "t/1"}, "capabilities": {}}
    h["capabilities"].update(kw)
    return h


async def recv(ws) -> dict:
    with trio.fail_after(WAIT):
        return json.loads(await ws.get_message())


async def recv_type(ws, *types) -> dict:
    while True:  # skip relay pings
        f = await recv(ws)
        if f.get("type") in types:
            return f


async def closed_code(ws) -> int:
    with trio.fail_after(WAIT):
        with pytest.raises(ConnectionClosed) as c:
            while True:
                await ws.get_message()
    return c.value.reason.code


async def test_upgrade_needs_the_token_when_one_is_set():
    async with running_relay(token=TOKEN) as (relay, base):
        with pytest.raises(ConnectionRejected) as r:
            async with open_websocket_url(ws_url(base)):
                pass
        assert r.value.status_code == 401
        with pytest.raises(ConnectionRejected):
            async with open_websocket_url(ws_url(base, "wrong")):
                pass
        for url, headers in ((ws_url(base, TOKEN), None),
                             (ws_url(base), [(b"authorization", f"Bearer {TOKEN}".encode())])):
            async with open_websocket_url(url, extra_headers=headers) as ws:
                await ws.send_message(json.dumps(hello()))
                reply = await recv(ws)
                assert reply["type"] == "hello" and reply["versions"] == ["0.1"]
                assert reply["capabilities"] == relay.capabilities()


async def test_hello_first_or_error_and_close():
    async with running_relay() as (relay, base):
        async with open_websocket_url(ws_url(base)) as ws:
            await ws.send_message(json.dumps({"type": "subscribe", "id": "x"}))
            assert (await recv(ws))["code"] == "hello-required"
            assert await closed_code(ws) == 1002
        async with open_websocket_url(ws_url(base)) as ws:
            await ws.send_message(json.dumps({**hello(), "versions": ["2.0"]}))
            err = await recv(ws)
            assert err["code"] == "version-unsupported" and err["versions"] == ["0.1"]
            assert await closed_code(ws) == 1002


async def test_binary_frames_are_rejected():
    async with running_relay() as (relay, base):
        async with open_websocket_url(ws_url(base)) as ws:
            await ws.send_message(json.dumps(hello()))
            await recv(ws)
            await ws.send_message(b"\x00\x01")
            assert (await recv(ws))["code"] == "binary-unsupported"
            assert await closed_code(ws) == 1003


async def test_malformed_frames_get_error_frames_and_the_socket_survives():
    async with running_relay() as (relay, base):
        async with open_websocket_url(ws_url(base)) as ws:
            await ws.send_message(json.dumps(hello()))
            await recv(ws)
            for bad in ("{", "null", "42", '"str"', json.dumps({"type": 7}), json.dumps({"x": 1})):
                await ws.send_message(bad)
            await ws.send_message(json.dumps({"type": "ping", "t": 99}))
            codes = []
            while True:
                f = await recv(ws)
                if f["type"] == "pong":
                    break
                codes.append(f["code"])
            assert codes == ["bad-json", "bad-frame", "bad-frame", "bad-frame"]
            assert f == {"type": "pong", "t": 99}


async def test_subscriptions_refusals_replay_and_unsubscribe():
    async with running_relay(buffer=3, max_from=2) as (relay, base), httpx.AsyncClient() as c:
        for s in range(5):
            relay.ingest_http([relay.entry(event(s))])
        async with open_websocket_url(ws_url(base)) as ws:
            await ws.send_message(json.dumps(hello()))
            await recv(ws)
            await ws.send_message(json.dumps({"type": "subscribe", "id": "bad",
                                              "filter": {"time": "x"}}))
            assert (await recv(ws))["code"] == "invalid-filter"
            await ws.send_message(json.dumps({"type": "subscribe", "id": "big", "from": [
                {"session": f"s{i}", "epoch": 0, "seq": 0} for i in range(3)]}))
            err = await recv(ws)
            assert err["code"] == "limit-exceeded" and "AEP_MAX_FROM" in err["detail"]
            await ws.send_message(json.dumps({"type": "subscribe", "id": "r", "filter": {"session": "s1"},
                                              "from": [{"session": "s1", "epoch": 0, "seq": 0}]}))
            assert await recv(ws) == {"type": "subscribed", "id": "r"}
            assert await recv(ws) == {"type": "replay-exhausted", "sub": "r", "session": "s1",
                                      "earliest": {"epoch": 0, "seq": 2}}
            assert [(await recv(ws))["seq"] for _ in range(3)] == [2, 3, 4]
            await ws.send_message(json.dumps({"type": "subscribe", "id": "att",
                                              "filter": {"type": "attention.*"}}))
            assert await recv(ws) == {"type": "subscribed", "id": "att"}
            r = await c.post(base + "/events", headers={"AEP-Version": "0.1",
                                                        "content-type": "application/x-ndjson"},
                             content="\n".join(json.dumps(e) for e in (
                                 event(5), event(0, session="s2", type="attention.requested",
                                                 severity="notice", data={"kind": "input"}))))
            assert r.status_code == 202
            got = [await recv(ws), await recv(ws)]
            assert sorted((f["session"], f["seq"]) for f in got) == [("s1", 5), ("s2", 0)]
            await ws.send_message(json.dumps({"type": "unsubscribe", "id": "r"}))
            assert await recv(ws) == {"type": "unsubscribed", "id": "r"}
            relay.ingest_http([relay.entry(event(6))])
            await ws.send_message(json.dumps({"type": "ping", "t": 1}))
            assert (await recv(ws))["type"] == "pong"  # nothing for s1 in between


async def test_relay_pings_and_drops_a_silent_peer():
    async with running_relay(ws_ping_s=0.05, ws_timeout_s=0.5) as (relay, base):
        async with open_websocket_url(ws_url(base)) as ws:
            await ws.send_message(json.dumps(hello()))
            await recv(ws)
            ping = await recv(ws)
            assert ping["type"] == "ping" and isinstance(ping["t"], int)
            await ws.send_message(json.dumps({"type": "pong", "t": ping["t"]}))
            # then silence: past the timeout the relay says goodbye
            closing = await recv_type(ws, "closing")
            assert closing["reason"] == "ping-timeout"
            assert await closed_code(ws) == 1001


async def test_remote_emitter_claims_and_receives_commands_byte_identical():
    async with running_relay(token=TOKEN) as (relay, base):
        async with open_websocket_url(ws_url(base, TOKEN)) as em:
            await em.send_message(json.dumps(hello(role="emitter", agent="codex", emits=["tool"],
                                                   control={"accepts": ["control.cancel"],
                                                            "ack_window_ms": 10000})))
            await recv(em)
            await em.send_message(json.dumps(event(0, session="sx")))
            await em.send_message(json.dumps({**event(1, session="sx"), "seq": "one"}))
            err = await recv(em)
            assert err["code"] == "invalid-event" and err["cause"] == event(1, session="sx")["id"]
            await wait_until(lambda: relay.roster())
            # the emitter role may not ask for the roster (in-band refusal, socket survives)
            await em.send_message(json.dumps({"type": "roster", "id": "r-9"}))
            assert await recv(em) == {"type": "error", "code": "unauthorized", "id": "r-9",
                                      "detail": "roster is answered on consumer/both connections"}

            results = {}

            def control():
                cc = aep_sdk.ControlClient(base, agent="mission-control", host="desk", token=TOKEN)
                cc.connect(connect_timeout_ms=WAIT * 1000)
                try:
                    results["roster"] = cc.roster(timeout_ms=WAIT * 1000)
                    results["ack"] = cc.send("control.cancel", "sx", data={"scope": "run"},
                                             ack_window_ms=WAIT * 1000, retries=0)
                finally:
                    cc.close()

            async with trio.open_nursery() as n:
                n.start_soon(trio.to_thread.run_sync, control)
                raw = await em.get_message()
                cmd = json.loads(raw)
                assert cmd["type"] == "control.cancel" and cmd["session"] == "sx"
                # forwarded as the sender framed it (the SDK's json.dumps spacing),
                # not re-serialized by the relay (AEP-0004 §4.4)
                assert raw == json.dumps(cmd)
                await em.send_message(json.dumps(event(1, session="sx", type="control.accepted",
                                                       cause=cmd["id"], severity="notice", data={})))
        assert results["ack"]["cause"] == cmd["id"]
        assert results["roster"] == [{"session": "sx", "agent": "codex", "instance": "t/1",
                                      "control": {"accepts": ["control.cancel"], "ack_window_ms": 10000},
                                      "emits": ["tool"]}]
        await wait_until(lambda: relay.roster() == [])  # the emitter left: its claim is gone


async def test_consumer_may_emit_foreign_events_without_claiming():
    async with running_relay(token=TOKEN) as (relay, base):
        async with open_websocket_url(ws_url(base, TOKEN)) as ws:
            await ws.send_message(json.dumps(hello()))
            await recv(ws)
            await ws.send_message(json.dumps({"type": "subscribe", "id": "a", "filter": {"session": "s1"}}))
            await recv(ws)
            routed = {"aep": "0.1", "id": "R1", "type": "attention.routed", "time": "2026-11-30T12:00:00Z",
                      "source": "aep://desk/agent/telegram-sink", "agent": "telegram-sink",
                      "session": "s1", "subject": "A1", "cause": "A1"}
            await ws.send_message(json.dumps(routed))
            assert await recv(ws) == routed
            assert relay.roster() == [] and relay.buffers.held("s1") == 0


async def test_oversize_message_closes_with_1009():
    async with running_relay(max_body=2048) as (relay, base):
        async with open_websocket_url(ws_url(base), max_message_size=1 << 20) as ws:
            await ws.send_message(json.dumps(hello()))
            await recv(ws)
            await ws.send_message(json.dumps({"type": "ping", "t": "x" * 4096}))
            assert await closed_code(ws) == 1009
        await wait_until(lambda: relay.stats()["connections"] == 0)


async def test_sessions_frame_lists_ended_sessions_too():
    """The ``sessions`` extension frame (``experimental.sessions``) names
    every session the relay holds history of: a session whose emitter is
    gone (absent from the roster) is listed, with its held event count;
    an emitter may not ask; a request without an id is refused in-band."""
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient() as client:
        r = await client.post(base + "/events", headers={
            "authorization": f"Bearer {TOKEN}", "aep-version": "0.1",
            "content-type": "application/x-ndjson"},
            content="\n".join(json.dumps(event(i, session=s, type=t)) for s, n in
                              (("gone", 3), ("other", 1)) for i in range(n)
                              for t in ["session.ended" if i == n - 1 else "tool.completed"]))
        assert r.status_code == 202, r.text
        async with open_websocket_url(ws_url(base, TOKEN)) as ws:
            await ws.send_message(json.dumps(hello()))
            h = await recv(ws)
            assert h["capabilities"]["experimental"]["sessions"] == {}
            await ws.send_message(json.dumps({"type": "sessions", "id": "s-1"}))
            got = await recv_type(ws, "sessions")
            assert got["id"] == "s-1" and got["complete"] is True
            assert sorted(got["entries"], key=lambda e: e["session"]) == [
                {"session": "gone", "events": 3}, {"session": "other", "events": 1}]
            assert relay.roster() == []  # nobody claims them: the roster would say nothing
            await ws.send_message(json.dumps({"type": "sessions"}))
            err = await recv_type(ws, "error")
            assert err["code"] == "invalid-request"
        async with open_websocket_url(ws_url(base, TOKEN)) as em:
            await em.send_message(json.dumps(hello(role="emitter", agent="codex")))
            await recv(em)
            await em.send_message(json.dumps({"type": "sessions", "id": "s-2"}))
            err = await recv_type(em, "error")
            assert err["code"] == "unauthorized" and err["id"] == "s-2"
