"""The fleet's reserved sources (issue 25, fifth outside attack: posts in
fresh sessions under ``aep://{host}/agent/claude-code``, the Claude Code
bridge's agent-scoped source, were accepted; the owned-source rule held
only a source a live emitter had already used).

Every source at or under a fleet bridge's ``aep://{host}/agent/{agent}``
(its agent-scoped source, the one of ``agent.idle``, and its per-session
ones under ``/session/``) is the fleet's from the moment the bridge is
attached (:meth:`Relay.attach_emitter <supervisor.relay.core.Relay.attach_emitter>`,
at the daemon's start), before its first event: refused to every other
party (:meth:`.ingest.Ingest.check_owner`, counted
``refused_owned_source``). docs/security.md "Integrity"."""
from __future__ import annotations

__all__ = ["FleetSources"]


class FleetSources:
    """The reserved source bases (a handful: one per fleet bridge agent)."""

    def __init__(self) -> None:
        self._bases: set[str] = set()  # casefolded
        self._under: tuple[str, ...] = ()  # each base with a "/" after it

    def reserve(self, base: str) -> None:
        """Every source at or under ``base`` is the fleet's from now on."""
        b = base.casefold()
        if b not in self._bases:
            self._bases.add(b)
            self._under += (b + "/",)

    def owns(self, source: str) -> bool:
        """Whether ``source`` is at or under a reserved base (compared
        casefolded: an authority is case-insensitive, and a source that
        differs only in case reads as the bridge's to a person)."""
        if not self._under:
            return False
        s = source.casefold()
        return s in self._bases or s.startswith(self._under)
