"""The real Claude Code 2.1.197 accepts and runs the hooks
``aep-bridges hooks install claude-code`` wrote: its ``SessionStart``
through the command shim (signed with ``AEP_TOKEN``, never carrying it), its ``UserPromptSubmit`` as an HTTP hook with the
bearer header expanded from ``AEP_TOKEN`` (``allowedEnvVars``), both to a
stub of the daemon's endpoint. The model endpoint refuses the key at once
(no mock conversation needed: both hooks fire before the first model
request, and Claude Code is stopped then, since it retries the refused key
for minutes; the full runs are the live harness's, issue 27 "Tests")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from bridges.core.asgi import send_json
from tests.support import vendors
from tests.support.hook_stub import HookStub
from tests.support.net import http_body, serve_loopback

pytestmark = pytest.mark.timeout(300)
CLAUDE_VERSION = "2.1.197"


@pytest.fixture(scope="module")
def claude() -> Path:
    prefix = vendors.npm_install("@anthropic-ai/claude-code", CLAUDE_VERSION)
    return vendors.find_binary(prefix / "node_modules", "claude")


async def refuse_every_key(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if await http_body(scope, receive, send) is None:
        return
    await send_json(send, 401, {"type": "error", "error": {
        "type": "authentication_error", "message": "invalid x-api-key"}})


async def test_installed_hooks_run_in_the_real_claude_code(claude, tmp_path, nursery):
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    stub = HookStub(token="the-token")
    await nursery.start(stub.serve)
    model = await nursery.start(serve_loopback, refuse_every_key)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    out = await trio.run_process([str(Path(sys.executable).with_name("aep-bridges")), "hooks",
                                  "install", "claude-code", "--daemon", stub.url],
                                 env=env, capture_stderr=True, capture_stdout=True, check=False)
    assert out.returncode == 0, out.stderr
    env.update({"ANTHROPIC_BASE_URL": model, "ANTHROPIC_API_KEY": "sk-ant-dummy",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
                "AEP_TOKEN": "the-token"})
    def fired() -> set[str]:
        return {json.loads(r.body).get("hook_event_name") for r in stub.requests}

    proc = await trio.lowlevel.open_process([str(claude), "-p", "hello"], env=env,
                                            cwd=str(home / "work"), stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
    try:  # both fire before the first model request; the refused key is retried for minutes
        with trio.move_on_after(180):
            while not {"SessionStart", "UserPromptSubmit"} <= fired() and proc.poll() is None:
                await trio.sleep(0.1)
    finally:
        proc.kill()
        await proc.wait()
    seen = {json.loads(r.body).get("hook_event_name"): r for r in stub.requests}
    why = f"exit {proc.returncode}"
    assert {"SessionStart", "UserPromptSubmit"} <= set(seen), (sorted(seen), why)
    assert seen["SessionStart"].headers["x-aep-hook-transport"] == "command"
    shim_auth = seen["SessionStart"].headers["authorization"]  # the shim signs, never sends it
    assert shim_auth.startswith("AEP-HMAC-SHA256 ") and "the-token" not in shim_auth
    http = seen["UserPromptSubmit"]
    assert "x-aep-hook-transport" not in http.headers  # Claude Code's own POST
    assert http.headers["authorization"] == "Bearer the-token"
    assert json.loads(http.body)["prompt"] == "hello"
    assert all(r.path == "/hooks/claude-code" for r in stub.requests)
