"""The real Codex 0.171.0 (``codex exec``, offline against the Responses mock)
hooked through the command shim (``bridges/hooks_common/shim.py``, run as
the installer runs it: ``python -S -E``) to the daemon's ``/hooks/codex``,
its ``PermissionRequest`` (``--approve-for-me`` + an escalation) answered
from AEP with the SDK ``ControlClient``: allowed, the command runs; a
free-text deny, the model reads the text as the tool's output.

The shim and the Codex hook harness are the ``shim`` and ``cclive``
branches'; until they are merged this module skips."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.daemon import DaemonProcess, command
from tests.support.schema import validated

ch = pytest.importorskip("tests.support.codex_hooks")
shim = pytest.importorskip("bridges.hooks_common.shim")

pytestmark = pytest.mark.vendor

TOKEN = "live-codex-hooks-token"
EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PermissionRequest", "PostToolUse",
          "Stop")


@pytest.fixture(scope="module")
def codex_bin() -> Path:
    from tests.support import codex as cx
    return cx.codex_binary()


@pytest.fixture
def daemon(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_CODEX_HOOKS": "1", "AEP_BRIDGE_OTLP_IN": "0",
                                           "AEP_CODEX_HOOKS_CONTROL": "1",
                                           "AEP_CODEX_HOOKS_HOLD_S": "60"}, token=TOKEN)
    d.start()
    stream = d.subscribe()
    yield d, stream
    stream.close()
    d.stop()


async def exec_answered(codex_bin: Path, root: Path, d: DaemonProcess, stream,
                        answer: dict[str, Any]):
    from tests.support import codex as cx
    from tests.support.mock_responses import MockResponsesServer
    home = root / "home"
    (home / ".codex").mkdir(parents=True)
    token_file = root / "token"
    token_file.write_text(TOKEN)
    source = home / ".codex" / "config.toml"
    cmd = shlex.join([sys.executable, "-S", "-E", str(Path(shim.__file__)), "codex",
                      "--daemon", d.url, "--token-file", str(token_file)])
    outside = root / "outside.txt"
    mock = MockResponsesServer(command=f"touch {outside} && echo made", extra_args=dict(ch.ESCALATE))
    box: dict[str, Any] = {}
    async with trio.open_nursery() as n:
        await n.start(mock.serve)
        cfg = (ch.base_config(mock.base_url, approval_policy="on-request",
                              sandbox_mode="workspace-write")
               + ch.hooks_toml(source, {ev: cmd for ev in EVENTS}, timeout=70))

        async def run() -> None:
            box["run"] = await cx.run_codex_exec(codex_bin, home, cx.PROMPT, cfg,
                                                 proxy_url=mock.base_url.rsplit("/v1", 1)[0],
                                                 timeout=120, args=("--approve-for-me",))
        n.start_soon(run)
        ask = await stream.wait_for(lambda s: next((e for e in s.events
                                                    if e["type"] == "attention.requested"), None),
                                    timeout=90, what="Codex's PermissionRequest")
        status, _ = await command(d, "control.attention.respond", ask["session"],
                                  subject=ask["id"], capture="redacted", data={"answer": answer})
        assert status == "accepted"
        await stream.wait_for(lambda s: "run" in box, timeout=120, what="codex exec to finish")
        n.cancel_scope.cancel()
    assert box["run"].returncode == 0, box["run"].describe()
    return ask, outside, mock


async def test_codex_permission_request_allowed_from_aep(codex_bin, tmp_path, daemon):
    d, stream = daemon
    ask, outside, mock = await exec_answered(codex_bin, tmp_path, d, stream, {"option": "allow"})
    assert outside.exists()
    assert ask["agent"] == "codex" and ask["data"]["kind"] == "permission"
    s = ask["session"]
    await stream.wait_for(lambda c: c.of(s, "run.finished"), what="run.finished")
    evs = validated(stream.of(s))
    types = [e["type"] for e in evs]
    for t in ("session.started", "run.started", "tool.requested", "attention.answered",
              "tool.completed", "run.finished"):
        assert t in types, types
    assert {e["run"] for e in evs if e["type"].startswith(("tool.", "run."))} == {ask["run"]}


async def test_codex_permission_request_denied_with_text_from_aep(codex_bin, tmp_path, daemon):
    d, stream = daemon
    reason = "AEP-CX-DENY-5: ask the on-call first"
    ask, outside, mock = await exec_answered(codex_bin, tmp_path, d, stream, {"text": reason})
    assert not outside.exists()
    (out,) = mock.tool_outputs()
    assert reason in out["output"], out
    validated(stream.of(ask["session"]))
