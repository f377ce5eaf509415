"""The Codex hook bridge (agent ``codex``): every Codex hook moment (through
the command shim, ``aep-bridges hook codex``) POSTed to ``/hooks/codex`` as
AEP events, with the opt-in gate answering ``PermissionRequest`` and the
held ``PreToolUse`` from AEP. With the OTLP bridge's Codex profile in the
same daemon, that one runs in companion mode: this channel is the core-type
authority (AEP-0002 Annex A.2).

Ground truth: AEP-0002 Annex A.2; pins
``shared/aep/conformance/fixtures/mappings/codex.json``. Modules:
:mod:`.mapping` (pure), :mod:`.profile`, :mod:`.config`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from bridges.core.capture import CapturePolicy

from .config import from_env as config_from_env
from .profile import PROFILE

if TYPE_CHECKING:  # the bridge is imported by from_env, when it is enabled
    from bridges.hooks_common.bridge import HookBridge

__all__ = ["PROFILE", "from_env"]


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> HookBridge:
    """The fleet factory (never raises for bad values)."""
    from bridges.hooks_common.bridge import HookBridge
    config, problems = config_from_env(environ)
    return HookBridge(PROFILE, config, policy, problems=problems)
