"""What the Claude Code and Codex installers share: the shim's command line,
how an entry is recognized as ours, the hold -> vendor timeout rule, and
writing a config file in place (mode and symlink kept, atomic)."""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bridges.core.paths import write_atomic

__all__ = ["AGENTS", "DEFAULT_HOLD_S", "EXTRA_TIMEOUT_S", "Plan", "Refused", "hold_seconds",
           "is_our_command", "shim_command", "shim_path", "write_in_place"]

#: the agents the installer knows, and the env prefix of their bridge's knobs
AGENTS = {"claude-code": "AEP_CLAUDE_CODE", "codex": "AEP_CODEX_HOOKS"}
#: the bridges' default hold limit (``AEP_<AGENT>_HOLD_S``, hooks-contract.md section 4)
DEFAULT_HOLD_S = 120
#: the vendor timeout of a holdable hook is the hold + this: the hold always ends first
EXTRA_TIMEOUT_S = 10


class Refused(Exception):
    """The file cannot be changed safely (malformed, or not the expected
    shape); ``str()`` says where (``path:line:col: why``). Nothing is written."""


@dataclass
class Plan:
    """One install/uninstall on one file: the text before (``None``: no file)
    and after, and one line per change made (empty: nothing to do);
    ``remove``: delete the file instead (an uninstall of a file install created)."""

    path: Path
    before: str | None
    after: str
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    remove: bool = False

    @property
    def changed(self) -> bool:
        return (self.remove and self.before is not None) or self.after != (self.before or "")


def hold_seconds(agent: str, given: int | None, env: Mapping[str, str]) -> int:
    """``--hold-s``, else ``AEP_<AGENT>_HOLD_S`` from ``env``, else 120."""
    if given is not None:
        return given
    raw = env.get(f"{AGENTS[agent]}_HOLD_S", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_HOLD_S


def shim_path() -> Path:
    """The absolute path of ``bridges/hooks_common/shim.py`` in this install."""
    from bridges.hooks_common import shim
    return Path(shim.__file__).resolve()


def shim_command(agent: str, *, daemon: str | None = None, python: str | None = None,
                 spool: str | None = None) -> str:
    """The fastest command line for the shim (``benchmarks/hook_shim_bench.py``
    measures the candidates): this install's interpreter with ``-S -E`` (no
    site-packages scan, no ``.pth`` files, no ``PYTHON*`` variables) importing
    ``shim`` from its directory, so its cached bytecode is used (a script
    given by path is compiled on every start); the directory replaces
    ``sys.path[0]``, the current directory, so no ``shim.py`` of the
    project the agent works in can be picked up. ``python`` defaults to
    ``sys.executable`` as is (a venv's ``bin/python``, not its resolved
    target). ``spool``: ``--spool DIR`` (the daemon's spool directory, so
    a daemon with its own ``AEP_STATE_DIR`` finds what the shim spooled
    whatever the agent's environment). Quoted for ``sh -c``."""
    code = (f"import sys; sys.path[0] = {json.dumps(str(shim_path().parent))}; "
            "from shim import main; sys.exit(main())")
    argv = [python or sys.executable, "-S", "-E", "-c", code, agent]
    if daemon:
        argv += ["--daemon", daemon]
    if spool:
        argv += ["--spool", spool]
    return shlex.join(argv)


def is_our_command(command: object, agent: str) -> bool:
    """Whether a hook's command line runs our shim for ``agent`` (any
    interpreter, any install path; the file or the console script)."""
    if not isinstance(command, str):
        return False
    try:
        argv = shlex.split(command)
    except ValueError:
        return False
    for i, word in enumerate(argv):
        rest = argv[i + 1:]
        launches = word.endswith("hooks_common/shim.py") or (
            "hooks_common" in word and "from shim import main" in word)
        if launches and rest[:1] == [agent]:
            return True
        if os.path.basename(word) == "aep-bridges" and rest[:2] == ["hook", agent]:
            return True
    return False


def write_in_place(path: Path, text: str, *, new_mode: int = 0o600) -> None:
    """Replace ``path``'s content with ``text`` atomically (a temporary file
    in the same directory, then ``os.replace``). A symlink is followed (a
    dotfiles manager's link stays a link); the file's mode is kept (a new
    file gets ``new_mode``). Raises ``OSError``."""
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = new_mode
    write_atomic(target, text, mode=mode)
