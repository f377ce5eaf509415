"""The installer's shared rules: the daemon URL, the hold, the shim's line."""
from __future__ import annotations

import shlex

import pytest

from supervisor.hookinstall.cli import daemon_url
from supervisor.hookinstall.common import hold_seconds, is_our_command, shim_command


@pytest.mark.parametrize("given, listen, want", [
    (None, None, "http://127.0.0.1:8787"),
    ("http://10.0.0.5:9000/", None, "http://10.0.0.5:9000"),
    (None, "0.0.0.0:9100", "http://127.0.0.1:9100"),
    (None, "[::]:9100", "http://[::1]:9100"),
    (None, "127.0.0.2:8000", "http://127.0.0.2:8000"),
])
def test_daemon_url(given, listen, want):
    assert daemon_url(given, {"AEP_LISTEN": listen} if listen else {}) == want


def test_hold_seconds():
    assert hold_seconds("codex", None, {}) == 120
    assert hold_seconds("codex", None, {"AEP_CODEX_HOOKS_HOLD_S": "45"}) == 45
    assert hold_seconds("claude-code", None, {"AEP_CLAUDE_CODE_HOLD_S": "x"}) == 120
    assert hold_seconds("claude-code", 7, {"AEP_CLAUDE_CODE_HOLD_S": "45"}) == 7


def test_the_shim_line_survives_odd_paths_and_is_recognized():
    line = shim_command("codex", daemon="http://127.0.0.1:1", python="/opt/my venv/bin/python")
    argv = shlex.split(line)
    assert argv[:4] == ["/opt/my venv/bin/python", "-S", "-E", "-c"]
    assert argv[5:] == ["codex", "--daemon", "http://127.0.0.1:1"]
    assert is_our_command(line, "codex") and not is_our_command(line, "claude-code")
    assert not is_our_command("echo 'unbalanced", "codex")
    assert not is_our_command("python -c 'from shim import main' codex", "codex")
