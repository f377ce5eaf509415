"""Where the daemon keeps state (DESIGN.md operator interface: ``AEP_STATE_DIR``)."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Mapping

__all__ = ["ROTATION_STAMP", "make_private_dirs", "state_dir", "write_atomic"]

ROTATION_STAMP = re.compile(r"\.[0-9]{8}T[0-9]{6}\.[0-9]{6}Z\Z")
"""The tail of a rotated session log segment's base name (``{session}.{UTC}``
before ``.jsonl``; ``UTC`` is ``YYYYmmddTHHMMSS.ffffffZ``): the one rule
the session log's writer (``supervisor.sessionlog``) and its readers (the
relay's restore, retention, the writer index) share. No session's file
name ends in it (``supervisor.sessionlog.jsonlog.safe_name``; issue 25,
attack 6: a session named ``{S}.{UTC}`` was read as a segment of ``S``)."""


def state_dir(env: Mapping[str, str]) -> Path:
    """``AEP_STATE_DIR``, else ``$XDG_STATE_HOME/aep-bridges``, else
    ``~/.local/state/aep-bridges``. A relative ``XDG_STATE_HOME`` is ignored
    (the XDG spec: invalid); a relative ``AEP_STATE_DIR`` is returned as is
    (the config refuses it)."""
    if env.get("AEP_STATE_DIR"):
        return Path(env["AEP_STATE_DIR"]).expanduser()
    xdg = env.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(xdg):
        xdg = os.path.join(env.get("HOME", "~"), ".local", "state")
    return Path(xdg).expanduser() / "aep-bridges"


def make_private_dirs(path: Path | str) -> None:
    """``os.makedirs(path, exist_ok=True)``, but every directory it makes
    is ``0700`` (``os.makedirs`` gives its mode to the last one only): the
    daemon's state and session logs are the user's alone (issue 25, attack
    5: ``logs/<agent>/`` at 0755 let other local users list session ids).
    Directories that exist are left as they are. Raises ``OSError``."""
    path = os.fspath(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    except FileNotFoundError:
        parent = os.path.dirname(path.rstrip("/"))
        if not parent or parent == path:
            raise
        make_private_dirs(parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def write_atomic(path: Path, text: str, *, fsync: bool = False, mode: int | None = None) -> None:
    """Replace the file at ``path`` with ``text`` (UTF-8) atomically: a
    temporary file in the same directory, then ``os.replace``, so a reader
    (or a crash) sees the old document or the new one, never half of one.
    Creates missing parent directories. ``fsync``: flush the data to disk
    before the rename (state that must survive a power cut, e.g. the epoch).
    ``mode``: the new file's permission bits (default ``0o600``, the
    temporary file's). Raises ``OSError``; the temporary file is removed on
    failure."""
    make_private_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
