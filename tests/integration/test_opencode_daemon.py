"""The eight SSE-bridge scenarios (issue section 5) against the REAL
``opencode serve`` (npm ``opencode-ai``, pinned in ``tests/support/opencode.py``),
through the daemon's ``/stream`` with the SDK consumer and the SDK
``ControlClient`` via the embedded relay. Scenario bodies:
``tests/support/sse_scenarios.py`` (shared with the Kilo Code module).

One server, one mock provider, one gated-on primary daemon and one reader
for the module; scenarios 7 and 8 start their own daemons; scenario 6 (the
server crash) runs last."""
from __future__ import annotations

import pytest

from tests.support import sse_scenarios as sc
from tests.support.opencode import OPENCODE, MockProviderProcess, SseDaemon, VendorServer, install

pytestmark = pytest.mark.vendor
VENDOR = "opencode"
SPEC = OPENCODE


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"{VENDOR}-sse")
    provider = MockProviderProcess().start()
    server = VendorServer(SPEC, install(SPEC), tmp / "server", provider.base_url)
    daemon = stream = None
    try:
        server.start_sync()
        daemon = SseDaemon(server, tmp / "primary").start()
        stream = daemon.subscribe()
        yield sc.Env(VENDOR, server, provider, daemon, stream, tmp)
    finally:
        if stream is not None:
            stream.close()
        status = daemon.stop() if daemon is not None else 0
        server.stop()
        provider.stop()
        assert status == 0, daemon.log()


async def test_1_plain_prompt_primary(env):
    await sc.plain_prompt_primary(env)


async def test_2_permission_answered_over_aep(env):
    await sc.permission_answered_over_aep(env)


async def test_2b_question_answered_over_aep(env):
    await sc.question_answered_over_aep(env)


async def test_3_permission_answered_vendor_side(env):
    await sc.permission_answered_vendor_side(env)


async def test_4_reject_with_free_text(env):
    await sc.reject_with_free_text(env)


async def test_5_cancel_mid_run(env):
    await sc.cancel_mid_run(env)


async def test_5b_todos_become_task_events(env):
    await sc.todos_become_task_events(env)


async def test_6b_daemon_restarted_mid_run(env):
    await sc.daemon_restarted_mid_run(env)


async def test_7_wrong_password(env):
    await sc.wrong_password(env.server, env.tmp)


async def test_8a_gate_off_primary(env):
    await sc.gate_off_primary(env.server, env.tmp)


async def test_8b_companion_mode_and_plain_prompt(env):
    await sc.companion_mode(env.server, env.provider, env.tmp, VENDOR)


def test_8c_control_in_companion_is_refused_at_start(env):
    sc.companion_gate_is_refused_at_start(env.server, env.tmp)


async def test_in_process_bridge_other_directory(env):
    """The bridge with a real BridgeContext (no daemon) against the real server:
    a session in another directory, answered through ctx.commands."""
    await sc.in_process_other_directory(env.server, env.provider, env.tmp, VENDOR)


async def test_6_server_killed_and_restarted(env):
    await sc.server_killed_and_restarted(env)
