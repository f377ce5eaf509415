"""The kap-server REST envelope rule (2.1.0: application errors are HTTP 200
with a non-zero ``code``) and the receiver's state file."""
from __future__ import annotations

import httpx
import pytest

from bridges.kimi_web.config import KimiWebConfig
from bridges.kimi_web.receiver import root_cause
from bridges.kimi_web.rest import AuthRefused, VendorError, envelope, state_path


def resp(status: int, body) -> httpx.Response:
    return httpx.Response(status, json=body) if not isinstance(body, bytes) else httpx.Response(status,
                                                                                              content=body)


def test_ok_envelope_is_its_data():
    assert envelope(resp(200, {"code": 0, "msg": "success", "data": {"items": []}})) == {"items": []}


@pytest.mark.parametrize("code", [40401, 40902, 41001, 40901, 50001])
def test_200_with_a_code_is_an_error(code):
    with pytest.raises(VendorError) as e:
        envelope(resp(200, {"code": code, "msg": "x" * 1000, "data": None, "stack": "Error2: at ..."}))
    assert e.value.code == code and len(e.value.msg) <= 300 and "stack" not in str(e.value)


def test_401_is_auth_refused_and_garbage_is_an_error():
    with pytest.raises(AuthRefused):
        envelope(resp(401, {"code": 40101, "msg": "Unauthorized", "data": None}))
    with pytest.raises(VendorError):
        envelope(resp(200, b"<html>proxy</html>"))
    with pytest.raises(VendorError):
        envelope(resp(200, ["not", "an", "envelope"]))
    with pytest.raises(VendorError):
        envelope(resp(502, {"code": 0, "msg": "", "data": None}))


def test_state_file_is_per_home_or_url(tmp_path):
    a = state_path(KimiWebConfig(home=tmp_path / "a", state_dir=tmp_path))
    b = state_path(KimiWebConfig(home=tmp_path / "b", state_dir=tmp_path))
    c = state_path(KimiWebConfig(home=tmp_path / "a", url="http://127.0.0.1:1", state_dir=tmp_path))
    assert len({a, b, c}) == 3 and a.parent == tmp_path / "kimi_web"
    assert state_path(KimiWebConfig(home=tmp_path)) is None


def test_root_cause_unwraps_single_groups():
    e = ValueError("x")
    assert root_cause(ExceptionGroup("g", [ExceptionGroup("h", [e])])) is e
    g = ExceptionGroup("g", [ValueError(), KeyError()])
    assert root_cause(g) is g


def test_the_announced_heartbeat_is_clamped_and_garbage_is_the_default():
    """Review finding 4: a server's ``heartbeat_ms`` of 1 would drop a
    healthy socket every 3 ms; a boolean, Infinity or NaN is not a number."""
    from bridges.kimi_web.receiver import DEFAULT_HEARTBEAT_S, heartbeat_s
    assert heartbeat_s(1) == 1.0 and heartbeat_s(0.5) == 1.0
    assert heartbeat_s(10_000) == 10.0
    assert heartbeat_s(10**12) == 300.0
    for bad in (True, False, float("inf"), float("nan"), -5, 0, "10000", None, [10]):
        assert heartbeat_s(bad) == DEFAULT_HEARTBEAT_S, bad


async def test_frames_held_before_the_ack_are_capped_by_bytes_per_session_and_in_total(monkeypatch, tmp_path):
    """Review finding 3: held frames were capped by count only (2,000 of up
    to 16 MiB each). Past the byte caps a frame is not held (counted
    ``frames_held_overflow``) and the session is rebuilt at the ack."""
    import logging

    import trio

    from bridges.core.bridge import BridgeContext, BridgeHealth
    from bridges.core.envelope import Stamper
    from bridges.core.posture import Posture
    from bridges.kimi_web import receiver as R
    from bridges.kimi_web.tracker import Tracker
    monkeypatch.setattr(R, "MAX_HELD_BYTES", 1000)
    monkeypatch.setattr(R, "MAX_HELD_TOTAL", 1500)
    out_s, _out_r = trio.open_memory_channel(10)
    _c, cmd_r = trio.open_memory_channel(1)
    ctx = BridgeContext("kimi_web", Stamper("kimi-code", epoch=1, host="h"), out_s, cmd_r,
                        BridgeHealth(), logging.getLogger("t"))
    r = R.Receiver(KimiWebConfig(home=tmp_path, state_dir=None), Tracker(Posture(mode="primary")), ctx)
    r.subscribed = {"a", "b"}
    r._held = {"a": [], "b": []}  # noqa: SLF001 - the receiver's own hold, driven directly
    for sid, n in (("a", 3), ("b", 3)):
        for seq in range(n):
            await r._on_event({"type": "turn.started", "session_id": sid, "seq": seq}, 400)  # noqa: SLF001
    assert [len(r._held[s]) for s in "ab"] == [2, 1]  # noqa: SLF001 - 800 of 1000; the total 1200 of 1500
    assert ctx.health.counters["frames_held_overflow"] == 3
    assert await r._release("a") is True and r._held_total == 400  # noqa: SLF001 - a rebuild is due


