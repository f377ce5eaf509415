"""The ``AEP_NATS_*`` settings (issue 14; the one config shape of issue 7:
a frozen :class:`NatsConfig`, :func:`from_env`, :data:`SETTINGS`). Pure: no
sockets, no file reads beyond nothing (whether a credentials file exists is
:func:`file_problems`'s question, asked by ``check``/``run``).

Unset ``AEP_NATS_URL`` means JetStream is off: :func:`from_env` returns
``None`` and nothing of :mod:`supervisor.jetstream` runs.
"""
from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from bridges.core.settings import EnvReader, Setting, check_fields

from .subjects import STREAM_NAME

URL = "AEP_NATS_URL"
STREAM = "AEP_NATS_STREAM"
MAX_AGE = "AEP_NATS_MAX_AGE"
MAX_BYTES = "AEP_NATS_MAX_BYTES"
REPLICAS = "AEP_NATS_REPLICAS"
CREDS = "AEP_NATS_CREDS"
TLS_CA = "AEP_NATS_TLS_CA"
TLS_CERT = "AEP_NATS_TLS_CERT"
TLS_KEY = "AEP_NATS_TLS_KEY"
OUTBOX = "AEP_NATS_OUTBOX"
CLAIM_TTL = "AEP_NATS_CLAIM_TTL"
DUPLICATE_WINDOW = "AEP_NATS_DUPLICATE_WINDOW"

DEFAULT_STREAM = "AEP"
DEFAULT_MAX_AGE = 7 * 86400.0
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_OUTBOX = 10_000
DEFAULT_CLAIM_TTL = 30.0
DEFAULT_DUPLICATE_WINDOW = 300.0

SETTINGS: tuple[Setting, ...] = (
    Setting(URL, "unset", "NATS servers, comma-separated (`nats://a:4222,nats://b:4222`; "
            "`tls://` for TLS). Set: every event is also published to JetStream and "
            "`aep-bridges relay` serves from it (\"Past one machine\"); unset: single host. "
            "`user:password@` in a URL is a credential, never logged", secret=True),
    Setting(STREAM, f"`{DEFAULT_STREAM}`", "the JetStream stream (created if absent) and the "
            "prefix of every subject and KV bucket (`AEP.ev.<agent>.<session>`); one per "
            "deployment"),
    Setting(MAX_AGE, f"`{int(DEFAULT_MAX_AGE)}` (7 days)", "seconds an event is kept in the "
            "stream (a resume from before it gets `replay-exhausted`)"),
    Setting(MAX_BYTES, f"`{DEFAULT_MAX_BYTES}`", "bytes the stream keeps (oldest dropped "
            "first)"),
    Setting(REPLICAS, "`1`", "stream replicas (`3` on a 3-node cluster: survives a node)"),
    Setting(DUPLICATE_WINDOW, f"`{int(DEFAULT_DUPLICATE_WINDOW)}`", "seconds the server "
            "remembers a `Nats-Msg-Id` (`<id> <source>`): a resend within it (a lost ack, a "
            "reconnect) is dropped as a duplicate; one later is stored twice (AEP consumers "
            "dedupe on `(source, id)`). At most `AEP_NATS_MAX_AGE`"),
    Setting(CREDS, "unset", "a NATS `.creds` file (JWT + NKey seed); its content is never "
            "logged"),
    Setting(TLS_CA, "unset", "CA bundle to verify the NATS servers (`tls://` URLs)"),
    Setting(TLS_CERT, "unset", "client certificate for mutual TLS (with `AEP_NATS_TLS_KEY`)"),
    Setting(TLS_KEY, "unset", "client private key for mutual TLS"),
    Setting(OUTBOX, f"`{DEFAULT_OUTBOX}`", "events held until JetStream acknowledges them "
            "(through an outage: `debug`/`info` shed first, counted; `notice`+ never dropped)"),
    Setting(CLAIM_TTL, f"`{int(DEFAULT_CLAIM_TTL)}`", "seconds a daemon's session claims live "
            "in the KV bucket without a refresh (a daemon gone this long routes `no-route`)"),
)
"""The JetStream knobs (the README's "Past one machine" table)."""


@dataclass(frozen=True)
class NatsConfig:
    """The parsed ``AEP_NATS_*`` settings. ``servers`` keep any
    ``user:password@`` (nats-py needs it); ``repr`` never shows them."""

    servers: tuple[str, ...] = field(repr=False)
    stream: str = DEFAULT_STREAM
    max_age: float = DEFAULT_MAX_AGE
    max_bytes: int = DEFAULT_MAX_BYTES
    replicas: int = 1
    creds: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    outbox: int = DEFAULT_OUTBOX
    claim_ttl: float = DEFAULT_CLAIM_TTL
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def shown_servers(self) -> tuple[str, ...]:
        """The server URLs without credentials (for logs and ``check``)."""
        return tuple(redact_url(u) for u in self.servers)

    @property
    def tls(self) -> bool:
        return any(u.startswith("tls://") for u in self.servers) or self.tls_ca is not None \
            or self.tls_cert is not None


