"""Configuration of the OTLP inbound bridge (issue 7, "one config shape"):
:data:`SETTINGS` (the operator knobs as documented, for the README table and
the supervisor's known-settings list), :class:`OtlpConfig` (one vendor
profile, typed and frozen) and :func:`from_env` (environment -> configs +
problem lines; never raises).

Names and meanings: ``shared/DESIGN.md`` (configuration) and the design
record ``shared/aep/docs/bridge-otlp-inbound-design.md`` ("Vendor profiles":
one emitter identity per profile, so a two-vendor deployment gives each
profile its own listeners). Pure: no sockets (whether a port is free is
:meth:`bridges.otlp_in.bridge.OtlpInBridge.preflight`'s question).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from bridges.core.settings import TRUE, Address, EnvReader, Setting, parse_hostport

from .profiles import PROFILES

DEFAULT_VENDOR = "codex"
DEFAULT_GRPC_LISTEN = "127.0.0.1:4317"
DEFAULT_HTTP_LISTEN = "127.0.0.1:4318"
DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Default request size limit in bytes (compressed and inflated)."""
MIN_MAX_BODY = 1024
MAX_MAX_BODY = 2**31 - 1
"""grpcio takes ``grpc.max_receive_message_length`` as a C int."""

OFF = ("off", "none", "disabled", "0")
"""Listener values that disable the listener (case-insensitive)."""

GRPC_LISTEN = "AEP_OTLP_GRPC_LISTEN"
HTTP_LISTEN = "AEP_OTLP_HTTP_LISTEN"
VENDOR = "AEP_OTLP_VENDOR"
PRIMARY = "AEP_OTLP_PRIMARY"
MAX_BODY = "AEP_OTLP_MAX_BODY"
MAX_NEW_SESSIONS = "AEP_OTLP_MAX_NEW_SESSIONS"
NEW_SESSIONS_PER_S = "AEP_OTLP_NEW_SESSIONS_PER_S"
DEFAULT_MAX_NEW_SESSIONS = 100
DEFAULT_NEW_SESSIONS_PER_S = 50

SETTINGS: tuple[Setting, ...] = (
    Setting(GRPC_LISTEN, "`127.0.0.1:4317`", "OTLP/gRPC listener"),
    Setting(HTTP_LISTEN, "`127.0.0.1:4318`", "OTLP/HTTP listener (`POST /v1/logs`)"),
    Setting(VENDOR, "`codex`", "vendor profile: `codex` or `vscode`; `codex,vscode` runs both "
            "profiles, each its own emitter; the second needs its own listeners"),
    Setting(PRIMARY, "`1`", "records with a core meaning as core types, in place of "
            "`x.{vendor}.otel.*` (primary mode, said at start); `0`: companion mode, "
            "`x.{vendor}.otel.*` only, for when another channel of the same agent (its hooks, "
            "its own adapter) is the core-type authority on the same AEP endpoint"),
    Setting("AEP_OTLP_{VENDOR}_GRPC_LISTEN", "first vendor: the shared listener",
            "per-profile OTLP/gRPC listener (`off` disables it)"),
    Setting("AEP_OTLP_{VENDOR}_HTTP_LISTEN", "first vendor: the shared listener",
            "per-profile OTLP/HTTP listener (`off` disables it)"),
    Setting(MAX_BODY, "`4194304`", "OTLP request size limit in bytes, compressed and inflated "
            "(413 / RESOURCE_EXHAUSTED above it)"),
    Setting(MAX_NEW_SESSIONS, "`100`", "sessions (session log files) one OTLP request may "
            "open; records of further new sessions are rejected in `partial_success`, counted "
            "`otlp.sessions_refused`"),
    Setting(NEW_SESSIONS_PER_S, "`50`", "new OTLP sessions per second over all requests "
            "(bursts up to `AEP_OTLP_MAX_NEW_SESSIONS`), same answer past it"),
)
"""Every ``AEP_OTLP_*`` knob, in the README's order. ``{VENDOR}`` stands for
a profile key upper-cased (``CODEX``, ``VSCODE``); :data:`SETTING_NAMES`
spells those out."""


def profile_setting(vendor: str, kind: str) -> str:
    """``("vscode", "grpc")`` -> ``AEP_OTLP_VSCODE_GRPC_LISTEN``."""
    return f"AEP_OTLP_{vendor.upper().replace('-', '_')}_{kind.upper()}_LISTEN"


HOOK_CHANNELS = {"codex": "AEP_BRIDGE_CODEX_HOOKS"}
"""A vendor whose hook bridge, enabled in the same daemon, is the core-type
authority (AEP-0002 Annex A.2, two channels one agent): its OTLP profile
then runs in companion mode whatever ``AEP_OTLP_PRIMARY`` says."""

SHARED_SETTINGS = frozenset({"AEP_BODY_TIMEOUT", "AEP_MAX_CONNECTIONS", *HOOK_CHANNELS.values()})
"""Daemon-wide settings the OTLP bridge honors too (documented with the
core settings, ``supervisor/config.py``: the HTTP listener's limits, the
hook bridges' enable flags)."""

