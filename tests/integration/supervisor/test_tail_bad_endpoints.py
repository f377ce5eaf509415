"""Issue 25 (degraded): ``aep-bridges tail`` against endpoints that send what
is not AEP. A stub SSE endpoint (fault injection: no real relay sends
these) answers every ``GET /stream``; ``tail`` runs as the real command.
Before, ``data`` that was a JSON string made the SDK consumer raise in its
reader and reconnect to the same bytes forever ("'str' object has no
attribute 'get' (retrying)"), and a web page made it reconnect silently."""
from __future__ import annotations

import io
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from tests.support.daemon import console_script
from tests.support.http_stub import LoopbackHttp

GOOD = {"id": "01J0000000000000000000GOOD", "type": "tool.completed", "agent": "stub",
        "source": "stub", "session": "s1", "seq": 0, "epoch": 1,
        "time": "2026-12-07T03:00:00.000Z", "data": {"tool": {"name": "t"}}}
BAD = ["this is not json", json.dumps("a string"), json.dumps([1, 2]), json.dumps(7),
       json.dumps({"no": "envelope"}), "[" * 50_000]


def sse(*datas: str) -> bytes:
    return b"".join(b"data: " + d.encode() + b"\n\n" for d in datas)


class Stub(LoopbackHttp):
    """A one-body HTTP endpoint on loopback; each request gets ``body`` with
    ``ctype`` and is then held open until :meth:`close` (a live stream)."""

    def __init__(self, body: bytes, ctype: str = "text/event-stream") -> None:
        self.requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                if self.path.startswith("/stream"):  # tail's /healthz look-up is no reconnect
                    stub.requests += 1
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                stub.stop.wait(60)

            def log_message(self, *args) -> None:
                pass

        super().__init__(Handler)


@pytest.fixture
def stub_factory():
    stubs: list[Stub] = []

    def make(body: bytes, ctype: str = "text/event-stream") -> Stub:
        stubs.append(Stub(body, ctype))
        return stubs[-1]
    yield make
    for s in stubs:
        s.close()


def tail(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run(console_script() + ["tail", "--url", url, "--color", "never", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_events_that_are_not_aep_are_skipped_named_once_and_counted(stub_factory):
    stub = stub_factory(sse(*BAD, *BAD, json.dumps(GOOD)))
    p = tail(stub.url, "--limit", "1", "--json")
    assert p.returncode == 0, p.stderr
    assert [json.loads(ln) for ln in p.stdout.splitlines()] == [GOOD]
    lines = p.stderr.splitlines()
    # the connect line (issue 29), then one line per kind (not JSON, not an
    # object, no envelope), then the count on exit
    assert [ln for ln in lines if "connected to" in ln] == [f"aep-bridges tail: connected to {stub.url}"]
    lines = [ln for ln in lines if "connected to" not in ln]
    assert len(lines) == 4, lines
    assert "not JSON" in lines[0] and "a JSON str, not an object" in lines[1]
    assert "without an AEP envelope" in lines[2]
    assert "skipped 12 event(s)" in lines[3] and "not-object: 6" in lines[3], lines[3]
    assert stub.requests == 1  # the stream went on: no reconnect


def test_an_answer_that_is_no_event_stream_ends_tail_with_a_message(stub_factory):
    stub = stub_factory(b"<html><body>hello</body></html>", "text/html; charset=utf-8")
    p = tail(stub.url)
    assert p.returncode == 1
    assert "not an AEP event stream" in p.stderr and "text/html" in p.stderr, p.stderr
    assert p.stdout == ""


def test_the_timeline_goes_on_past_bad_events_in_process(stub_factory):
    from supervisor.tools.tail import run
    stub = stub_factory(sse(json.dumps("x"), json.dumps(GOOD)))
    out, err = io.StringIO(), io.StringIO()
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(
        run(stub.url, limit=1, out=out, err=err, color="never")), daemon=True)
    t.start()
    t.join(60)
    assert done == [0], err.getvalue()
    assert "t ✓ completed" in out.getvalue()
    assert "skipped 1 event(s) that were not AEP (not-object: 1)" in err.getvalue()
