"""The SSE-bridge scenarios (issue section 5) against BOTH real servers,
each test once per vendor (``[opencode]``: ``opencode serve``, npm
``opencode-ai``; ``[kilocode]``: ``kilo serve``, npm ``@kilocode/cli``; both
pinned in ``tests/support/opencode.py``): the real vendor binary, the daemon
(``aep-bridges run``, its own process, the embedded relay), the SDK consumer
(``aep_sdk.subscribe`` on ``/stream``) and the SDK ``ControlClient`` through
the relay.

Per vendor, one server, one mock provider, one gated-on primary daemon and
one reader (the module-scoped ``env``): every assertion is scoped to the
scenario's own session ids. Scenarios 6b, 7 and 8 start their own daemons;
scenario 6 (the server crash) runs last.

The SDK clients are thread-based by design; blocking calls (the daemon's
start/stop, ``ControlClient``) are handed to a worker thread with
``trio.to_thread.run_sync``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.daemon import Collector, command
from tests.support.opencode import VENDORS, MockProviderProcess, SseDaemon, VendorServer, install
from tests.support.schema import validate_stream, validated

pytestmark = pytest.mark.vendor

OPTIONS = [{"id": "once", "label": "Allow once"}, {"id": "always", "label": "Always allow"},
           {"id": "reject", "label": "Reject"}]


@dataclass
class Env:
    """What a vendor's tests share: ``daemon`` is primary with the gate on."""

    vendor: str
    server: VendorServer
    provider: MockProviderProcess
    daemon: SseDaemon
    stream: Collector
    tmp: Path


@pytest.fixture(scope="module", params=list(VENDORS))
def env(request, tmp_path_factory):
    vendor = request.param
    tmp = tmp_path_factory.mktemp(f"{vendor}-sse")
    spec = VENDORS[vendor]
    provider = MockProviderProcess().start()
    server = VendorServer(spec, install(spec), tmp / "server", provider.base_url)
    daemon = stream = None
    try:
        server.start_sync()
        daemon = SseDaemon(server, tmp / "primary").start().wait_source()
        stream = daemon.subscribe()
        yield Env(vendor, server, provider, daemon, stream, tmp)
    finally:
        if stream is not None:
            stream.close()
        status = daemon.stop() if daemon is not None else 0
        server.stop()
        provider.stop()
        assert status == 0, daemon.log()


# ---------------------------------------------------------------- helpers

async def start_prompt(env_or_server: Any, text: str, session: str | None = None) -> str:
    server = env_or_server.server if isinstance(env_or_server, Env) else env_or_server
    async with server.client() as c:
        sid = session or await server.new_session(c)
        await server.prompt_async(c, sid, text)
    return sid


def types(evs: list[dict]) -> list[str]:
    return [e["type"] for e in evs]


def core(evs: list[dict]) -> list[dict]:
    return [e for e in evs if not e["type"].startswith("x.")]


def only(evs: list[dict], type_: str) -> dict:
    hits = [e for e in evs if e["type"] == type_]
    assert len(hits) == 1, (type_, types(evs))
    return hits[0]


async def pending_permission(server: VendorServer, sid: str) -> dict:
    async with server.client() as c:
        with trio.fail_after(30):
            while True:
                r = await c.get("/permission")
                hit = [p for p in r.json() if p.get("sessionID") == sid]
                if hit:
                    return hit[0]
                await trio.sleep(0.1)


async def wait_idle(server: VendorServer, sid: str, timeout: float = 60) -> None:
    async with server.client() as c:
        with trio.fail_after(timeout):
            while sid in (await c.get("/session/status")).json():
                await trio.sleep(0.1)


async def slow_started(provider: MockProviderProcess, before: int) -> None:
    with trio.fail_after(30):
        while provider.slow_chunks() < before + 3:
            await trio.sleep(0.1)


# ---------------------------------------------------------------- 1: plain prompt

