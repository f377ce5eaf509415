"""Issue 25, re-attack: the paths bridges mount on the daemon's listener
(``/bridges/acp/{agent}``, ``/hooks/<agent>``) refuse what the Host guard,
the Origin rule and ``AEP_TOKEN`` refuse. A WebSocket upgrade with bytes
behind it (a pipelined request, a body) makes that refusal's answer fail
in h11 (hypercorn#225): the relay's own paths count it and log one line per
kind, but a mounted path logged hypercorn's "Error in ASGI Framework" with
a full traceback (~2.5 KB) for every such request, without a token: an
unauthenticated log flood."""
from __future__ import annotations

import socket

from tests.support.daemon import DaemonProcess

TOKEN = "mount-faults-token"


def _upgrade(path: bytes, extra: bytes = b"") -> bytes:
    return (b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n" + extra + b"\r\n"
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")


def _send(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        return out


def test_refused_upgrades_with_pipelined_bytes_do_not_flood_the_log(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_BRIDGE_ACP": "1", "AEP_BRIDGE_CLAUDE_CODE": "1"},
                      token=TOKEN)
    d.start()
    try:
        before = d.log().count("\n")
        port = d.port
        for _ in range(20):  # bounded: 20 of each kind of refusal
            _send(port, _upgrade(b"/bridges/acp/acp"))                      # no token
            _send(port, _upgrade(b"/hooks/claude-code"))                    # no token
            _send(port, _upgrade(b"/bridges/acp/acp", b"Origin: http://evil\r\n"))
        log = d.log()
        assert "Traceback" not in log
        assert log.count("\n") - before <= 6, log[-3000:]  # one line per kind, not per request
        assert d.healthz(TOKEN)["ok"] is True
    finally:
        d.stop(timeout=20)
