"""The ACP bridge's settings: a frozen :class:`AcpConfig`, read by
:func:`from_env` (``(config, problems)``, never raising), described by
:data:`SETTINGS` (name, default, meaning; the README's table rows).

The tee itself is configured by its command line (ACP clients trim the
agent command's environment); ``AEP_ACP_DAEMON`` and ``AEP_TOKEN`` are the
only variables it reads, and only when present."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from bridges.core.settings import EnvReader, Setting, check_fields

from .wire import valid_name

__all__ = ["AcpConfig", "SETTINGS", "from_env"]

SETTINGS: tuple[Setting, ...] = (
    Setting("AEP_ACP_AGENTS", "`acp`", "comma-separated AEP agent ids tees may observe as "
            "(`--name`); one emitter each, each at `/bridges/acp/{name}` on `AEP_LISTEN`"),
    Setting("AEP_ACP_DELTAS", "`0`", "`1`: message, thought and user chunks as "
            "`x.acp.*.chunk` at `debug` (their text only at capture `redacted`+)"),
    Setting("AEP_ACP_MAX_TEES", "`64`", "tees attached at once per agent id (more are refused 503)"),
    Setting("AEP_ACP_MAX_HELD_BYTES", "`67108864`", "bytes of unfinished lines the daemon "
            "holds over all tees of one agent id (64 MiB); a line that would pass it is cut "
            "(not observed; the agent's own pass-through is untouched), counted `lines_cut`"),
    Setting("AEP_ACP_NEW_SESSIONS_PER_S", "`20`", "new sessions (session log files) per second "
            "over all tees of one agent id, bursts up to 5 s of it; events of further new "
            "sessions are dropped, counted `sessions_refused`"),
    Setting("AEP_ACP_DAEMON", "`http://127.0.0.1:8787`", "read by the TEE when present (its "
            "`--daemon` wins): the daemon it reports to"),
)


@dataclass(frozen=True)
class AcpConfig:
    """``agents``: the agent ids served (one bridge, one emitter each);
    ``deltas``: map chunks; ``max_tees``: concurrent tee connections per
    agent id; ``max_held_bytes``: unfinished-line bytes held over all
    tees; ``new_sessions_per_s``: the new-session rate (bursts of 5 s of
    it). Raises ``TypeError`` for a field of the wrong type."""

    agents: tuple[str, ...] = ("acp",)
    deltas: bool = False
    max_tees: int = 64
    max_held_bytes: int = 64 << 20
    new_sessions_per_s: int = 20

    def __post_init__(self) -> None:
        check_fields(self)


def from_env(environ: Mapping[str, str]) -> tuple[AcpConfig, list[str]]:
    """Parse the ACP settings; ``problems`` has one line per bad value (its
    field keeps the default). Never raises."""
    r = EnvReader(environ)
    raw = r.text("AEP_ACP_AGENTS") or "acp"
    agents = tuple(dict.fromkeys(a.strip() for a in raw.split(",") if a.strip())) or ("acp",)
    bad = [a for a in agents if not valid_name(a)]
    for a in bad:
        r.problems.append(f"AEP_ACP_AGENTS: {a!r} is not an agent id "
                          "(letters, digits, '_' or '-', at most 64)")
    if bad:
        agents = ("acp",)
    deltas = r.flag("AEP_ACP_DELTAS")
    max_tees = r.integer("AEP_ACP_MAX_TEES", 64, minimum=1, maximum=10_000)
    held = r.integer("AEP_ACP_MAX_HELD_BYTES", 64 << 20, minimum=1 << 20, maximum=1 << 40)
    rate = r.integer("AEP_ACP_NEW_SESSIONS_PER_S", 20, minimum=1, maximum=100_000)
    return AcpConfig(agents=agents, deltas=deltas, max_tees=max_tees, max_held_bytes=held,
                     new_sessions_per_s=rate), r.problems