def redact_url(url: str) -> str:
    """``url`` with everything before the last ``@`` of its authority
    replaced by ``***``. Text, not a URL parse: a password holding an
    unencoded ``/``, ``#`` or ``?`` (or a URL too broken to parse) must not
    slip past the redaction."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    return (f"{scheme}://" if sep else "") + "***@" + rest.rpartition("@")[2]


MAX_SECONDS = 10 * 365 * 86400.0
"""The longest ``AEP_NATS_MAX_AGE`` (and so duplicate window) accepted."""


def _duplicate_window(r: EnvReader, max_age: float) -> float:
    """``AEP_NATS_DUPLICATE_WINDOW``: seconds > 0, at most the stream's
    ``AEP_NATS_MAX_AGE`` (JetStream refuses a window longer than the
    stream keeps its events: it cannot remember an id past its event). A
    value over it is a problem line naming that limit and the max age in
    force; the field keeps the default (cut to the max age, as an unset
    window is: never a problem)."""
    fallback = min(DEFAULT_DUPLICATE_WINDOW, max_age)
    given = r.raw(DUPLICATE_WINDOW)
    if given is None:
        return fallback
    try:
        window = float(given)
        if not window > 0 or window != window:
            raise ValueError
    except ValueError:
        r.problems.append(f"{DUPLICATE_WINDOW}={given!r}: expected seconds > 0 "
                          f"(default {DEFAULT_DUPLICATE_WINDOW:g})")
        return fallback
    if window > max_age:
        r.problems.append(f"{DUPLICATE_WINDOW}={given!r}: expected at most {MAX_AGE} "
                          f"({max_age:g} s: the stream cannot remember an id longer than it "
                          f"keeps the event; default {DEFAULT_DUPLICATE_WINDOW:g})")
        return fallback
    return window


def from_env(env: Mapping[str, str]) -> tuple[NatsConfig | None, list[str]]:
    """``(config, problems)``; config ``None`` when ``AEP_NATS_URL`` is
    unset (JetStream off) or unusable. Never raises; problem lines never
    echo a credential."""
    r = EnvReader(env)
    raw = r.text(URL)
    if raw is None:
        return None, []
    servers = []
    for u in (x.strip() for x in raw.split(",")):
        if not u:
            continue
        try:
            parts = urllib.parse.urlsplit(u)
            port_ok = parts.port is None or 0 < parts.port < 65536
            host = parts.hostname
        except ValueError:  # "nats://[::1", a port out of range
            parts, port_ok, host = urllib.parse.urlsplit(""), False, None
        if parts.scheme not in ("nats", "tls") or not host or not port_ok:
            r.problems.append(f"{URL}: {redact_url(u)!r} is not nats://host:port or tls://host:port")
            continue
        servers.append(u)
    stream = (r.text(STREAM) or DEFAULT_STREAM).strip()
    if not STREAM_NAME.fullmatch(stream):
        r.problems.append(f"{STREAM}={stream!r}: expected 1-64 of [A-Za-z0-9_-]")
        stream = DEFAULT_STREAM
    cfg_paths = {}
    for name, key in ((CREDS, "creds"), (TLS_CA, "tls_ca"), (TLS_CERT, "tls_cert"),
                      (TLS_KEY, "tls_key")):
        v = r.text(name)
        if v is not None:
            p = Path(os.path.expanduser(v.strip()))
            if not p.is_absolute():
                r.problems.append(f"{name}={v!r}: expected an absolute path")
                continue
            cfg_paths[key] = p
    if ("tls_cert" in cfg_paths) != ("tls_key" in cfg_paths):
        r.problems.append(f"{TLS_CERT} and {TLS_KEY} go together (mutual TLS needs both)")
        cfg_paths.pop("tls_cert", None)
        cfg_paths.pop("tls_key", None)
    max_age = r.seconds(MAX_AGE, DEFAULT_MAX_AGE, maximum=MAX_SECONDS)
    cfg = NatsConfig(
        servers=tuple(servers), stream=stream, max_age=max_age,
        max_bytes=r.integer(MAX_BYTES, DEFAULT_MAX_BYTES, minimum=1 << 20, unit="bytes"),
        replicas=r.integer(REPLICAS, 1, minimum=1, maximum=5),
        duplicate_window=_duplicate_window(r, max_age),
        outbox=r.integer(OUTBOX, DEFAULT_OUTBOX, minimum=16),
        claim_ttl=r.seconds(CLAIM_TTL, DEFAULT_CLAIM_TTL, maximum=3600.0),
        **cfg_paths,
    )
    if not servers:
        if not r.problems:
            r.problems.append(f"{URL}: no server URL")
        return None, r.problems
    return (cfg if not r.problems else None), r.problems


def file_problems(cfg: NatsConfig) -> list[str]:
    """The credential/TLS files that are missing or unreadable (one line
    each, the path but never the content)."""
    out = []
    for name, p in ((CREDS, cfg.creds), (TLS_CA, cfg.tls_ca), (TLS_CERT, cfg.tls_cert),
                    (TLS_KEY, cfg.tls_key)):
        if p is not None and not os.access(p, os.R_OK):
            out.append(f"{name}={str(p)!r}: not a readable file")
    return out


__all__: Sequence[str] = ("NatsConfig", "SETTINGS", "file_problems", "from_env", "redact_url")