async def test_1_plain_prompt_primary(env: Env) -> None:
    """session.started, run.started -> run.finished (primary)."""
    sid = await start_prompt(env, "say hello")
    await env.stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
    evs = validated(env.stream.of(sid))
    c = core(evs)
    assert c[0]["type"] == "session.started"
    assert c[0]["data"]["client"]["name"] == env.vendor
    started, finished = only(evs, "run.started"), only(evs, "run.finished")
    assert started["data"] == {"trigger": "user"} and started["run"] == finished["run"]
    assert started["run"].startswith("msg_")
    assert evs.index(started) < evs.index(finished)
    assert {"progress.status"} >= {e["type"] for e in c if e.get("run") == started["run"]} - {
        "run.started", "run.finished"}
    assert all(e["agent"] == env.vendor for e in evs)


async def plain_prompt_companion(server: VendorServer, stream: Collector, vendor: str) -> None:
    """Companion: the same prompt as ``x.{vendor}.*`` only, zero core types."""
    sid = await start_prompt(server, "say hello")
    await stream.wait_for(lambda s: s.of(sid, f"x.{vendor}.session.idle"), what="idle")
    evs = validated(stream.of(sid))
    assert evs and all(e["type"].startswith(f"x.{vendor}.") for e in evs), types(evs)
    assert f"x.{vendor}.session.created" in types(evs)
    assert f"x.{vendor}.message.updated" in types(evs)


# ---------------------------------------------------------------- 2: answered over AEP

async def test_2_permission_answered_over_aep(env: Env) -> None:
    sid = await start_prompt(env, "AEP_BASH echo aep-approved")
    req = (await env.stream.wait_for(lambda s: s.of(sid, "attention.requested"),
                                     what="attention.requested"))[0]
    assert req["data"]["kind"] == "permission" and req["subject"] == "bash"
    assert req["data"]["options"] == OPTIONS and req["data"]["respond_via"] == ["control"]
    status, ack = await command(env.daemon, "control.attention.respond", sid, subject=req["id"],
                                cause=req["id"], data={"answer": {"option": "once"}})
    assert status == "accepted", (status, ack)
    cmd_id = ack["cause"]
    await env.stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
    evs = validated(env.stream.of(sid))
    answered, resolved = only(evs, "attention.answered"), only(evs, "attention.resolved")
    assert answered["cause"] == cmd_id and answered["subject"] == req["id"]
    assert answered["data"] == {"answer": {"option": "once"}, "via": "control"}
    assert resolved["cause"] == answered["id"] and resolved["subject"] == req["id"]
    assert resolved["data"] == {"resolution": "answered"}
    done = only(evs, "tool.completed")
    assert done["data"]["tool"]["name"] == "bash"
    order = types(evs)
    assert order.index("attention.answered") < order.index("attention.resolved") \
        < order.index("tool.completed") < order.index("run.finished")
    assert any("aep-approved" in t for t in env.provider.tool_results())


# ---------------------------------------------------------------- 2b: a question form

