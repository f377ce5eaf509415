"""The real daemon (``aep-bridges``) as a subprocess on free loopback ports,
and its stream read with the protocol's SDK consumer. The one place tests
start the daemon:

- :class:`DaemonProcess`: one daemon (``run`` by default), restartable on the
  same state dir. Synchronous (``subprocess``), so a module-scoped fixture
  can share one; trio tests call the blocking methods through
  ``trio.to_thread.run_sync``. Vendor modules subclass it to supply their
  bridge's settings (:meth:`DaemonProcess.vendor_env`), e.g.
  ``tests.support.openhands.OpenHandsDaemon``,
  ``tests.support.opencode.SseDaemon``.
- :func:`run_daemon`: a context manager over it for a one-off daemon.
- :class:`Collector`: ``aep_sdk.subscribe`` (the SDK's threaded SSE consumer)
  collecting every event, waited on from plain or trio code.
- :func:`command`: one command through the relay with the SDK ``ControlClient``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import httpx
import trio

from tests.support.net import free_ports

ROOT = Path(__file__).resolve().parents[2]


def console_script() -> list[str]:
    """``aep-bridges`` from the venv, or ``python -m supervisor.cli`` when the
    entry point is not installed yet (editable dev)."""
    exe = Path(sys.executable).with_name("aep-bridges")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "supervisor.cli"]


class DaemonProcess:
    """``aep-bridges <args>`` (default ``run``) on free loopback ports.

    The environment is the inherited one with every ``AEP_*`` variable (and
    every prefix in :attr:`scrub`) removed, then :meth:`defaults` (the relay
    listener ``AEP_LISTEN``, both OTLP listeners, ``AEP_STATE_DIR`` = ``state``,
    ``AEP_TOKEN`` when :attr:`token` is set, JSON logs), then
    :meth:`vendor_env` (a subclass's bridge), then ``env`` (the test's
    overrides, which win). ``env`` after :meth:`start` is what the running
    process got; ``url`` is its relay / ``/healthz`` base. stdout+stderr go to
    ``log_path`` (a new file per start, beside ``state``)."""

    token: str | None = None
    scrub: tuple[str, ...] = ("AEP_",)

    def __init__(self, state: Path, env: Mapping[str, str] | None = None, *,
                 args: Sequence[str] = ("run",), token: str | None = None) -> None:
        self.state = Path(state)
        self.overrides = dict(env or {})
        self.args = tuple(args)
        if token is not None:
            self.token = token
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.env: dict[str, str] = {}
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.port, self.grpc_port, self.http_port = free_ports(3)

    # -- environment ------------------------------------------------------
    def defaults(self) -> dict[str, str]:
        env = {
            "AEP_LISTEN": f"127.0.0.1:{self.port}",
            "AEP_OTLP_GRPC_LISTEN": f"127.0.0.1:{self.grpc_port}",
            "AEP_OTLP_HTTP_LISTEN": f"127.0.0.1:{self.http_port}",
            "AEP_STATE_DIR": str(self.state),
            "AEP_LOG_FORMAT": "json",
            # a test daemon starts few sessions: 64 spare files, not 2,048 per state dir
            "AEP_LOG_SPARES": "64",
            "PYTHONUNBUFFERED": "1",
        }
        if self.token:
            env["AEP_TOKEN"] = self.token
        return env

    def vendor_env(self) -> dict[str, str]:
        """A subclass's bridge settings (on top of :meth:`defaults`)."""
        return {}

    def build_env(self) -> dict[str, str]:
        """The environment the next :meth:`start` gives the process."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(self.scrub)}
        env.update(self.defaults())
        env.update(self.vendor_env())
        env.update(self.overrides)
        return env

    @property
    def url(self) -> str:
        return "http://" + (self.env or self.build_env())["AEP_LISTEN"]

    # -- process ----------------------------------------------------------
    def start(self, healthy: bool = True, *, wait: bool = True,
              timeout: float = 30.0) -> "DaemonProcess":
        """Start the process and wait until ``/healthz`` says ``ok: true``
        (``healthy=False``: until it answers at all; ``wait=False``: return at
        once, e.g. to read a refusal's exit status). A port taken between
        picking and binding (exit 2, "in use") is retried on new ports.
        Raises ``AssertionError`` (with the log) when it does not come up."""
        self.state.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):
            self._pick_ports()
            self.env = self.build_env()
            self.log_path = self.state.parent / f"{self.state.name}-daemon-{self.port}.log"
            with open(self.log_path, "wb") as out:
                self.proc = subprocess.Popen(console_script() + list(self.args), env=self.env,
                                             cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT)
            if not wait or self._wait_up(healthy, timeout):
                return self
            if self.proc.poll() == 2 and "in use" in self.log():
                continue
            break
        status = self.proc.poll()
        self.kill()
        raise AssertionError(f"daemon not {'healthy' if healthy else 'answering'} within "
                             f"{timeout}s (exit {status}):\n{self.log()[-6000:]}")

    def _wait_up(self, healthy: bool, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                body = self.healthz()
                if not healthy or body.get("ok") is True:
                    return True
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        return False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; returns the exit status (``None`` if never
        started). Past ``timeout`` it is killed and ``AssertionError`` raised."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"daemon ignored SIGTERM for {timeout}s\n"
                                     f"{self.log()[-6000:]}") from None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self, healthy: bool = True, timeout: float = 30.0) -> int | None:
        """:meth:`stop` then :meth:`start` on the same state dir (new ports);
        returns the stopped process's exit status."""
        status = self.stop()
        self.start(healthy, timeout=timeout)
        return status

    # -- reading it -------------------------------------------------------
    def healthz(self, token: str | None = None) -> dict[str, Any]:
        """``GET /healthz`` with ``token`` (default: :attr:`token`; ``""``:
        anonymous)."""
        token = self.token if token is None else token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + "/healthz", headers=headers, timeout=5,
                         trust_env=False).json()

    def log(self) -> str:
        """The current process's stdout+stderr so far."""
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def subscribe(self, **kw: Any) -> "Collector":
        """The SDK consumer on this daemon's ``/stream`` with its token,
        replaying from the start (``from_="all"``); ``kw`` overrides."""
        return Collector(self.url, **{"token": self.token, "from_": "all",
                                      "timeout_ms": 60_000, **kw})


