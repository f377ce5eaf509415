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

from .bridge import OpenHandsBridge, url_problem
from .receiver import Settings

__all__ = ["OpenHandsBridge", "from_env", "Settings"]

DEFAULT_URL = "http://127.0.0.1:8000"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def from_env(environ: Mapping[str, str], *, policy: CapturePolicy) -> OpenHandsBridge:
    """Build the bridge from the environment. Never raises for bad values:
    each becomes one line of :meth:`OpenHandsBridge.preflight` (the
    supervisor refuses to start on any)."""
    problems: list[str] = []

    def flag(name: str) -> bool:
        raw = (environ.get(name) or "").strip().lower()
        if raw in _TRUE:
            return True
        if raw not in _FALSE:
            problems.append(f"{name}={environ.get(name)!r}: expected 1 or 0")
        return False

    url = (environ.get("AEP_OPENHANDS_URL") or DEFAULT_URL).strip().rstrip("/")
    if (p := url_problem(url)) is not None:
        problems.append(p)
    poll = 15.0
    raw_poll = environ.get("AEP_OPENHANDS_POLL")
    if raw_poll not in (None, ""):
        try:
            poll = float(raw_poll)
            if not 0 < poll <= 86400:
                raise ValueError
        except ValueError:
            problems.append(f"AEP_OPENHANDS_POLL={raw_poll!r}: expected seconds > 0 (e.g. 15)")
            poll = 15.0
    guard = 8000
    raw_guard = environ.get("AEP_OPENHANDS_ACK_GUARD_MS")
    if raw_guard not in (None, ""):
        try:
            guard = int(raw_guard)
            if not 0 < guard < 10000:
                raise ValueError
        except ValueError:
            problems.append(f"AEP_OPENHANDS_ACK_GUARD_MS={raw_guard!r}: expected milliseconds in 1..9999 "
                            "(inside the declared 10000 ms ack window)")
            guard = 8000
    deltas = flag("AEP_OPENHANDS_DELTAS")
    control = flag("AEP_OPENHANDS_CONTROL")
    token = environ.get("AEP_TOKEN") or None
    if control and not token:
        problems.append("AEP_OPENHANDS_CONTROL=1 needs AEP_TOKEN: control is refused on unauthenticated "
                        "bindings (set AEP_TOKEN or unset AEP_OPENHANDS_CONTROL)")
    key = environ.get("AEP_OPENHANDS_SESSION_API_KEY") or None
    agent = (environ.get("AEP_AGENT_NAME") or "openhands").strip() or "openhands"
    settings = Settings(url=url, key=key, poll=poll, deltas=deltas, control=control, guard_ms=guard,
                        state_dir=_state_dir(environ), agent=agent)
    return OpenHandsBridge(settings, policy, token=token, problems=problems)
