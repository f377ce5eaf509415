"""Finding the live ``kimi web`` and its token (thin file I/O, no sockets).

Design record: ``shared/aep/docs/adapter-kimi-code-design.md`` ("The kimi
web channel"): the server registers ``<home>/server/instances/<id>.json``
(``{server_id, pid, host, port, started_at, heartbeat_at, host_version}``,
removed on a clean shutdown, left behind by a crash) and keeps its bearer
token in ``<home>/server.token`` (mode 0600; the vendor itself refuses a
more permissive file, and so do we). Never the token in a URL, a log line
or an exception message.
"""
from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import KimiWebConfig

TOKEN_FILE = "server.token"


class NotFound(Exception):
    """No usable server (no live instance, no token): the message says
    which, never the token."""


@dataclass(frozen=True)
class Instance:
    """One registered server whose pid is alive."""

    server_id: str
    pid: int
    host: str
    port: int
    started_at: float
    heartbeat_at: float
    version: str | None = None


@dataclass(frozen=True)
class Endpoint:
    """Where to attach: ``url`` (``http://host:port``), ``token`` (hidden
    from ``repr``), ``server_id`` (``None`` with ``AEP_KIMI_WEB_URL``)."""

    url: str
    token: str = field(repr=False)
    server_id: str | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        """What identifies the attachment (a change means: reconnect)."""
        return (self.url, self.server_id)


#: an instance whose pid belongs to another user (``EPERM``) counts as live
#: only while its ``heartbeat_at`` is this recent (seconds): a crashed
#: server's pid reused by someone else's process is stale, not live
FOREIGN_PID_FRESH_S = 120.0


def pid_alive(pid: int, heartbeat_at: float = 0.0, now: float | None = None) -> bool:
    """``kill(pid, 0)``: our process with that pid -> True, none -> False.
    ``EPERM`` (a process of another user holds the pid: the server runs as
    someone else, or a crash left the file and the pid was reused) -> True
    only when ``heartbeat_at`` (epoch seconds or milliseconds; ``0``:
    unknown) is within :data:`FOREIGN_PID_FRESH_S` of ``now``, or unknown."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        if heartbeat_at <= 0:
            return True  # nothing to tell by: as before
        hb = heartbeat_at / 1000 if heartbeat_at > 1e11 else heartbeat_at
        return abs((time.time() if now is None else now) - hb) <= FOREIGN_PID_FRESH_S
    except OSError:
        return False
    return True


def parse_instance(body: Any) -> Instance | None:
    """An instance file's JSON, or ``None`` when it is not one."""
    if not isinstance(body, dict):
        return None
    sid, pid, host, port = body.get("server_id"), body.get("pid"), body.get("host"), body.get("port")
    if not (isinstance(sid, str) and sid and isinstance(pid, int) and isinstance(host, str) and host
            and isinstance(port, int) and 0 < port < 65536):
        return None

    def num(k: str) -> float:
        v = body.get(k)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0
    version = body.get("host_version") if isinstance(body.get("host_version"), str) else None
    return Instance(sid, pid, host, port, num("started_at"), num("heartbeat_at"), version)


def live_instances(home: Path) -> list[Instance]:
    """Registered servers whose pid is alive, newest first (``started_at``,
    then ``heartbeat_at``); stale and unreadable files are skipped."""
    d = Path(home) / "server" / "instances"
    found = []
    try:
        paths = sorted(d.glob("*.json"))
    except OSError:
        return []
    for p in paths:
        try:
            inst = parse_instance(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
        if inst is not None and pid_alive(inst.pid, inst.heartbeat_at):
            found.append(inst)
    return sorted(found, key=lambda i: (i.started_at, i.heartbeat_at), reverse=True)


def read_token(home: Path) -> str:
    """``<home>/server.token``. Raises :class:`NotFound` when missing,
    empty, or readable by group/others (the vendor's own 0600 rule)."""
    path = Path(home) / TOKEN_FILE
    try:
        st = path.stat()
        if os.name != "nt" and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise NotFound(f"{path} is readable by others (mode {st.st_mode & 0o777:o}); "
                           "kimi web requires 0600")
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise NotFound(f"no {TOKEN_FILE} in {home} (has kimi web run there?)") from None
    except OSError as e:
        raise NotFound(f"{path}: {e.strerror or type(e).__name__}") from None
    if not token:
        raise NotFound(f"{path} is empty")
    return token


def _host(host: str) -> str:
    h = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    return f"[{h}]" if ":" in h else h


def resolve(config: KimiWebConfig) -> Endpoint:
    """The endpoint to attach to now: ``AEP_KIMI_WEB_URL`` /
    ``AEP_KIMI_WEB_TOKEN`` when set, else the newest live instance under
    ``KIMI_CODE_HOME`` and its token file (re-read every call: a rotated
    token is picked up). Raises :class:`NotFound`."""
    if config.url:
        token = config.token or read_token(config.home)
        return Endpoint(config.url, token, None)
    instances = live_instances(config.home)
    if not instances:
        raise NotFound(f"no live kimi web registered under {config.home}/server/instances")
    inst = instances[0]
    token = config.token or read_token(config.home)
    return Endpoint(f"http://{_host(inst.host)}:{inst.port}", token, inst.server_id)
