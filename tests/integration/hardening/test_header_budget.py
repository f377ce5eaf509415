"""Issue 25 (degraded): headers trickled on 300 connections cut ``/stream``
for the length of the attack, because one connection cap was shared by
connections still sending their request headers and the ones being served.

Now a listener keeps a separate budget for connections waiting for their
request headers (``bridges/core/http.py`` ``_Budgets``): when it is full
the one that has waited longest is closed, and each has a header timeout.
The real daemon (``aep-bridges relay``, ``AEP_MAX_CONNECTIONS=64``) is
attacked from outside with a bounded number of trickling sockets; an
established ``/stream`` consumer keeps receiving, a new ``GET /healthz``
is answered, and a ``/stream`` consumer that connects during the attack
is served past the 2 s an overflow connection gets.
"""
from __future__ import annotations

import socket
import threading
import time

import httpx

from tests.support.daemon import DaemonProcess
from tests.support.hardening import event, fd_count, post_events, raw_connect

ATTACKERS = 300


class _Reader(threading.Thread):
    """An SSE consumer of ``/stream``: counts ``data:`` lines; ``ended``
    once its stream is over (cut or closed)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.events = url, 0
        self.ready, self.ended = threading.Event(), threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("GET", self.url + "/stream", timeout=None, trust_env=False) as r:
                self.ready.set()
                for line in r.iter_lines():
                    self.events += line.startswith("data:")
        except httpx.HTTPError:
            pass
        finally:
            self.ended.set()


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout}s")


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.01)
    try:
        return s.recv(1024) == b""
    except (socket.timeout, BlockingIOError):
        return False
    except OSError:
        return True  # reset


def test_trickled_headers_never_shed_stream_consumers_or_new_requests(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_MAX_CONNECTIONS": "64"}, args=("relay",)).start()
    held: list[socket.socket] = []
    try:
        early = _Reader(d.url)
        early.start()
        assert early.ready.wait(10)
        fds = fd_count(d.proc.pid)
        for _ in range(ATTACKERS):  # unfinished request heads, more than the whole cap
            try:
                held.append(raw_connect(d.port, b"GET /healthz HTTP/1.1\r\nHo"))
            except OSError:
                pass  # refused at the door is a defined answer too
        for s in held:  # one more byte each, a trickle
            try:
                s.send(b"s")
            except OSError:
                pass
        # a new well-formed request is answered during the attack
        r = httpx.get(d.url + "/healthz", timeout=5, trust_env=False)
        assert r.status_code == 200 and r.json()["ok"] is True
        # a consumer connecting during the attack is served, not cut after 2 s
        late = _Reader(d.url)
        late.start()
        assert late.ready.wait(10)
        time.sleep(3)
        assert post_events(d.url, [event(i, "trickle") for i in range(5)]).status_code == 202
        _wait(lambda: early.events >= 5 and late.events >= 5, 20,
              f"both consumers got the 5 events (early {early.events}, late {late.events})")
        assert not early.ended.is_set() and not late.ended.is_set()
        # what the attack holds is the header budget (a quarter of the cap), not the cap
        grown = fd_count(d.proc.pid) - fds
        assert grown < 40, f"{grown} descriptors held by {len(held)} unfinished requests"
        # and each unfinished request ends at the header timeout
        _wait(lambda: all(_closed_by_server(s) for s in held), 30,
              "every unfinished request closed by the daemon")
        assert not early.ended.is_set() and not late.ended.is_set()
    finally:
        for s in held:
            s.close()
        d.stop(timeout=20)
        d.kill()
