"""The OpenHands bridge: every conversation on an ``openhands-agent-server``
as AEP events, with the opt-in five-write control gate.

Design record: ``shared/aep/docs/bridge-openhands-design.md``; pins:
``shared/aep/conformance/fixtures/mappings/openhands.json``. Modules:
:mod:`.mapping` (pure), :mod:`.receiver` (discovery + sockets + run
synthesis), :mod:`.control` (the gated writes), :mod:`.bridge`.

Configuration (:func:`from_env`):

=================================  ==========================  ===========================================
variable                           default                     meaning
=================================  ==========================  ===========================================
``AEP_OPENHANDS_URL``              ``http://127.0.0.1:8000``   the agent server (its default port, loopback)
``AEP_OPENHANDS_SESSION_API_KEY``  unset                       the server's session key (header + socket
                                                               auth frame; never logged, never in a URL)
``AEP_OPENHANDS_POLL``             ``15``                      conversation discovery interval, seconds
``AEP_OPENHANDS_DELTAS``           ``0``                       ``1``: map ``StreamingDeltaEvent``
``AEP_OPENHANDS_CONTROL``          ``0``                       ``1`` (with ``AEP_TOKEN``): the five writes
``AEP_OPENHANDS_ACK_GUARD_MS``     ``8000``                    REST-settled ack guard (< the 10 s window)
``AEP_AGENT_NAME``                 ``openhands``               the AEP agent id
=================================  ==========================  ===========================================
"""
from __future__ import annotations

from typing import Mapping

from bridges.core.capture import CapturePolicy
from bridges.core.paths import state_dir as _state_dir
from bridges.core.settings import EnvReader

from .bridge import OpenHandsBridge
from .receiver import Settings

__all__ = ["OpenHandsBridge", "from_env", "Settings"]

DEFAULT_URL = "http://127.0.0.1:8000"


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> OpenHandsBridge:
    """Build the bridge from the environment. Never raises for bad values:
    each becomes one line of :meth:`OpenHandsBridge.preflight` (the
    supervisor refuses to start on any)."""
    r = EnvReader(environ)
    problems = r.problems
    url = r.url("AEP_OPENHANDS_URL", DEFAULT_URL, hint=" (the agent server's base URL; the key "
                "goes in AEP_OPENHANDS_SESSION_API_KEY)")
    poll = r.seconds("AEP_OPENHANDS_POLL", 15.0)
    guard = r.integer("AEP_OPENHANDS_ACK_GUARD_MS", 8000, minimum=1, maximum=9999,
                      unit="milliseconds inside the declared 10000 ms ack window")
    deltas = r.flag("AEP_OPENHANDS_DELTAS")
    control = r.flag("AEP_OPENHANDS_CONTROL")
    token = environ.get("AEP_TOKEN") or None
    if control and not token:
        problems.append("AEP_OPENHANDS_CONTROL=1 needs AEP_TOKEN: control is refused on unauthenticated "
                        "bindings (set AEP_TOKEN or unset AEP_OPENHANDS_CONTROL)")
    key = environ.get("AEP_OPENHANDS_SESSION_API_KEY") or None
    agent = (environ.get("AEP_AGENT_NAME") or "openhands").strip() or "openhands"
    settings = Settings(url=url, key=key, poll=poll, deltas=deltas, control=control, guard_ms=guard,
                        state_dir=_state_dir(environ), agent=agent)
    return OpenHandsBridge(settings, policy, token=token, problems=problems)
