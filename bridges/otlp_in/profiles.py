"""Vendor profiles of the OTLP inbound bridge (design record "Vendor
profiles": a profile is exactly three seams: the agent identity, the session
key, the pure mapper, each with its own namespace and primary core subset).

Pure data; :data:`PROFILES` is keyed by the ``AEP_OTLP_VENDOR`` value."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from bridges.core.bridge import Emission, Gating
from bridges.core.capture import declares
from bridges.core.posture import Posture

from . import codex, vscode
from .common import MAX_EVENT_NAME, EventSpec, Mapper, Plain, Recipe, vendor_type
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
    (``tests/unit/otlp_in/test_otlp_reads.py`` holds each profile to it).

    ``plain``: what the mapper's plain events are
    (:class:`~bridges.otlp_in.common.Plain`), for :meth:`recipes` and
    :attr:`session_attribute`; ``None``: no compiled plan."""

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
    plain: Plain | None = None

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

    def recipes(self, posture: Posture) -> dict[str, Recipe]:
        """Per event name whose mapping at ``posture`` is exactly its gated
        payload (a known name, not ``special``, and in primary mode not
        ``core``), the compiled :class:`~bridges.otlp_in.common.Recipe`:
        the type, the payload plan, the ceiling's answers and the gating
        hint decided once per posture instead of once per record
        (:func:`bridges.otlp_in.export.plan`). Kept per posture object (a
        run has one)."""
        kept = self._recipes.get(id(posture))
        if kept is not None and kept[0] is posture:
            return kept[1]
        out: dict[str, Recipe] = {}
        plain = self.plain
        if plain is not None and plain.mapper is self.map_record:
            skip = plain.special | plain.core if posture.primary else plain.special
            for name, spec in plain.events.items():
                if name in skip or len(name) > MAX_EVENT_NAME:
                    continue
                type_ = vendor_type(self.namespace, spec.leaf)
                gating = self._gatings.get(type_)
                if gating is None or not type_.startswith(self._prefix):
                    continue  # the hint path decides (no table entry: nothing shared)
                red_ok, full_ok = posture.allows(type_, "redacted"), posture.allows(type_, "full")
                out[name] = Recipe(type_, spec.grades, red_ok, full_ok, posture.policy,
                                   self._plain_gating(type_, spec, gating, red_ok, full_ok))
        if len(self._recipes) >= 64:
            self._recipes.clear()
        self._recipes[id(posture)] = (posture, out)
        return out

    def _plain_gating(self, type_: str, spec: EventSpec, gating: Gating, red_ok: bool,
                      full_ok: bool) -> Gating:
        """``gating`` with the ``plain`` claim (:class:`bridges.core.bridge.Gating`)
        when the recipe's payload can only be plain: at this posture it keeps
        no content key (none allowed, or the spec has none), its metadata
        values are JSON scalars (:func:`~bridges.otlp_in.common.payload`) and
        ``levels`` declares none of its metadata keys. One hint object per
        type, built once (the gate's per-type plan keys on it)."""
        if (red_ok and spec.redacted) or (full_ok and spec.full):
            return gating
        levels = gating.get("levels")
        if levels is None or declares(levels, spec.meta):
            return gating
        kept = self._plain_gatings.get(type_)
        if kept is None or kept.get("levels") is not levels:
            kept = self._plain_gatings[type_] = {"levels": levels, "plain": True}
        return kept

    @cached_property
    def _plain_gatings(self) -> dict[str, Gating]:
        return {}

    @property
    def session_attribute(self) -> str | None:
        """The LogRecord attribute :attr:`session_key` returns, when that is
        all it does (:class:`~bridges.otlp_in.common.Plain`), else ``None``."""
        plain = self.plain
        return plain.session_attribute if plain is not None and \
            plain.session_key is self.session_key else None

    @cached_property
    def _recipes(self) -> dict[int, tuple[Posture, dict[str, Recipe]]]:
        return {}

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
                     codex.READS, codex.RESOURCE_READS, codex.FIELDS, codex.PLAIN),
    "vscode": Profile("vscode", "vscode", vscode.session_key, vscode.map_record,
                      vscode.NAMESPACE, vscode.PRIMARY_TYPES, frozenset(vscode.EVENTS),
                      vscode.LEVELS, vscode.READS, vscode.RESOURCE_READS, vscode.FIELDS,
                      vscode.PLAIN),
}
