"""The Kimi web bridge's settings: one frozen :class:`KimiWebConfig` read by
:func:`from_env` ``(env) -> (config, problems)`` (never raises for a bad
value: each is one problem line, the supervisor refuses to start on any).

:data:`SETTINGS` is the settings metadata (name, default, meaning): the
README's knob table and ``supervisor.config.KNOWN_SETTINGS`` are built from
it (:class:`bridges.core.settings.Setting`, ``render_table``), so a setting
exists in exactly one place.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bridges.core.paths import state_dir as _state_dir
from bridges.core.settings import EnvReader, Setting, check_fields

SETTINGS: tuple[Setting, ...] = (
    Setting("KIMI_CODE_HOME", "`~/.kimi-code`",
            "the vendor's own home: where `kimi web` registers (`server/instances/<id>.json`) and "
            "keeps its token (`server.token`, 0600); the bridge finds the live server there"),
    Setting("AEP_KIMI_WEB_URL", "unset (discovered)",
            "the server's base URL (`http://127.0.0.1:58627`), overriding discovery"),
    Setting("AEP_KIMI_WEB_TOKEN", "unset (read from `server.token`)",
            "the server's bearer token, overriding the token file; never logged, never in a URL",
            secret=True),
    Setting("AEP_KIMI_WEB_PRIMARY", "`0`",
            "`1`: the core mapping (runs, tools, attention) for stream-only deployments; default "
            "companion: `x.kimi-code.web.*` only (the hook adapter carries the core story)"),
    Setting("AEP_KIMI_WEB_CONTROL", "`0`",
            "`1` with primary mode and `AEP_TOKEN`: answer tool approvals "
            "(`control.attention.respond`) and cancel turns (`control.cancel` scope `run`)"),
    Setting("AEP_KIMI_WEB_ACK_GUARD_MS", "`8000`", "REST-settled ack guard, inside the 10 s ack window"),
)

NAMES = frozenset(s.name for s in SETTINGS if s.name.startswith("AEP_"))
AGENT = "kimi-code"


@dataclass(frozen=True)
class KimiWebConfig:
    """The parsed settings.

    ``home``: ``KIMI_CODE_HOME`` (discovery root); ``url`` / ``token``:
    the overrides (``None``: discovered; the token kept out of ``repr``);
    ``primary`` / ``control``: the posture and the gate's opt-in;
    ``guard_ms``: the ack guard, ms; ``state_dir``: the daemon's state dir
    (cursors survive a daemon restart; ``None``: nothing persisted);
    ``aep_token``: whether ``AEP_TOKEN`` is set (the gate needs it);
    ``agent``: the AEP agent id. Raises ``TypeError`` for a field of the
    wrong type."""

    home: Path
    url: str | None = None
    token: str | None = field(default=None, repr=False)
    primary: bool = False
    control: bool = False
    guard_ms: int = 8000
    state_dir: Path | None = None
    aep_token: bool = False
    agent: str = AGENT

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def control_open(self) -> bool:
        """The gate: opted in, primary mode, and ``AEP_TOKEN`` set."""
        return self.control and self.primary and self.aep_token


def default_home(env: Mapping[str, str]) -> Path:
    """``KIMI_CODE_HOME`` or the vendor's default ``~/.kimi-code``."""
    v = (env.get("KIMI_CODE_HOME") or "").strip()
    if v:
        return Path(v).expanduser()
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".kimi-code"


def from_env(env: Mapping[str, str]) -> tuple[KimiWebConfig, list[str]]:
    """Parse the settings; ``(config, problems)``."""
    r = EnvReader(env)
    problems = r.problems
    url = r.text("AEP_KIMI_WEB_URL")
    if url is not None:
        before = len(problems)
        url = r.url("AEP_KIMI_WEB_URL", url, hint=" (the kimi web base URL; the token goes in "
                    "AEP_KIMI_WEB_TOKEN)")
        if len(problems) > before:
            url = None  # a bad value keeps the default: discovery
    token = r.text("AEP_KIMI_WEB_TOKEN")
    if token is not None:
        token = token.strip()
    primary = r.flag("AEP_KIMI_WEB_PRIMARY")
    control = r.flag("AEP_KIMI_WEB_CONTROL")
    guard = r.integer("AEP_KIMI_WEB_ACK_GUARD_MS", 8000, minimum=1, maximum=9999,
                      unit="milliseconds inside the declared 10000 ms ack window")
    aep_token = bool(env.get("AEP_TOKEN"))
    if control and not primary:
        problems.append("AEP_KIMI_WEB_CONTROL=1 needs AEP_KIMI_WEB_PRIMARY=1: in companion mode the "
                        "hook adapter owns the core story and nothing here is answerable")
    if control and not aep_token:
        problems.append("AEP_KIMI_WEB_CONTROL=1 needs AEP_TOKEN: control is refused on unauthenticated "
                        "bindings (set AEP_TOKEN or unset AEP_KIMI_WEB_CONTROL)")
    cfg = KimiWebConfig(home=default_home(env), url=url, token=token,
                        primary=primary, control=control, guard_ms=guard,
                        state_dir=_state_dir(env), aep_token=aep_token)
    return cfg, problems
