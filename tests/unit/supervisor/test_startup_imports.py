"""What a daemon or CLI start imports (issue 29: the suite starts hundreds
of daemons and CLIs; each paid ~0.3 CPU-s importing bridges nobody had
enabled). The settings' names of every bridge are read at each start
(:func:`supervisor.config.known_settings`, the did-you-mean check), so a
bridge package's ``__init__`` and ``config`` must not import the bridge
itself, and the CLI's parser must not import the ACP tee (the SDK's
generated pydantic types) for another command."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# the bridges not enabled by default, the SDK behind the ACP tee's ids, and
# the package metadata read for --version
NOT_AT_START = ("bridges.openhands.bridge", "bridges.kimi_web.bridge", "bridges.acp.bridge",
                "bridges.agui.bridge", "bridges.hooks_common.bridge", "bridges.sse_common.bridge",
                "aep_sdk", "pydantic", "importlib.metadata")


def test_check_with_the_default_bridges_imports_no_disabled_bridge(tmp_path):
    """``aep-bridges check`` (the CLI's parser, the whole configuration with
    every bridge's settings, the enabled bridges built) in a fresh
    interpreter: none of :data:`NOT_AT_START` is imported. Before, every
    bridge package imported its bridge (and the ACP wire the SDK) from its
    ``__init__``, and ``--version`` read the metadata at every start."""
    code = ("import sys; from supervisor.cli import main; rc = main(['check', '--no-ports']); "
            f"print(rc, sorted(set({NOT_AT_START!r}) & set(sys.modules)))")
    env = {"PATH": "/usr/bin:/bin", "AEP_STATE_DIR": str(tmp_path / "state"),
           "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["0 []"], out.stdout + out.stderr


def test_a_disabled_bridge_is_still_built_on_demand():
    """The lazy names resolve: each bridge class is still reachable from
    its package (``__all__`` keeps listing it) once asked for."""
    code = ("import bridges.openhands as o, bridges.kimi_web as k, bridges.acp as a, "
            "bridges.agui as g, bridges.otlp_in as t; "
            "print(o.OpenHandsBridge.__name__, o.OpenHandsRun.__name__, k.KimiWebBridge.__name__, "
            "a.AcpBridge.__name__, g.AguiBridge.__name__, t.OtlpInBridge.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["OpenHandsBridge", "OpenHandsRun", "KimiWebBridge", "AcpBridge",
                                  "AguiBridge", "OtlpInBridge"], out.stderr
