"""Bad input and faults against a stub speaking the kap-server protocol on
loopback (``tests/support/kimi_stub.py``; the real server is in
``test_live.py`` / ``test_restarts.py``): each has a defined answer (a
vendor fallback type, counted and skipped, a reattach with the shared
backoff, a refused/busy ack), nothing crashes, and the bridge keeps
delivering afterwards. The token never appears in an event or a log line."""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.kimi_web.bridge import KimiWebBridge, KimiWebRun
from bridges.kimi_web.config import KimiWebConfig
from supervisor.fleet import run_bridge
from tests.support.kimi_stub import StubKap, event, session_item
from tests.support.schema import validated

S = "session_stub_1"


@dataclass
class Harness:
    bridge: KimiWebBridge
    run: KimiWebRun
    ctx: BridgeContext
    events: list[dict]
    commands: trio.MemorySendChannel
    stub: StubKap

    def of(self, type_: str) -> list[dict]:
        return [e for e in self.events if e["type"] == type_]

    def counters(self) -> dict[str, int]:
        return self.ctx.health.counters

    async def until(self, pred, what: str = "condition", timeout: float = 20) -> Any:
        with trio.fail_after(timeout):
            while not (got := pred()):
                await trio.sleep(0.02)
        return got

    async def command(self, cid: str, type_: str, **kw) -> dict:
        cmd = {"aep": "0.1", "id": cid, "type": type_, "time": "2026-01-01T00:00:00Z",
               "source": "aep://t/agent/op", "agent": "op", "session": S, **kw}
        await self.commands.send(cmd)
        return (await self.until(lambda: [e for e in self.events if e.get("cause") == cid
                                          and e["type"].startswith("control.")], f"ack {cid}"))[0]


@asynccontextmanager
async def bridge_on(stub: StubKap, tmp_path: Path, *, primary: bool = True, control: bool = False,
                    token: str | None = None, capture: str = "metadata", token_file: bool = False):
    async with trio.open_nursery() as n:
        await n.start(stub.serve)
        cfg = KimiWebConfig(home=tmp_path / "home", url=stub.url,
                            token=None if token_file else token or stub.token,
                            primary=primary, control=control, aep_token=control,
                            state_dir=tmp_path / "state")
        policy = CapturePolicy.from_env({"AEP_CAPTURE": capture})
        b = KimiWebBridge(cfg, policy)
        out_s, out_r = trio.open_memory_channel(100_000)
        cmd_s, cmd_r = trio.open_memory_channel(16)
        ctx = BridgeContext(b.name, Stamper("kimi-code", epoch=1, host="stub", policy=policy), out_s, cmd_r,
                            BridgeHealth(), logging.getLogger("aep.test"))
        events: list[dict] = []

        async def collect():
            async for o in out_r:
                events.append(o.event)
        n.start_soon(collect)
        run = await n.start(run_bridge, b, ctx)  # exactly as the fleet runs it (its ledger)
        yield Harness(b, run, ctx, events, cmd_s, stub)
        n.cancel_scope.cancel()


def turn(seq: int, prompt: str = "msg_p1") -> dict:
    return event("turn.started", S, seq, turnId=0, promptId=prompt, origin={"kind": "user"})


def ended(seq: int, reason: str = "completed") -> dict:
    return event("turn.ended", S, seq, turnId=0, reason=reason)


def approval(seq: int, aid: str = "approval_1") -> dict:
    return event("event.approval.requested", S, seq, approval_id=aid, session_id=S, turn_id=0,
                 tool_call_id="call_1", tool_name="Bash", action="Running: echo probe",
                 created_at="2026-12-01T09:00:00.000Z", expires_at="2026-12-02T09:00:00.000Z")


def stub_with(*scripts, **kw) -> StubKap:
    return StubKap(sessions=[session_item(S)], scripts=[list(s) for s in scripts], **kw)


# ------------------------------------------------------------------ frames

async def test_malformed_frames_are_counted_and_skipped(tmp_path):
    stub = stub_with([
        "{not json", "[1, 2]", '{"no": "type"}', b"\xff\xfe binary garbage",
        {"type": "turn.started", "seq": "x", "session_id": S, "payload": "not an object"},
        {"type": "tool.result", "seq": 2, "session_id": S, "epoch": "ep_stub", "payload": {"toolCallId": 7}},
        {"type": "event.approval.requested", "session_id": S, "seq": 3, "epoch": "ep_stub", "payload": []},
        turn(4), ended(5), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"), "the run after the garbage")
        c = h.counters()
        assert c["frames_not_json"] >= 1 and c["frames_malformed"] >= 2
        assert stub.connections == 1 and h.ctx.health.source is True
    validated(h.events)


async def test_unknown_types_degrade_to_the_channel_family(tmp_path):
    stub = stub_with([event("brand.new.thing", S, 1, foo="bar"),
                      event("event.future.moment", S, 2), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("x.kimi-code.web.event.future.moment"))
        new = h.of("x.kimi-code.web.brand.new.thing")
        assert len(new) == 1 and not new[0].get("data")
    validated(h.events)


async def test_a_ten_megabyte_frame_is_taken_and_the_stream_lives(tmp_path):
    big = event("context.spliced", S, 1, messages=[{"role": "user", "content": "x" * (10 << 20)}])
    stub = stub_with([big, turn(2), ended(3), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"), "the frames after the big one")
        spliced = h.of("x.kimi-code.web.context.spliced")
        assert len(spliced) == 1 and not spliced[0].get("data")  # no content leaves at metadata
        assert stub.connections == 1


async def test_volatile_frames_never_emit_and_never_move_the_cursor(tmp_path):
    stub = stub_with([turn(1), event("assistant.delta", S, 1, volatile=True, delta="hi"),
                      event("agent.status.updated", S, 1, volatile=True), ended(2), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"))
        assert h.counters()["frames_volatile"] == 2
        assert not [e for e in h.events if "delta" in e["type"] or "status" in e["type"]]


# ------------------------------------------------------------------ the socket's life

async def test_every_ping_gets_its_pong(tmp_path):
    stub = stub_with([("ping",), ("sleep", 0.2), ("ping",), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: len([f for f in stub.received if f.get("type") == "pong"]) == 2)
        assert all(f["payload"] == {"nonce": "n1"} for f in stub.received if f["type"] == "pong")
        # the socket carries nothing but the protocol: no writes, no abort frames
        assert {f["type"] for f in stub.received} == {"client_hello", "subscribe", "pong"}


async def test_a_silent_socket_is_dropped_and_reattached(tmp_path):
    stub = stub_with([("hang",)], [turn(1), ended(2), ("hang",)], heartbeat_ms=200)
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"), "the run on the second socket")
        assert h.counters()["socket_silent"] >= 1 and stub.connections >= 2


async def test_a_closed_socket_reattaches_and_resumes_by_cursor(tmp_path):
    stub = stub_with([turn(1), ("close",)], [turn(1), ended(2), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("run.finished"))
        subs = [f for f in stub.received if f["type"] == "subscribe"]
        assert subs[-1]["payload"]["cursors"][S] == {"seq": 1, "epoch": "ep_stub"}
        assert len(h.of("run.started")) == 1  # the replayed turn.started is a duplicate
        assert h.counters()["frames_duplicate"] >= 1
    validated(h.events)


async def test_a_wrong_token_is_refused_and_nothing_leaks(tmp_path, caplog):
    stub = stub_with([turn(1), ("hang",)])
    caplog.set_level(logging.DEBUG)
    async with bridge_on(stub, tmp_path, token="wrong-token-abcdef") as h:
        await h.until(lambda: h.counters().get("socket_auth_failed", 0) >= 2, "two refusals")
        assert h.ctx.health.source is False and "token" in (h.ctx.health.detail or "")
        assert stub.connections == 0 and not h.events
    assert "wrong-token-abcdef" not in caplog.text
    assert all("wrong-token" not in p for _, p, _ in stub.rest)  # never in a URL


async def test_200_with_an_error_code_is_an_error(tmp_path):
    """REST answers HTTP 200 with code 40401 for a subscribed session that is
    gone: its run and ask are closed, not left dangling."""
    stub = stub_with([turn(1), approval(2), ("hang",)])
    stub.resync.add(S)
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.counters().get("resyncs"), "the rebuild")
    stub2 = stub_with([turn(1), approval(2), ("sleep", 0.3), ("close",)], [("hang",)])
    async with bridge_on(stub2, tmp_path / "b") as h:
        await h.until(lambda: h.of("attention.requested"))
        stub2.sessions.clear()  # the session is deleted while we are away: GET -> 40401
        stub2.not_found.add(S)
        await h.until(lambda: h.of("run.cancelled"), "the gone session's run closed")
        assert [e["data"]["resolution"] for e in h.of("attention.resolved")] == ["dismissed"]
    validated(h.events)


async def test_resync_required_rebuilds_from_rest(tmp_path):
    stub = stub_with([("hang",)])
    stub.resync.add(S)
    stub.prompts[S] = {"active": {"prompt_id": "msg_live", "status": "running"}, "queued": []}
    stub.approvals[S] = [{"approval_id": "approval_9", "session_id": S, "tool_call_id": "c9",
                          "tool_name": "Bash", "action": "Running: ls"}]
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: h.of("attention.requested"), "the rebuilt ask")
        assert h.of("run.started")[0]["run"] == "msg_live"
        assert h.of("attention.requested")[0]["subject"] == "approval_9"
    validated(h.events)


# ------------------------------------------------------------------ control against vendor answers

@pytest.mark.parametrize("code,reason", [(40902, "refused"), (41001, "refused"), (40901, "busy"),
                                         (40404, "refused")])
async def test_vendor_error_codes_on_respond(tmp_path, code, reason):
    stub = stub_with([turn(1), approval(2), ("hang",)])
    stub.post_answers["/approvals/"] = {"code": code, "msg": "no", "data": {"resolved": False}}
    async with bridge_on(stub, tmp_path, control=True) as h:
        req = (await h.until(lambda: h.of("attention.requested")))[0]
        ack = await h.command("c1", "control.attention.respond", subject=req["id"],
                              data={"answer": {"option": "approved"}})
        assert ack["type"] == "control.rejected" and ack["data"]["reason"] == reason
        assert str(code) in ack["data"].get("detail", str(code))
        # the note was disarmed: a later oob answer is not claimed as ours
        assert h.run.tracker.find_ask(S, req["id"]).settling is None
    validated(h.events)


async def test_unreachable_vendor_is_busy(tmp_path):
    stub = stub_with([turn(1), approval(2), ("hang",)])
    async with bridge_on(stub, tmp_path, control=True) as h:
        req = (await h.until(lambda: h.of("attention.requested")))[0]
        h.run.receiver.endpoint = type(h.run.receiver.endpoint)(
            "http://127.0.0.1:9", stub.token)  # the server went away between check and write
        ack = await h.command("c1", "control.attention.respond", subject=req["id"],
                              data={"answer": {"option": "rejected"}})
        assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "busy"


async def test_respond_and_cancel_write_the_vendor_routes(tmp_path):
    stub = stub_with([turn(1, "msg_abc"), approval(2), ("hang",)])
    async with bridge_on(stub, tmp_path, control=True) as h:
        req = (await h.until(lambda: h.of("attention.requested")))[0]
        ack = await h.command("c1", "control.attention.respond", subject=req["id"],
                              data={"answer": {"option": "approved_for_session"}})
        assert ack["type"] == "control.accepted"
        ack2 = await h.command("c2", "control.cancel", data={"scope": "run"})
        assert ack2["type"] == "control.accepted"
        ack3 = await h.command("c1", "control.attention.respond", subject=req["id"],
                               data={"answer": {"option": "approved_for_session"}})
        assert ack3 == ack  # a redelivery: the recorded ack, byte-identical
    assert stub.posts() == [(f"/api/v1/sessions/{S}/approvals/approval_1",
                             {"decision": "approved", "scope": "session"}),
                            (f"/api/v1/sessions/{S}/prompts/msg_abc:abort", {})]


async def test_gate_off_declares_nothing_and_writes_nothing(tmp_path):
    stub = stub_with([turn(1), approval(2), ("hang",)])
    async with bridge_on(stub, tmp_path) as h:
        assert h.bridge.capabilities()["control"]["accepts"] == []
        req = (await h.until(lambda: h.of("attention.requested")))[0]
        assert "respond_via" not in req["data"]
        ack = await h.command("c1", "control.attention.respond", subject=req["id"],
                              data={"answer": {"option": "approved"}})
        assert ack["data"]["reason"] == "unsupported"
    assert stub.posts() == []


async def test_content_quoting_the_token_is_redacted_by_value(tmp_path):
    """A tool that prints ``server.token`` (capture ``redacted``): the token
    is a secret value like ``AEP_KIMI_WEB_TOKEN`` and never leaves."""
    stub = stub_with([])
    out = f"token is {stub.token} ok"
    stub.scripts = [[turn(1), event("tool.call.started", S, 2, toolCallId="c1", name="Bash",
                                    args={"command": "cat server.token"}),
                     event("tool.result", S, 3, toolCallId="c1", output=out), ended(4), ("hang",)]]
    async with bridge_on(stub, tmp_path, capture="redacted") as h:
        done = (await h.until(lambda: h.of("tool.completed")))[0]
        assert "result_redacted" in done["data"]
        assert stub.token not in repr(h.events)


async def test_a_server_that_accepts_and_drops_the_socket_is_backed_off(tmp_path):
    """Review finding 4: every socket is accepted (hello, subscribe acked)
    and closed at once. The backoff resets only after an attachment stayed
    up a while, so the retries slow down (0.25-0.5 s, 0.5-1 s, 1-2 s, 2-4 s):
    in 5 s at most a handful, not one every half second (10 or more)."""
    stub = stub_with([("close",)])
    async with bridge_on(stub, tmp_path) as h:
        await h.until(lambda: stub.connections >= 1, "the first socket")
        await trio.sleep(5)
        assert 2 <= stub.connections <= 6, (stub.connections, h.counters())


async def test_vendor_ids_in_the_write_routes_are_quoted(tmp_path):
    """Review finding 6: a hostile approval id or prompt id cannot steer a
    write to another route (``../``, ``?``): each is one quoted segment."""
    stub = stub_with([turn(1, "p/../../x?y"), approval(2, "a/../../sessions?z"), ("hang",)])
    async with bridge_on(stub, tmp_path, control=True) as h:
        req = (await h.until(lambda: h.of("attention.requested")))[0]
        ack = await h.command("c1", "control.attention.respond", subject=req["id"],
                              data={"answer": {"option": "approved"}})
        assert ack["type"] == "control.accepted", ack
        ack2 = await h.command("c2", "control.cancel", data={"scope": "run"})
        assert ack2["type"] == "control.accepted", ack2
    # the stub sees the decoded path: the whole id arrived inside its segment
    # (unquoted, the client would have folded the ``..`` and cut at ``?``)
    assert [p for p, _ in stub.posts()] == [
        f"/api/v1/sessions/{S}/approvals/a/../../sessions?z",
        f"/api/v1/sessions/{S}/prompts/p/../../x?y:abort"]



async def test_a_token_file_made_readable_while_attached_shows_in_health(tmp_path):
    """Review finding 6: the token file turning 0644 (or unreadable) while
    attached keeps the socket but says so in ``health.detail`` (never the
    token); fixed again, the detail clears."""
    home = tmp_path / "home"
    home.mkdir()
    stub = stub_with([turn(1), ended(2), ("hang",)])
    tok = home / "server.token"
    tok.write_text(stub.token)
    tok.chmod(0o600)
    async with bridge_on(stub, tmp_path, token_file=True) as h:
        await h.until(lambda: h.of("run.finished"))
        assert h.ctx.health.detail is None
        tok.chmod(0o644)
        await h.until(lambda: h.ctx.health.detail, "the operator signal")
        detail = h.ctx.health.detail
        assert "readable by others" in detail and stub.token not in detail
        assert h.ctx.health.source is True and stub.connections == 1  # still attached
        assert h.counters()["discovery_failed_attached"] == 1
        tok.chmod(0o600)
        await h.until(lambda: h.ctx.health.detail is None, "the signal cleared")
