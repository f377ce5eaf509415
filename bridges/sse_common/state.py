"""The SSE bridges' state file is the shared :mod:`bridges.core.statefile`
(moved there so that OpenHands uses the same journaled document; issue 11).
Re-exported under its old name; patch module constants on
:mod:`bridges.core.statefile`, not here."""
from __future__ import annotations

from bridges.core.statefile import COMPACT_CHUNK, COMPACT_MIN, StateFile, state_path

__all__ = ["COMPACT_CHUNK", "COMPACT_MIN", "StateFile", "state_path"]
