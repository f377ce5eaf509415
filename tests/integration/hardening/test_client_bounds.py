"""Round 16 of issue 25: the client commands (``tail``, ``respond``,
``check``) against a hostile endpoint. An endless ``/healthz`` answer grew
``tail`` to 4.3 GB in 6 s (read whole: ``httpx``'s timeout is per read),
and a replay of nothing but ``: ping`` comments kept tail's catch-up waiting
forever (its deadline was checked only when an event came). A stub
endpoint on loopback (fault injection) streams forever and counts what it
sent; the reads end within their bounds."""
from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from supervisor.tools import control, tailstream
from tests.support.http_stub import LoopbackHttp


class Endless(LoopbackHttp):
    """Every GET is answered 200 with ``ctype`` and ``chunk`` written again
    and again (``every`` seconds apart) until the client goes away."""

    def __init__(self, chunk: bytes, ctype: str, every: float = 0.0) -> None:
        self.sent = 0
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.end_headers()
                try:
                    while not me.stop.is_set():
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        me.sent += len(chunk)
                        if every:
                            me.stop.wait(every)
                except OSError:  # the client stopped reading and left
                    return

            def log_message(self, *args) -> None:
                pass

        super().__init__(Handler)


@pytest.fixture
def endless():
    made: list[Endless] = []

    def make(chunk: bytes, ctype: str = "application/json", every: float = 0.0) -> Endless:
        made.append(Endless(chunk, ctype, every))
        return made[-1]
    yield make
    for e in made:
        e.close()


def test_an_endless_healthz_is_read_to_its_cap_only(endless):
    server = endless(b'{"ok": "' + b"x" * 65536)
    with pytest.raises(ValueError, match="over"):
        tailstream.get_json(server.url + "/healthz", {}, timeout=30)
    assert tailstream.held_sessions(server.url, None) is None
    # the kernel's buffers hold some more than was read; never the gigabytes of before
    assert server.sent < tailstream.HEALTHZ_BYTES * 2 + (16 << 20)


def test_a_healthz_that_drips_ends_at_its_deadline(endless):
    server = endless(b" ", every=0.05)
    start = time.monotonic()
    with pytest.raises((ValueError, httpx.HTTPError)):
        tailstream.get_json(server.url + "/healthz", {}, timeout=1.0)
    assert server.sent < 1000  # a bound on what was read, not a timing assertion
    assert time.monotonic() - start < 30


def test_a_catch_up_of_comments_only_ends_at_its_deadline(endless):
    server = endless(b": ping\n\n", ctype="text/event-stream", every=0.01)
    got = list(tailstream.held(server.url, None, {}, from_="all", deadline=time.monotonic() + 1.0))
    assert got == []
    assert server.stop.is_set() is False  # the endpoint never ended it: the deadline did


def test_a_held_read_that_never_ends_raises_a_transport_error(endless, monkeypatch):
    monkeypatch.setattr(control, "HELD_READ_S", 1.0)
    server = endless(b": ping\n\n", ctype="text/event-stream", every=0.01)
    with pytest.raises(httpx.HTTPError):
        list(control.held_events(server.url, None, {"type": "attention.requested"}))
