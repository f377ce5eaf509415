"""Daemon configuration from the environment (the systemd ``EnvironmentFile``
/ launchd ``EnvironmentVariables`` way). Names and defaults: the operator's
interface table in ``shared/DESIGN.md``.

The one config shape (issue 7; ``bridges/core/settings.py``): the daemon's
core settings are a frozen, typed :class:`Config` built in one step by
:func:`load`, with their metadata in :data:`SETTINGS`; each bridge owns
its ``config.py`` with its own frozen dataclass, ``from_env`` and
``SETTINGS``, named by its :class:`BridgeSpec` (``settings=``). The
known-settings list (:func:`known_settings`, the misspelling check) and the
README's knob tables (``python -m supervisor.knobs``) are generated from
all that metadata.

:func:`load` never raises for bad settings: it returns a :class:`Config` and a
list of problems, one clear line each, so the CLI can refuse to start (exit
2) before anything binds."""
from __future__ import annotations

import difflib
import errno
import functools
import importlib
import logging
import os
import re
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from bridges.core.capture import CapturePolicy
from bridges.core.paths import state_dir
from bridges.core.settings import EnvReader, Setting, bindable, check_fields, token_problem

from .jetstream.config import SETTINGS as NATS_SETTINGS
from .jetstream.config import NatsConfig, file_problems
from .jetstream.config import from_env as nats_from_env
from .relay.buffer import ENTRY_OVERHEAD
from .relay.core import normalize_origin
from .sessionlog.retention import SETTINGS as RETENTION_SETTINGS
from .sessionlog.retention import RetentionPolicy
from .sessionlog.spares import SPARE_DIR, give_back

log = logging.getLogger("aep.config")

DEFAULT_LISTEN = "127.0.0.1:8787"


@dataclass(frozen=True)
class BridgeSpec:
    """One entry of the fleet: its enable flag, whether it is on by default,
    the ``module:function`` factory ``from_env(environ, *, policy)``
    returning a bridge or a list of bridges (``None`` while not built), the
    ``module:NAME`` of its :class:`~bridges.core.settings.Setting` metadata
    (``None`` while not built), and ``title``, the flag's README meaning."""

    key: str
    flag: str
    default: bool
    factory: str | None
    settings: str | None = None
    title: str = ""

    @property
    def built(self) -> bool:
        return self.factory is not None


FLEET: tuple[BridgeSpec, ...] = (
    BridgeSpec("openhands", "AEP_BRIDGE_OPENHANDS", False, "bridges.openhands:from_env",
               "bridges.openhands.config:SETTINGS", "the OpenHands bridge"),
    BridgeSpec("opencode_sse", "AEP_BRIDGE_OPENCODE_SSE", False, "bridges.opencode_sse:from_env",
               "bridges.opencode_sse.config:SETTINGS", "the OpenCode bridge"),
    BridgeSpec("kilocode_sse", "AEP_BRIDGE_KILOCODE_SSE", False, "bridges.kilocode_sse:from_env",
               "bridges.kilocode_sse.config:SETTINGS", "the Kilo Code bridge"),
    BridgeSpec("kimi_web", "AEP_BRIDGE_KIMI_WEB", False, "bridges.kimi_web:from_env",
               "bridges.kimi_web.config:SETTINGS", "the Kimi web bridge"),
    BridgeSpec("otlp_in", "AEP_BRIDGE_OTLP_IN", True, "bridges.otlp_in:from_env",
               "bridges.otlp_in.config:SETTINGS", "the OTel inbound bridge (Codex, VS Code)"),
    BridgeSpec("claude_code", "AEP_BRIDGE_CLAUDE_CODE", False, "bridges.claude_code:from_env",
               "bridges.claude_code.config:SETTINGS",
               "the Claude Code hook bridge (`POST /hooks/claude-code`)"),
    BridgeSpec("codex_hooks", "AEP_BRIDGE_CODEX_HOOKS", False, "bridges.codex_hooks:from_env",
               "bridges.codex_hooks.config:SETTINGS", "the Codex hook bridge (`POST /hooks/codex`)"),
    BridgeSpec("acp", "AEP_BRIDGE_ACP", False, "bridges.acp:from_env",
               "bridges.acp.config:SETTINGS",
               "the ACP bridge (the tees of `aep-bridges acp -- AGENT`)"),
    BridgeSpec("agui", "AEP_BRIDGE_AGUI", False, "bridges.agui:from_env",
               "bridges.agui.config:SETTINGS", "the AG-UI tee proxy"),
)
_FLAGS = {s.flag for s in FLEET}

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

SETTINGS: tuple[Setting, ...] = (
    Setting("AEP_CONFIG", "unset", "a TOML file of these settings, by these names "
            "(`--config FILE` on `run`, `relay`, `check`, `doctor` and the client commands `tail`, "
            "`respond`, `cancel`, `pause`, `resume`); the environment wins over it"),
    Setting("AEP_LISTEN", f"`{DEFAULT_LISTEN}`", "embedded relay and `/healthz` listener"),
    Setting("AEP_TOKEN", "unset", "bearer token (`Authorization: Bearer` or `?access_token=`); "
            "unset: watch-only, every command refused `unauthorized`", secret=True),
    Setting("AEP_EMITTER_TOKENS", "unset", "a file of per-emitter credentials, one "
            "`name=token` a line (`#` comments); each is accepted where `AEP_TOKEN` is on "
            "the relay (`/socket`, `POST /events`, `/stream`; the hook and ACP mounts take "
            "only `AEP_TOKEN`) and "
            "names its holder: a session is bound to the credential that first claimed it, "
            "and no one else may emit into it or receive its commands, connected or not, "
            "across restarts; a credential's commands go only into its own sessions (refused "
            "`unauthorized` elsewhere; see \"Limits and hardening\"). The file must not be "
            "readable by group or "
            "others (mode 0600); needs `AEP_TOKEN`"),
    Setting("AEP_CLAIM_GRACE", "`120`", "seconds a session claimed with the shared "
            "`AEP_TOKEN` stays held for its emitter's `source` after its last connection left "
            "(a reconnect, a relay restart); another claimant meanwhile is refused, counted "
            "`refused_owned_session`"),
    Setting("AEP_MAX_BINDINGS", "`65536` (4 × `AEP_MAX_SESSIONS` when larger)",
            "session bindings kept (which principal owns each session, across restarts: "
            "`relay-bindings.jsonl`); past it the least recently used are forgotten, an open "
            "bridge's (OTLP, AG-UI) first, and an open bridge's new session pushes out only "
            "its own kind's, never a hook or other authenticated bridge's"),
    Setting("AEP_RELAY_URL", "unset", "a remote AEP relay (`http(s)://host:port`); each bridge "
            "uplinks as its own emitter to `{url}/socket` with `AEP_TOKEN`"),
    Setting("AEP_STATE_DIR", "`$XDG_STATE_HOME/aep-bridges` (`~/.local/state/aep-bridges`)",
            "session logs (`logs/{agent}/{session}.jsonl`) and the persisted epoch; "
            "an absolute path (a relative one is refused)"),
    Setting("AEP_BUFFER", "`10000`", "relay replay buffer, events per session"),
    Setting("AEP_MAX_SESSIONS", "`500`",
            "relay session cap (least recently written evicted: OTLP, AG-UI and remote posts "
            "first, then the authenticated bridges'; a session with an open ask is kept, up to "
            "a quarter of the cap)"),
    Setting("AEP_MAX_BODY", "`16777216`",
            "relay `POST /events` body limit in bytes (413 above it)"),
    Setting("AEP_MAX_BATCH", "`10000`",
            "events per NDJSON batch (413 `too-many-events` above it)"),
    Setting("AEP_MAX_FROM", "`AEP_MAX_SESSIONS`",
            "resume positions per `from` (SSE 400 / WS `limit-exceeded` above it)"),
    Setting("AEP_RELAY_MAX_NEW_SESSIONS", "`100`", "new sessions (session log files) one "
            "remote request to the embedded relay may open (a `POST /events` batch; a "
            "`/socket` event is one); past it the batch is refused whole, 429 "
            "`too-many-sessions` with `Retry-After` (`/socket`: a `limit-exceeded` error "
            "frame), counted `refused_new_sessions`; known sessions and the fleet's own "
            "bridges are never refused"),
    Setting("AEP_RELAY_NEW_SESSIONS_PER_S", "`50`", "new sessions per second over all the "
            "embedded relay's remote emitters (bursts up to `AEP_RELAY_MAX_NEW_SESSIONS`), "
            "same answer past it"),
    Setting("AEP_BUFFER_BYTES", "`8388608`", "relay replay buffer bytes per session (oldest "
            "trimmed first; a resume from before them gets `replay-exhausted`)"),
    Setting("AEP_BUFFER_TOTAL_BYTES", "`268435456`", "relay replay bytes for all sessions "
            "together (least recently written trimmed first, in `AEP_MAX_SESSIONS`' order)"),
    Setting("AEP_CORS_ORIGINS", "unset", "comma-separated browser origins "
            "(`https://dash.example:8443`) allowed to read and post cross-origin and to open "
            "`/socket`; unset: no cross-origin access without a token (with `AEP_TOKEN`, any "
            "origin may read, the token still required). On a loopback listener a `Host` that "
            "is not loopback is refused (DNS rebinding). Not needed for the console at `/`: it "
            "is same-origin (its own origin may open `/socket`); set it only for a page served "
            "from another origin (your own dashboard), or to watch a tokenless relay bound to a "
            "non-loopback `AEP_LISTEN` in the console (there its origin passes only with a "
            "token)"),
    Setting("AEP_CAPTURE", "`metadata`", "capture ceiling: `none`, `metadata`, `redacted`, "
            "`full` (`attention.*` at `redacted` by default)"),
    Setting("AEP_CAPTURE_ATTENTION", "`redacted` (or `AEP_CAPTURE` when higher)",
            "ceiling for `attention.*` (prompts stay readable); refused above `none` when "
            "`AEP_CAPTURE=none`"),
    Setting("AEP_REDACT_NAMES", "unset", "comma-separated environment variable names whose "
            "values are redacted as secrets (AEP-0003 §9.4 b); the daemon's own tokens and "
            "passwords always are"),
    Setting("AEP_REDACT_PII", "`1`", "`0` turns off email/phone redaction at `redacted`"),
    Setting("AEP_LOG_LEVEL", "`info`", "`debug`, `info`, `warning`, `error`, `critical`"),
    Setting("AEP_LOG_FORMAT", "JSON lines unless stderr is a TTY", "`json` or `text`"),
    Setting("AEP_LOG_MAX_OPEN", "`128`", "session log descriptors kept open (least recently "
            "written closed first, counted)"),
    Setting("AEP_LOG_SPARES", "`2048`", "empty session log files kept ready in `logs/.spare` "
            "for new sessions (linked into place; a burst of up to 7/8 of them creates no file "
            "while it lasts; each is an inode, no data; 1-65536, never past 95% of the file "
            "system's inodes)"),
    Setting("AEP_STRICT_IDENTITY", "`0`", "`1`: refuse (`invalid-event`) an emitter's events "
            "whose `agent` is not its hello `identity.agent`; `0`: accept and claim them, "
            "counted `identity_mismatch`, logged once per connection"),
    Setting("AEP_MAX_FILTER_TERMS", "`1024`", "alternatives (values and type patterns, all "
            "keys) one subscription filter may hold (WS `limit-exceeded`, SSE 400 "
            "`limit-exceeded`)"),
    Setting("AEP_SUBSCRIBER_BYTES", "`8388608`", "per-subscriber byte budget: output queued "
            "for one consumer; a `notice`+ event past it sheds the consumer (it resumes exactly)"),
    Setting("AEP_BODY_TIMEOUT", "`30`", "seconds a request body may take to arrive once its "
            "headers have (relay and OTLP/HTTP answer 408)"),
    Setting("AEP_MAX_CONNECTIONS", "(open-files limit - 256) / 3, within 64..4096",
            "connections served at once per HTTP listener (relay, OTLP/HTTP; at least 8); see \"Limits and "
            "hardening\""),
    *RETENTION_SETTINGS,
)
"""The daemon's core settings (the README's core table, before the flags)."""

