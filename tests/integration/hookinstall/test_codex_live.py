"""The real Codex 0.171.0 runs the hooks ``aep-bridges hooks install codex``
wrote, trusted: a ``codex exec`` turn offline (the Responses mock,
``tests/support/mock_responses.py``) fires them through the command shim to
a stub of the daemon's endpoint; its app-server's ``hooks/list`` reports
each of ours ``trusted`` with the very hash we wrote. Without the trust
entries the same config runs no hook at all (Codex skips untrusted hooks
silently), which is why the installer writes them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

from supervisor.hookinstall import codex as installer
from tests.support import codex as cx
from tests.support.hook_stub import HookStub
from tests.support.mock_responses import MODEL, MockResponsesServer
from tests.support.net import free_port

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def binary() -> Path:
    return cx.codex_binary()


def base_config(model_base_url: str) -> str:
    features = "\n".join(f"{f} = false" for f in cx.OFFLINE_FEATURES_OFF)
    return f'''# the test's own settings: the installer must keep them (and this comment)
model = "{MODEL}"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.mock]
name = "mock"
base_url = "{model_base_url}"
env_key = "{cx.API_KEY_ENV}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
{features}
'''


def install(home: Path, daemon: str, *extra: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("aep-bridges")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "CODEX_HOME": str(home / ".codex")}
    return subprocess.run([str(exe), "hooks", "install", "codex", "--daemon", daemon, *extra],
                          env=env, capture_output=True, text=True, timeout=120)


async def exec_turn(binary: Path, home: Path, mock: MockResponsesServer) -> cx.CodexRun:
    config = (home / ".codex" / "config.toml").read_text()
    proxy = mock.base_url.rsplit("/v1", 1)[0]
    return await cx.run_codex_exec(binary, home, cx.PROMPT, config, proxy_url=proxy, timeout=180)


def hooks_list(binary: Path, home: Path) -> list[dict]:
    """``hooks/list`` from ``codex app-server`` (JSON-RPC lines on stdio)."""
    (home / "work").mkdir(exist_ok=True)
    proc = subprocess.Popen([str(binary), "app-server"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=cx.codex_env(binary, home, None), cwd=str(home / "work"))
    assert proc.stdin is not None and proc.stdout is not None
    try:
        msgs = [{"method": "initialize", "id": 0,
                 "params": {"clientInfo": {"name": "aep-test", "title": "aep-test",
                                           "version": "0.1"}}},
                {"method": "initialized"},
                {"method": "hooks/list", "id": 1, "params": {"cwds": [str(home / "work")]}}]
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in msgs))
        proc.stdin.flush()
        for line in proc.stdout:
            msg = json.loads(line)
            if msg.get("id") == 1:
                return [h for entry in msg["result"]["data"] for h in entry["hooks"]]
        raise AssertionError("codex app-server closed without answering hooks/list")
    finally:
        proc.kill()
        proc.wait()


async def test_installed_hooks_are_trusted_and_fire_through_the_shim(binary, tmp_path,
                                                                     nursery):
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    mock, stub = MockResponsesServer(), HookStub()
    await nursery.start(mock.serve)
    await nursery.start(stub.serve)
    (home / ".codex" / "config.toml").write_text(base_config(mock.base_url))
    out = install(home, stub.url)
    assert out.returncode == 0, out.stderr
    text = (home / ".codex" / "config.toml").read_text()
    assert text.startswith("# the test's own settings")

    listed = {h["key"]: h for h in hooks_list(binary, home)}
    doc = tomlkit.parse(text)
    ours = [k for k in doc["hooks"]["state"]]
    assert len(ours) == len(installer.EVENTS)
    for key in ours:
        assert listed[key]["trustStatus"] == "trusted", listed[key]
        assert listed[key]["currentHash"] == doc["hooks"]["state"][key]["trusted_hash"]

    run = await exec_turn(binary, home, mock)
    assert run.returncode == 0, run.describe()
    fired = [json.loads(r.body).get("hook_event_name") for r in stub.requests]
    assert {"SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"} <= set(
        fired), fired
    assert all(r.path == "/hooks/codex" and r.headers["x-aep-hook-transport"] == "command"
               for r in stub.requests)
    assert run.commands(), run.describe()  # the turn ran its tool after the hooks


async def test_without_the_trust_entries_codex_runs_none_of_them(binary, tmp_path, nursery):
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    mock, stub = MockResponsesServer(), HookStub()
    await nursery.start(mock.serve)
    await nursery.start(stub.serve)
    (home / ".codex" / "config.toml").write_text(base_config(mock.base_url))
    assert install(home, stub.url).returncode == 0
    path = home / ".codex" / "config.toml"
    doc = tomlkit.parse(path.read_text())
    del doc["hooks"]["state"]
    path.write_text(tomlkit.dumps(doc))
    assert {h["trustStatus"] for h in hooks_list(binary, home)} == {"untrusted"}
    run = await exec_turn(binary, home, mock)
    assert run.returncode == 0, run.describe()
    assert stub.requests == []


async def test_with_the_daemon_down_the_turn_finishes_and_the_moments_are_spooled(
        binary, tmp_path, nursery):
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    mock = MockResponsesServer()
    await nursery.start(mock.serve)
    (home / ".codex" / "config.toml").write_text(base_config(mock.base_url))
    assert install(home, f"http://127.0.0.1:{free_port()}").returncode == 0
    run = await exec_turn(binary, home, mock)
    assert run.returncode == 0, run.describe()
    assert run.commands(), run.describe()
    spool = home / ".local" / "state" / "aep-bridges" / "hooks-spool" / "codex.jsonl"
    lines = [json.loads(x) for x in spool.read_text().splitlines()]
    events = {line["payload"]["hook_event_name"] for line in lines}
    assert {"SessionStart", "PreToolUse", "PostToolUse", "Stop"} <= events, events
    assert len({line["id"] for line in lines}) == len(lines)


async def test_a_project_install_is_trusted_by_codex_in_that_project(binary, tmp_path, nursery):
    """``--project``: the hooks in ``<project>/.codex/config.toml``, their
    trust in the user config under that file's path; Codex loads a project
    layer only for a trusted project (the user's call, said by install)."""
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    project = home / "work"
    project.mkdir()
    mock, stub = MockResponsesServer(), HookStub()
    await nursery.start(mock.serve)
    await nursery.start(stub.serve)
    (home / ".codex" / "config.toml").write_text(
        base_config(mock.base_url) + f'\n[projects."{project.resolve()}"]\n'
                                     'trust_level = "trusted"\n')
    out = install(home, stub.url, "--project", str(project))
    assert out.returncode == 0, out.stderr
    assert "trust_level" not in out.stdout  # trusted already: no note
    listed = [h for h in hooks_list(binary, home) if h["source"] == "project"]
    assert len(listed) == len(installer.EVENTS)
    assert {h["trustStatus"] for h in listed} == {"trusted"}
    run = await exec_turn(binary, home, mock)
    assert run.returncode == 0, run.describe()
    fired = {json.loads(r.body).get("hook_event_name") for r in stub.requests}
    assert {"SessionStart", "PreToolUse", "Stop"} <= fired, fired
