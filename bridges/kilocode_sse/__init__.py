"""The Kilo Code SSE bridge: a PROFILE on the shared implementation
(:mod:`bridges.sse_common`). Attaches to ``kilo serve`` (an OpenCode fork
serving the same surface).

Configuration (:func:`from_env`; names from ``shared/DESIGN.md``):

=================================  ==========================  ===========================================
variable                           default                     meaning
=================================  ==========================  ===========================================
``AEP_KILOCODE_URL``               ``http://127.0.0.1:4096``   the server (``kilo serve``'s own port)
``AEP_KILOCODE_USERNAME``          ``kilo``                    basic-auth user (the vendor's default)
``AEP_KILOCODE_PASSWORD``          unset                       basic-auth password (``KILO_SERVER_PASSWORD``);
                                                               unset: no auth header; never logged
``AEP_KILOCODE_SSE_PRIMARY``       ``0``                       ``1``: the full core mapping (default companion:
                                                               ``x.kilocode.*`` only)
``AEP_KILOCODE_SSE_CONTROL``       ``0``                       ``1`` (primary mode + ``AEP_TOKEN``): answer
                                                               permissions/questions and cancel runs
``AEP_KILOCODE_SSE_ACK_GUARD_MS``  ``8000``                    REST-settled ack guard (inside the 10 s window)
=================================  ==========================  ===========================================
"""
from __future__ import annotations

from typing import Mapping

from bridges.core.capture import CapturePolicy
from bridges.sse_common.profile import SseProfile

PROFILE = SseProfile(
    name="kilocode_sse", agent="kilocode", env="AEP_KILOCODE",
    default_url="http://127.0.0.1:4096", default_user="kilo",
    pins="mappings/kilocode.json",
)


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy):
    """The bridge configured from ``environ`` (never raises for bad values:
    each becomes one :meth:`preflight` line)."""
    from bridges.sse_common.bridge import SseBridge
    return SseBridge.from_env(PROFILE, environ, policy=policy)
