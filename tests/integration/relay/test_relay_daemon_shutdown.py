"""``aep-bridges relay`` as an operator runs it, with an SSE consumer that
stopped reading mid-stream: SIGTERM still ends the process cleanly (exit 0,
inside the daemon's 5 s drain deadline). hypercorn shields its socket
writes, so without the relay's per-connection abort the stuck stream would
hold the process forever."""
from __future__ import annotations

import json
import socket

import httpx

from tests.support.daemon import run_daemon


def test_sigterm_with_a_stalled_sse_consumer(tmp_path):
    with run_daemon(tmp_path, {"AEP_TOKEN": "tok"}, args=("relay",)) as d:
        port = int(d.url.rsplit(":", 1)[1])
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(b"GET /stream?access_token=tok HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        try:
            pad = "x" * 60_000
            for k in range(4):  # ~12 MB toward a peer that reads nothing
                body = "\n".join(json.dumps({
                    "aep": "0.1", "id": f"E{k}-{i}", "type": "tool.completed",
                    "time": "2026-11-30T12:00:00Z", "source": "aep://h/agent/a/session/s",
                    "agent": "a", "session": "s", "seq": k * 50 + i, "severity": "notice",
                    "data": {"pad": pad}}) for i in range(50))
                r = httpx.post(d.url + "/events", content=body, timeout=30,
                               headers={"AEP-Version": "0.1", "content-type": "application/x-ndjson",
                                        "authorization": "Bearer tok"})
                assert r.status_code == 202
            counters = d.healthz("tok")["relay_counts"]["counters"]
            # the relay shed it (§8.4) or it is still stuck mid-send: either way
            # SIGTERM must end the process
            assert d.stop(timeout=20) == 0, d.log()
        finally:
            stalled.close()
    assert counters["events"] == 200
    assert "drain exceeded" not in d.log()
