"""``aep-bridges doctor`` through the console script with the Claude Code hook
bridge enabled (issue 27's trial, finding 3): before ``hooks install`` it
fails with the install command; after it (the installer's own output in a
temporary home) every hook check passes and the gate is said."""
from __future__ import annotations

import subprocess

from tests.support.daemon import console_script
from tests.support.net import free_ports


def run(tmp_path, port: int, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "AEP_STATE_DIR": str(tmp_path / "state"), "AEP_LISTEN": f"127.0.0.1:{port}",
           "AEP_BRIDGE_CLAUDE_CODE": "1", "AEP_BRIDGE_OTLP_IN": "0", "AEP_TOKEN": "t0k3n-doctor"}
    return subprocess.run(console_script() + list(args), capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path / "proj")


def test_doctor_checks_the_claude_code_hooks(tmp_path):
    for d in ("home", "state", "proj"):
        (tmp_path / d).mkdir()
    (port,) = free_ports(1)
    before = run(tmp_path, port, "doctor")
    assert before.returncode == 1, before.stdout + before.stderr
    assert "FAIL  claude-code hooks: not installed" in before.stdout
    assert f"fix: aep-bridges hooks install claude-code --daemon http://127.0.0.1:{port}" \
        in before.stdout
    inst = run(tmp_path, port, "hooks", "install", "claude-code")
    assert inst.returncode == 0, inst.stderr
    after = run(tmp_path, port, "doctor")
    hook_lines = [ln for ln in after.stdout.splitlines() if "claude-code" in ln]
    assert hook_lines and all(ln.startswith("ok") for ln in hook_lines), after.stdout
    assert "point at this daemon" in after.stdout and "control gate: off" in after.stdout
    assert after.returncode == 0, after.stdout
    assert "t0k3n-doctor" not in after.stdout + after.stderr
