"""Where the daemon keeps state (DESIGN.md operator interface: ``AEP_STATE_DIR``)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping


def state_dir(env: Mapping[str, str]) -> Path:
    """``AEP_STATE_DIR``, else ``$XDG_STATE_HOME/aep-bridges``, else
    ``~/.local/state/aep-bridges``."""
    if env.get("AEP_STATE_DIR"):
        return Path(env["AEP_STATE_DIR"]).expanduser()
    xdg = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME", "~"), ".local", "state")
    return Path(xdg).expanduser() / "aep-bridges"
