"""The one :class:`Posture`: everything a pure mapper depends on besides the
vendor's input (who the vendor is, which mapping mode, the capture policy,
the opt-ins). Every bridge's mapping module takes it; the bridge builds it
once per run from its config and ``ctx.stamper.policy``.

Design: ``shared/DESIGN.md`` ("Capture"; the primary/companion modes of
each bridge's design record); AEP-0003 §9 (the ceiling per type).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import capture as _capture
from .aep import CAPTURE_RANK as _RANK
from .capture import CapturePolicy
from .naming import dotted_type

__all__ = ["MODES", "Posture"]

MODES = ("adapter", "companion", "primary")
"""``companion``: only the vendor namespace (``x.<agent>.*``), zero core
types (every bridge's default); ``primary``: the full core mapping;
``adapter``: a plugin adapter's posture some pins are written in (the SSE
family reproduces it; no bridge runs in it)."""


@dataclass(frozen=True, kw_only=True)
class Posture:
    """What a mapper may emit, keyword-only:
    ``Posture(agent="opencode", mode="primary", policy=ctx.stamper.policy,
    deltas=False, answerable=False)``.

    - ``agent``: the AEP agent id and vendor namespace (``opencode``:
      ``x.opencode.*``); ``""`` for a mapper that takes its namespace
      elsewhere (the OTLP profiles);
    - ``mode``: one of :data:`MODES` (``ValueError`` otherwise);
    - ``policy``: the capture posture (``AEP_CAPTURE``...); a type's
      ceiling is ``policy.ceiling_for(type)``;
    - ``deltas``: streaming deltas opted in (``AEP_OPENHANDS_DELTAS=1``);
    - ``answerable``: asks carry answer affordances (the control gate is
      open and honored).

    The default is the pins' posture: companion, ``metadata``, no opt-ins.
    """

    agent: str = ""
    mode: str = "companion"
    policy: CapturePolicy = field(default_factory=CapturePolicy)
    deltas: bool = False
    answerable: bool = False
    # type -> ceiling, filled as mappers ask (the policy is frozen): a
    # mapper asks per event, often twice
    _ceilings: dict[str, str] = field(default_factory=dict, init=False, repr=False,
                                      compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} not in {MODES}")

    @property
    def primary(self) -> bool:
        """Core types are emitted (``mode == "primary"``)."""
        return self.mode == "primary"

    def ceiling(self, type_: str) -> str:
        """The capture ceiling for ``type_`` (``none`` ... ``full``)."""
        c = self._ceilings.get(type_)
        if c is None:
            c = self._ceilings[type_] = self.policy.ceiling_for(type_)
        return c

    def level(self, type_: str) -> int:
        """The rank of :meth:`ceiling` (``bridges.core.capture.rank``)."""
        return _capture.rank(self.ceiling(type_))

    def allows(self, type_: str, level: str) -> bool:
        """True when ``level`` content may go into a ``type_`` payload."""
        return _RANK[self.ceiling(type_)] >= _capture.rank(level)

    def content(self, type_: str) -> str | None:
        """``redacted``/``full`` when content may ride on ``type_``, else
        ``None``."""
        c = self.ceiling(type_)
        return c if c in ("redacted", "full") else None

    def text(self, type_: str, value: str) -> str:
        """``value`` as it may ride at this type's ceiling (call only when
        :meth:`content` allows): verbatim at ``full``, else through the
        AEP-0003 §9.4 redaction pipeline."""
        if self.ceiling(type_) == "full":
            return value
        return _capture.redact_text(value, self.policy)

    def vendor(self, name: str) -> str:
        """``x.{agent}.{name}`` by the mechanical naming rule
        (:func:`bridges.core.naming.dotted_type`)."""
        return dotted_type(self.agent, name)