SETTING_NAMES: frozenset[str] = frozenset(
    {s.name for s in SETTINGS if "{" not in s.name}
    | {profile_setting(v, k) for v in PROFILES for k in ("grpc", "http")}) | SHARED_SETTINGS
"""The concrete variable names :func:`from_env` reads (for the supervisor's
misspelling check): :data:`SETTINGS` with ``{VENDOR}`` expanded per profile."""


@dataclass(frozen=True)
class OtlpConfig:
    """One vendor profile's configuration.

    ``vendor``: the profile key (``codex``/``vscode``; another value is a
    :func:`check` problem); ``grpc_listen`` / ``http_listen``: ``(host,
    port)`` to bind (port 0: the OS picks) or ``None`` (listener off);
    ``primary``: core-type mapping, companion otherwise (from the
    environment: ``AEP_OTLP_PRIMARY``, default on, issue 29: the mode the
    demo runs; the dataclass default stays the pins' companion posture); ``max_body``: request size limit in bytes, compressed and
    inflated; ``grpc_setting`` / ``http_setting``: the variable each address
    came from, named in problem lines; ``max_new_sessions`` /
    ``new_sessions_per_s``: sessions one request may open and their rate
    over all requests (issue 10 #10: each session is a file);
    ``body_timeout`` / ``max_connections``: the daemon-wide
    ``AEP_BODY_TIMEOUT`` / ``AEP_MAX_CONNECTIONS`` for the HTTP listener
    (``None``: derived from the fd limit); ``hook_channel``: the enable
    flag of this vendor's hook bridge when it is on (:data:`HOOK_CHANNELS`:
    ``primary`` is then off, said at start), else ``None``."""

    vendor: str = DEFAULT_VENDOR
    grpc_listen: Address | None = parse_hostport(DEFAULT_GRPC_LISTEN)
    http_listen: Address | None = parse_hostport(DEFAULT_HTTP_LISTEN)
    primary: bool = False
    max_body: int = DEFAULT_MAX_BODY
    grpc_setting: str = GRPC_LISTEN
    http_setting: str = HTTP_LISTEN
    max_new_sessions: int = DEFAULT_MAX_NEW_SESSIONS
    new_sessions_per_s: int = DEFAULT_NEW_SESSIONS_PER_S
    body_timeout: float = 30.0
    max_connections: int | None = None
    hook_channel: str | None = None

    def listeners(self) -> dict[str, Address | None]:
        """``{"grpc": addr | None, "http": addr | None}`` as configured."""
        return {"grpc": self.grpc_listen, "http": self.http_listen}

    def setting(self, kind: str) -> str:
        """The variable behind the ``kind`` (``grpc``/``http``) listener."""
        return self.grpc_setting if kind == "grpc" else self.http_setting


def parse_listen(value: str | None) -> Address | None:
    """``host:port`` / ``[v6]:port`` -> ``(host, port)``; ``None``/``off``
    -> ``None`` (listener disabled). Raises ``ValueError`` otherwise."""
    if value is None or value.strip().lower() in OFF:
        return None
    try:
        return parse_hostport(value)
    except ValueError:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:4317) or off") from None


def from_env(env: Mapping[str, str]) -> tuple[tuple[OtlpConfig, ...], list[str]]:
    """One :class:`OtlpConfig` per profile named in ``AEP_OTLP_VENDOR``
    (``codex`` when unset), and one problem line per bad setting. Never
    raises: a bad value is a problem line and its field keeps a typed
    stand-in (``None`` for an address, the default for a number), so the
    configs are always well-typed and a config with problems is never run.

    The first profile listens on ``AEP_OTLP_GRPC_LISTEN`` /
    ``AEP_OTLP_HTTP_LISTEN`` unless its own ``AEP_OTLP_<VENDOR>_*_LISTEN``
    is set; every later profile must set its own (design record "Vendor
    profiles": two identities never share a listener)."""
    reader = EnvReader(env)
    # primary unless the operator says otherwise: with no other channel of
    # the agent in the daemon, OTLP is the only source of its core types
    primary = reader.flag(PRIMARY, True)
    max_new = reader.integer(MAX_NEW_SESSIONS, DEFAULT_MAX_NEW_SESSIONS, minimum=1)
    per_s = reader.integer(NEW_SESSIONS_PER_S, DEFAULT_NEW_SESSIONS_PER_S, minimum=1)
    # daemon-wide settings (supervisor/config.py documents and checks them)
    body_timeout = reader.seconds("AEP_BODY_TIMEOUT", 30.0, maximum=3600.0)
    max_connections = (reader.integer("AEP_MAX_CONNECTIONS", 1000, minimum=8,
                                    shown_default="derived from the open-files limit")
                       if reader.raw("AEP_MAX_CONNECTIONS") is not None else None)
    problems = [p for p in reader.problems if not p.startswith(("AEP_BODY_TIMEOUT",
                                                                "AEP_MAX_CONNECTIONS"))]
    max_body = _max_body(env, problems)
    unreadable: set[str] = set()
    configs: list[OtlpConfig] = []
    for i, vendor in enumerate(_vendors(env)):
        listen: dict[str, Address | None] = {}
        names: dict[str, str] = {}
        for kind, shared, default in (("grpc", GRPC_LISTEN, DEFAULT_GRPC_LISTEN),
                                      ("http", HTTP_LISTEN, DEFAULT_HTTP_LISTEN)):
            names[kind], listen[kind], problem = _listen(env, vendor, kind, shared, default,
                                                         first=i == 0)
            if problem:
                problems.append(problem)
                unreadable.add(names[kind])
        flag = HOOK_CHANNELS.get(vendor)
        # the fleet parses (and reports) the flag itself; a bad value here is just "off"
        hooks = flag if flag and (env.get(flag) or "").strip().lower() in TRUE else None
        configs.append(OtlpConfig(vendor, listen["grpc"], listen["http"], primary and not hooks,
                                  max_body, names["grpc"], names["http"], max_new_sessions=max_new,
                                  new_sessions_per_s=per_s, body_timeout=body_timeout,
                                  max_connections=max_connections, hook_channel=hooks))
    problems.extend(check(configs, unreadable=unreadable))
    return tuple(configs), problems