FLAG_SETTINGS: tuple[Setting, ...] = tuple(
    Setting(s.flag, "`1`" if s.default else "`0`", s.title) for s in FLEET if s.built)
"""One enable flag per bridge of this build (the end of the core table)."""

DEV_SETTINGS: tuple[Setting, ...] = (
    Setting("AEP_PYTHON", "the first Python >= 3.11 on `PATH`", "`scripts/dev`'s interpreter"),
    Setting("AEP_PYTHON312", "`python3.12` on `PATH`, or pyenv",
            "the interpreter the OpenHands agent server is installed with (tests)"),
    Setting("AEP_SHARED", "`../shared`", "the spec, design records and fixtures (tests)"),
    Setting("AEP_VENDOR_CACHE", "`${XDG_CACHE_HOME:-~/.cache}/aep-bridges/vendors`",
            "where the tests install the real vendor software"),
)
"""Names ``scripts/dev`` and the test suite read (known, not daemon knobs)."""

def bridge_settings(spec: BridgeSpec) -> tuple[Setting, ...]:
    """The settings metadata of ``spec`` (``()`` for a bridge not built).
    Raises ``ImportError`` / ``AttributeError`` when its module is broken."""
    if spec.settings is None:
        return ()
    mod_name, _, attr = spec.settings.partition(":")
    return tuple(getattr(importlib.import_module(mod_name), attr))


@functools.lru_cache(maxsize=1)
def known_settings() -> frozenset[str]:
    """Every ``AEP_*`` name something in this project reads, generated from
    the metadata (core, flags, every built bridge's, the dev/test names),
    so a misspelt setting is pointed out instead of silently ignored. A
    bridge whose settings cannot be imported is skipped (its factory's load
    failure is reported when it is enabled)."""
    out = {s.name for s in SETTINGS + DEV_SETTINGS + NATS_SETTINGS} | _FLAGS
    for spec in FLEET:
        try:
            out |= bridge_setting_names(spec)
        except (ImportError, AttributeError) as e:
            log.debug("settings of %s unavailable: %s", spec.key, e)
    return frozenset(out)


def bridge_setting_names(spec: BridgeSpec) -> frozenset[str]:
    """The concrete variable names ``spec``'s bridge reads: its module's
    ``SETTING_NAMES`` when it has one (a documented name with a
    ``{VENDOR}``-style placeholder expands to several), else the names of
    its settings metadata."""
    if spec.settings is None:
        return frozenset()
    mod = importlib.import_module(spec.settings.partition(":")[0])
    names = getattr(mod, "SETTING_NAMES", None)
    if names is not None:
        return frozenset(names)
    return frozenset(s.name for s in bridge_settings(spec) if "{" not in s.name)


@dataclass(frozen=True)
class Config:
    """The parsed daemon settings (frozen; every field holds its declared
    type or construction raises ``TypeError``). ``environ`` is kept for the
    bridges' own ``from_env`` readers; it is never logged. ``enabled``: the
    bridges to build, ``warnings``: one line per ignored name."""

    token: str | None = field(default=None, repr=False)
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
    cors_origins: tuple[str, ...] = ()
    log_max_open: int = 128
    log_spares: int = 2048
    strict_identity: bool = False
    max_filter_terms: int = 1024
    subscriber_bytes: int = 8 << 20
    body_timeout: float = 30.0
    relay_max_new_sessions: int = 100
    relay_new_sessions_per_s: int = 50
    max_connections: int | None = None  # per listener; None: from the fd limit
    emitter_tokens: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    claim_grace: float = 120.0
    max_bindings: int | None = None  # None: max(65536, 4 * max_sessions)
    channel_size: int = 4096
    drain_deadline: float = 5.0
    policy: CapturePolicy = field(default_factory=CapturePolicy, repr=False)  # holds secret values
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    enabled: tuple[BridgeSpec, ...] = ()
    warnings: tuple[str, ...] = ()
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    nats: NatsConfig | None = field(default=None, repr=False)  # AEP_NATS_URL set: JetStream

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def embedded_relay(self) -> bool:
        return self.relay_url is None


