"""The daemon side of the tees on the real daemon: the WebSocket path on its
own listener and its guards (token, browser Origin, Host, unknown agent
ids, bad hellos), several tees at once under two agent ids, what the tees
report in ``/healthz`` (attached, drops, oversize), and uplink mode (the
path rides the health listener; events reach the remote relay)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.integration.acp.peers.py_client import drive
from tests.integration.acp.test_acp_pairs import ANSWERS, assert_python_story, wait_attached, wait_story
from tests.support.acp import DAEMON_ENV, py_agent, tee
from tests.support.daemon import DaemonProcess, run_daemon, send_command

SLOW_ECHO = [sys.executable, "-c", textwrap.dedent("""
    import sys, time
    time.sleep(1.5)
    sys.stdout.write(sys.stdin.read())
""")]


ECHO = [sys.executable, "-c", textwrap.dedent("""
    import os
    while True:
        b = os.read(0, 1 << 16)
        if not b:
            break
        os.write(1, b)
""")]


def run_tee(url: str, agent: list[str], data: bytes, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    return subprocess.run(tee(url, *extra) + agent, input=data, capture_output=True, env=env,
                          timeout=120)


def test_with_a_token_the_tee_needs_it_and_the_session_never_notices(tmp_path):
    sent: list = []
    with run_daemon(tmp_path, {**DAEMON_ENV, "AEP_TOKEN": "s3cret-token"}, healthy=True) as d:
        d.token = "s3cret-token"
        p = run_tee(d.url, SLOW_ECHO, b'{"jsonrpc":"2.0","method":"x"}\n')
        assert p.returncode == 0 and p.stdout == b'{"jsonrpc":"2.0","method":"x"}\n'
        assert b"HTTP 401" in p.stderr and b"s3cret" not in p.stderr
        assert d.healthz()["bridges"]["acp"]["counters"]["tees_seen"] == 0
        tok = tmp_path / "token"
        tok.write_text("s3cret-token\n")
        p = run_tee(d.url, SLOW_ECHO, b'{"jsonrpc":"2.0","method":"x"}\n', "--token-file", str(tok))
        assert p.returncode == 0 and p.stderr == b""
        counters_when(d, lambda c: c["tees_seen"] == 1 and c["lines"] == 2)
        # read-only: a command for an ACP session is refused by the bridge itself
        col = d.subscribe()
        try:
            asyncio.run(drive(tee(d.url, "--token-file", str(tok)) + py_agent(), ANSWERS[:1],
                              prompts=["one"], between=lambda turn: sent.append(
                                  col.first(lambda e: e["type"] == "run.finished", 30)
                                  and send_command(d, "control.cancel", "sess-1"))))
            assert sent[0][0] == "unsupported", sent
            wait_story(col, "sess-1")
        finally:
            col.close()


def test_an_agent_id_the_daemon_does_not_serve_is_refused_404(tmp_path):
    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        p = run_tee(d.url, SLOW_ECHO, b"{}\n", "--name", "gemini")
        assert p.returncode == 0 and p.stdout == b"{}\n"
        assert b"HTTP 404" in p.stderr and b"AEP_ACP_AGENTS" in p.stderr


async def test_guards_on_the_tee_path(tmp_path):
    d = DaemonProcess(tmp_path / "state", DAEMON_ENV)
    await trio.to_thread.run_sync(lambda: d.start(healthy=True))
    try:
        url = d.url.replace("http://", "ws://") + "/bridges/acp/acp"
        with pytest.raises(ConnectionRejected) as e:
            async with open_websocket_url(url, extra_headers=[(b"origin", b"https://evil.example")]):
                pass
        assert e.value.status_code == 403
        # DNS rebinding: a raw upgrade naming a foreign Host (a WebSocket
        # client library always sends the real one)
        stream = await trio.open_tcp_stream("127.0.0.1", d.port)
        await stream.send_all(b"GET /bridges/acp/acp HTTP/1.1\r\nHost: rebind.example\r\n"
                              b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              b"Sec-WebSocket-Version: 13\r\n\r\n")
        with trio.fail_after(10):
            head = await stream.receive_some(4096)
        await stream.aclose()
        assert head.startswith(b"HTTP/1.1 403"), head
        for first in ("not a hello", json.dumps({"aep_acp_tee": 1, "tee": "T1", "agent": "other"})):
            async with open_websocket_url(url) as ws:
                await ws.send_message(first)
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.get_message()
                assert closed.value.reason.code == 1008
        import httpx
        async with httpx.AsyncClient(trust_env=False) as http:
            r = await http.get(d.url + "/bridges/acp/acp")
        assert r.status_code == 426
        c = (await trio.to_thread.run_sync(d.healthz))["bridges"]["acp"]["counters"]
        assert c["refused"] == 2 and c["tees_seen"] == 0
    finally:
        await trio.to_thread.run_sync(lambda: d.stop(timeout=10))


def test_several_tees_at_once_under_two_agent_ids(tmp_path):
    """Two real Python pairs at once, one ``--name gemini``: each its own
    emitter and story; ``/healthz`` sees each attached while its session
    runs (each pair checks itself mid-session: the two run at their own
    pace, and one may be done before the other's second turn)."""
    env = {**DAEMON_ENV, "AEP_ACP_AGENTS": "acp,gemini"}
    with run_daemon(tmp_path, env, healthy=True) as d:
        col = d.subscribe()
        seen = {}

        def between(name: str):
            def check(turn: int) -> None:
                if turn == 2 and name not in seen:
                    seen[name] = wait_attached(d, 1, name)
            return check

        async def both():
            return await asyncio.gather(
                drive(tee(d.url) + py_agent(), ANSWERS, between=between("acp")),
                drive(tee(d.url, "--name", "gemini") + py_agent(), ANSWERS,
                      between=between("acp.gemini")))

        try:
            a, b = asyncio.run(both())
            assert a == b
            assert seen["acp"]["tees_attached"] == 1 and seen["acp.gemini"]["tees_attached"] == 1
            # both stories end (each agent says sess-1): waiting for one of them let
            # the other's last events still be on their way (a clean-clone CI run)
            for agent in ("acp", "gemini"):
                col.first(lambda e, a=agent: e["type"] == "session.ended" and e["agent"] == a,
                          60, what=f"session.ended of {agent}")
            events = wait_story(col, "sess-1")
            for agent in ("acp", "gemini"):
                assert_python_story([e for e in events if e["agent"] == agent])
            runs = {agent: {e["run"] for e in events if e["agent"] == agent and "run" in e}
                    for agent in ("acp", "gemini")}
            assert runs["acp"].isdisjoint(runs["gemini"])
        finally:
            col.close()


def test_oversize_lines_and_queue_drops_are_reported(tmp_path):
    with run_daemon(tmp_path, DAEMON_ENV, healthy=True) as d:
        big = b'{"jsonrpc":"2.0","method":"big","params":{"x":"' + b"x" * 5000 + b'"}}\n'
        p = run_tee(d.url, SLOW_ECHO, big, "--max-line", "1024")
        assert p.returncode == 0 and p.stdout == big
        # the agent writes 200,000 lines one write each, far faster than the
        # tee's sender (it lingers 20 ms per batch) drains a 4 KiB queue
        n = 200_000
        chatty = [sys.executable, "-c", textwrap.dedent(f"""
            import os
            for i in range({n}):
                os.write(1, b'{{"jsonrpc":"2.0","method":"n","params":{{"i":%d}}}}\\n' % i)
        """)]
        p = run_tee(d.url, chatty, b"", "--queue-bytes", "4096")
        assert p.returncode == 0 and p.stdout.count(b"\n") == n  # the session never noticed
        # the daemon maps what it got after the tees are gone: wait for the exit records
        c = counters_when(d, lambda c: c["tees_attached"] == 0 and c["tee_drops"] > 0
                          and c["oversize"] == 2)
        assert c["lines"] < n + 2, c
        assert c["malformed"] == 0, c  # each gap resynchronized at the next line end


def counters_when(d: DaemonProcess, pred, timeout: float = 30.0) -> dict:
    import time
    deadline = time.monotonic() + timeout
    while True:
        c = d.healthz()["bridges"]["acp"]["counters"]
        if pred(c) or time.monotonic() > deadline:
            assert pred(c), c
            return c
        time.sleep(0.1)


def test_uplink_mode_serves_the_tee_path_on_the_health_listener(tmp_path):
    """With ``AEP_RELAY_URL`` the daemon's listener is the health app; the
    tees attach there all the same and the events reach the remote relay."""
    with run_daemon(tmp_path / "relay", {}, args=("relay",), healthy=True) as relay:
        env = {**DAEMON_ENV, "AEP_RELAY_URL": relay.url}
        with run_daemon(tmp_path / "fleet", env, healthy=True) as d:
            col = relay.subscribe()
            try:
                asyncio.run(drive(tee(d.url) + py_agent(), ANSWERS))
                assert_python_story(wait_story(col, "sess-1"))
            finally:
                col.close()
