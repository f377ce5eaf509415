"""Vendor profiles of the OTLP inbound bridge (design record "Vendor
profiles": a profile is exactly three seams: the agent identity, the session
key, the pure mapper, each with its own namespace and primary core subset).

Pure data; :data:`PROFILES` is keyed by the ``AEP_OTLP_VENDOR`` value."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import codex, vscode
from .common import Emission, Posture


@dataclass(frozen=True)
class Profile:
    """One vendor's seams.

    ``vendor``: the profile key (``codex``/``vscode``); ``agent``: the AEP
    agent id (own emitter identity); ``session_key``: record -> raw session
    id (``None`` when absent); ``map_record``: record, posture, notes ->
    emissions; ``namespace``: the ``x.<vendor>.otel`` family;
    ``primary_types``: the core subset emitted in primary mode;
    ``known``: the event names mapped to named vendor types."""

    vendor: str
    agent: str
    session_key: Callable[[dict[str, Any]], Any]
    map_record: Callable[[dict[str, Any], Posture, list[str]], list[Emission]]
    namespace: str
    primary_types: tuple[str, ...]
    known: frozenset[str]


PROFILES: dict[str, Profile] = {
    "codex": Profile("codex", "codex", codex.session_key, codex.map_record, codex.NAMESPACE,
                     codex.PRIMARY_TYPES, frozenset(codex.EVENTS)),
    "vscode": Profile("vscode", "vscode", vscode.session_key, vscode.map_record,
                      vscode.NAMESPACE, vscode.PRIMARY_TYPES, frozenset(vscode.EVENTS)),
}
