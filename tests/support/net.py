"""Loopback plumbing for the tests: a free port number for processes that need
one up front (the daemon's listeners, a vendor server's ``--port``)."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago. Another process may
    take it before ours binds: :class:`tests.support.daemon.DaemonProcess`
    retries that race."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
