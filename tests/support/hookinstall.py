"""Running the real installer, ``aep-bridges hooks install <agent>``, the way
a person does: the console script of this worktree's venv, with the
environment the daemon will run with (``AEP_LISTEN``, ``AEP_STATE_DIR``,
the hold), so the live tests run the vendor on exactly what it writes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import DaemonProcess

__all__ = ["install"]


def install(agent: str, home: Path, daemon: DaemonProcess, *args: str,
            hold_s: int | None = None) -> str:
    """``aep-bridges hooks install agent ARGS`` with ``HOME`` = ``home``
    (``CODEX_HOME`` = ``home/.codex``) and the daemon's ``AEP_LISTEN`` and
    ``AEP_STATE_DIR`` (whether or not it runs yet); the hold from ``hold_s``
    or the daemon's ``AEP_<AGENT>_HOLD_S``. Returns the installer's output;
    raises ``AssertionError`` when it fails."""
    exe = Path(sys.executable).with_name("aep-bridges")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "CODEX_HOME": str(home / ".codex"), "AEP_LISTEN": f"127.0.0.1:{daemon.port}",
           "AEP_STATE_DIR": str(daemon.state)}
    prefix = {"claude-code": "AEP_CLAUDE_CODE", "codex": "AEP_CODEX_HOOKS"}[agent]
    hold = str(hold_s) if hold_s is not None else daemon.overrides.get(f"{prefix}_HOLD_S")
    if hold:
        env[f"{prefix}_HOLD_S"] = hold
    done = subprocess.run([str(exe), "hooks", "install", agent, *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout
