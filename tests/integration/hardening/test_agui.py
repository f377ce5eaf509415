"""Issue 25, the AG-UI proxy attacked from outside: the real daemon
(``AEP_BRIDGE_AGUI=1``) in front of a raw-socket stub upstream (fault
injection: it records what reaches it, hangs, or holds an event open),
attacked over loopback with bounded loops.

- row 1: a request target cannot move the request to another host or port
  (``@127.0.0.1:PORT/x``, the absolute form, ``Host``), nor climb above
  the upstream's path prefix (``..``, percent-encoded too): ``400``, and
  the upstream's userinfo reaches only the upstream;
- row 10: the upstream's password is in no log line (DEBUG included), no
  ``/healthz``, no ``aep-bridges check`` output, no answer to the UI;
- row 2: frontends that leave before a hung upstream answers release its
  connections at once; a legitimate stream works after;
- degraded: the bytes of unfinished events held across streams are bounded
  (``AEP_AGUI_MAX_BUFFERED``), what goes past it is counted in ``/healthz``
  and ``/metrics``, and the UI still gets every byte.
"""
from __future__ import annotations

import base64
import hashlib
import json
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.agui import AguiDaemon
from tests.support.daemon import console_script
from tests.support.hardening import raw_connect, rss_kib

TOKEN = "hardening-agui-token"
PASSWORD = "s3cret-Pa55word"  # noqa: S105 -- the value the tests look for everywhere
RUN_STARTED = b'data: {"type":"RUN_STARTED","threadId":"t","runId":"r"}\n\n'
RUN_FINISHED = b'data: {"type":"RUN_FINISHED","threadId":"t","runId":"r"}\n\n'


class Stub:
    """A raw HTTP/1.1 upstream on loopback, one thread per connection, one
    request per connection (``Connection: close``). ``GET`` (the bridge's
    probe) is always answered ``200``; a ``POST`` per :attr:`mode`:
    ``echo`` (JSON of the target and headers), ``hang`` (never answered;
    :attr:`hanging` counts those whose client is still connected),
    ``stream`` (a short AG-UI run), ``threads`` (a short run in the POSTed
    ``threadId``), ``big`` (a run whose one event of
    :attr:`big` bytes is held open until :attr:`release` is set).
    :attr:`seen`: every request's ``(method, target, headers)``."""

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.hanging = 0
        self.big = 0
        self.sent: list[bytes] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (Linux)
        except OSError:
            pass
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split(" ")[:2]
            headers = {k.strip().lower(): v.strip() for k, v in
                       (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            want = int(headers.get("content-length", "0"))
            while len(body) < want:
                more = conn.recv(65536)
                if not more:
                    return
                body += more
            with self._lock:
                self.seen.append((method, target, headers))
            mode = "echo" if method == "GET" else self.mode
            if mode == "threads":
                self._threads(conn, body)
                return
            getattr(self, "_" + mode)(conn, target, headers)

    @staticmethod
    def _answer(conn: socket.socket, ctype: str, body: bytes) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}"
                     "\r\nconnection: close\r\n\r\n".encode() + body)

    def _echo(self, conn: socket.socket, target: str, headers: dict[str, str]) -> None:
        self._answer(conn, "application/json", json.dumps({"target": target}).encode())

    def _stream(self, conn: socket.socket, target: str, headers: dict[str, str]) -> None:
        self._answer(conn, "text/event-stream", RUN_STARTED + RUN_FINISHED)

    def _threads(self, conn: socket.socket, body: bytes) -> None:
        """A short AG-UI run in the POSTed input's ``threadId`` (a new session per thread)."""
        tid = json.loads(body).get("threadId", "t").encode()
        self._answer(conn, "text/event-stream", RUN_STARTED.replace(b'"t"', b'"' + tid + b'"')
                     + RUN_FINISHED.replace(b'"t"', b'"' + tid + b'"'))

    def _hang(self, conn: socket.socket, target: str, headers: dict[str, str]) -> None:
        with self._lock:
            self.hanging += 1
        try:
            conn.settimeout(120)
            while conn.recv(4096):
                pass
        except OSError:
            pass
        finally:
            with self._lock:
                self.hanging -= 1

    def _big(self, conn: socket.socket, target: str, headers: dict[str, str]) -> None:
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"connection: close\r\n\r\n")
        opening = RUN_STARTED + b'data: {"type":"STATE_SNAPSHOT","snapshot":{"blob":"'
        body = [opening] + [b"x" * 65536] * (self.big // 65536)
        tail = b'"}}\n\n' + RUN_FINISHED
        digest = hashlib.sha256()
        try:
            conn.sendall(head)
            for piece in body:
                conn.sendall(piece)
                digest.update(piece)
            self.release.wait(120)
            conn.sendall(tail)
            digest.update(tail)
        except OSError:
            return
        with self._lock:
            self.sent.append(digest.digest())


def _daemon(tmp_path: Path, stub: Stub, env: dict[str, str] | None = None, *,
            prefix: str = "", userinfo: str = "") -> AguiDaemon:
    upstream = f"http://{userinfo}127.0.0.1:{stub.port}{prefix}"
    return AguiDaemon(tmp_path / "state", upstream, env, token=TOKEN).start()


def _raw(port: int, request: bytes) -> bytes:
    """One raw request on its own connection; the answer's head and its
    ``content-length`` body (``b""`` when the connection closes first)."""
    with raw_connect(port, request) as s:
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
        head = out.partition(b"\r\n\r\n")[0].lower()
        length = int(head.split(b"content-length:", 1)[1].split(b"\r\n")[0])
        while len(out) - len(head) - 4 < length and (chunk := s.recv(65536)):
            out += chunk
        return out


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout}s (last: {last})")


# ------------------------------------------------------------------ row 1: SSRF


@pytest.mark.parametrize("prefix", ["", "/base"])
def test_no_request_target_or_host_moves_the_request_off_the_configured_upstream(tmp_path,
                                                                                   prefix):
    upstream, victim = Stub(), Stub()
    d = _daemon(tmp_path, upstream, prefix=prefix, userinfo=f"agent:{PASSWORD}@")
    try:
        port = d.proxy_port
        before = len(upstream.seen)

        def get(target: str, host: str | None = None) -> bytes:
            host = host or f"127.0.0.1:{port}"
            return _raw(port, f"POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 2"
                              "\r\nConnection: close\r\n\r\n{}".encode())

        refused = [f"@127.0.0.1:{victim.port}/x", f"http://127.0.0.1:{victim.port}/x",
                   "*",
                   "/../x", "/a/../../x", "/%2e%2e/x", "/%2E%2E/x", "/%2e./x", "/.%2E/x",
                   "/a/%2e%2e/%2E%2e/x", "/..%2fx/../x", "/..%5cx", "/%252e%252e/x",
                   "/..\\x"]
        for target in refused:
            answer = get(target)
            assert answer.startswith(b"HTTP/1.1 400 "), (target, answer[:200])
        assert victim.seen == [], victim.seen  # nothing, credentials least of all
        assert len(upstream.seen) == before, upstream.seen[before:]

        # a Host naming the victim changes nothing: the request goes upstream, with its Host
        answer = get("/run", host=f"127.0.0.1:{victim.port}")
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        assert victim.seen == []
        method, target, headers = upstream.seen[-1]
        assert (method, target, headers["host"]) == ("POST", prefix + "/run",
                                                      f"127.0.0.1:{upstream.port}")
        # the configured userinfo goes to the configured upstream, as Basic
        want = base64.b64encode(f"agent:{PASSWORD}".encode()).decode()
        assert headers["authorization"] == f"Basic {want}"

        # dot segments that stay below the prefix are resolved, not refused
        for sent, arrived in (("/a/../run", "/run"), ("/a/./b/%2e%2e/c?q=1", "/a/c?q=1"),
                              ("/agent/run%20x", "/agent/run%20x")):
            assert get(sent).startswith(b"HTTP/1.1 200 "), sent
            assert upstream.seen[-1][1] == prefix + arrived, (sent, upstream.seen[-1])
        assert d.healthz()["bridges"]["agui"]["counters"]["agui.bad_requests"] == len(refused)
    finally:
        d.stop(timeout=20)
        upstream.close()
        victim.close()


