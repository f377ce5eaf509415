"""Configuration of the hook family (the one config shape, issue 7; the
knobs of ``/work/hooks-contract.md`` §4).

Every name is the profile's prefix plus a suffix, so each vendor package
generates its own: ``bridges/claude_code/config.py`` is ``SETTINGS =
settings(PROFILE)`` and ``from_env = partial(from_env, PROFILE)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bridges.core.paths import state_dir as _state_dir
from bridges.core.settings import EnvReader, Setting, check_fields

from .profile import HookProfile

__all__ = ["HOLD_MAX_S", "HOLD_S", "HookConfig", "NEW_SESSIONS_PER_S", "from_env", "settings",
           "spool_dir"]

HOLD_S = 120.0
"""The longest a hook is held by default (the installer writes the vendor's
``timeout`` as hold + 10 s, so the hold always ends first)."""
HOLD_MAX_S = 3600.0
NEW_SESSIONS_PER_S = 20
"""New sessions (session log files) a hook bridge opens per second by
default, bursts of :data:`bridges.core.limits.BURST_S` seconds of it (issue 25)."""


@dataclass(frozen=True)
class HookConfig:
    """One hook bridge's settings.

    ``control``: the operator's opt-in; ``aep_token``: whether ``AEP_TOKEN``
    is set (the gate needs it; the value is never kept here);
    ``gate_tools``: tool names whose ``PreToolUse`` is held (``("*",)``:
    all; ``()``: none); ``hold_s``: the longest hold, seconds;
    ``instruct``: ``AEP_INSTRUCT=1`` (steering); ``spool_dir``: where shims
    spool moments the daemon did not take; ``state_dir``: ``AEP_STATE_DIR``
    (the open runs are kept under it, :mod:`.runs`; ``None``: not kept);
    ``new_sessions_per_s``: the
    new-session rate (session log files a second, bursts of 5 s). Raises ``TypeError`` for a field
    of the wrong type."""

    control: bool = False
    aep_token: bool = False
    gate_tools: tuple[str, ...] = ()
    hold_s: float = HOLD_S
    instruct: bool = False
    spool_dir: Path | None = field(default=None)
    state_dir: Path | None = field(default=None)
    new_sessions_per_s: int = NEW_SESSIONS_PER_S

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def control_open(self) -> bool:
        """The gate: opted in and ``AEP_TOKEN`` set."""
        return self.control and self.aep_token

    @property
    def instruct_open(self) -> bool:
        """Steering: ``AEP_INSTRUCT=1`` and ``AEP_TOKEN`` set."""
        return self.instruct and self.aep_token

    def gated(self, tool: object) -> bool:
        """Whether ``tool``'s ``PreToolUse`` is held (the gate open, and the
        tool listed or ``*``)."""
        return self.control_open and isinstance(tool, str) and (
            "*" in self.gate_tools or tool in self.gate_tools)


def spool_dir(env: Mapping[str, str]) -> Path:
    """``${AEP_STATE_DIR:-${XDG_STATE_HOME:-~/.local/state}/aep-bridges}/hooks-spool``
    (the contract's §3; the shim's default too)."""
    return _state_dir(env) / "hooks-spool"


def settings(profile: HookProfile) -> tuple[Setting, ...]:
    """The profile's settings, in README order."""
    return (
        Setting(profile.knob("CONTROL"), "`0`",
                "`1` with `AEP_TOKEN`: answer the agent's permission asks and forms "
                "(`control.attention.respond`) while its hook is held; without a token it is "
                "refused at start"),
        Setting(profile.knob("GATE_TOOLS"), "unset (none)",
                "comma list of tool names whose `PreToolUse` is held as a permission ask "
                "(`*`: every tool); the only gate where no `PermissionRequest` fires (`claude -p`; "
                "`codex exec` without `--approve-for-me`); needs the control gate"),
        Setting(profile.knob("HOLD_S"), f"`{HOLD_S:g}`",
                "the longest a hook is held for an answer, seconds; then `attention.timeout` "
                "and no decision (the agent's own flow); the installer writes the vendor's "
                "timeout as this + 10 s"),
        Setting("AEP_INSTRUCT", "`0`",
                f"`1` with `AEP_TOKEN`: steering, `{profile.instruct}` queued and delivered "
                "as `additionalContext` on the next eligible hook reply"),
        Setting(profile.knob("NEW_SESSIONS_PER_S"), f"`{NEW_SESSIONS_PER_S}`",
                "new sessions (session log files) per second over all hook POSTs and the spool, "
                "bursts up to 5 s of it; a moment of a further new session is not logged and "
                "answered `{}` (no decision), counted `sessions_refused`; known sessions always pass"),
    )


def from_env(profile: HookProfile, env: Mapping[str, str]) -> tuple[HookConfig, list[str]]:
    """Parse the profile's settings; ``(config, problems)``, never raises."""
    r = EnvReader(env)
    problems = r.problems
    control = r.flag(profile.knob("CONTROL"))
    raw = r.text(profile.knob("GATE_TOOLS")) or ""
    tools = tuple(t.strip() for t in raw.split(",") if t.strip())
    hold = r.seconds(profile.knob("HOLD_S"), HOLD_S, maximum=HOLD_MAX_S)
    instruct = r.flag("AEP_INSTRUCT")
    rate = r.integer(profile.knob("NEW_SESSIONS_PER_S"), NEW_SESSIONS_PER_S, minimum=1,
                     maximum=100_000)
    aep_token = bool(env.get("AEP_TOKEN"))
    if control and not aep_token:
        problems.append(f"{profile.knob('CONTROL')}=1 needs AEP_TOKEN: control is refused on "
                        f"unauthenticated bindings (set AEP_TOKEN or unset {profile.knob('CONTROL')})")
    if tools and not control:
        problems.append(f"{profile.knob('GATE_TOOLS')} needs {profile.knob('CONTROL')}=1: a gate "
                        "nobody can answer would only delay the agent")
    if instruct and not aep_token:
        problems.append("AEP_INSTRUCT=1 needs AEP_TOKEN: steering is refused on unauthenticated "
                        "bindings (set AEP_TOKEN or unset AEP_INSTRUCT)")
    cfg = HookConfig(control=control, aep_token=aep_token, gate_tools=tools, hold_s=hold,
                     instruct=instruct, spool_dir=spool_dir(env), state_dir=_state_dir(env),
                     new_sessions_per_s=rate)
    return cfg, problems
