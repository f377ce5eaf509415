"""The Claude Code hook bridge (agent ``claude-code``): every hook moment
POSTed to ``/hooks/claude-code`` as AEP events, with the opt-in gate
answering permission asks, forms and the held ``PreToolUse`` from AEP.

Ground truth: AEP-0002 Annex A.1; pins
``shared/aep/conformance/fixtures/mappings/claude-code.json``; the
reference behaviour ``shared/aep/docs/adapters.md``. Modules:
:mod:`.mapping` (pure), :mod:`.profile`, :mod:`.config`; the machinery is
:mod:`bridges.hooks_common`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from bridges.core.capture import CapturePolicy

from .config import from_env as config_from_env
from .profile import PROFILE

if TYPE_CHECKING:  # the bridge is imported by from_env, when it is enabled
    from bridges.hooks_common.bridge import HookBridge

__all__ = ["PROFILE", "from_env", "mapping"]  # mapping: Codex's hook mapping reuses it


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> HookBridge:
    """The fleet factory (never raises for bad values: each becomes one
    :meth:`~bridges.hooks_common.bridge.HookBridge.preflight` line)."""
    from bridges.hooks_common.bridge import HookBridge
    config, problems = config_from_env(environ)
    return HookBridge(PROFILE, config, policy, problems=problems)
