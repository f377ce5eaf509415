"""The opencode_sse bridge's configuration: the SSE family's one config shape
(:mod:`bridges.sse_common.config`) with this profile's ``AEP_OPENCODE_*`` names."""
from __future__ import annotations

from typing import Mapping

from bridges.sse_common import config as _family
from bridges.sse_common.config import SseConfig

from . import PROFILE

__all__ = ["SETTINGS", "SseConfig", "from_env"]

SETTINGS = _family.settings(PROFILE)
"""This bridge's knobs (README table, known-settings list)."""


def from_env(env: Mapping[str, str]) -> tuple[SseConfig, list[str]]:
    """``(config, problems)`` for this profile; never raises."""
    return _family.from_env(PROFILE, env)
