"""The bridge's small persistent state (``{AEP_STATE_DIR}/{bridge}/{host}_{port}.json``):
what a daemon restart must not lose so that no run and no attention request
is left dangling and nothing is emitted twice (open runs, pending asks with
their ``attention.requested`` ids, settling marks, cancel notes); see
:meth:`bridges.sse_common.tracker.Tracker.snapshot`. Written atomically
(temporary file + ``os.replace``) whenever that state changes."""
from __future__ import annotations

import json
import logging
import re
import urllib.parse
from pathlib import Path

from bridges.core.paths import write_atomic

log = logging.getLogger("aep.sse.state")


def state_path(state_dir: Path | None, bridge: str, url: str) -> Path | None:
    """The state file for one bridge and server (``None``: no persistence)."""
    if state_dir is None:
        return None
    p = urllib.parse.urlsplit(url)
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{p.hostname or 'server'}_{p.port or ''}").strip("_")
    return Path(state_dir) / bridge / f"{key}.json"


class StateFile:
    """Load/save one JSON document; failures are logged once and counted by
    the caller, never raised (the bridge keeps running without persistence)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.errors = 0
        self._warned = False
        self._last: str | None = None

    def load(self) -> object:
        """The saved document as parsed JSON (untrusted: the tracker checks
        its shape), or ``None`` when there is none or it is unreadable."""
        if self.path is None:
            return None
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self._warn(f"unreadable ({type(e).__name__}); starting without it")
            return None

    def save(self, doc: object) -> None:
        if self.path is None:
            return
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        if text == self._last:
            return
        try:
            write_atomic(self.path, text)
            self._last = text
        except OSError as e:
            self.errors += 1
            self._warn(f"cannot be written ({e.strerror or type(e).__name__})")

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("bridge state file %s %s", self.path, what)
