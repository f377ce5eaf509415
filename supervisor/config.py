"""Daemon configuration from the environment (the systemd ``EnvironmentFile``
/ launchd ``EnvironmentVariables`` way). Names and defaults: the operator's
interface table in ``shared/DESIGN.md``.

:func:`load` never raises for bad settings: it returns a :class:`Config` and a
list of problems, one clear line each, so the CLI can refuse to start (exit
2) before anything binds."""
from __future__ import annotations

import difflib
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bridges.agui.config import SETTINGS as AGUI_SETTINGS
from bridges.core.capture import CapturePolicy
from bridges.core.paths import state_dir
from bridges.core.settings import EnvReader, bindable

from .relay.core import normalize_origin

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
    BridgeSpec("agui", "AEP_BRIDGE_AGUI", False, "bridges.agui:from_env"),
)
_FLAGS = {s.flag for s in FLEET}

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

# Every AEP_* name something in this project reads (the README's tables),
# so a misspelt setting is pointed out instead of silently ignored.
KNOWN_SETTINGS = frozenset({
    "AEP_TOKEN", "AEP_RELAY_URL", "AEP_LISTEN", "AEP_STATE_DIR", "AEP_BUFFER",
    "AEP_MAX_SESSIONS", "AEP_MAX_BODY", "AEP_MAX_BATCH", "AEP_MAX_FROM", "AEP_CAPTURE",
    "AEP_BUFFER_BYTES", "AEP_BUFFER_TOTAL_BYTES", "AEP_CORS_ORIGINS",
    "AEP_CAPTURE_ATTENTION", "AEP_REDACT_NAMES", "AEP_REDACT_PII", "AEP_LOG_LEVEL",
    "AEP_LOG_FORMAT", "AEP_AGENT_NAME",
    "AEP_OTLP_GRPC_LISTEN", "AEP_OTLP_HTTP_LISTEN", "AEP_OTLP_VENDOR", "AEP_OTLP_PRIMARY",
    "AEP_OTLP_MAX_BODY", "AEP_OTLP_CODEX_GRPC_LISTEN", "AEP_OTLP_CODEX_HTTP_LISTEN",
    "AEP_OTLP_VSCODE_GRPC_LISTEN", "AEP_OTLP_VSCODE_HTTP_LISTEN",
    "AEP_OPENHANDS_URL", "AEP_OPENHANDS_SESSION_API_KEY", "AEP_OPENHANDS_POLL",
    "AEP_OPENHANDS_DELTAS", "AEP_OPENHANDS_CONTROL", "AEP_OPENHANDS_ACK_GUARD_MS",
    *(f"AEP_{v}_{k}" for v in ("OPENCODE", "KILOCODE")
      for k in ("URL", "USERNAME", "PASSWORD", "SSE_PRIMARY", "SSE_CONTROL", "SSE_ACK_GUARD_MS")),
    *(s.name for s in AGUI_SETTINGS),
    # scripts/dev and the test suite
    "AEP_PYTHON", "AEP_PYTHON312", "AEP_SHARED", "AEP_VENDOR_CACHE",
}) | _FLAGS


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
    buffer_bytes: int = 8 << 20
    total_bytes: int = 256 << 20
    cors_origins: list[str] = field(default_factory=list)
    channel_size: int = 4096
    drain_deadline: float = 5.0
    policy: CapturePolicy = field(default_factory=CapturePolicy)
    enabled: list[BridgeSpec] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def embedded_relay(self) -> bool:
        return self.relay_url is None


def state_dir_problem(path: Path) -> str | None:
    """``None`` when the state directory exists (or can be created) and a
    file can be written in it; else the problem line. Session logs and the
    epoch live there: a daemon that cannot write them has no history."""
    probe = path / ".aep-bridges-probe"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return f"AEP_STATE_DIR={str(path)!r}: not writable ({e.strerror or type(e).__name__})"
    return None


