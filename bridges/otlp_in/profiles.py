"""Vendor profiles of the OTLP inbound bridge (design record "Vendor
profiles": a profile is exactly three seams: the agent identity, the session
key, the pure mapper, each with its own namespace and primary core subset).

Pure data; :data:`PROFILES` is keyed by the ``AEP_OTLP_VENDOR`` value."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from bridges.core.bridge import Emission, Gating

from . import codex, vscode
from .common import Mapper
from .flatten import FlatRecord


@dataclass(frozen=True)
class Profile:
    """One vendor's seams.

    ``vendor``: the profile key (``codex``/``vscode``); ``agent``: the AEP
    agent id (own emitter identity); ``session_key``: record -> raw session
    id (``None`` when absent); ``map_record``: record, posture, notes ->
    emissions; ``namespace``: the ``x.<vendor>.otel`` family;
    ``primary_types``: the core subset emitted in primary mode;
    ``known``: the event names mapped to named vendor types; ``levels``:
    per vendor type, its content keys and their grade; ``reads`` /
    ``resource_reads``: every LogRecord / resource attribute the session
    key, the record time and the mapper look at (``None``: any), and
    ``fields`` every other record field they look at: the
    decoder flattens only these, so the mapping is the same for less work
    (``tests/unit/otlp_in/test_otlp_reads.py`` holds each profile to it)."""

    vendor: str
    agent: str
    session_key: Callable[[FlatRecord], object]
    map_record: Mapper
    namespace: str
    primary_types: tuple[str, ...]
    known: frozenset[str]
    levels: dict[str, dict[str, str]]
    reads: frozenset[str] | None = None
    resource_reads: frozenset[str] | None = None
    fields: frozenset[str] | None = None

    def stampable(self, emission: Emission) -> Emission:
        """``emission`` plus the stamper's ``gating`` hint for a vendor
        type (:meth:`bridges.core.envelope.Stamper.stamp`): the gate then
        claims the capture level actually honored rather than the ceiling.
        Core types need none (their schema annotations are the table)."""
        type_ = emission.get("type", "")
        if not type_.startswith(self._prefix):
            return emission
        gating = self._gatings.get(type_)
        if gating is None:  # a type outside the table (``unknown``): nothing declared
            gating = {"levels": self.levels.get(type_, {})}
        return {**emission, "gating": gating}

    def hint(self, emission: Emission) -> Emission:
        """:meth:`stampable` in place: ``emission`` itself, its ``gating``
        set to the same hint (for the mapper's own fresh emissions: the
        planning step, :func:`bridges.otlp_in.export.plan`, which makes
        one per record; a copy per record was ~0.2-0.3 us)."""
        type_ = emission.get("type", "")
        if type_.startswith(self._prefix):
            gating = self._gatings.get(type_)
            emission["gating"] = gating if gating is not None else \
                {"levels": self.levels.get(type_, {})}
        return emission

    @cached_property
    def _prefix(self) -> str:
        return self.namespace + "."

    @cached_property
    def _gatings(self) -> dict[str, Gating]:
        """Per vendor type, its ``gating`` hint, built once (the same
        ``levels`` mapping each time, so the gate's per-type plan is reused)."""
        return {t: {"levels": lv} for t, lv in self.levels.items()}


PROFILES: dict[str, Profile] = {
    "codex": Profile("codex", "codex", codex.session_key, codex.map_record, codex.NAMESPACE,
                     codex.PRIMARY_TYPES, frozenset(codex.EVENTS), codex.LEVELS,
                     codex.READS, codex.RESOURCE_READS, codex.FIELDS),
    "vscode": Profile("vscode", "vscode", vscode.session_key, vscode.map_record,
                      vscode.NAMESPACE, vscode.PRIMARY_TYPES, frozenset(vscode.EVENTS),
                      vscode.LEVELS, vscode.READS, vscode.RESOURCE_READS, vscode.FIELDS),
}