def state_dir_problem(path: Path, *, create: bool = True) -> str | None:
    """``None`` when the state directory exists (or can be created) and a
    file can be written in it; else the problem line. Session logs and the
    epoch live there: a daemon that cannot write them has no history.
    ``create=False`` (``aep-bridges check``) creates and writes nothing: a
    missing directory passes when its nearest existing ancestor is a
    directory this user may create entries in."""
    if not path.is_absolute():
        # a service's working directory is not the user's: a relative path
        # would put the history somewhere else under systemd or launchd
        return f"AEP_STATE_DIR={str(path)!r}: must be an absolute path"
    if not create:
        at = path
        while not at.exists() and at.parent != at:
            at = at.parent
        if not at.is_dir() or not os.access(at, os.W_OK | os.X_OK):
            why = "not a directory" if at.exists() and not at.is_dir() else "permission denied"
            return f"AEP_STATE_DIR={str(path)!r}: not writable ({why}: {str(at)!r})"
        return None
    probe = path / ".aep-bridges-probe"
    for attempt in (0, 1):
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)  # session logs: the user's alone
            probe.write_bytes(b"")
            probe.unlink()
            return None
        except OSError as e:
            # the file system's inodes are gone, and our own spare session log
            # files hold some: they are only ready-made files, give some back
            if attempt or e.errno not in (errno.ENOSPC, errno.EDQUOT) \
                    or not give_back(path / "logs" / SPARE_DIR):
                return f"AEP_STATE_DIR={str(path)!r}: not writable ({e.strerror or type(e).__name__})"
    return None


def load(env: Mapping[str, str] | None = None, *, relay_only: bool = False,
         check_ports: bool = True, create: bool = True) -> tuple[Config, list[str]]:
    """Parse the environment. Returns ``(config, problems)``; a non-empty
    ``problems`` list means: refuse to start (a bad value is never stored:
    its field keeps the default). ``relay_only`` is ``aep-bridges relay``
    (no bridges, no uplink); ``check_ports`` probes the machine (listen
    ports free, state directory writable); ``create=False`` (``check``)
    probes without creating the state directory. A relative
    ``AEP_STATE_DIR`` is a problem either way."""
    env = dict(os.environ if env is None else env)
    r = EnvReader(env)
    limits = _relay_limits(r)
    cors = _cors_origins(r)
    listen = r.hostport("AEP_LISTEN", DEFAULT_LISTEN) or Config.listen
    _check_logging(r)
    policy = _policy(env, r.problems)
    retention, more = RetentionPolicy.from_env(env)
    r.problems.extend(more)
    relay_url = None if relay_only else _relay_url(r)
    enabled = () if relay_only else _enabled(r, env)
    nats, more = nats_from_env(env)
    r.problems.extend(more)
    token = r.text("AEP_TOKEN")
    if (problem := token_problem("AEP_TOKEN", token)):
        r.problems.append(problem)
        token = None
    limits["emitter_tokens"] = _emitter_tokens(r.text("AEP_EMITTER_TOKENS"), token, r.problems)
    if limits["emitter_tokens"]:  # the daemon's own credentials: redacted like AEP_TOKEN
        policy = replace(policy, secret_values=policy.secret_values + tuple(
            t for _, t in limits["emitter_tokens"]))
    cfg = Config(token=token, relay_url=relay_url, listen=listen,
                 state_dir=state_dir(env), cors_origins=cors, policy=policy,
                 retention=retention, enabled=enabled,
                 warnings=_unknown_names(env), environ=env, nats=nats, **limits)
    if nats is not None:  # the credential / TLS files must be readable (with --no-ports too)
        r.problems.extend(file_problems(nats))
    if check_ports:
        r.problems.extend(_probe(cfg, blocked=bool(r.problems), create=create))
    elif not cfg.state_dir.is_absolute() and (problem := state_dir_problem(cfg.state_dir)):
        r.problems.append(problem)  # a config problem, probes or not
    return cfg, r.problems


