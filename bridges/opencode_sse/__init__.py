"""The OpenCode SSE bridge: a PROFILE on the shared implementation
(:mod:`bridges.sse_common`). Attaches to ``opencode serve``.

Configuration: :mod:`bridges.opencode_sse.config` (the ``AEP_OPENCODE_*`` names,
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
    name="opencode_sse", agent="opencode", env="AEP_OPENCODE",
    default_url="http://127.0.0.1:4096", default_user="opencode",
    pins="mappings/opencode.json",
)


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> "SseBridge":
    """The bridge configured from ``environ`` (never raises for bad values:
    each becomes one :meth:`preflight` line)."""
    from bridges.sse_common.bridge import SseBridge
    return SseBridge.from_env(PROFILE, environ, policy=policy)
