"""The capture policy and the helpers every gate path shares (AEP-0003
§9.3, §9.4; issue 26 split it from :mod:`bridges.core.capture`, which
re-exports everything here):

- :class:`CapturePolicy`: the operator's ceilings (``AEP_CAPTURE``, per-type
  overrides), the configured secret values, the home path and the PII switch,
  read from the environment (:meth:`CapturePolicy.from_env`);
- :func:`redact_text` / :func:`redact_value`: the §9.4 pipeline under a
  policy (:mod:`bridges.core.redaction`; fixture ``redaction/cases.json``);
- :func:`canonical_json` / :func:`digest`: ``*_digest`` values (§9.3).

Pure: no I/O at import or call time, no clocks.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import redaction as _red
from .aep import CAPTURE_LEVELS as LEVELS
from .aep import CAPTURE_RANK as _RANK
from .aep import capture_rank as rank
from .settings import FALSE, FLAG_EXPECTED, TRUE

#: Credentials of the daemon itself (shared/DESIGN.md operator interface):
#: their values are always treated as configured secrets (§9.4 b).
BUILTIN_SECRET_NAMES = (
    "AEP_TOKEN",
    "AEP_OPENHANDS_SESSION_API_KEY",
    "AEP_OPENCODE_PASSWORD",
    "AEP_KILOCODE_PASSWORD",
    "AEP_KIMI_WEB_TOKEN",
    "AEP_NATS_URL",  # may hold user:password@ (issue 14)
)

_FALSE = set(FALSE) - {""}
_TRUE = {*TRUE, ""}  # unset: redact PII (the default)


def _max(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


class CaptureConfigError(ValueError):
    """Bad capture configuration; ``problems`` holds one line per problem
    (the supervisor prints each and exits 2)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class CapturePolicy:
    """The operator's capture posture (AEP-0003 §9.1, §9.4).

    ``ceiling``: the global ceiling (``AEP_CAPTURE``, default ``metadata``).

    ``attention``: the ceiling for ``attention.*``. ``None`` (the default)
    means the RECOMMENDED per-category override of AEP-0003 §9.1: ``redacted``
    so prompts stay readable, or the global ceiling when that is higher
    (``full`` stays ``full``). An explicit level is used as given, above or
    below the global ceiling (``AEP_CAPTURE_ATTENTION``).

    ``overrides``: per-type or per-category ceilings (``{"tool.completed":
    "full", "progress": "redacted"}``); the longest matching dotted prefix
    wins over ``attention`` and ``ceiling``.

    The rule that binds them all: a global ``none`` is absolute. With
    ``ceiling="none"`` every type's ceiling is ``none`` whatever
    ``attention``/``overrides`` say (:meth:`from_env` refuses such a
    configuration outright rather than silently ignoring it).

    ``secret_values``: literal values redacted by §9.4 rule (b) (normalized:
    deduplicated, longest first, values under 4 characters dropped).
    ``home``: the prefix rule (c) replaces with ``~`` (ignored when empty,
    relative or ``/``). ``pii``: rule (d) (default on).

    Raises ``ValueError`` for an unknown level."""

    ceiling: str = "metadata"
    attention: str | None = None
    secret_values: tuple[str, ...] = ()
    home: str | None = None
    pii: bool = True
    overrides: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        rank(self.ceiling)
        if self.attention is not None:
            rank(self.attention)
        for v in dict(self.overrides).values():
            rank(v)
        object.__setattr__(self, "secret_values",
                           _red.normalize_secret_values(self.secret_values))
        object.__setattr__(self, "home", _red.usable_home(self.home))
        object.__setattr__(self, "overrides", dict(self.overrides))

    def ceiling_for(self, type_: str) -> str:
        """The ceiling that applies to events of ``type_`` (see the class
        docstring for the precedence)."""
        if self.ceiling == "none":
            return "none"
        if self.overrides:
            parts = type_.split(".")
            for n in range(len(parts), 0, -1):
                hit = self.overrides.get(".".join(parts[:n]))
                if hit is not None:
                    return hit
        if type_.startswith("attention."):
            if self.attention is not None:
                return self.attention
            return _max(self.ceiling, "redacted")
        return self.ceiling

    # ------------------------------------------------------------ configuration

    @classmethod
    def config_problems(cls, environ: Mapping[str, str]) -> list[str]:
        """One line per problem in the capture configuration of ``environ``
        (empty when it is usable). See :meth:`from_env`."""
        return cls._parse(environ)[1]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "CapturePolicy":
        """The posture from the environment (``os.environ`` or a dict):

        - ``AEP_CAPTURE``: ``none|metadata|redacted|full`` (default
          ``metadata``; case-insensitive).
        - ``AEP_CAPTURE_ATTENTION``: explicit ``attention.*`` ceiling (unset:
          ``redacted`` or the global ceiling when higher; see the class
          docstring). Refused when above a global ``none``.
        - ``AEP_REDACT_NAMES``: comma-separated environment variable names
          whose values are secrets (§9.4 b); the daemon's own credentials
          (:data:`BUILTIN_SECRET_NAMES`) are always included.
        - ``HOME``: the home prefix for rule (c).
        - ``AEP_REDACT_PII``: ``0``/``false``/``no``/``off`` disables rule
          (d); default on.

        Raises :class:`CaptureConfigError` (a ``ValueError``) listing every
        problem."""
        policy, problems = cls._parse(environ)
        if problems:
            raise CaptureConfigError(problems)
        assert policy is not None
        return policy

    @classmethod
    def _parse(cls, environ: Mapping[str, str]) -> tuple["CapturePolicy | None", list[str]]:
        problems: list[str] = []

        def level(name: str, default: str | None) -> str | None:
            raw = environ.get(name)
            if raw is None or raw.strip() == "":
                return default
            val = raw.strip().lower()
            if val not in _RANK:
                problems.append(f"{name}={raw!r} is not a capture level "
                                f"(expected one of {', '.join(LEVELS)})")
                return default
            return val

        ceiling = level("AEP_CAPTURE", "metadata") or "metadata"
        attention = level("AEP_CAPTURE_ATTENTION", None)
        if ceiling == "none" and attention not in (None, "none"):
            problems.append(f"AEP_CAPTURE_ATTENTION={attention} exceeds AEP_CAPTURE=none "
                            "(none is absolute: unset AEP_CAPTURE_ATTENTION or raise AEP_CAPTURE)")
        names = list(BUILTIN_SECRET_NAMES)
        for n in (environ.get("AEP_REDACT_NAMES") or "").split(","):
            n = n.strip()
            if n and n not in names:
                names.append(n)
        values = [environ[n] for n in names if environ.get(n)]
        pii_raw = (environ.get("AEP_REDACT_PII") or "").strip().lower()
        if pii_raw in _FALSE:
            pii = False
        elif pii_raw in _TRUE:
            pii = True
        else:
            problems.append(f"AEP_REDACT_PII={environ.get('AEP_REDACT_PII')!r} is not a boolean "
                            f"({FLAG_EXPECTED})")
            pii = True
        if problems:
            return None, problems
        return cls(ceiling=ceiling, attention=attention, secret_values=tuple(values),
                   home=environ.get("HOME"), pii=pii), []