def load(env: Mapping[str, str] | None = None, *, relay_only: bool = False,
         check_ports: bool = True) -> tuple[Config, list[str]]:
    """Parse the environment. Returns ``(config, problems)``; a non-empty
    ``problems`` list means: refuse to start. ``relay_only`` is
    ``aep-bridges relay`` (no bridges, no uplink); ``check_ports`` probes
    the machine (listen ports free, state directory writable)."""
    env = dict(os.environ if env is None else env)
    r = EnvReader(env)
    problems = r.problems
    cfg = Config(environ=env)
    cfg.token = r.text("AEP_TOKEN")
    cfg.state_dir = state_dir(env)
    cfg.buffer = r.integer("AEP_BUFFER", 10_000, minimum=1)
    cfg.max_sessions = r.integer("AEP_MAX_SESSIONS", 500, minimum=1)
    cfg.max_body = r.integer("AEP_MAX_BODY", 16 << 20, minimum=1, unit="bytes")
    cfg.max_batch = r.integer("AEP_MAX_BATCH", 10_000, minimum=1)
    cfg.max_from = r.integer("AEP_MAX_FROM", cfg.max_sessions, minimum=1)
    cfg.buffer_bytes = r.integer("AEP_BUFFER_BYTES", 8 << 20, minimum=1024, unit="bytes")
    cfg.total_bytes = r.integer("AEP_BUFFER_TOTAL_BYTES", 256 << 20, minimum=1024, unit="bytes")
    for origin in (r.text("AEP_CORS_ORIGINS") or "").split(","):
        if origin.strip():
            try:
                cfg.cors_origins.append(normalize_origin(origin, strict=True))
            except ValueError as e:
                problems.append(f"AEP_CORS_ORIGINS: {e}")
    cfg.listen = r.hostport("AEP_LISTEN", DEFAULT_LISTEN) or cfg.listen
    level = (r.text("AEP_LOG_LEVEL") or "info").strip().lower()
    if level not in LOG_LEVELS:
        problems.append(f"AEP_LOG_LEVEL={level!r}: expected one of {', '.join(LOG_LEVELS)}")
    fmt = r.text("AEP_LOG_FORMAT")
    if fmt is not None and fmt.strip().lower() not in ("json", "text"):
        problems.append(f"AEP_LOG_FORMAT={fmt!r}: expected json or text")
    try:
        cfg.policy = CapturePolicy.from_env(env)
    except ValueError as e:
        problems.extend(getattr(e, "problems", None) or [str(e)])

    url = r.text("AEP_RELAY_URL")
    if url and not relay_only:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            problems.append(f"AEP_RELAY_URL={url!r}: expected http(s)://host:port")
        else:
            cfg.relay_url = url.rstrip("/")

    if not relay_only:
        buildable = ", ".join(s.flag for s in FLEET if s.factory)
        for name in sorted(env):
            if name.startswith("AEP_BRIDGE_") and name not in _FLAGS:
                problems.append(f"{name}: unknown bridge (known: {buildable})")
        for spec in FLEET:
            if r.flag(spec.flag, spec.default):
                if spec.factory is None:
                    problems.append(f"{spec.flag}=1: the {spec.key} bridge is not part of this build")
                else:
                    cfg.enabled.append(spec)

    for name in sorted(env):
        if name.startswith("AEP_") and name not in KNOWN_SETTINGS and not name.startswith("AEP_BRIDGE_"):
            close = difflib.get_close_matches(name, KNOWN_SETTINGS, n=1)
            cfg.warnings.append(f"{name} is not a setting (ignored)"
                                + (f"; did you mean {close[0]}?" if close else ""))

    if check_ports and (problem := state_dir_problem(cfg.state_dir)):
        problems.append(problem)
    if check_ports and cfg.embedded_relay and not problems and not bindable(*cfg.listen):
        problems.append(f"AEP_LISTEN={cfg.listen[0]}:{cfg.listen[1]}: address in use or not bindable")
    return cfg, problems
