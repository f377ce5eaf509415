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

from typing import Mapping

from bridges.core.capture import CapturePolicy

from . import config as _config
from .bridge import OpenHandsBridge, OpenHandsRun
from .config import DEFAULT_URL, OpenHandsConfig

Settings = OpenHandsConfig
"""The former name of :class:`~bridges.openhands.config.OpenHandsConfig`."""

__all__ = ["DEFAULT_URL", "OpenHandsBridge", "OpenHandsConfig", "OpenHandsRun", "Settings",
           "from_env"]


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> OpenHandsBridge:
    """Build the bridge from the environment (:func:`bridges.openhands.config.from_env`).
    Never raises for bad values: each becomes one line of
    :meth:`OpenHandsBridge.preflight` (the supervisor refuses to start on any)."""
    cfg, problems = _config.from_env(environ)
    return OpenHandsBridge(cfg, policy, problems=problems)
