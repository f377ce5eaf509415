"""The OpenHands bridge: every conversation on an ``openhands-agent-server``
as AEP events, with the opt-in five-write control gate.

Design record: ``shared/aep/docs/bridge-openhands-design.md``; pins:
``shared/aep/conformance/fixtures/mappings/openhands.json``. Modules:
:mod:`.mapping` (pure), :mod:`.receiver` (discovery + sockets + run
synthesis), :mod:`.control` (the gated writes), :mod:`.bridge`.

Configuration: :mod:`.config` (:class:`~.config.OpenHandsConfig`, its
``SETTINGS``; the README's OpenHands table is generated from them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from bridges.core.capture import CapturePolicy

from . import config as _config
from .config import DEFAULT_URL, OpenHandsConfig

if TYPE_CHECKING:
    from .bridge import OpenHandsBridge, OpenHandsRun
_LAZY = ("OpenHandsBridge", "OpenHandsRun")


Settings = OpenHandsConfig
"""The former name of :class:`~bridges.openhands.config.OpenHandsConfig`."""

__all__ = ["DEFAULT_URL", "OpenHandsBridge", "OpenHandsConfig", "OpenHandsRun", "Settings",
           "from_env"]


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> OpenHandsBridge:
    """Build the bridge from the environment (:func:`bridges.openhands.config.from_env`).
    Never raises for bad values: each becomes one line of
    :meth:`OpenHandsBridge.preflight` (the supervisor refuses to start on any)."""
    from .bridge import OpenHandsBridge
    cfg, problems = _config.from_env(environ)
    return OpenHandsBridge(cfg, policy, problems=problems)


def __getattr__(name: str) -> Any:
    # the bridge itself (and what it imports) only when asked for: the daemon
    # and the CLI import every bridge's config for its settings' names
    # (supervisor.config.known_settings), enabled or not, at each start
    if name in _LAZY:
        from . import bridge
        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
