"""Capture posture and the payload gate (AEP-0001 §8.2, AEP-0002 §5.1,
AEP-0003 §9). PLACEHOLDER API: the field table, synthesis rules, digests and
down-leveling are filled in by the capture work item; the signatures below
are the contract the stamper and the bridges use."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LEVELS = ("none", "metadata", "redacted", "full")


def rank(level: str) -> int:
    return LEVELS.index(level)


@dataclass(frozen=True)
class CapturePolicy:
    """The operator's capture posture (``AEP_CAPTURE``).

    ``ceiling``: the global ceiling (default ``metadata``); ``attention``:
    the ceiling for ``attention.*`` (default ``redacted``, AEP-0003 §9.1,
    never above ``ceiling`` unless explicitly configured);
    ``secret_names``: values of these environment variables are redacted
    (§9.4 b); ``home``: the home prefix replaced with ``~`` (§9.4 c);
    ``pii``: redact emails/phones (§9.4 d)."""

    ceiling: str = "metadata"
    attention: str = "redacted"
    secret_values: tuple[str, ...] = ()
    home: str | None = None
    pii: bool = True
    overrides: dict[str, str] = field(default_factory=dict)

    def ceiling_for(self, type_: str) -> str:
        if type_.startswith("attention."):
            return self.attention
        return self.ceiling


def gate(type_: str, data: dict[str, Any] | None, ceiling: str,
         policy: CapturePolicy) -> tuple[dict[str, Any] | None, str]:
    """Prune ``data`` to ``ceiling`` by the field table; returns
    ``(data, honored_level)``."""
    return data, "metadata" if rank(ceiling) >= 1 else "none"


def downlevel(event: dict[str, Any], ceiling: str) -> dict[str, Any]:
    """A relay hop's mechanical down-level of a whole envelope to ``ceiling``
    (AEP-0001 §8.2(b)(e), fixture ``downlevel/cases.json``). Returns a new
    dict; never up-levels; never mints ``redacted``."""
    return event


def redact_text(text: str, policy: CapturePolicy) -> str:
    """The AEP-0003 §9.4 pipeline over one string (fixture
    ``redaction/cases.json``)."""
    return text


def digest(value: Any) -> str:
    """``*_digest``: SHA-256 hex, first 16 bytes, over canonical JSON (keys
    sorted, no spaces, ``ensure_ascii=False``); AEP-0003 §9.3."""
    import hashlib
    import json
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]