def test_vendor_ids_are_one_quoted_path_segment():
    """Review finding 6: an id with ``/``, ``?``, ``#`` or ``..`` cannot reach
    another route or add a query; a plain 2.1.0 id is unchanged."""
    from bridges.kimi_web.rest import seg
    assert seg("session_01JX") == "session_01JX" and seg("msg_abc-1.2~") == "msg_abc-1.2~"
    assert seg("../../admin?x=1#f") == "..%2F..%2Fadmin%3Fx%3D1%23f"
    assert "/" not in seg("a/b") and "&" not in seg("a&before_id=z")


async def test_a_401_retries_when_a_reattach_adopted_the_rotated_token_mid_request(tmp_path):
    """CI flake of 2026-12-02 (``test_token_rotated``: ``busy``, "kimi web
    refused the token"): the write left with the old token; while it was in
    flight the watcher's reattach adopted the rotated one, so re-resolving
    found nothing new and the 401 was final. The retry is decided against
    the token the request carried."""
    from bridges.kimi_web import discovery

    r, tok = _discovering_receiver(tmp_path, "01A", 3333, "tok-new")
    url = "http://127.0.0.1:3333"
    r.endpoint = discovery.Endpoint(url, "tok-old", "01A")
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["authorization"])
        # the reattach lands while this request is in flight
        r.endpoint = discovery.Endpoint(url, "tok-new", "01A")
        if request.headers["authorization"] != "Bearer tok-new":
            return httpx.Response(401, json={"code": 40101, "msg": "Unauthorized", "data": None})
        return httpx.Response(200, json={"code": 0, "msg": "success", "data": {"ok": True}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        r._client = client  # noqa: SLF001 - the receiver's own client, given directly
        assert await r.request("POST", "/sessions/s/approvals/a", {"decision": "approved"}) == {"ok": True}
        assert sent == ["Bearer tok-old", "Bearer tok-new"]
        # a token the server refuses twice is still refused, once retried
        sent.clear()
        tok.write_text("tok-other")
        with pytest.raises(AuthRefused):
            r.endpoint = discovery.Endpoint(url, "tok-x", "01A")
            await r.request("GET", "/sessions")
        assert sent == ["Bearer tok-x", "Bearer tok-other"]


async def test_a_401_is_never_retried_on_another_server(tmp_path):
    """A review's finding: the write was refused by server A; while it was
    in flight the run loop moved to B, and discovery now finds C. The
    retry went to B (a session of A's, a decision resent to another kimi
    web). It is retried only on the server that refused it, with a rotated
    token; here, on none."""
    from bridges.kimi_web import discovery

    r, _tok = _discovering_receiver(tmp_path, "01C", 5555, "tok-c")
    r.endpoint = discovery.Endpoint("http://127.0.0.1:3333", "tok-a", "01A")
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.url.host}:{request.url.port}")
        r.endpoint = discovery.Endpoint("http://127.0.0.1:4444", "tok-b", "01B")
        if len(sent) == 1:
            return httpx.Response(401, json={"code": 40101, "msg": "Unauthorized", "data": None})
        return httpx.Response(200, json={"code": 0, "msg": "success", "data": {"ok": True}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        r._client = client  # noqa: SLF001 - the receiver's own client, given directly
        with pytest.raises(AuthRefused):
            await r.request("POST", "/sessions/s/approvals/a", {"decision": "approved"})
    assert sent == ["127.0.0.1:3333"]


def _discovering_receiver(tmp_path, server: str, port: int, token: str):
    """A kimi_web ``Receiver`` whose discovery under ``tmp_path`` finds
    ``server`` on ``port`` with ``token`` (the file, returned beside it)."""
    import json
    import logging
    import os

    import trio

    from bridges.core.bridge import BridgeContext, BridgeHealth
    from bridges.core.envelope import Stamper
    from bridges.core.posture import Posture
    from bridges.kimi_web import receiver as R
    from bridges.kimi_web.tracker import Tracker

    d = tmp_path / "server" / "instances"
    d.mkdir(parents=True)
    (d / f"{server}.json").write_text(json.dumps({
        "server_id": server, "pid": os.getpid(), "host": "127.0.0.1", "port": port,
        "started_at": 1, "heartbeat_at": 1}))
    tok = tmp_path / "server.token"
    tok.write_text(token)
    os.chmod(tok, 0o600)
    out_s, _out_r = trio.open_memory_channel(10)
    _c, cmd_r = trio.open_memory_channel(1)
    ctx = BridgeContext("kimi_web", Stamper("kimi-code", epoch=1, host="h"), out_s, cmd_r,
                        BridgeHealth(), logging.getLogger("t"))
    return R.Receiver(KimiWebConfig(home=tmp_path, state_dir=None),
                      Tracker(Posture(mode="primary")), ctx), tok


async def test_a_run_cut_off_by_a_server_restart_is_lost_even_when_the_session_says_completed(tmp_path):
    """Flake of ``test_kimi_web_killed_and_restarted_mid_session`` (the cut
    run ended ``run.finished``): ``last_turn_reason`` is the session's last
    turn that ENDED, with no prompt id. 2.1.0 clears it when a turn starts
    with an asynchronous metadata write (``SessionOutcomeMirror``) that a
    SIGKILL can beat, so after the restart the session still says
    ``completed``: the turn BEFORE the cut one. The rebuild that follows a
    restart (``not_found`` at subscribe, the session still exists) closes
    the open run ``run.failed`` ``lost``; a plain ``resync_required`` (the
    server stayed up) still takes the vendor's reason."""
    import trio

    from bridges.kimi_web import discovery

    r, _tok = _discovering_receiver(tmp_path, "01A", 3333, "tok")
    r.endpoint = discovery.Endpoint("http://127.0.0.1:3333", "tok", "01A")
    out_r = _out_of(r)

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        data: object = {"items": []}
        if path in ("/sessions/s", "/sessions/t"):
            data = {"id": path.rsplit("/", 1)[1], "busy": False, "pending_interaction": "none",
                    "last_turn_reason": "completed"}
        elif path.endswith("/prompts"):
            data = {"active": None, "queued": []}
        return httpx.Response(200, json={"code": 0, "msg": "success", "data": data})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        r._client = client  # noqa: SLF001 - the receiver's own client, given directly
        for sid in ("s", "t"):
            for seq, (t, p) in enumerate((("turn.started", {"promptId": "p1", "turnId": 1}),
                                          ("turn.ended", {"reason": "completed"}),
                                          ("turn.started", {"promptId": "p2", "turnId": 2}))):
                await r._process({"type": t, "session_id": sid, "seq": seq, "epoch": "e",  # noqa: SLF001
                                  "payload": p})
        # s: the server restarted (subscribe said not_found, REST says it exists)
        await r._check_exists("s")  # noqa: SLF001 - the restart path, driven directly
        await r._resync("s", None)  # noqa: SLF001 - what the ack of the resubscription starts
        # t: resync_required while the server stayed up
        await r._resync("t", {"seq": 9, "epoch": "e"})  # noqa: SLF001
    evs = []
    while True:
        try:
            evs.append(out_r.receive_nowait().event)
        except trio.WouldBlock:
            break
    ends = [(e["session"], e["run"], e["type"], e.get("data", {})) for e in evs
            if e["type"] in ("run.finished", "run.failed", "run.cancelled")]
    assert ends == [("s", "p1", "run.finished", {}), ("t", "p1", "run.finished", {}),
                    ("s", "p2", "run.failed", {"reason": "lost"}), ("t", "p2", "run.finished", {})]


def _out_of(r):
    """The receiving end of ``r``'s context's output channel (re-made: the
    helper drops it)."""
    import trio
    s, rcv = trio.open_memory_channel(100)
    r.ctx._channel = s  # noqa: SLF001 - the context's own channel, swapped for the test
    return rcv
