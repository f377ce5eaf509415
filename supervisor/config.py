"""Daemon configuration from the environment (the systemd ``EnvironmentFile``
/ launchd ``EnvironmentVariables`` way). Names and defaults: the operator's
interface table in ``shared/DESIGN.md``.

:func:`load` never raises for bad settings: it returns a :class:`Config` and a
list of problems, one clear line each, so the CLI can refuse to start (exit
2) before anything binds."""
from __future__ import annotations

import os
import socket
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bridges.core.capture import CapturePolicy
from bridges.core.paths import state_dir

DEFAULT_LISTEN = "127.0.0.1:8787"


@dataclass(frozen=True)
class BridgeSpec:
    """One entry of the fleet: its enable flag, whether it is on by default,
    and the ``module:function`` factory ``from_env(environ, *, policy)``
    returning a bridge or a list of bridges (``None`` while not built)."""

    key: str
    flag: str
    default: bool
    factory: str | None


FLEET: tuple[BridgeSpec, ...] = (
    BridgeSpec("openhands", "AEP_BRIDGE_OPENHANDS", False, "bridges.openhands:from_env"),
    BridgeSpec("opencode_sse", "AEP_BRIDGE_OPENCODE_SSE", False, "bridges.opencode_sse:from_env"),
    BridgeSpec("kilocode_sse", "AEP_BRIDGE_KILOCODE_SSE", False, "bridges.kilocode_sse:from_env"),
    BridgeSpec("kimi_web", "AEP_BRIDGE_KIMI_WEB", False, None),
    BridgeSpec("otlp_in", "AEP_BRIDGE_OTLP_IN", True, "bridges.otlp_in:from_env"),
    BridgeSpec("acp", "AEP_BRIDGE_ACP", False, None),
)
_FLAGS = {s.flag for s in FLEET}


@dataclass
class Config:
    """The parsed daemon settings. ``environ`` is kept for the bridges' own
    ``from_env`` readers; it is never logged."""

    token: str | None = None
    relay_url: str | None = None
    listen: tuple[str, int] = ("127.0.0.1", 8787)
    state_dir: Path = Path(".")
    buffer: int = 10_000
    max_sessions: int = 500
    max_body: int = 16 << 20
    max_batch: int = 10_000
    max_from: int | None = None
    channel_size: int = 4096
    drain_deadline: float = 5.0
    policy: CapturePolicy = field(default_factory=CapturePolicy)
    enabled: list[BridgeSpec] = field(default_factory=list)
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def embedded_relay(self) -> bool:
        return self.relay_url is None


def parse_hostport(value: str, what: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> ``(host, port)``. Raises ``ValueError``
    with a message naming ``what``."""
    v = value.strip()
    if v.startswith("["):
        host, sep, port = v[1:].partition("]:")
    else:
        host, sep, port = v.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what}={value!r} is not host:port (e.g. 127.0.0.1:8787)")
    return host, int(port)


def port_free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound right now (TCP). Port 0 is
    always free. An unresolvable host counts as not free."""
    if port == 0:
        return True
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError:
            return False
    return True


def _flag(env: Mapping[str, str], name: str, default: bool, problems: list[str]) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    problems.append(f"{name}={raw!r}: expected 1 or 0")
    return default


def _int(env: Mapping[str, str], name: str, default: int, problems: list[str],
         minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        problems.append(f"{name}={raw!r}: expected a whole number")
        return default
    if v < minimum:
        problems.append(f"{name}={v}: must be at least {minimum}")
        return default
    return v


def load(env: Mapping[str, str] | None = None, *, relay_only: bool = False,
         check_ports: bool = True) -> tuple[Config, list[str]]:
    """Parse the environment. Returns ``(config, problems)``; a non-empty
    ``problems`` list means: refuse to start. ``relay_only`` is
    ``aep-bridges relay`` (no bridges, no uplink)."""
    env = dict(os.environ if env is None else env)
    problems: list[str] = []
    cfg = Config(environ=env)
    cfg.token = env.get("AEP_TOKEN") or None
    cfg.state_dir = state_dir(env)
    cfg.buffer = _int(env, "AEP_BUFFER", 10_000, problems)
    cfg.max_sessions = _int(env, "AEP_MAX_SESSIONS", 500, problems)
    cfg.max_body = _int(env, "AEP_MAX_BODY", 16 << 20, problems)
    cfg.max_batch = _int(env, "AEP_MAX_BATCH", 10_000, problems)
    cfg.max_from = _int(env, "AEP_MAX_FROM", cfg.max_sessions, problems)
    try:
        cfg.listen = parse_hostport(env.get("AEP_LISTEN") or DEFAULT_LISTEN, "AEP_LISTEN")
    except ValueError as e:
        problems.append(str(e))
    try:
        cfg.policy = CapturePolicy.from_env(env)
    except ValueError as e:
        problems.extend(getattr(e, "problems", None) or [str(e)])

    url = env.get("AEP_RELAY_URL") or None
    if url and not relay_only:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            problems.append(f"AEP_RELAY_URL={url!r}: expected http(s)://host:port")
        else:
            cfg.relay_url = url.rstrip("/")

    if not relay_only:
        for name in sorted(env):
            if name.startswith("AEP_BRIDGE_") and name not in _FLAGS:
                known = ", ".join(sorted(_FLAGS))
                problems.append(f"{name}: unknown bridge (known: {known})")
        for spec in FLEET:
            if _flag(env, spec.flag, spec.default, problems):
                if spec.factory is None:
                    problems.append(f"{spec.flag}=1: the {spec.key} bridge is not part of this build")
                else:
                    cfg.enabled.append(spec)

    if check_ports and cfg.embedded_relay and not problems and not port_free(*cfg.listen):
        problems.append(f"AEP_LISTEN={cfg.listen[0]}:{cfg.listen[1]}: address in use or not bindable")
    return cfg, problems