def send_command(daemon: DaemonProcess, type_: str, session: str,
                 **kw: Any) -> tuple[str, Any]:
    """Blocking: one command through the daemon's relay with the SDK
    ``ControlClient`` (no retries, 10 s ack window): ``("accepted", ack)``,
    or ``(reason, detail)`` for a nack (a target nack or a relay refusal).
    ``kw`` goes to ``ControlClient.send`` (``subject``, ``data``, ...)."""
    import aep_sdk
    client = aep_sdk.ControlClient(daemon.url, agent="tester", host="laptop", token=daemon.token)
    client.connect(connect_timeout_ms=10_000)
    try:
        return "accepted", client.send(type_, session, ack_window_ms=10_000, retries=0, **kw)
    except aep_sdk.NackError as e:
        return e.reason, e.detail
    finally:
        client.close()


async def command(daemon: DaemonProcess, type_: str, session: str, **kw: Any) -> tuple[str, Any]:
    """:func:`send_command` from trio (a worker thread; 40 s at most)."""
    with trio.fail_after(40):
        return await trio.to_thread.run_sync(lambda: send_command(daemon, type_, session, **kw))


@contextlib.contextmanager
def run_daemon(tmp_path: Path, env: dict[str, str] | None = None, *,
               args: tuple[str, ...] = ("run",), wait: bool = True, healthy: bool = False,
               ready_timeout: float = 30.0) -> Iterator[DaemonProcess]:
    """A :class:`DaemonProcess` with state in ``tmp_path / "state"`` and
    ``env`` on top of the defaults. Waits until ``/healthz`` answers
    (``healthy=True``: until it says ok) unless ``wait=False``. Always
    terminates it (SIGKILL past 10 s)."""
    d = DaemonProcess(tmp_path / "state", env, args=args)
    try:
        yield d.start(healthy, wait=wait, timeout=ready_timeout)
    finally:
        with contextlib.suppress(AssertionError):
            d.stop(timeout=10)


