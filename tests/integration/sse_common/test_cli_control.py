"""``aep-bridges respond | cancel | pause`` (issue 29, :mod:`supervisor.tools.control`)
against the real OpenCode server through the daemon: the console script as
an operator runs it, its ack line, the outcome lines, and its exit status
for accepted (0), rejected (3) and an answer it cannot send (2)."""
from __future__ import annotations

import subprocess

import pytest
import trio

from tests.support.daemon import console_script
from tests.support.opencode import OPENCODE, MockProviderProcess, SseDaemon, VendorServer, install

pytestmark = pytest.mark.vendor


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-control")
    provider = MockProviderProcess().start()
    server = VendorServer(OPENCODE, install(OPENCODE), tmp / "server", provider.base_url)
    daemon = stream = None
    try:
        server.start_sync()
        daemon = SseDaemon(server, tmp / "primary").start().wait_source()
        stream = daemon.subscribe()
        yield server, daemon, stream, provider
    finally:
        if stream is not None:
            stream.close()
        status = daemon.stop() if daemon is not None else 0
        server.stop()
        provider.stop()
        assert status == 0, daemon.log()


async def cli(daemon: SseDaemon, *args: str) -> subprocess.CompletedProcess:
    """The console script with the daemon's URL, the token from ``AEP_TOKEN``."""
    env = {"PATH": "/usr/bin:/bin", "AEP_TOKEN": daemon.token, "COLUMNS": "200"}
    cmd = console_script() + [*args, "--url", daemon.url]
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=120))


async def prompt(server: VendorServer, text: str) -> str:
    async with server.client() as c:
        sid = await server.new_session(c)
        await server.prompt_async(c, sid, text)
    return sid


async def test_respond_by_request_id_alone_waits_for_the_outcome(world) -> None:
    server, daemon, stream, _ = world
    sid = await prompt(server, "AEP_BASH echo via-cli")
    req = (await stream.wait_for(lambda s: s.of(sid, "attention.requested")))[0]
    r = await cli(daemon, "respond", req["id"], "--option", "once")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"accepted by session {sid}" in r.stdout
    assert "attention.answered" in r.stdout and "attention.resolved" in r.stdout
    await stream.wait_for(lambda s: s.of(sid, "run.finished"), what="run.finished")
    answered = stream.of(sid, "attention.answered")[0]
    assert answered["data"]["answer"] == {"option": "once"} and answered["subject"] == req["id"]
    # the same request again: the stream says it ended (answered through control),
    # so nothing is sent; exit 3 as for a rejection
    r = await cli(daemon, "respond", sid, req["id"], "--option", "once")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "already resolved: answered (via control" in r.stderr, r.stderr
    assert len(stream.of(sid, "attention.answered")) == 1  # no second answer


async def test_cancel_mid_run_and_an_unsupported_pause(world) -> None:
    server, daemon, stream, provider = world
    before = provider.slow_chunks()
    sid = await prompt(server, "AEP_SLOW")
    started = (await stream.wait_for(lambda s: s.of(sid, "run.started")))[0]
    with trio.fail_after(60):
        while provider.slow_chunks() == before:
            await trio.sleep(0.1)
    r = await cli(daemon, "pause", sid, "--wait", "5")
    assert r.returncode == 3 and "rejected: unsupported" in r.stderr, (r.stdout, r.stderr)
    r = await cli(daemon, "cancel", sid, "--run", started["run"], "--reason", "operator stop")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "run.cancelled" in r.stdout
    assert stream.of(sid, "run.cancelled")[0]["data"] == {"by": "control"}


async def test_an_answer_is_required_and_values_must_be_an_object(world) -> None:
    _, daemon, _, _ = world
    r = await cli(daemon, "respond", "s1", "r1")
    assert r.returncode == 2 and "--option" in r.stderr
    r = await cli(daemon, "respond", "s1", "r1", "--values", "[1]")
    assert r.returncode == 2 and "JSON object" in r.stderr
    # a request id alone that the relay holds no ask for: a bad argument (2), not unreachable (1)
    r = await cli(daemon, "respond", "no-such-request", "--option", "once")
    assert r.returncode == 2 and "holds no attention.requested" in r.stderr, (r.stdout, r.stderr)



async def test_doctor_knows_a_refused_password_from_an_accepted_one(world) -> None:
    server, daemon, _, _ = world
    base = {"PATH": "/usr/bin:/bin", "AEP_BRIDGE_OTLP_IN": "0", "AEP_BRIDGE_OPENCODE_SSE": "1",
            "AEP_OPENCODE_URL": server.url, "AEP_STATE_DIR": str(daemon.state),
            "AEP_LISTEN": daemon.env["AEP_LISTEN"], "AEP_TOKEN": daemon.token}

    def doctor(password: str) -> subprocess.CompletedProcess:
        return subprocess.run(console_script() + ["doctor"], capture_output=True, text=True,
                              env={**base, "AEP_OPENCODE_PASSWORD": password}, timeout=60)
    bad = await trio.to_thread.run_sync(doctor, "not-the-password")
    assert bad.returncode == 1, bad.stdout
    assert f"FAIL  opencode_sse: {server.url} answers, but refuses our credential (HTTP 401)" \
        in bad.stdout, bad.stdout
    assert "fix: set AEP_OPENCODE_PASSWORD to the server's own" in bad.stdout
    good = await trio.to_thread.run_sync(doctor, server.password)
    assert good.returncode == 0, good.stdout
    assert f"ok    opencode_sse: {server.url} answers (HTTP 200)" in good.stdout
    assert "held by the running aep-bridges daemon" in good.stdout  # AEP_LISTEN: ours