# ------------------------------------------------------------------ row 10: no password anywhere


def test_the_upstream_password_is_in_no_log_healthz_check_output_or_answer(tmp_path):
    stub = Stub("stream")
    d = _daemon(tmp_path, stub, {"AEP_LOG_LEVEL": "debug"}, prefix="/p",
                userinfo=f"agent:{PASSWORD}@")
    try:
        r = httpx.post(d.proxy_url + "/", content=b"{}", timeout=30, trust_env=False)
        assert r.status_code == 200 and b"RUN_FINISHED" in r.content
        # refused 400 and logged at DEBUG (today's code; the old one forwarded it)
        httpx.post(d.proxy_url + "/%2e%2e/x", content=b"{}", timeout=30, trust_env=False)
        health = json.dumps(d.healthz())  # with the token: counters and detail too
        stub.close()  # the agent goes away: a 502, its warning, the probe failing
        r = httpx.post(d.proxy_url + "/", content=b"{}", timeout=30, trust_env=False)
        assert r.status_code == 502
        assert PASSWORD not in r.text and "127.0.0.1" in r.text
        _wait(lambda: d.healthz()["bridges"]["agui"]["source"] is False, 30,
              "the probe saw the agent gone")
        health += json.dumps(d.healthz()) + json.dumps(d.healthz(token=""))
        assert PASSWORD not in health
    finally:
        d.stop(timeout=20)
    log = d.log()
    assert "agui proxy listening on" in log and "AG-UI upstream" in log
    assert PASSWORD not in log

    env = {**d.env, "AEP_STATE_DIR": str(tmp_path / "check")}
    for upstream in (f"http://agent:{PASSWORD}@127.0.0.1:{stub.port}/p",  # ok
                     f"http://agent:{PASSWORD}@127.0.0.1:notaport",       # bad port
                     f"ftp://agent:{PASSWORD}@127.0.0.1",                  # bad scheme
                     f"http://agent:{PASSWORD}@127.0.0.1/?q=1"):           # a query
        out = subprocess.run(console_script() + ["check"], env={**env,
                             "AEP_AGUI_UPSTREAM": upstream}, capture_output=True, text=True,
                             timeout=60)
        assert "AEP_AGUI_UPSTREAM" in out.stdout + out.stderr or out.returncode == 0, out
        assert PASSWORD not in out.stdout + out.stderr, (upstream, out.stdout, out.stderr)
    assert '"level": "debug"' in log  # DEBUG lines were written, and looked at


# ------------------------------------------------------------------ row 2: frontends that leave


def test_frontends_leaving_before_a_hung_upstream_answers_release_its_connections(tmp_path):
    stub = Stub("hang")
    d = _daemon(tmp_path, stub)
    held: list[socket.socket] = []
    try:
        n = 120
        request = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{d.proxy_port}\r\n"
                   "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}").encode()
        for _ in range(n):
            held.append(raw_connect(d.proxy_port, request))
        _wait(lambda: stub.hanging >= n, 30, f"{n} requests hanging upstream")
        for s in held:
            s.close()
        # every upstream request of a frontend that left is given up: the
        # stub sees each of its connections closed
        _wait(lambda: stub.hanging == 0, 30, "the upstream connections released")
        counters = d.healthz()["bridges"]["agui"]["counters"]
        assert counters["agui.client_disconnects"] == n
        stub.mode = "stream"
        r = httpx.post(d.proxy_url + "/", content=b"{}", timeout=30, trust_env=False)
        assert r.status_code == 200 and r.content == RUN_STARTED + RUN_FINISHED
    finally:
        for s in held:
            s.close()
        d.stop(timeout=20)
        stub.close()


# ------------------------------------------------------------------ degraded: a total bound


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{want}}} in /metrics")


