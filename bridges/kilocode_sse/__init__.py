"""The Kilo Code SSE bridge: a PROFILE on the shared implementation
(:mod:`bridges.sse_common`). Attaches to ``kilo serve`` (an OpenCode fork
serving the same surface).

Configuration: :mod:`bridges.kilocode_sse.config` (the ``AEP_KILOCODE_*`` names,
generated from the profile by :func:`bridges.sse_common.config.settings`;
the README's OpenCode/Kilo table is generated from them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from bridges.core.capture import CapturePolicy
from bridges.sse_common.profile import SseProfile

if TYPE_CHECKING:
    from bridges.sse_common.bridge import SseBridge

PROFILE = SseProfile(
    name="kilocode_sse", agent="kilocode", env="AEP_KILOCODE",
    default_url="http://127.0.0.1:4096", default_user="kilo",
    pins="mappings/kilocode.json",
)


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> "SseBridge":
    """The bridge configured from ``environ`` (never raises for bad values:
    each becomes one :meth:`preflight` line)."""
    from bridges.sse_common.bridge import SseBridge
    return SseBridge.from_env(PROFILE, environ, policy=policy)