async def test_2b_question_answered_over_aep(env: Env) -> None:
    sid = await start_prompt(env, "AEP_QUESTION")
    req = (await env.stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
    assert req["data"]["kind"] == "form" and req["data"]["respond_via"] == ["control"]
    field = req["data"]["fields"][0]
    sqlite = next(c["id"] for c in field["choices"] if c["label"] == "SQLite")
    status, ack = await command(env.daemon, "control.attention.respond", sid, subject=req["id"],
                                data={"answer": {"values": {field["id"]: sqlite}}})
    assert status == "accepted", (status, ack)
    await env.stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
    evs = validated(env.stream.of(sid))
    answered = only(evs, "attention.answered")
    assert answered["data"]["answer"] == {"values": {field["id"]: sqlite}}
    assert only(evs, "attention.resolved")["cause"] == answered["id"]
    assert any('"SQLite"' in t for t in env.provider.tool_results())


# ---------------------------------------------------------------- 3: answered vendor-side

async def test_3_permission_answered_vendor_side(env: Env) -> None:
    sid = await start_prompt(env, "AEP_BASH echo vendor-side")
    req = (await env.stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
    perm = await pending_permission(env.server, sid)
    async with env.server.client() as c:
        r = await c.post(f"/permission/{perm['id']}/reply", json={"reply": "once"})
        assert r.status_code == 200
    await env.stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
    evs = validated(env.stream.of(sid))
    assert "attention.answered" not in types(evs)  # no control claim
    resolved = only(evs, "attention.resolved")
    assert resolved["subject"] == req["id"] and resolved["data"] == {"resolution": "answered"}
    assert "cause" not in resolved or resolved["cause"] == req["id"]
    only(evs, "tool.completed")


# ---------------------------------------------------------------- 4: reject with free text

async def test_4_reject_with_free_text(env: Env) -> None:
    reason = "not on this branch, use make clean"
    sid = await start_prompt(env, "AEP_BASH rm -rf build")
    req = (await env.stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
    status, ack = await command(env.daemon, "control.attention.respond", sid, subject=req["id"],
                                capture="redacted", data={"answer": {"text": reason}})
    assert status == "accepted", (status, ack)
    await env.stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
    evs = validated(env.stream.of(sid))
    answered = only(evs, "attention.answered")
    # AEP-0008: unmatched text applies the refusing option with the text kept
    assert answered["data"]["answer"] == {"option": "reject", "text": reason}
    assert answered["cause"] == ack["cause"]
    denied = only(evs, "tool.denied")
    assert denied["data"]["by"] == "policy" and denied["cause"] == ack["cause"]
    assert "tool.completed" not in types(evs)
    # the text reached the server: it answered the model with it
    assert any(reason in t for t in env.provider.tool_results())


# ---------------------------------------------------------------- 5: cancel mid-run

async def test_5_cancel_mid_run(env: Env) -> None:
    before = env.provider.slow_chunks()
    sid = await start_prompt(env, "AEP_SLOW")
    started = (await env.stream.wait_for(lambda s: s.of(sid, "run.started")))[0]
    await slow_started(env.provider, before)
    status, ack = await command(env.daemon, "control.cancel", sid, run=started["run"],
                                capture="redacted", data={"scope": "run", "reason": "operator stop"})
    assert status == "accepted", (status, ack)
    cancelled = (await env.stream.wait_for(lambda s: s.of(sid, "run.cancelled"),
                                           what="run.cancelled"))[0]
    assert cancelled["cause"] == ack["cause"] and cancelled["run"] == started["run"]
    assert cancelled["data"] == {"by": "control"}
    await wait_idle(env.server, sid)
    await trio.sleep(1.0)  # the vendor re-broadcasts idle: still one terminal
    evs = validated(env.stream.of(sid))
    terminals = [e for e in evs if e["type"] in ("run.finished", "run.failed", "run.cancelled")]
    assert terminals == [cancelled]
    # refusals: scope session is destruction, and no run is open any more
    status, detail = await command(env.daemon, "control.cancel", sid, data={"scope": "session"})
    assert status == "refused", (status, detail)
    status, detail = await command(env.daemon, "control.cancel", sid, data={"scope": "run"})
    assert status == "refused", (status, detail)
    status, detail = await command(env.daemon, "control.attention.respond", sid,
                                   subject="01NOSUCHREQUEST", data={"answer": {"option": "once"}})
    assert status == "refused", (status, detail)


# ---------------------------------------------------------------- todos (real shape)

async def test_5b_todos_become_task_events(env: Env) -> None:
    """The real ``todowrite`` tool's ``todo.updated`` snapshot (current
    ``Todo``: no id) diffs into plan-item transitions inside the run."""
    from bridges.core.capture import digest
    sid = await start_prompt(env, "AEP_TODO")
    await env.stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
    evs = validated(env.stream.of(sid))
    run = only(evs, "run.started")["run"]
    planned = [e for e in evs if e["type"] == "progress.task.planned"]
    completed = [e for e in evs if e["type"] == "progress.task.completed"]
    sub = {c: "todo-" + digest(c)[:16] for c in ("write the fix", "run the suite")}
    assert [e["subject"] for e in planned] == [sub["write the fix"], sub["run the suite"]]
    assert [e["subject"] for e in completed] == [sub["write the fix"]]
    assert all(e["run"] == run and "data" not in e for e in planned + completed)


# ---------------------------------------------------------------- daemon restart

async def test_6b_daemon_restarted_mid_run(env: Env) -> None:
    """A daemon restart while a run waits on a permission: the new daemon
    restores its open runs and pending asks (the state dir) and reconciles
    from REST (the stream has no replay). The run continues under the same
    id without a second ``run.started``, the ask keeps its id and is
    answered over AEP after the restart; a consumer attaching after the
    restart sees the open run and the pending ask (re-announced: the same
    envelopes, byte-identical, not logged twice), and the session's JSONL history
    across both daemon lives is one valid stream: nothing dangles, nothing
    twice."""
    state = env.tmp / "restart"
    d = SseDaemon(env.server, state)
    await trio.to_thread.run_sync(d.start)
    stream = d.subscribe()
    try:
        sid = await start_prompt(env, "AEP_BASH echo across-restart")
        first = (await stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
        started = stream.of(sid, "run.started")[0]
        stream.close()
        assert await trio.to_thread.run_sync(d.restart) == 0
        stream = d.subscribe()
        # the restarted relay replays the session's logged history (issue 25
        # row 9) and the bridge re-announces the open run and ask: either way
        # the same envelopes, byte-identical
        opened = {started["id"]: started, first["id"]: first}
        again = await stream.wait_for(
            lambda s: (lambda got: got if {e["id"] for e in got} == set(opened) else None)(
                [e for e in s.of(sid) if e["id"] in opened]),
            what="the open run and ask replayed and re-announced")
        assert all(e == opened[e["id"]] for e in again)
        # the reconcile's observation of the busy session (it also re-claims
        # the session at the relay, so the command can be routed)
        # (the new daemon's: the replayed history has the first one's too, and
        # a command sent on that one could come before this: seen under load)
        busy = (await stream.wait_for(lambda s: [e for e in s.of(sid, "progress.status")
                                                 if e["epoch"] > first["epoch"]]))[0]
        assert busy["subject"] == "busy" and busy["run"] == first["run"]
        status, ack = await command(d, "control.attention.respond", sid, subject=first["id"],
                                    data={"answer": {"option": "once"}})
        assert status == "accepted", (status, ack)
        await stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
        # the new daemon's events (and seq-less live ones: the command)
        after = [e for e in stream.of(sid) if e.get("epoch", first["epoch"] + 1) > first["epoch"]]
        assert "run.started" not in types(after) and "attention.requested" not in types(after)
        assert types(after)[0] == "progress.status"
        answered = only(after, "attention.answered")
        assert answered["subject"] == first["id"] and answered["cause"] == ack["cause"]
        assert answered["epoch"] > first["epoch"]
        assert only(after, "run.finished")["run"] == first["run"]
        log = state / "logs" / env.vendor
        lines = [json.loads(x) for f in sorted(log.glob("*.jsonl"))
                 for x in f.read_text().splitlines() if x.strip()]
        history = [e for e in lines if e.get("session") == sid]
        validate_stream(history)
        assert types(history).count("run.started") == 1
        assert types(history).count("run.finished") == 1
        assert types(history).count("attention.requested") == 1
    finally:
        stream.close()
        assert d.stop() == 0, d.log()

# ---------------------------------------------------------------- 7: wrong password

async def test_7_wrong_password(env: Env) -> None:
    server, tmp = env.server, env.tmp
    d = SseDaemon(server, tmp / "wrong-pw", password="definitely-not-it-0x42")
    await trio.to_thread.run_sync(lambda: d.start(healthy=False))
    try:
        with trio.fail_after(30):
            while d.bridge_health().get("counters", {}).get("auth_failures", 0) < 2:
                await trio.sleep(0.2)
        await trio.sleep(2.0)
        h = d.bridge_health()
        assert h["source"] is False and h["ok"] is False
        assert "HTTP 401" in h["detail"]
        # backoff, not a hot loop: a handful of attempts in several seconds
        assert 2 <= h["counters"]["auth_failures"] <= 12, h["counters"]
        logs = d.log()
        lines = [ln for ln in logs.splitlines() if "refused the credentials" in ln]
        assert len(lines) == 1, lines  # one clear line per episode
        assert f"{d.prefix}_PASSWORD" in lines[0]
        assert "definitely-not-it" not in logs and server.password not in logs
    finally:
        assert d.stop() == 0, d.log()


# ---------------------------------------------------------------- 8: gate off

async def test_8a_gate_off_primary(env: Env) -> None:
    """Primary without the gate: the ask is read-only, a respond is refused
    (the relay answers for the target: accepts is []), the vendor gets no
    write (its ask stays pending until the test answers it itself)."""
    server, tmp = env.server, env.tmp
    d = SseDaemon(server, tmp / "gate-off", primary=True, control=False)
    await trio.to_thread.run_sync(d.start)
    stream = d.subscribe()
    try:
        assert d.healthz()["bridges"][d.bridge]["control"] is False
        sid = await start_prompt(server, "AEP_BASH echo gate-off")
        req = (await stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
        assert "options" not in req["data"] and "respond_via" not in req["data"]
        status, _ = await command(d, "control.attention.respond", sid, subject=req["id"],
                                  data={"answer": {"option": "once"}})
        assert status == "unsupported"
        status, _ = await command(d, "control.cancel", sid, data={"scope": "run"})
        assert status == "unsupported"
        perm = await pending_permission(server, sid)  # still pending: nothing was written
        await trio.sleep(0.5)
        assert (await pending_permission(server, sid))["id"] == perm["id"]
        async with server.client() as c:
            assert (await c.post(f"/permission/{perm['id']}/reply",
                                 json={"reply": "reject"})).status_code == 200
        await stream.wait_for(lambda s: s.of(sid, "run.finished"))
        validated(stream.of(sid))
    finally:
        stream.close()
        assert d.stop() == 0, d.log()


async def test_8b_companion_mode_and_plain_prompt(env: Env) -> None:
    """Companion with the gate flag AND the token set (the preflight refuses
    that combination, so the flag is off here and the token on): only
    ``x.{vendor}.*``; a cancel is refused and the run keeps going."""
    server, provider, tmp, vendor = env.server, env.provider, env.tmp, env.vendor
    d = SseDaemon(server, tmp / "companion", primary=False, control=False)
    await trio.to_thread.run_sync(d.start)
    stream = d.subscribe()
    try:
        await plain_prompt_companion(server, stream, vendor)
        before = provider.slow_chunks()
        sid = await start_prompt(server, "AEP_SLOW")
        await slow_started(provider, before)
        status, _ = await command(d, "control.cancel", sid, data={"scope": "run"})
        assert status == "unsupported"
        mark = provider.slow_chunks()
        await trio.sleep(1.0)
        assert provider.slow_chunks() > mark  # the vendor was not aborted
        async with server.client() as c:
            assert sid in (await c.get("/session/status")).json()
            await c.post(f"/session/{sid}/abort")  # clean up as the user would
        await wait_idle(server, sid)
        evs = validated(stream.of(sid))
        assert all(e["type"].startswith(f"x.{vendor}.") for e in evs)
    finally:
        stream.close()
        assert d.stop() == 0, d.log()


def test_8c_control_in_companion_is_refused_at_start(env: Env) -> None:
    """The control flag in companion mode is a configuration error: the
    daemon refuses to start with one clear line (exit 2)."""
    import subprocess
    import sys
    daemon_env = SseDaemon(env.server, env.tmp / "refused", primary=False,
                           control=True).build_env()
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", "check", "--no-ports"],
                          env=daemon_env, capture_output=True, text=True, timeout=60,
                          cwd=str(Path(__file__).resolve().parents[3]))
    assert proc.returncode == 2, proc
    lines = [ln for ln in proc.stderr.splitlines() if "SSE_CONTROL" in ln]
    assert len(lines) == 1 and "ignored in companion mode" in lines[0]


# ---------------------------------------------------------------- in-process

async def test_in_process_bridge_other_directory(env: Env) -> None:
    """The bridge in-process with a real :class:`BridgeContext` against the
    real server: a session started in ANOTHER directory than the server's is
    observed (the global stream), its ask is answered through a command on
    ``ctx.commands`` and the reply is routed to that directory's instance;
    the per-instance stream is never used."""
    import logging

    from bridges.core.bridge import BridgeContext, BridgeHealth
    from bridges.core.capture import CapturePolicy
    from bridges.core.envelope import Stamper
    from bridges.kilocode_sse import PROFILE as KILO
    from bridges.opencode_sse import PROFILE as OC
    from bridges.sse_common.bridge import SseBridge
    from bridges.sse_common.config import SseConfig
    from supervisor.fleet import run_bridge

    server, tmp, vendor = env.server, env.tmp, env.vendor
    profile = OC if vendor == "opencode" else KILO
    seen: list[tuple[str, str]] = []

    class Spy(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request):
            seen.append((request.method, request.url.path,
                         request.url.params.get("directory")))
            return await super().handle_async_request(request)

    cfg = SseConfig.defaults(profile, url=server.url, password=server.password, primary=True,
                             control=True, token="t")
    bridge = SseBridge(profile, cfg, policy=CapturePolicy(), transport=Spy())
    out_s, out_r = trio.open_memory_channel(10_000)
    cmd_s, cmd_r = trio.open_memory_channel(16)
    ctx = BridgeContext(profile.name, Stamper(vendor, epoch=7, host="test"), out_s, cmd_r,
                        BridgeHealth(), logging.getLogger("test"))
    events: list[dict] = []
    other = tmp / "elsewhere"
    other.mkdir(exist_ok=True)

    def of(sid, t):
        return [e for e in events if e.get("session") == sid and e["type"] == t]

    async def until(pred, what):
        with trio.fail_after(60):
            while not pred():
                await trio.sleep(0.05)

    async with trio.open_nursery() as n:
        await n.start(run_bridge, bridge, ctx)

        async def collect():
            async for o in out_r:
                events.append(o.event)
        n.start_soon(collect)
        await until(lambda: ctx.health.source is True, "connected")
        async with server.client() as c:
            sid = await server.new_session(c, directory=str(other))
            r = await c.post(f"/session/{sid}/prompt_async", params={"directory": str(other)},
                             json={"parts": [{"type": "text", "text": "AEP_BASH echo far"}]})
            assert r.status_code == 204
        await until(lambda: of(sid, "attention.requested"), "ask")
        req = of(sid, "attention.requested")[0]
        await cmd_s.send({"aep": "0.1", "id": "cmd-far", "type": "control.attention.respond",
                          "time": "2026-01-01T00:00:00Z", "source": "aep://t/agent/op",
                          "agent": "op", "session": sid, "subject": req["id"],
                          "data": {"answer": {"option": "once"}}})
        await until(lambda: of(sid, "run.finished"), "run.finished")
        n.cancel_scope.cancel()
    evs = [e for e in events if e.get("session") == sid]
    validate_stream(evs)
    ack = only(evs, "control.accepted")
    assert ack["cause"] == "cmd-far"
    assert only(evs, "attention.answered")["cause"] == "cmd-far"
    only(evs, "tool.completed")
    paths = {(m, p) for m, p, _ in seen}
    assert ("GET", "/event") not in paths and ("GET", "/global/event") in paths
    writes = [(m, p, d) for m, p, d in seen if m != "GET"]
    assert len(writes) == 1, writes
    method, path, directory = writes[0]
    assert method == "POST" and path.startswith("/permission/per_") and path.endswith("/reply")
    assert directory == str(other)  # routed to the session's own instance


# ---------------------------------------------------------------- 6: server killed

async def test_6_server_killed_and_restarted(env: Env) -> None:
    sid = await start_prompt(env, "AEP_BASH echo before-the-crash")
    req = (await env.stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
    run = req["run"]
    await env.server.restart(kill=True)  # SIGKILL: a crash mid-run with an ask pending
    # the bridge reconnects and reconciles: the ask and the run are closed
    await env.stream.wait_for(
        lambda s: [e for e in s.of(sid) if e["type"] in ("run.finished", "run.failed")
                   and e.get("run") == run], timeout=90, what="the crashed run closed")
    evs = validated(env.stream.of(sid))  # every request resolved, one terminal per run
    resolved = only(evs, "attention.resolved")
    assert resolved["subject"] == req["id"] and resolved["data"] == {"resolution": "dismissed"}
    terminal = next(e for e in evs if e.get("run") == run and e["type"].startswith("run.")
                    and e["type"] != "run.started")
    assert terminal["type"] == "run.failed" and terminal["data"] == {"reason": "interrupted"}
    with trio.fail_after(30):
        while env.daemon.bridge_health()["source"] is not True:
            await trio.sleep(0.2)
    # the same session works after the restart; nothing is emitted twice
    await start_prompt(env, "say hello again", session=sid)
    await env.stream.wait_for(
        lambda s: len(s.of(sid, "run.finished")) == 1 and s.of(sid, "run.finished"), timeout=60)
    evs = validated(env.stream.of(sid))
    assert types(evs).count("run.started") == 2
    assert types(evs).count("attention.requested") == 1
    assert len({e["id"] for e in evs}) == len(evs)

