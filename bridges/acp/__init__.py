"""The ACP bridge (``bridges/acp``): the Agent Client Protocol tee and the
daemon side that maps what the tees observe. Design record:
``shared/aep/docs/bridge-acp-design.md``; pins
``shared/aep/conformance/fixtures/mappings/acp.json``.

- :mod:`bridges.acp.mapping`: the pure moment -> emissions mapping.
- :mod:`bridges.acp.join`: the pure per-tee state (request/response join per
  (direction, id), run identity, the attention lifecycle).
- :mod:`bridges.acp.wire`: the tee -> daemon WebSocket protocol.
- :mod:`bridges.acp.tee`: the tee (``aep-bridges acp -- AGENT``).
- :mod:`bridges.acp.link`: the tee's observation queue and its link to the daemon.
- :mod:`bridges.acp.bridge`: the daemon side (``AEP_BRIDGE_ACP=1``).
- :mod:`bridges.acp.config`: the settings (:data:`~bridges.acp.config.SETTINGS`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from bridges.core.capture import CapturePolicy

from . import config as _config

if TYPE_CHECKING:
    from .bridge import AcpBridge
_LAZY = ("AcpBridge",)


__all__ = ["AcpBridge", "from_env"]


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy | None = None) -> list[AcpBridge]:
    """One :class:`AcpBridge` per agent id in ``AEP_ACP_AGENTS`` (the FLEET
    factory). Never raises: bad values become the first bridge's
    :meth:`~AcpBridge.preflight` lines."""
    from .bridge import AcpBridge
    cfg, problems = _config.from_env(environ)
    return [AcpBridge(agent, cfg, policy=policy, problems=problems if i == 0 else None)
            for i, agent in enumerate(cfg.agents)]


def __getattr__(name: str) -> Any:
    # the bridge itself (and what it imports) only when asked for: the daemon
    # and the CLI import every bridge's config for its settings' names
    # (supervisor.config.known_settings), enabled or not, at each start
    if name in _LAZY:
        from . import bridge
        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
