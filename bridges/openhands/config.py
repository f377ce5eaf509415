"""The OpenHands bridge's configuration (the one config shape, issue 7;
design record ``shared/aep/docs/bridge-openhands-design.md``).

- :class:`OpenHandsConfig`: the frozen, typed settings (the key and the
  token kept out of ``repr``).
- :func:`from_env` -> ``(config, problems)``: never raises; one problem line
  per bad value (bad values fall back to their defaults) or refused
  combination (the control opt-in without ``AEP_TOKEN``).
- :data:`SETTINGS`: the metadata the README table and the supervisor's
  known-settings list are generated from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bridges.core.paths import state_dir as _state_dir
from bridges.core.settings import EnvReader, Setting, check_fields

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_POLL = 15.0
DEFAULT_GUARD_MS = 8000

SETTINGS: tuple[Setting, ...] = (
    Setting("AEP_OPENHANDS_URL", f"`{DEFAULT_URL}`", "the agent server"),
    Setting("AEP_OPENHANDS_SESSION_API_KEY", "unset",
            "the server's session key (REST header and the socket's first-message auth "
            "frame; never logged, never in a URL)", secret=True),
    Setting("AEP_OPENHANDS_POLL", f"`{DEFAULT_POLL:g}`", "conversation discovery interval, seconds"),
    Setting("AEP_OPENHANDS_DELTAS", "`0`", "`1`: map streaming deltas"),
    Setting("AEP_OPENHANDS_CONTROL", "`0`",
            "`1` with `AEP_TOKEN`: the five gated writes (respond, pause, resume, "
            "`x.openhands.control.send_input`, `x.openhands.control.interrupt`)"),
    Setting("AEP_OPENHANDS_ACK_GUARD_MS", f"`{DEFAULT_GUARD_MS}`",
            "REST-settled ack guard, inside the 10 s ack window"),
    Setting("AEP_AGENT_NAME", "`openhands`", "the AEP agent id the OpenHands bridge emits as"),
)
"""This bridge's knobs, in README order."""


@dataclass(frozen=True)
class OpenHandsConfig:
    """One agent server's settings.

    ``url``: the server's base URL (no trailing slash); ``key``: the session
    API key (``X-Session-API-Key`` header and the socket's auth frame);
    ``poll``: discovery interval, seconds; ``deltas``: map
    ``StreamingDeltaEvent``; ``control``: the operator's control opt-in
    (honored only with ``token``); ``guard_ms``: the REST-settled ack
    guard, ms; ``state_dir``: ``AEP_STATE_DIR`` (``None``: nothing
    persisted); ``agent``: the AEP agent id; ``token``: ``AEP_TOKEN``.
    Raises ``TypeError`` for a field of the wrong type."""

    url: str = DEFAULT_URL
    key: str | None = field(default=None, repr=False)
    poll: float = DEFAULT_POLL
    deltas: bool = False
    control: bool = False
    guard_ms: int = DEFAULT_GUARD_MS
    state_dir: Path | None = None
    agent: str = "openhands"
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def control_open(self) -> bool:
        """The gate: the operator's opt-in AND a token (control is refused
        on unauthenticated bindings, AEP-0004 §4.1)."""
        return bool(self.control and self.token)


def from_env(env: Mapping[str, str]) -> tuple[OpenHandsConfig, list[str]]:
    """Read the ``AEP_OPENHANDS_*`` names, ``AEP_AGENT_NAME``, ``AEP_TOKEN``
    and ``AEP_STATE_DIR`` from ``env``. Never raises."""
    r = EnvReader(env)
    url = r.url("AEP_OPENHANDS_URL", DEFAULT_URL, hint=" (the agent server's base URL; the "
                "key goes in AEP_OPENHANDS_SESSION_API_KEY)")
    poll = r.seconds("AEP_OPENHANDS_POLL", DEFAULT_POLL)
    guard = r.integer("AEP_OPENHANDS_ACK_GUARD_MS", DEFAULT_GUARD_MS, minimum=1, maximum=9999,
                      unit="milliseconds inside the declared 10000 ms ack window")
    deltas = r.flag("AEP_OPENHANDS_DELTAS")
    control = r.flag("AEP_OPENHANDS_CONTROL")
    agent = (env.get("AEP_AGENT_NAME") or "openhands").strip() or "openhands"
    cfg = OpenHandsConfig(url=url, key=env.get("AEP_OPENHANDS_SESSION_API_KEY") or None,
                          poll=poll, deltas=deltas, control=control, guard_ms=guard,
                          state_dir=_state_dir(env), agent=agent,
                          token=env.get("AEP_TOKEN") or None)
    problems = r.problems
    if cfg.control and not cfg.token:
        problems.append("AEP_OPENHANDS_CONTROL=1 needs AEP_TOKEN: control is refused on "
                        "unauthenticated bindings (set AEP_TOKEN or unset AEP_OPENHANDS_CONTROL)")
    return cfg, problems
