"""Start-up posture warnings (issue 10 #12): listeners reachable from the
network without a credential start, but never silently.

- the embedded relay on a non-loopback ``AEP_LISTEN`` without ``AEP_TOKEN``:
  anyone on the network can read every stream and post events;
- an OTLP listener on a non-loopback address: OTLP carries no credential
  here at all, so anyone on the network can inject telemetry."""
from __future__ import annotations

import ipaddress
import socket
from typing import Any, Iterable

from .config import Config


def is_loopback(host: str) -> bool:
    """True when ``host`` (a name or literal) resolves only to loopback
    addresses; an unresolvable name or a wildcard (``0.0.0.0``, ``::``) is not."""
    h = host.strip("[]").split("%", 1)[0]
    if h.lower() == "localhost" or h.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(h, None)
    except OSError:
        return False
    addrs = {str(i[4][0]) for i in infos}
    try:
        return bool(addrs) and all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback
                                   for a in addrs)
    except ValueError:
        return False


def exposure_warnings(cfg: Config, bridges: Iterable[Any] = ()) -> list[str]:
    """One loud line per listener exposed beyond loopback without a credential."""
    out: list[str] = []
    if cfg.embedded_relay and not cfg.token and not is_loopback(cfg.listen[0]):
        out.append(f"AEP_LISTEN={cfg.listen[0]}:{cfg.listen[1]} is not a loopback address and "
                   "AEP_TOKEN is unset: the relay is readable and writable by anyone on the "
                   "network (set AEP_TOKEN, or listen on 127.0.0.1)")
    for b in bridges:
        listeners = getattr(b, "listeners", None)
        config = getattr(b, "config", None)
        try:
            addrs = listeners() if callable(listeners) else {}
        except ValueError:
            continue  # the bridge's preflight reports it
        for kind, addr in addrs.items():
            if addr is not None and not is_loopback(addr[0]):
                setting = getattr(config, "setting", None)
                name = (setting(kind) if callable(setting)
                        else f"{getattr(b, 'name', 'bridge')} {kind} listener")
                out.append(f"{name}={addr[0]}:{addr[1]} is not a loopback address: OTLP takes "
                           "no credential, anyone on the network can send telemetry as "
                           f"{getattr(b, 'agent', 'this agent')} (listen on 127.0.0.1 unless "
                           "the network is trusted)")
    return out
