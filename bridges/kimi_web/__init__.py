"""The Kimi web bridge: every kap-hosted ``kimi web`` session as AEP
events (agent ``kimi-code``), with the opt-in two-write control gate.

Design record: ``shared/aep/docs/adapter-kimi-code-design.md`` ("The kimi
web channel"); pins: ``shared/aep/conformance/fixtures/mappings/kimi-code.json``
``ws_modes``; the 2.1.0 drifts: ``tests/fixtures/kimi_web_real/README.md``.
Modules: :mod:`.config` (settings), :mod:`.discovery` (instance files and
token), :mod:`.mapping` (pure), :mod:`.tracker` (state, no I/O),
:mod:`.receiver` (socket + REST), :mod:`.control` (the gated writes),
:mod:`.bridge`. Settings: :data:`bridges.kimi_web.config.SETTINGS`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from bridges.core.capture import CapturePolicy

from .config import KimiWebConfig
from .config import from_env as config_from_env

if TYPE_CHECKING:
    from .bridge import KimiWebBridge
_LAZY = ("KimiWebBridge",)


__all__ = ["KimiWebBridge", "KimiWebConfig", "from_env"]


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> KimiWebBridge:
    """The fleet factory: the bridge configured from ``environ`` (never
    raises for bad values: each becomes one :meth:`KimiWebBridge.preflight`
    line)."""
    from .bridge import KimiWebBridge
    config, problems = config_from_env(environ)
    return KimiWebBridge(config, policy, problems=problems)


def __getattr__(name: str) -> Any:
    # the bridge itself (and what it imports) only when asked for: the daemon
    # and the CLI import every bridge's config for its settings' names
    # (supervisor.config.known_settings), enabled or not, at each start
    if name in _LAZY:
        from . import bridge
        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