def _relay_limits(r: EnvReader) -> dict[str, Any]:
    # read in README order: the problem lines come out in that order
    buffer = r.integer("AEP_BUFFER", 10_000, minimum=1)
    max_sessions = r.integer("AEP_MAX_SESSIONS", 500, minimum=1)
    return {
        "buffer": buffer,
        "max_sessions": max_sessions,
        "max_body": r.integer("AEP_MAX_BODY", 16 << 20, minimum=1, unit="bytes"),
        "max_batch": r.integer("AEP_MAX_BATCH", 10_000, minimum=1),
        "max_from": r.integer("AEP_MAX_FROM", max_sessions, minimum=1),
        # each held event is accounted len(raw) + ENTRY_OVERHEAD: below four
        # overheads a session buffer could hold nothing (or one event)
        "relay_max_new_sessions": r.integer("AEP_RELAY_MAX_NEW_SESSIONS", 100, minimum=1,
                                            maximum=1_000_000),
        "relay_new_sessions_per_s": r.integer("AEP_RELAY_NEW_SESSIONS_PER_S", 50, minimum=1,
                                              maximum=1_000_000),
        "buffer_bytes": r.integer("AEP_BUFFER_BYTES", 8 << 20, minimum=4 * ENTRY_OVERHEAD,
                                  unit="bytes"),
        "total_bytes": r.integer("AEP_BUFFER_TOTAL_BYTES", 256 << 20,
                                 minimum=4 * ENTRY_OVERHEAD, unit="bytes"),
        "log_max_open": r.integer("AEP_LOG_MAX_OPEN", 128, minimum=1),
        "log_spares": r.integer("AEP_LOG_SPARES", 2048, minimum=1, maximum=65536),
        "strict_identity": r.flag("AEP_STRICT_IDENTITY"),
        "max_filter_terms": r.integer("AEP_MAX_FILTER_TERMS", 1024, minimum=1),
        "subscriber_bytes": r.integer("AEP_SUBSCRIBER_BYTES", 8 << 20, minimum=64 << 10,
                                      unit="bytes"),
        "body_timeout": r.seconds("AEP_BODY_TIMEOUT", 30.0, maximum=3600.0),
        "claim_grace": r.seconds("AEP_CLAIM_GRACE", 120.0, maximum=86400.0),
        "max_bindings": (r.integer("AEP_MAX_BINDINGS", 65_536, minimum=16)
                         if r.raw("AEP_MAX_BINDINGS") is not None else None),
        "max_connections": (r.integer("AEP_MAX_CONNECTIONS", 1000, minimum=8,
                                    shown_default="derived from the open-files limit")
                            if r.raw("AEP_MAX_CONNECTIONS") is not None else None),
    }


_EMITTER_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _emitter_tokens(path: str | None, token: str | None,
                    problems: list[str]) -> tuple[tuple[str, str], ...]:
    """``AEP_EMITTER_TOKENS``: the ``(name, token)`` pairs of the file at
    ``path`` (lines ``name=token``, blank and ``#`` lines skipped); each
    problem (unreadable, readable by group or others, a bad line, a
    duplicate name or token, a token equal to ``AEP_TOKEN``, no
    ``AEP_TOKEN``) is one line, never quoting a token."""
    if not path:
        return ()
    where = f"AEP_EMITTER_TOKENS={path!r}"
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"{where}: {getattr(e, 'strerror', None) or type(e).__name__}")
        return ()
    if mode & 0o077:
        problems.append(f"{where}: readable or writable by group or others (mode "
                        f"{mode & 0o777:o}); chmod 600 it")
        return ()
    if not token:
        problems.append(f"{where}: needs AEP_TOKEN (per-emitter credentials add to it)")
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, eq, value = (x.strip() for x in line.partition("="))
        if not eq or not _EMITTER_NAME.fullmatch(name) or not value \
                or token_problem("", value) is not None:
            problems.append(f"{where} line {n}: expected name=token (name: A-Z a-z 0-9 . _ -, "
                            "at most 64; token: RFC 6750 token characters; value not shown)")
        elif name in out or value in out.values() or value == token:
            problems.append(f"{where} line {n}: {name!r} repeats a name or a token "
                            "(AEP_TOKEN's included; value not shown)")
        else:
            out[name] = value
    return tuple(out.items())