def test_event_bytes_held_across_streams_are_bounded_counted_and_passed_through(tmp_path):
    streams, cap, budget = 20, 4 << 20, 4 << 20
    stub = Stub("big")
    stub.big = cap - (256 << 10)  # each event just under the per-event cap
    d = _daemon(tmp_path, stub, {"AEP_AGUI_MAX_EVENT": str(cap),
                                 "AEP_AGUI_MAX_BUFFERED": str(budget)})
    try:
        base = rss_kib(d.proc.pid)
        got: dict[int, tuple[int, bytes]] = {}
        received = [0] * streams

        def ui(i: int) -> None:
            digest = hashlib.sha256()
            with httpx.stream("POST", d.proxy_url + "/", content=b"{}", timeout=120,
                              trust_env=False) as r:
                for chunk in r.iter_raw():
                    digest.update(chunk)
                    received[i] += len(chunk)
                got[i] = (r.status_code, digest.digest())

        with ThreadPoolExecutor(streams) as pool:
            futures = [pool.submit(ui, i) for i in range(streams)]
            # every stream holds its open event (the UI has all of it so far)
            _wait(lambda: min(received) >= stub.big, 120, "every event's bytes through")
            time.sleep(1)
            grown = (rss_kib(d.proc.pid) - base) // 1024
            stub.release.set()
            for f in futures:
                f.result(timeout=120)
        # the proxy is transparent: every UI got exactly what the agent sent
        assert sorted(h for _, h in got.values()) == sorted(stub.sent)
        assert len(got) == streams and {s for s, _ in got.values()} == {200}
        # held across streams: the budget, not streams x the event cap
        assert grown < (streams * stub.big >> 20) // 2, f"RSS grew {grown} MiB"
        counters = d.healthz()["bridges"]["agui"]["counters"]
        over = counters["agui.over_budget"]
        assert streams - budget // stub.big <= over <= streams, counters
        assert counters.get("agui.oversize", 0) == 0  # each event is under its own cap
        text = httpx.get(d.url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"},
                         timeout=10, trust_env=False).text
        assert _metric(text, "aep_bridges_events_dropped_total", reason="agui-over-budget",
                       severity="*") == over
    finally:
        d.stop(timeout=20)
        stub.close()


def test_new_sessions_past_the_budget_pass_through_unmapped_and_make_no_files(tmp_path):
    """Issue 25, fifth outside attack: 1,500 unauthenticated runs, each with
    a new ``threadId``, made 1,500 session log files (bounded only by CPU).
    Past ``AEP_AGUI_NEW_SESSIONS_PER_S`` (here 1 a second, bursts of 5)
    a new session's run still reaches the UI whole, but it is not mapped
    or logged: counted ``sessions_refused`` in ``/healthz`` and ``/metrics``."""
    stub = Stub("threads")
    d = _daemon(tmp_path, stub, {"AEP_AGUI_NEW_SESSIONS_PER_S": "1"})
    n = 40  # far past the burst: the bucket refills 1 a second
    try:
        def one(i: int) -> bytes:
            body = json.dumps({"threadId": f"th-{i}", "runId": "r"}).encode()
            r = httpx.post(d.proxy_url + "/", content=body, timeout=60, trust_env=False)
            assert r.status_code == 200, r.text
            return r.content

        with ThreadPoolExecutor(8) as ex:
            answers = list(ex.map(one, range(n)))
        for i, got in enumerate(answers):  # the UI's run, whole, mapped or not
            assert f'"threadId":"th-{i}"'.encode() in got and b"RUN_FINISHED" in got

        def counted() -> int:
            return d.healthz(TOKEN)["bridges"]["agui"]["counters"].get("sessions_refused", 0)
        logs = d.state / "logs"

        def files() -> int:
            return len(list(logs.rglob("th-*.jsonl")))
        _wait(lambda: counted() + files() == n, 30, "every run mapped or refused")
        assert counted() >= 1 and files() < n, (counted(), files())
        metrics = httpx.get(d.url + "/metrics", headers={"authorization": f"Bearer {TOKEN}"},
                            timeout=10, trust_env=False).text
        assert 'reason="session-refused"' in metrics
    finally:
        d.stop(timeout=20)
        stub.close()