def check(configs: Sequence[OtlpConfig], *, unreadable: set[str] | frozenset[str] = frozenset()
          ) -> list[str]:
    """The problems of typed configs, one line each: an unknown vendor, both
    listeners off, one address for both listeners, an address a sibling
    profile already uses (reported once, on the later profile), a size limit
    out of range. ``unreadable``: settings already reported as unparsable
    (no "both off" line for those)."""
    problems: list[str] = []
    taken: dict[Address, tuple[str, str]] = {}  # address -> (vendor, setting)
    for cfg in configs:
        problems.extend(_check_one(cfg, unreadable))
        for kind, addr in cfg.listeners().items():
            if addr is None or addr[1] == 0:
                continue
            owner, setting = taken.setdefault(addr, (cfg.vendor, cfg.setting(kind)))
            if owner != cfg.vendor:  # one profile's own clash is _check_one's line
                problems.append(f"{cfg.setting(kind)}={addr[0]}:{addr[1]}: also used by "
                                f"{setting}; each OTLP vendor needs its own listeners")
    return problems


def _check_one(cfg: OtlpConfig, unreadable: set[str] | frozenset[str]) -> list[str]:
    problems: list[str] = []
    if cfg.vendor not in PROFILES:
        problems.append(f"{VENDOR}: unknown vendor {cfg.vendor!r} "
                        f"(known: {', '.join(sorted(PROFILES))})")
    g, h = cfg.grpc_listen, cfg.http_listen
    if g is None and h is None and not {cfg.grpc_setting, cfg.http_setting} & unreadable:
        problems.append(f"{cfg.grpc_setting} and {cfg.http_setting} are both off: "
                        f"the {cfg.vendor} profile would receive nothing")
    if g is not None and g == h and g[1] != 0:
        problems.append(f"{cfg.grpc_setting} and {cfg.http_setting} are both {g[0]}:{g[1]}: "
                        "use two ports")
    if not MIN_MAX_BODY <= cfg.max_body <= MAX_MAX_BODY:
        problems.append(f"{MAX_BODY}={cfg.max_body!r}: must be a whole number of bytes, "
                        f"at least {MIN_MAX_BODY}")
    return problems


def _vendors(env: Mapping[str, str]) -> list[str]:
    vendors = [v.strip().lower() for v in (env.get(VENDOR) or DEFAULT_VENDOR).split(",")]
    return [v for v in dict.fromkeys(vendors) if v] or [DEFAULT_VENDOR]


def _listen(env: Mapping[str, str], vendor: str, kind: str, shared: str, default: str, *,
            first: bool) -> tuple[str, Address | None, str | None]:
    """``(setting, address, problem)`` for one listener of one profile."""
    own = profile_setting(vendor, kind)
    if env.get(own):
        name, raw = own, env[own]
    elif first:
        name, raw = shared, env.get(shared) or default
    else:
        return own, None, (f"{own}: not set; every OTLP vendor after the first needs its own "
                           "listeners (host:port or off)")
    try:
        return name, parse_listen(raw), None
    except ValueError as e:
        return name, None, f"{name}={raw!r}: {e}"


def _max_body(env: Mapping[str, str], problems: list[str]) -> int:
    raw = (env.get(MAX_BODY) or "").strip()
    if not raw:
        return DEFAULT_MAX_BODY
    if not (raw.isascii() and raw.isdigit()):
        problems.append(f"{MAX_BODY}={raw!r}: must be a whole number of bytes, at least "
                        f"{MIN_MAX_BODY}")
        return DEFAULT_MAX_BODY
    n = int(raw)
    if not MIN_MAX_BODY <= n <= MAX_MAX_BODY:
        problems.append(f"{MAX_BODY}={n!r}: must be a whole number of bytes, at least "
                        f"{MIN_MAX_BODY}" + (f" and at most {MAX_MAX_BODY}" if n > MAX_MAX_BODY
                                             else ""))
        return DEFAULT_MAX_BODY
    return n
