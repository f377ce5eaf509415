"""The durable session log: ``{state}/logs/{agent}/{session}.jsonl``, one
event per line, each line written with a single ``write`` on an
``O_APPEND`` descriptor so a concurrent ``tail -f`` never sees a torn event
(AEP-0003 §3.1). Written before any other sink (DESIGN.md "Delivery").

Session ids are producer-controlled (AEP-0001 §12): they are encoded before
they become file names."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import urllib.parse
from collections import OrderedDict
from pathlib import Path
from typing import Any

from bridges.core.aep import dumps

log = logging.getLogger("aep.jsonl")

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,150}\Z")


def safe_name(value: str) -> str:
    """A file-system-safe, collision-free name for an untrusted id: the id
    itself when it fits ``[A-Za-z0-9][A-Za-z0-9._-]*`` (and is short), else
    ``~`` + its percent-encoding (shortened with a digest suffix when long).
    The two forms cannot collide: one starts alphanumeric, the other ``~``."""
    if _SAFE.match(value):
        return value
    enc = urllib.parse.quote(value, safe="")
    if len(enc) > 150:
        enc = enc[:100] + "~" + hashlib.sha256(value.encode()).hexdigest()[:24]
    return "~" + enc


def encode_line(event: dict[str, Any]) -> bytes:
    """One JSONL line: the event's wire form (:func:`bridges.core.aep.dumps`)
    and a newline. Raises ``UnicodeEncodeError`` for text with a lone UTF-16
    surrogate (no UTF-8 form; see :func:`bridges.core.aep.scrub_surrogates`)
    and ``TypeError``/``ValueError`` for anything that is not JSON."""
    return dumps(event) + b"\n"


class SessionLog:
    """Appends events to per-session files, keeping at most ``max_open``
    descriptors open (least recently written closed first).

    ``write`` raises nothing: a failing disk is logged once per file and
    counted in ``errors``, and the event still flows to the relay (the log
    is history, not a gate)."""

    def __init__(self, root: Path, *, max_open: int = 128) -> None:
        self.root = Path(root)
        self.max_open = max_open
        self._fds: OrderedDict[Path, int] = OrderedDict()
        self._failed: set[Path] = set()
        self.errors = 0
        self.lines = 0
        self.failing = False  # the last write failed (health)

    def path_for(self, event: dict[str, Any]) -> Path:
        agent = safe_name(str(event.get("agent") or "unknown"))
        session = event.get("session")
        name = safe_name(str(session)) if session else "_agent"  # cannot collide: see safe_name
        return self.root / agent / f"{name}.jsonl"

    def _fd(self, path: Path) -> int:
        fd = self._fds.pop(path, None)
        if fd is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            while len(self._fds) >= self.max_open:
                _, old = self._fds.popitem(last=False)
                os.close(old)
        self._fds[path] = fd
        return fd

    def write(self, event: dict[str, Any], line: bytes | None = None) -> None:
        path = self.path_for(event)
        data = line if line is not None else encode_line(event)
        try:
            n = os.write(self._fd(path), data)
            if n != len(data):  # regular files don't short-write short of ENOSPC
                raise OSError(f"short write ({n}/{len(data)} bytes)")
            self.lines += 1
            self.failing = False
        except OSError as e:
            self.errors += 1
            self.failing = True
            if path not in self._failed:
                self._failed.add(path)
                log.error("cannot write session log %s: %s", path, e)

    def flush(self) -> None:
        """fsync every open file (shutdown)."""
        for fd in self._fds.values():
            try:
                os.fsync(fd)
            except OSError:
                pass

    def close(self) -> None:
        self.flush()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
