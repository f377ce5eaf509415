"""The AG-UI bridge (``bridges/agui``): a tee proxy between an AG-UI frontend
and a real AG-UI agent server. The UI points at ``AEP_AGUI_LISTEN``; every
request is forwarded verbatim to ``AEP_AGUI_UPSTREAM`` and every response
streamed back untouched; each run's ``text/event-stream`` is teed onto the
AEP stream (``threadId`` -> session, ``runId`` -> run). Read-only.

Design record: ``shared/aep/docs/bridge-agui-design.md``; pins:
``shared/aep/conformance/fixtures/mappings/agui.json``. Modules:
:mod:`.config` (settings: :data:`~bridges.agui.config.SETTINGS`),
:mod:`.mapping` (pure), :mod:`.stream` (pure per-stream joins: pairing,
scope, run closing), :mod:`.sse` (pure incremental SSE parser); the
receiver is two modules, :mod:`.proxy` (the sockets: the ASGI proxy and
the upstream client) and :mod:`.tee` (parse the copy, map, emit), with
:mod:`.target` (pure: the fixed upstream, the path a request may add);
:mod:`.bridge` (the ``Bridge`` and its per-run :class:`~.bridge.AguiRun`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from bridges.core.capture import CapturePolicy

from . import config

if TYPE_CHECKING:
    from .bridge import AguiBridge
_LAZY = ("AguiBridge",)


__all__ = ["AguiBridge", "from_env"]


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy | None = None) -> AguiBridge:
    """The bridge from the environment (the fleet's factory). Never raises
    for bad values: each is one :meth:`AguiBridge.preflight` line."""
    from .bridge import AguiBridge
    cfg, problems = config.from_env(environ)
    return AguiBridge(cfg, policy, problems)


def __getattr__(name: str) -> Any:
    # the bridge itself (and what it imports) only when asked for: the daemon
    # and the CLI import every bridge's config for its settings' names
    # (supervisor.config.known_settings), enabled or not, at each start
    if name in _LAZY:
        from . import bridge
        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
