"""A plain HTTP endpoint on loopback for fault injection: an
``http.server`` request handler served in daemon threads on
``127.0.0.1:0``, with a ``stop`` event the handler may wait on (to hold a
request open) and :meth:`LoopbackHttp.close`, which sets it and shuts the
server down."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackHttp:
    """``handler`` served on an ephemeral loopback port (``url``)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.stop = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
