"""The OpenCode SSE bridge: a PROFILE on the shared implementation
(:mod:`bridges.sse_common`). Attaches to ``opencode serve``.

Configuration (:func:`from_env`; names from ``shared/DESIGN.md``):

=================================  ==========================  ===========================================
variable                           default                     meaning
=================================  ==========================  ===========================================
``AEP_OPENCODE_URL``               ``http://127.0.0.1:4096``   the server (``opencode serve``'s own port)
``AEP_OPENCODE_USERNAME``          ``opencode``                basic-auth user (the vendor's default)
``AEP_OPENCODE_PASSWORD``          unset                       basic-auth password (``OPENCODE_SERVER_PASSWORD``);
                                                               unset: no auth header; never logged
``AEP_OPENCODE_SSE_PRIMARY``       ``0``                       ``1``: the full core mapping (default companion:
                                                               ``x.opencode.*`` only)
``AEP_OPENCODE_SSE_CONTROL``       ``0``                       ``1`` (primary mode + ``AEP_TOKEN``): answer
                                                               permissions/questions and cancel runs
``AEP_OPENCODE_SSE_ACK_GUARD_MS``  ``8000``                    REST-settled ack guard (inside the 10 s window)
=================================  ==========================  ===========================================
"""
from __future__ import annotations

from typing import Mapping

from bridges.core.capture import CapturePolicy
from bridges.sse_common.profile import SseProfile

PROFILE = SseProfile(
    name="opencode_sse", agent="opencode", env="AEP_OPENCODE",
    default_url="http://127.0.0.1:4096", default_user="opencode",
    pins="mappings/opencode.json",
)


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy):
    """The bridge configured from ``environ`` (never raises for bad values:
    each becomes one :meth:`preflight` line)."""
    from bridges.sse_common.bridge import SseBridge
    return SseBridge.from_env(PROFILE, environ, policy=policy)
