"""Configuration of the SSE bridge family (the one config shape, issue 7;
names: ``shared/DESIGN.md``, the operator's interface).

Every name is the profile's prefix (:attr:`SseProfile.env`, e.g.
``AEP_OPENCODE``) plus a suffix, so each vendor package generates its own
settings from its profile: ``bridges/opencode_sse/config.py`` is
``SETTINGS = settings(PROFILE)`` and ``from_env = partial(from_env, PROFILE)``.

- :class:`SseConfig`: the frozen, typed result (secrets kept out of ``repr``).
- :func:`from_env` -> ``(config, problems)``: never raises; one problem line
  per bad value (bad values fall back to their defaults), plus the control
  gate's combination rules (:func:`gate_problems`).
- :func:`settings`: the :class:`~bridges.core.settings.Setting` metadata the
  README table and the known-settings list are generated from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bridges.core.control import ACK_WINDOW_MS
from bridges.core.paths import state_dir as _state_dir
from bridges.core.settings import EnvReader, Setting, check_fields

from .profile import SseProfile

DEFAULT_GUARD_MS = 8000


@dataclass(frozen=True)
class SseConfig:
    """One SSE bridge's settings.

    ``url``: the vendor server's base URL (no trailing slash); ``username``
    / ``password``: basic auth (no password: no auth header); ``primary``:
    the full core mapping (else companion, ``x.<agent>.*`` only);
    ``control``: the operator's control opt-in (honored only with
    ``primary`` and ``token``); ``token``: ``AEP_TOKEN``; ``guard_ms``: the
    REST-settled ack guard, ms inside the 10 s window; ``state_dir``: where
    open runs and pending asks survive a restart (``None``: not persisted).
    Raises ``TypeError`` for a field of the wrong type."""

    url: str
    username: str
    password: str | None = field(default=None, repr=False)
    primary: bool = False
    control: bool = False
    token: str | None = field(default=None, repr=False)
    guard_ms: int = DEFAULT_GUARD_MS
    state_dir: Path | None = None

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def defaults(cls, profile: SseProfile, **overrides: object) -> "SseConfig":
        """The profile's defaults with ``overrides`` (tests, embedding)."""
        base: dict[str, object] = {"url": profile.default_url, "username": profile.default_user}
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]

    @property
    def control_honored(self) -> bool:
        """The gate: primary mode AND ``AEP_TOKEN`` AND ``{env}_SSE_CONTROL=1``."""
        return self.primary and bool(self.token) and self.control


def settings(profile: SseProfile) -> tuple[Setting, ...]:
    """The profile's settings, in README order (meanings are
    profile-neutral so the family shares one README table)."""
    e = profile.env
    return (
        Setting(f"{e}_URL", f"`{profile.default_url}`",
                "the server; the bridge reads its global event stream (`/global/event`), so "
                "sessions of every project directory are seen. Both vendors default to the "
                "same port: running both, point one elsewhere"),
        Setting(f"{e}_USERNAME", f"`{profile.default_user}`",
                "basic-auth user (the vendor's default)"),
        Setting(f"{e}_PASSWORD", "unset",
                "basic-auth password (the server's `OPENCODE_SERVER_PASSWORD` / "
                "`KILO_SERVER_PASSWORD`); never logged",
                secret=True),
        Setting(f"{e}_SSE_PRIMARY", "`0`",
                "`1`: the full core mapping (sessions, synthesized runs, tools, attention, "
                "todos); default companion: `x.opencode.*` / `x.kilocode.*` only"),
        Setting(f"{e}_SSE_CONTROL", "`0`",
                "`1` with primary mode and `AEP_TOKEN`: answer permissions and questions "
                "(`control.attention.respond`), cancel runs (`control.cancel`); set in "
                "companion mode or without a token it is refused at start"),
        Setting(f"{e}_SSE_ACK_GUARD_MS", f"`{DEFAULT_GUARD_MS}`",
                "REST-settled ack guard, inside the 10 s ack window"),
    )


def gate_problems(profile: SseProfile, cfg: SseConfig) -> list[str]:
    """The control gate's combination rules: the opt-in without primary
    mode, or without a token, is refused at start (one line each)."""
    e = profile.env
    if cfg.control and not cfg.primary:
        return [f"{e}_SSE_CONTROL=1 is ignored in companion mode (control needs "
                f"{e}_SSE_PRIMARY=1): set it, or unset the control gate"]
    if cfg.control and not cfg.token:
        return [f"{e}_SSE_CONTROL=1 needs AEP_TOKEN (control is refused on an "
                "unauthenticated binding): set AEP_TOKEN, or unset the control gate"]
    return []


def from_env(profile: SseProfile, env: Mapping[str, str]) -> tuple[SseConfig, list[str]]:
    """Read the profile's settings (and ``AEP_TOKEN``, ``AEP_STATE_DIR``)
    from ``env``. Never raises: returns the config (defaults where a value
    was bad) and one problem line per bad value or refused combination."""
    r = EnvReader(env)
    e = profile.env
    cfg = SseConfig(
        url=r.url(f"{e}_URL", profile.default_url),
        username=env.get(f"{e}_USERNAME") or profile.default_user,
        password=env.get(f"{e}_PASSWORD") or None,
        primary=r.flag(f"{e}_SSE_PRIMARY"),
        control=r.flag(f"{e}_SSE_CONTROL"),
        token=env.get("AEP_TOKEN") or None,
        guard_ms=r.integer(f"{e}_SSE_ACK_GUARD_MS", DEFAULT_GUARD_MS, minimum=0,
                           maximum=ACK_WINDOW_MS - 1, unit="milliseconds inside the ack window"),
        state_dir=_state_dir(env),
    )
    return cfg, r.problems + gate_problems(profile, cfg)
