"""Run the real daemon (``aep-bridges``) as a subprocess on free loopback
ports, and read its stream with the protocol's SDK consumer."""
from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def console_script() -> list[str]:
    exe = Path(sys.executable).with_name("aep-bridges")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "supervisor.cli"]


class Daemon:
    """A running ``aep-bridges`` process. ``url`` is its relay/health base."""

    def __init__(self, proc: subprocess.Popen, url: str, env: dict[str, str], log_path: Path):
        self.proc = proc
        self.url = url
        self.env = env
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def healthz(self, token: str | None = None) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + "/healthz", headers=headers, timeout=5).json()

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


@contextlib.contextmanager
def run_daemon(tmp_path: Path, env: dict[str, str] | None = None, *, args: tuple[str, ...] = ("run",),
               wait: bool = True, ready_timeout: float = 30.0) -> Iterator[Daemon]:
    """Start the daemon with defaults on free ports (``AEP_LISTEN``, both
    OTLP listeners, ``AEP_STATE_DIR`` under ``tmp_path``); ``env`` overrides.
    Waits for ``/healthz`` unless ``wait=False``. Always terminates it."""
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    full.update({
        "AEP_LISTEN": f"127.0.0.1:{port}",
        "AEP_OTLP_GRPC_LISTEN": f"127.0.0.1:{free_port()}",
        "AEP_OTLP_HTTP_LISTEN": f"127.0.0.1:{free_port()}",
        "AEP_STATE_DIR": str(tmp_path / "state"),
        "AEP_LOG_FORMAT": "json",
    })
    full.update(env or {})
    tmp_path.mkdir(parents=True, exist_ok=True)
    log_path = tmp_path / f"daemon-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(console_script() + list(args), env=full, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
    d = Daemon(proc, f"http://{full['AEP_LISTEN']}", full, log_path)
    try:
        if wait:
            deadline = time.monotonic() + ready_timeout
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"daemon exited {proc.returncode}:\n{d.log()}")
                try:
                    if httpx.get(d.url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"daemon not ready in {ready_timeout}s:\n{d.log()}")
                time.sleep(0.1)
        yield d
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Collector:
    """``aep_sdk.subscribe`` (the SDK's threaded SSE consumer) into a queue."""

    def __init__(self, url: str, **kw: Any) -> None:
        import aep_sdk
        self.q: queue.Queue = queue.Queue()
        self.errors: list[Exception] = []
        self.events: list[dict[str, Any]] = []
        self.sub = aep_sdk.subscribe(url, self.q.put, on_error=self.errors.append,
                                     backoff_initial_ms=100, backoff_max_ms=1000, **kw)

    def wait_for(self, pred, timeout: float = 30.0, what: str = "event") -> dict[str, Any]:
        """The first event (seen so far or arriving) matching ``pred``."""
        for ev in self.events:
            if pred(ev):
                return ev
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                types = [e.get("type") for e in self.events]
                raise AssertionError(f"no {what} within {timeout}s; got {types}; errors {self.errors}")
            try:
                ev = self.q.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            self.events.append(ev)
            if pred(ev):
                return ev

    def drain(self, settle: float = 0.5) -> list[dict[str, Any]]:
        """Everything received until ``settle`` seconds pass with nothing new."""
        while True:
            try:
                self.events.append(self.q.get(timeout=settle))
            except queue.Empty:
                return self.events

    def close(self) -> None:
        self.sub.close()