def _cors_origins(r: EnvReader) -> tuple[str, ...]:
    out = []
    for origin in (r.text("AEP_CORS_ORIGINS") or "").split(","):
        if origin.strip():
            try:
                out.append(normalize_origin(origin, strict=True))
            except ValueError as e:
                r.problems.append(f"AEP_CORS_ORIGINS: {e}")
    return tuple(out)


def _check_logging(r: EnvReader) -> None:
    """``AEP_LOG_LEVEL`` / ``AEP_LOG_FORMAT`` (applied by :mod:`supervisor.tools.logs`)."""
    level = (r.text("AEP_LOG_LEVEL") or "info").strip().lower()
    if level not in LOG_LEVELS:
        r.problems.append(f"AEP_LOG_LEVEL={level!r}: expected one of {', '.join(LOG_LEVELS)}")
    fmt = r.text("AEP_LOG_FORMAT")
    if fmt is not None and fmt.strip().lower() not in ("json", "text"):
        r.problems.append(f"AEP_LOG_FORMAT={fmt!r}: expected json or text")


def _policy(env: Mapping[str, str], problems: list[str]) -> CapturePolicy:
    try:
        return CapturePolicy.from_env(env)
    except ValueError as e:
        problems.extend(getattr(e, "problems", None) or [str(e)])
        return CapturePolicy()


def _relay_url(r: EnvReader) -> str | None:
    url = r.text("AEP_RELAY_URL")
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        r.problems.append(f"AEP_RELAY_URL={url!r}: expected http(s)://host:port")
        return None
    return url.rstrip("/")


def _enabled(r: EnvReader, env: Mapping[str, str]) -> tuple[BridgeSpec, ...]:
    """The bridges switched on; an unknown ``AEP_BRIDGE_*`` or a bridge not
    part of this build switched on is a problem."""
    buildable = ", ".join(s.flag for s in FLEET if s.built)
    for name in sorted(env):
        if name.startswith("AEP_BRIDGE_") and name not in _FLAGS:
            r.problems.append(f"{name}: unknown bridge (known: {buildable})")
    enabled = []
    for spec in FLEET:
        if r.flag(spec.flag, spec.default):
            if spec.built:
                enabled.append(spec)
            else:
                r.problems.append(f"{spec.flag}=1: the {spec.key} bridge is not part of this build")
    return tuple(enabled)


def _unknown_names(env: Mapping[str, str]) -> tuple[str, ...]:
    known = known_settings()
    out = []
    for name in sorted(env):
        if name.startswith("AEP_") and name not in known and not name.startswith("AEP_BRIDGE_"):
            close = difflib.get_close_matches(name, known, n=1)
            out.append(f"{name} is not a setting (ignored)"
                       + (f"; did you mean {close[0]}?" if close else ""))
    return tuple(out)


def _probe(cfg: Config, *, blocked: bool, create: bool = True) -> list[str]:
    """The machine checks: the state directory writable, the listen address
    free (only when the embedded relay serves and nothing else is wrong)."""
    problems = []
    if problem := state_dir_problem(cfg.state_dir, create=create):
        problems.append(problem)
    if cfg.embedded_relay and not blocked and not problems and not bindable(*cfg.listen):
        problems.append(f"AEP_LISTEN={cfg.listen[0]}:{cfg.listen[1]}: address in use or "
                        "not bindable")
    return problems


def all_settings() -> dict[str, tuple[Setting, ...]]:
    """Every documented setting by owner: ``core`` (with the flags),
    ``dev``, ``nats`` (``AEP_NATS_*``, "Past one machine"), and each built bridge's key (the knob tables' source)."""
    out: dict[str, tuple[Setting, ...]] = {"core": SETTINGS + FLAG_SETTINGS, "dev": DEV_SETTINGS,
                                           "nats": NATS_SETTINGS}
    for spec in FLEET:
        if spec.built:
            out[spec.key] = bridge_settings(spec)
    return out


__all__: Sequence[str] = ("BridgeSpec", "Config", "DEV_SETTINGS", "FLAG_SETTINGS", "FLEET",
                          "SETTINGS", "all_settings", "bridge_setting_names", "bridge_settings", "known_settings",
                          "load",
                          "state_dir_problem")
