"""``aep-bridges tail``'s saved resume position, one file per endpoint.

The ecosystem's ``aep tail`` keeps ``positions[session] = {epoch, seq}`` in
``~/.aep/tail-state.json`` and sends them back as ``from`` on its next start
(AEP-0003 §7), so a restarted tail shows what it missed, not everything
again nor a gap. Here the positions live under the state directory
(``AEP_STATE_DIR``, else ``$XDG_STATE_HOME/aep-bridges``), one file per
endpoint URL: ``tail/<host>_<port>-<hash>.json`` holding ``{"url": URL,
"saved_at": SECONDS, "positions": [{"session", "epoch", "seq"}, ...]}``,
replaced atomically. ``saved_at`` (Unix seconds, the wall clock of the
save; a file without it: its modification time) is when the tail last
knew what it had shown: a restarted tail also shows the sessions that are
not in ``positions`` and have events after it (:func:`.tailstream.missed`).

The file is a convenience: an unreadable or malformed one is treated as
absent (the tail starts live), and a failure to write is reported once by
the caller, never fatal."""
from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple, TextIO

from bridges.core.paths import state_dir, write_atomic

from .gist import _safe

__all__ = ["MAX_POSITIONS", "Keeper", "Saved", "load", "load_saved", "position_file", "save"]

MAX_POSITIONS = 1000
"""Sessions a file keeps (the most recently seen): the SDK sends what fits
its ``from`` budget on the live request and drains the rest in bounded
replay requests."""


def position_file(url: str, environ: Mapping[str, str]) -> Path:
    """The file for ``url``: readable name from its host and port, a hash
    of the whole URL (path and scheme included) so two endpoints never share one."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    readable = re.sub(r"[^A-Za-z0-9.-]+", "_", f"{parts.hostname or 'endpoint'}_{parts.port or ''}")
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    return state_dir(environ) / "tail" / f"{readable.strip('_')}-{digest}.json"


def _position(p: Any) -> dict[str, Any] | None:
    if not isinstance(p, dict):
        return None
    session, epoch, seq = p.get("session"), p.get("epoch", 0), p.get("seq")
    if not isinstance(session, str) or not session:
        return None
    if not isinstance(epoch, int) or not isinstance(seq, int) or isinstance(seq, bool) \
            or isinstance(epoch, bool) or seq < 0 or epoch < 0:
        return None
    return {"session": session, "epoch": epoch, "seq": seq}


class Saved(NamedTuple):
    """What a file holds: the ``positions`` (``[{session, epoch, seq}]``,
    oldest first) and ``saved_at`` (Unix seconds)."""

    positions: list[dict[str, Any]]
    saved_at: float


def load_saved(path: Path) -> Saved | None:
    """The file at ``path`` read: ``None`` when it is missing, unreadable
    or not the expected shape (the tail starts live); malformed entries
    are skipped. ``saved_at``: the document's, else the file's
    modification time (a file written before it was kept)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        mtime = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    raw = doc.get("positions") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        return None
    at = doc.get("saved_at")
    saved_at = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) \
        and 0 < at < 1e11 else mtime
    return Saved([p for p in map(_position, raw) if p is not None], saved_at)


def load(path: Path) -> list[dict[str, Any]]:
    """The positions saved in ``path`` (``[]`` when it is missing,
    unreadable or not the expected shape; malformed entries are skipped)."""
    saved = load_saved(path)
    return saved.positions if saved is not None else []


def save(path: Path, url: str, positions: list[dict[str, Any]], *,
         saved_at: float | None = None) -> None:
    """Write ``positions`` (the last :data:`MAX_POSITIONS`) for ``url``,
    stamped ``saved_at`` (Unix seconds; default now). Raises ``OSError``."""
    import time
    kept = [p for p in map(_position, positions) if p is not None][-MAX_POSITIONS:]
    doc = {"url": url, "saved_at": round(time.time() if saved_at is None else saved_at, 3),
           "positions": kept}
    write_atomic(path, json.dumps(doc, separators=(",", ":")))


@dataclass
class Keeper:
    """``tail``'s position as it shows events, saved to ``path`` (:func:`save`). The
    positions are those of the events *shown* (the SDK's own run ahead of
    the screen: it has read what ``--limit`` never prints), newest last."""

    path: Any
    url: str
    err: TextIO
    positions: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_save: float = 0.0  # monotonic seconds
    failed: bool = False

    def shown(self, ev: Mapping[str, Any]) -> None:
        session, seq = ev.get("session"), ev.get("seq")
        if isinstance(session, str) and isinstance(seq, int):
            self.positions.pop(session, None)
            self.positions[session] = {"session": session, "epoch": ev.get("epoch", 0), "seq": seq}

    def save(self, *, now: float, force: bool = False) -> None:
        if self.failed or (not force and now - self.last_save < 1.0):
            return
        self.last_save = now
        try:
            save(self.path, self.url, list(self.positions.values()))
        except OSError as e:
            self.failed = True  # said once; the tail goes on
            print(_safe(f"aep-bridges tail: cannot save the resume position in {self.path}: "
                        f"{e.strerror or e} (--no-resume to not try)"), file=self.err)