class Collector:
    """``aep_sdk.subscribe`` (the SDK's own thread) collecting every event
    into a lock-guarded list that plain code (:meth:`first`, :meth:`drain`)
    and trio code (:meth:`wait_for`) can wait on. ``kw`` goes to
    ``aep_sdk.subscribe`` (``token``, ``filter``, ``from_``, ...)."""

    def __init__(self, url: str, **kw: Any) -> None:
        import aep_sdk
        self._cond = threading.Condition()
        self._events: list[dict[str, Any]] = []
        self.errors: list[Exception] = []
        #: how many streams the relay opened for this reader so far (its
        #: ``: connected`` comments: each one is subscribed by then)
        self.connections = 0
        self.sub = aep_sdk.subscribe(url, self._add, on_error=self.errors.append,
                                     on_comment=self._comment,
                                     backoff_initial_ms=100, backoff_max_ms=1000, **kw)

    def _add(self, ev: dict[str, Any]) -> None:
        with self._cond:
            self._events.append(ev)
            self._cond.notify_all()

    def _comment(self, text: str) -> None:
        if text.startswith("connected"):
            with self._cond:
                self.connections += 1
                self._cond.notify_all()

    def wait_connected(self, count: int, timeout: float = 30.0) -> None:
        """Blocking: until the relay has opened ``count`` streams for this
        reader in all (``: connected`` is sent once the subscription is
        registered, so an event admitted after this reaches it live).
        A reader that reconnects resumes with the positions of the sessions
        it has seen (AEP-0003 §3.3 ``from``): a session that began while it
        was away is not in that list, so an event of it admitted before the
        reconnect is never replayed to it; wait for the reconnect first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.connections < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the reader opened {self.connections} streams, not "
                                         f"{count}, within {timeout}s; errors {self.errors}")
                self._cond.wait(min(left, 0.5))

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event so far, in arrival order (a copy)."""
        with self._cond:
            return list(self._events)

    def of(self, session: str, type_: str | None = None) -> list[dict[str, Any]]:
        """The events of ``session`` (of ``type_`` only, if given)."""
        return [e for e in self.events
                if e.get("session") == session and (type_ is None or e["type"] == type_)]

    def first(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 30.0,
              what: str = "event") -> dict[str, Any]:
        """Blocking: the first event (seen so far or arriving) matching ``pred``."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for ev in self._events[seen:]:
                    if pred(ev):
                        return ev
                seen = len(self._events)
                left = deadline - time.monotonic()
                if left <= 0:
                    types = [e.get("type") for e in self._events]
                    raise AssertionError(f"no {what} within {timeout}s; got {types}; "
                                         f"errors {self.errors}")
                self._cond.wait(min(left, 0.5))

    def drain(self, settle: float = 0.5) -> list[dict[str, Any]]:
        """Blocking: every event, once ``settle`` seconds pass with nothing new."""
        with self._cond:
            while True:
                n = len(self._events)
                self._cond.wait(settle)
                if len(self._events) == n:
                    return list(self._events)

    async def wait_for(self, predicate: Callable[["Collector"], Any], timeout: float = 60.0,
                       what: str = "condition") -> Any:
        """In trio: wait until ``predicate(self)`` is truthy and return its
        value; ``AssertionError`` with the stream's tail after ``timeout`` s."""
        with trio.move_on_after(timeout):
            while True:
                got = predicate(self)
                if got:
                    return got
                await trio.sleep(0.05)
        tail = "\n".join(f"  {(e.get('session') or '')[:8]} {e.get('seq')} {e['type']} "
                         f"{json.dumps(e.get('data'))[:90]}" for e in self.events[-40:])
        raise AssertionError(f"timed out waiting for {what}; errors {self.errors}; "
                             f"stream tail:\n{tail}")

    def close(self) -> None:
        self.sub.close()
