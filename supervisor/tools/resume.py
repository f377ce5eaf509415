"""``aep-bridges tail``'s saved resume position, one file per endpoint.

The ecosystem's ``aep tail`` keeps ``positions[session] = {epoch, seq}`` in
``~/.aep/tail-state.json`` and sends them back as ``from`` on its next start
(AEP-0003 §7), so a restarted tail shows what it missed, not everything
again nor a gap. Here the positions live under the state directory
(``AEP_STATE_DIR``, else ``$XDG_STATE_HOME/aep-bridges``), one file per
endpoint URL: ``tail/<host>_<port>-<hash>.json`` holding ``{"url": URL,
"positions": [{"session", "epoch", "seq"}, ...]}``, replaced atomically.

The file is a convenience: an unreadable or malformed one is treated as
absent (the tail starts live), and a failure to write is reported once by
the caller, never fatal."""
from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from bridges.core.paths import state_dir, write_atomic

__all__ = ["MAX_POSITIONS", "load", "position_file", "save"]

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


def load(path: Path) -> list[dict[str, Any]]:
    """The positions saved in ``path`` (``[]`` when it is missing,
    unreadable or not the expected shape; malformed entries are skipped)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    raw = doc.get("positions") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        return []
    return [p for p in map(_position, raw) if p is not None]


def save(path: Path, url: str, positions: list[dict[str, Any]]) -> None:
    """Write ``positions`` (the last :data:`MAX_POSITIONS`) for ``url``.
    Raises ``OSError``."""
    kept = [p for p in map(_position, positions) if p is not None][-MAX_POSITIONS:]
    write_atomic(path, json.dumps({"url": url, "positions": kept}, separators=(",", ":")))