_DEFAULT_POLICY = CapturePolicy()

# ------------------------------------------------------------------ redaction, digests


def redact_text(text: str, policy: CapturePolicy | None = None) -> str:
    """The AEP-0003 §9.4 pipeline over one string under ``policy`` (secrets,
    configured values, home paths, PII when enabled); see
    :mod:`bridges.core.redaction`. Idempotent; never raises for a ``str``;
    a non-``str`` is returned unchanged."""
    p = policy or _DEFAULT_POLICY
    return _red.redact_text(text, secret_values=p.secret_values, home=p.home, pii=p.pii)


def redact_value(value: Any, policy: CapturePolicy | None = None) -> Any:
    """The pipeline over a JSON value: strings redacted, containers walked,
    credential-named keys' values replaced (see
    :func:`bridges.core.redaction.redact_value`). Returns a new value."""
    p = policy or _DEFAULT_POLICY
    return _red.redact_value(value, secret_values=p.secret_values, home=p.home, pii=p.pii)


def canonical_json(value: Any) -> str:
    """The canonical JSON form digests are computed over
    (``shared/aep/README.md``): keys sorted, no spaces, ``ensure_ascii=False``;
    a string is its JSON string form (quoted)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


def digest(value: Any) -> str:
    """``*_digest``: SHA-256 over :func:`canonical_json` of the ORIGINAL
    value (before any redaction), hex, first 16 bytes (32 hex characters);
    AEP-0003 §9.3. Never raises for JSON-shaped input (non-JSON leaves are
    stringified; lone surrogates are kept via ``surrogatepass``)."""
    raw = canonical_json(value)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]
