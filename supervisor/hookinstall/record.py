"""What a file was before ``hooks install`` first changed it, so ``hooks
uninstall`` gives it back byte for byte (docs/hooks.md "What install writes").

One record per installed file, ``<state dir>/hookinstall/<sha256 of the
file's real path>.json``::

    {"path": "<real path>", "before": "<the exact text>" | null (install created it),
     "after_sha256": "<hex of the bytes install last wrote>",
     "made_dirs": ["<a directory install created for it>", ...] (optional, deepest first)}

- made by a *fresh* install (the file had none of our entries), kept by a
  re-install that finds the file as it last wrote it (``after_sha256``
  follows), replaced by one that finds it edited;
- used by ``uninstall`` only when the file still hashes to
  ``after_sha256`` (nobody touched it since): the recorded text is put back,
  or the file removed when install created it. Otherwise uninstall edits the
  file (our entries out, the rest as it is) and the record only tells
  whether install created the file (then an empty result is removed);
- removed once uninstall has written.

The state directory is :func:`bridges.core.paths.state_dir` of the
command's environment (``AEP_STATE_DIR``, ``XDG_STATE_HOME``, ``~/.local/state``)."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Mapping

from bridges.core.paths import state_dir, write_atomic

__all__ = ["distrust", "forget", "load", "record_path", "remember", "sha256_of"]


def sha256_of(path: Path) -> str | None:
    """The hex SHA-256 of ``path``'s bytes, ``None`` when there is no file."""
    try:
        return hashlib.sha256(Path(os.path.realpath(path)).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def record_path(env: Mapping[str, str], target: Path) -> Path:
    """Where the record of ``target`` (any path to it; its real path counts) lives."""
    real = os.path.realpath(target)
    return state_dir(env) / "hookinstall" / (
        hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json")


def distrust(env: Mapping[str, str], target: Path) -> str | None:
    """Why ``target``'s record (or its ``hookinstall`` directory) must not be
    used, or ``None``: not owned by this user, or group/world-writable (as
    the hook spool's directory is checked). A shared or pre-created state
    directory would let another user plant a record whose ``before`` text
    uninstall writes into the user's config (a hook of theirs)."""
    rec = record_path(env, target)
    for p, kind in ((rec.parent, "directory"), (rec, "file")):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"{p}: {e.strerror or e}"
        if st.st_uid != os.geteuid():
            return f"the record {kind} {p} is owned by uid {st.st_uid}, not by this user"
        if st.st_mode & 0o022:
            return (f"the record {kind} {p} is group/world-writable "
                    f"({stat.S_IMODE(st.st_mode):04o})")
        if kind == "file" and not stat.S_ISREG(st.st_mode):
            return f"the record {p} is not a regular file"
    return None


def load(env: Mapping[str, str], target: Path) -> dict[str, Any] | None:
    """The record of ``target``, or ``None`` (none, unreadable, or one
    :func:`distrust` refuses: then uninstall just edits the file)."""
    if distrust(env, target) is not None:
        return None
    try:
        rec = json.loads(record_path(env, target).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # (nested past the parser's recursion)
        return None
    if (not isinstance(rec, dict) or not isinstance(rec.get("after_sha256"), str)
            or not isinstance(rec.get("before"), (str, type(None)))):
        return None
    return rec


def remember(env: Mapping[str, str], target: Path, before: str | None, *,
             fresh: bool, made_dirs: list[str] | None = None) -> None:
    """Called by an install right after it wrote ``target``: ``before`` is
    the file's exact text before that write (``None``: there was none),
    ``fresh`` whether it had none of our entries, ``made_dirs`` the
    directories that write created (deepest first; uninstall removes them
    with the file, while empty). Raises ``OSError``."""
    rec = load(env, target)
    before_sha = (None if before is None
                  else hashlib.sha256(before.encode("utf-8", "surrogateescape")).hexdigest())
    if rec is None or rec["after_sha256"] != before_sha:
        if not fresh:
            forget(env, target)  # an older install's file, edited: nothing exact to give back
            return
        rec = {"path": os.path.realpath(target), "before": before}
        if before is None and made_dirs:
            rec["made_dirs"] = list(made_dirs)
    rec["after_sha256"] = sha256_of(target)
    write_atomic(record_path(env, target), json.dumps(rec), mode=0o600)


def forget(env: Mapping[str, str], target: Path) -> None:
    """Remove ``target``'s record (after an uninstall wrote)."""
    try:
        record_path(env, target).unlink()
    except FileNotFoundError:
        pass
