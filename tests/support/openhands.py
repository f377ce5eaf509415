"""The real OpenHands agent server for the tests, and the mock model it talks to.

All loopback-only:

- :func:`install_agent_server` / :func:`require_agent_server`: the real
  ``openhands-agent-server`` from PyPI (pinned :data:`OH_VERSION`), installed
  ONCE into its own Python >= 3.12 virtual environment under the vendor cache
  outside the checkout, keyed by version::

      ${AEP_VENDOR_CACHE:-~/.cache/aep-bridges/vendors}/openhands-agent-server@<ver>/venv

  An exclusive ``fcntl`` lock serialises concurrent installers and a marker
  file is written only after pip succeeded. The interpreter is found by
  :func:`find_python312` (``AEP_PYTHON312``, ``python3.12``/``3.13`` on PATH,
  then pyenv's versions); none found, or the registry unreachable, skips the
  calling test LOUDLY (``warnings.warn`` + ``pytest.skip``).
- :class:`AgentServer`: one server process (``python -m openhands.agent_server
  --host 127.0.0.1 --port P``; the host is ALWAYS passed: with a session key
  and no host the server binds every interface) with a session API key, its
  offline switches (no tool preloading, no VS Code, no browser, telemetry off
  by ``DO_NOT_TRACK``, litellm's bundled model-cost map) and every data
  directory in a scratch directory. Synchronous (``subprocess``) so one server
  can serve a whole test module while each test runs its own trio loop.
- :class:`AgentClient`: the test's own REST client (a user's writes), and
  :func:`model_and_client` serving a :class:`MockModel` for it.
- :class:`MockModel`: an OpenAI-compatible ``/v1/chat/completions`` endpoint
  (hypercorn, trio worker, in the test's own trio loop; the server's litellm
  layer calls it). Stateless per conversation: a request whose last message is
  the user's gets a ``terminal`` tool call (``echo`` of a marker), a request
  whose last message is a tool result gets a ``finish`` tool call. A user text
  containing ``[hold]`` makes the answer wait until :meth:`MockModel.release`
  (a way to keep a conversation ``running``); ``[chat]`` answers with plain
  text; ``MockModel.fail_status`` answers every request with that HTTP status.
  The "unreachable model" mode is a base URL nobody listens on
  (:func:`dead_url`).

``python -m tests.support.openhands capture`` regenerates
``tests/fixtures/openhands_real/`` from a live server (see that README).
"""
from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import trio

from bridges.core.asgi import headers, send_json
from tests.support.daemon import DaemonProcess
from tests.support.net import free_port, http_body, serve_loopback

OH_VERSION = "1.58.2"
PACKAGE = "openhands-agent-server"
MARKER = ".aep-installed"
PIP_TIMEOUT_S = 900
START_TIMEOUT_S = 120
SESSION_KEY = "aep-test-session-key-" + "0123456789abcdef"


class VendorUnavailable(RuntimeError):
    """The environment cannot provide the vendor (no 3.12 interpreter, the
    registry unreachable). Tests skip loudly on this."""


# ---------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------

def cache_root() -> Path:
    try:
        from tests.support.vendors import cache_root as _root
        return _root()
    except ImportError:  # pragma: no cover - the npm helper is absent
        env = os.environ.get("AEP_VENDOR_CACHE")
        if env:
            return Path(env).expanduser()
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aep-bridges" / "vendors"


def skip_loudly(reason: str) -> None:
    """``warnings.warn`` + ``pytest.skip`` with the same message (never returns)."""
    import pytest
    msg = f"REAL VENDOR UNAVAILABLE, test NOT run: {reason}"
    warnings.warn(msg, stacklevel=2)
    pytest.skip(msg)


def _py_version(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        major, minor = (int(x) for x in out.stdout.split())
    except ValueError:
        return None
    return major, minor


def find_python312() -> str | None:
    """A Python >= 3.12 interpreter: ``$AEP_PYTHON312``, then ``python3.12`` /
    ``python3.13`` on PATH, then pyenv (``$PYENV_ROOT`` or ``~/.pyenv``)
    versions, newest 3.12 first. ``None`` when there is none."""
    cands: list[str] = []
    if os.environ.get("AEP_PYTHON312"):
        cands.append(os.environ["AEP_PYTHON312"])
    for name in ("python3.12", "python3.13"):
        p = shutil.which(name)
        if p:
            cands.append(p)
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if root.is_dir():
        vers = sorted((d for d in root.iterdir() if d.name.startswith(("3.12", "3.13"))),
                      key=lambda d: d.name, reverse=True)
        vers.sort(key=lambda d: not d.name.startswith("3.12"))  # 3.12 first: the tested line
        for d in vers:
            for exe in ("python3.12", "python3.13", "python3"):
                if (d / "bin" / exe).exists():
                    cands.append(str(d / "bin" / exe))
                    break
    for c in cands:
        v = _py_version(c)
        if v and v >= (3, 12):
            return c
    return None


def install_dir(version: str = OH_VERSION) -> Path:
    return cache_root() / f"{PACKAGE}@{version}"


def install_agent_server(version: str = OH_VERSION) -> Path:
    """Install ``openhands-agent-server==version`` (once) and return the
    venv's python. Raises :class:`VendorUnavailable` when no 3.12 interpreter
    exists or pip cannot reach the registry; ``RuntimeError`` for anything
    else (a wrong pin fails the test, it is not an environment problem)."""
    target = install_dir(version)
    py = target / "venv" / "bin" / "python"
    if (target / MARKER).exists() and py.exists():
        return py
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = open(str(target) + ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MARKER).exists() and py.exists():
            return py
        base = find_python312()
        if base is None:
            raise VendorUnavailable(
                f"{PACKAGE} needs Python >= 3.12 and none was found "
                "(set AEP_PYTHON312, put python3.12 on PATH, or install one with pyenv)")
        if target.exists():
            shutil.rmtree(target)  # an interrupted install is redone, never half-used
        target.mkdir(parents=True)
        t0 = time.monotonic()
        subprocess.run([base, "-m", "venv", str(target / "venv")], check=True, timeout=120)
        res = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             f"{PACKAGE}=={version}"],
            capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if res.returncode != 0:
            err = (res.stderr or res.stdout)[-2000:]
            shutil.rmtree(target, ignore_errors=True)
            low = err.lower()
            if any(s in low for s in ("connection", "temporary failure", "name resolution",
                                      "timed out", "network is unreachable", "proxy")):
                raise VendorUnavailable(f"pip could not reach the registry for {PACKAGE}: {err[-300:]}")
            raise RuntimeError(f"pip install {PACKAGE}=={version} failed:\n{err}")
        (target / MARKER).write_text(json.dumps({
            "package": PACKAGE, "version": version, "python": base,
            "install_seconds": round(time.monotonic() - t0, 1)}) + "\n")
        return py
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def require_agent_server(version: str = OH_VERSION) -> Path:
    """:func:`install_agent_server` for tests: skips loudly when the
    environment cannot provide the server."""
    try:
        return install_agent_server(version)
    except VendorUnavailable as e:
        skip_loudly(str(e))
        raise  # unreachable


def dead_url() -> str:
    """A base URL on loopback where nothing listens (the unreachable model)."""
    return f"http://127.0.0.1:{free_port()}/v1"


# ---------------------------------------------------------------------------
# the server process
# ---------------------------------------------------------------------------

@dataclass
class AgentServer:
    """One real agent server bound to 127.0.0.1. ``url``, ``key``,
    ``scratch`` (its data dirs), ``log_path`` (its stdout+stderr)."""

    python: Path
    key: str | None = SESSION_KEY
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="aep-oh-")))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.scratch / "server.log"

    @property
    def workspace(self) -> Path:
        return self.scratch / "workspace" / "project"

    def env(self) -> dict[str, str]:
        s = self.scratch
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OH_", "OPENHANDS_", "LITELLM_", "SESSION_API_KEY", "AEP_"))}
        env.update({
            "HOME": str(s / "home"),
            "OPENHANDS_AGENT_SERVER_CONFIG_PATH": str(s / "no-config.json"),
            "OH_CONVERSATIONS_PATH": str(s / "workspace" / "conversations"),
            "OH_WORKSPACE_PATH": str(self.workspace),
            "OH_BASH_EVENTS_DIR": str(s / "workspace" / "bash_events"),
            "OH_PERSISTENCE_DIR": str(s / "persistence"),
            "OH_CONVERSATION_WORKTREE_ROOT": str(s / "worktrees"),
            "OH_PRELOAD_TOOLS": "false",
            "OH_ENABLE_VSCODE": "false",
            "OH_ENABLE_BROWSER": "false",
            "OH_LEASE_TTL_SECONDS": "0",
            "OH_TELEMETRY_CONSENT": "denied",
            "DO_NOT_TRACK": "1",
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LOG_JSON": "false",
            "COLUMNS": "400",  # rich: one log line per record (server_posts reads them)
            "TMUX_TMPDIR": str(s / "tmux"),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        })
        if self.key:
            env["SESSION_API_KEY"] = self.key
        return env

    def argv(self) -> list[str]:
        """The host is ALWAYS passed: with a session key and no ``--host``
        the server binds every interface."""
        return [str(self.python), "-m", "openhands.agent_server", "--host", "127.0.0.1",
                "--port", str(self.port)]

    def start(self) -> "AgentServer":
        for d in ("home", "workspace/project", "workspace/conversations", "persistence", "tmux"):
            (self.scratch / d).mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv(), env=self.env(), cwd=self.scratch, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent server exited {self.proc.returncode}:\n{self.tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"agent server not ready in {START_TIMEOUT_S}s:\n{self.tail()}")

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)

    # -- REST helpers (the test's own client; the bridge has its own) ---
    def headers(self) -> dict[str, str]:
        return {"X-Session-API-Key": self.key} if self.key else {}

    def conversation_request(self, model_url: str, text: str | None = "list the files [mark]",
                             *, confirm: bool = True, retries: int = 0,
                             stream: bool = False) -> dict[str, Any]:
        """A ``StartConversationRequest`` body: the mock model at
        ``model_url`` (chat completions; ``stream``: SSE, which makes the
        server publish ``StreamingDeltaEvent``), the terminal tool only, a
        local workspace, ``AlwaysConfirm`` (or ``NeverConfirm``)."""
        body: dict[str, Any] = {
            "agent_settings": {
                "agent_kind": "openhands",
                "llm": {
                    "model": "openai/aep-mock",
                    "base_url": model_url,
                    "api_key": "mock-key",
                    "api_mode": "chat",
                    "num_retries": retries,
                    "retry_min_wait": 1,
                    "retry_max_wait": 1,
                    "timeout": 60,
                    "usage_id": "aep-mock",
                    "stream": stream,
                },
                "tools": [{"name": "terminal"}],
            },
            "workspace": {"working_dir": str(self.workspace)},
            "confirmation_policy": {"kind": "AlwaysConfirm" if confirm else "NeverConfirm"},
            "autotitle": False,
            "stuck_detection": False,
            "max_iterations": 20,
        }
        if text is not None:
            body["initial_message"] = {"role": "user", "content": [{"type": "text", "text": text}],
                                       "run": False}
        return body


# ---------------------------------------------------------------------------
# the test's own client (a user of the server)
# ---------------------------------------------------------------------------

class AgentClient:
    """The test's own REST client for the agent server: a user's writes
    (create a conversation on ``model_url``, send a message, approve on the
    vendor side), never the bridge's. ``http`` (an ``httpx.AsyncClient`` with
    the session key) for anything else."""

    def __init__(self, server: AgentServer, model_url: str) -> None:
        self.server, self.model_url = server, model_url
        self.http = httpx.AsyncClient(base_url=server.url, headers=server.headers(), timeout=60,
                                      trust_env=False)

    async def create(self, model_url: str | None = None, *, confirm: bool = True,
                     stream: bool = False) -> str:
        """A new conversation without a first message; its id."""
        r = await self.http.post("/api/conversations", json=self.server.conversation_request(
            model_url or self.model_url, text=None, confirm=confirm, stream=stream))
        r.raise_for_status()
        return r.json()["id"]

    async def say(self, cid: str, text: str, run: bool = True) -> None:
        r = await self.http.post(f"/api/conversations/{cid}/events", json={
            "role": "user", "content": [{"type": "text", "text": text}], "run": run})
        r.raise_for_status()

    async def confirm(self, cid: str, accept: bool = True) -> None:
        r = await self.http.post(f"/api/conversations/{cid}/events/respond_to_confirmation",
                                 json={"accept": accept})
        r.raise_for_status()

    async def status(self, cid: str) -> str:
        """The conversation's ``execution_status`` as the server reports it."""
        return (await self.http.get(f"/api/conversations/{cid}")).json()["execution_status"]


@asynccontextmanager
async def model_and_client(server: AgentServer,
                           *rigs: "Rig") -> AsyncIterator[tuple["MockModel", AgentClient]]:
    """``async with model_and_client(server, rig) as (mock, vendor)``: a
    :class:`MockModel` served in this trio loop, each :class:`Rig` running,
    and an :class:`AgentClient` on that model; all stopped when the block
    ends."""
    async with trio.open_nursery() as n:
        mock = MockModel()
        await n.start(mock.serve)
        for rig in rigs:
            await n.start(rig.run)
        client = AgentClient(server, mock.url)
        try:
            yield mock, client
        finally:
            with trio.CancelScope(shield=True):
                await client.http.aclose()
            n.cancel_scope.cancel()


# ---------------------------------------------------------------------------
# the mock model
# ---------------------------------------------------------------------------

def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


@dataclass
class MockModel:
    """See the module docstring. ``url`` (``http://127.0.0.1:P/v1``) once
    :meth:`serve` started; ``requests``: every chat body received;
    ``held``: how many requests are waiting on :meth:`release`."""

    url: str | None = None
    requests: list[dict] = field(default_factory=list)
    fail_status: int | None = None
    held: int = 0
    command: str = "echo aep-mock-ran"
    _release: trio.Event = field(default_factory=trio.Event)
    _seq: int = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(serve_loopback, self._app) + "/v1"
            task_status.started(self.url)

    def release(self) -> None:
        """Let every held request (and every later ``[hold]``) answer."""
        self._release.set()

    def rearm(self) -> None:
        self._release = trio.Event()

    async def wait_held(self, timeout: float = 30) -> None:
        """Until a ``[hold]`` request waits on :meth:`release`."""
        with trio.fail_after(timeout):
            while self.held == 0:
                await trio.sleep(0.05)

    def _answer(self, body: dict) -> tuple[dict, float]:
        msgs = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        last = msgs[-1] if msgs else {}
        self._seq += 1
        n = self._seq
        user_texts = [_text_of(m.get("content")) for m in msgs if m.get("role") == "user"]
        if last.get("role") == "tool":
            call = {"id": f"call_finish_{n}", "type": "function",
                    "function": {"name": "finish",
                                 "arguments": json.dumps({"message": "Done: the command ran."})}}
            return self._completion(n, None, [call]), 0
        if user_texts and "[chat]" in user_texts[-1]:
            return self._completion(n, "Hello from the mock model.", None), 0
        call = {"id": f"call_term_{n}", "type": "function",
                "function": {"name": "terminal",
                             "arguments": json.dumps({"command": self.command,
                                                      "summary": "run the marker command",
                                                      "security_risk": "LOW"})}}
        return self._completion(n, None, [call]), 0

    def _completion(self, n: int, text: str | None, calls: list | None) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            msg["tool_calls"] = calls
        return {"id": f"chatcmpl-aep-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": "aep-mock",
                "choices": [{"index": 0, "message": msg,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    async def _app(self, scope, receive, send) -> None:
        raw = await http_body(scope, receive, send)
        if raw is None:
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        path = scope.get("path", "")
        if not path.endswith("/chat/completions"):
            await send_json(send, 404, {"error": {"message": f"no route {path}"}})
            return
        self.requests.append(body)
        if self.fail_status:
            await send_json(send, self.fail_status,
                             {"error": {"message": "mock model failure", "type": "server_error",
                                        "code": str(self.fail_status)}})
            return
        users = [_text_of(m.get("content")) for m in body.get("messages") or []
                 if isinstance(m, dict) and m.get("role") == "user"]
        last = (body.get("messages") or [{}])[-1]
        if users and "[hold]" in users[-1] and isinstance(last, dict) and last.get("role") == "user":
            self.held += 1
            try:
                await self._release.wait()
            finally:
                self.held -= 1
        answer, _ = self._answer(body)
        if body.get("stream"):
            await _send_stream(send, answer)
        else:
            await send_json(send, 200, answer)


async def _send_stream(send, answer: dict) -> None:
    """The same completion as one SSE chunk + ``[DONE]`` (for ``stream: true``)."""
    choice = answer["choices"][0]
    delta = dict(choice["message"])
    if delta.get("tool_calls"):
        delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(delta["tool_calls"])]
    chunk = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
             "model": answer["model"],
             "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"]}]}
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def new_conversation_id() -> str:
    return str(uuid.uuid4())


# ---------------------------------------------------------------------------
# an in-process bridge rig (a real BridgeContext, the test as the relay)
# ---------------------------------------------------------------------------

_EPOCHS = itertools.count(int(time.time()))


class Rig:
    """One :class:`bridges.openhands.OpenHandsBridge` running in the test's
    trio loop with a real :class:`bridges.core.bridge.BridgeContext`:
    ``events`` collects every stamped envelope in channel order,
    :meth:`command` plays the relay (puts a command envelope on the bridge's
    control inbox). ``env`` is the bridge's environment (``from_env``)."""

    def __init__(self, env: dict[str, str], *, policy=None, agent: str = "openhands") -> None:
        import logging

        from bridges.core.bridge import BridgeContext, BridgeHealth
        from bridges.core.capture import CapturePolicy
        from bridges.core.envelope import Stamper
        from bridges.openhands import from_env
        self.policy = policy or CapturePolicy.from_env(env)
        self.bridge = from_env(env, policy=self.policy)
        self.events: list[dict] = []
        self._send, self._recv = trio.open_memory_channel(10_000)
        self._csend, crecv = trio.open_memory_channel(64)
        self.health = BridgeHealth()
        self.ctx = BridgeContext("openhands", Stamper(self.bridge.agent, epoch=next(_EPOCHS),
                                                      host="test-host", policy=self.policy),
                                 self._send, crecv, self.health, logging.getLogger("aep.test.openhands"))
        self._changed = trio.Event()
        self.scope: trio.CancelScope | None = None
        self.handle = None  # the running bridge's per-run handle (OpenHandsRun)

    @property
    def receiver(self):
        """The current run's receiver (``None`` before the bridge started)."""
        return self.handle.receiver if self.handle is not None else None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The bridge as the fleet runs it (``supervisor.fleet.run_bridge``:
        the fleet's ledger serves the control inbox)."""
        from supervisor.fleet import run_bridge
        with trio.CancelScope() as scope:
            self.scope = scope
            async with trio.open_nursery() as n:
                n.start_soon(self._drain)
                self.handle = await n.start(run_bridge, self.bridge, self.ctx)
                task_status.started()

    def stop(self) -> None:
        if self.scope is not None:
            self.scope.cancel()

    async def _drain(self) -> None:
        async for item in self._recv:
            self.events.append(item.event)
            self._changed.set()
            self._changed = trio.Event()

    async def wait(self, predicate, timeout: float = 60, what: str = "condition") -> Any:
        """Wait until ``predicate(events)`` is truthy; returns its value."""
        with trio.move_on_after(timeout):
            while True:
                got = predicate(self.events)
                if got:
                    return got
                await self._changed.wait()
        raise AssertionError(f"timed out waiting for {what}; events:\n" + "\n".join(
            f"  {e.get('seq')} {e['type']} {json.dumps(e.get('data'))[:100]}" for e in self.events[-40:]))

    def of(self, session: str, type_: str | None = None) -> list[dict]:
        return [e for e in self.events if e.get("session") == session and (type_ is None or e["type"] == type_)]

    async def command(self, type_: str, session: str, *, data: dict | None = None,
                      subject: str | None = None, cmd_id: str | None = None) -> dict:
        from aep_sdk import ulid
        cmd = {"aep": "0.1", "id": cmd_id or ulid(), "type": type_, "time": "2026-01-01T00:00:00Z",
               "source": "aep://laptop/agent/tester", "agent": "tester", "session": session,
               "data": data or {}}
        if subject is not None:
            cmd["subject"] = subject
        await self._csend.send(cmd)
        return cmd

    async def ack_for(self, cmd: dict, timeout: float = 30) -> dict:
        return await self.wait(lambda evs: next((e for e in evs if e["type"] in ("control.accepted", "control.rejected")
                                                 and e.get("cause") == cmd["id"]), None),
                               timeout, f"the ack of {cmd['type']}")


def run_wound_down(events: list[dict]) -> bool:
    """Whether the server's run task behind the last status flip of one
    conversation's ``events`` (as the bridge published them) is over: a
    ``state.snapshot`` stamped (vendor time) at or after the last
    ``execution_status`` ``state.delta`` (the server publishes that snapshot
    once the task has drained its callbacks and cleared itself). An approval
    on the vendor side before that is dropped by the server
    (``respond_to_confirmation`` answers 200 for a task it takes for
    "already running"), so a test approving there waits for this first."""
    def ts(e: dict) -> datetime:
        return datetime.fromisoformat((e.get("data") or {}).get("vendor_ts") or "1970-01-01")
    flips = [ts(e) for e in events if e["type"] == "state.delta"
             and (e.get("data") or {}).get("key") == "execution_status"]
    snaps = [ts(e) for e in events if e["type"] == "state.snapshot"]
    return bool(snaps) and (not flips or max(snaps) >= max(flips))


def server_posts(server: AgentServer, cid: str) -> list[str]:
    """The POST request lines the server logged for conversation ``cid`` (its
    uvicorn access log): the vendor-side proof of which writes it received."""
    text = server.log_path.read_text(errors="replace")
    flat = re.sub(r"\s*\n\s*", "", text)  # rich wraps long log lines
    return re.findall(r'"POST (/api/conversations/' + re.escape(cid) + r'[^ "]*)', flat)


# ---------------------------------------------------------------------------
# the daemon (``aep-bridges run`` subprocess)
# ---------------------------------------------------------------------------

class OpenHandsDaemon(DaemonProcess):
    """``aep-bridges run`` with only the OpenHands bridge (``AEP_BRIDGE_OPENHANDS=1``,
    ``AEP_BRIDGE_OTLP_IN=0``) pointed at ``server``, polling every 0.5 s, a
    token, and ``env`` on top (:class:`tests.support.daemon.DaemonProcess`:
    free ports, restartable on ``state``)."""

    token = "daemon-test-token-0123456789"
    scrub = ("AEP_", "OH_")

    def __init__(self, server: AgentServer, state: Path, env: dict[str, str] | None = None) -> None:
        self.server = server
        super().__init__(state, env)

    def vendor_env(self) -> dict[str, str]:
        return {"AEP_BRIDGE_OPENHANDS": "1", "AEP_BRIDGE_OTLP_IN": "0",
                "AEP_OPENHANDS_URL": self.server.url,
                "AEP_OPENHANDS_SESSION_API_KEY": self.server.key or "",
                "AEP_OPENHANDS_POLL": "0.5"}


# ---------------------------------------------------------------------------
# a stub agent server (fault injection and benchmarks; never instead of the real one)
# ---------------------------------------------------------------------------

@dataclass
class StubConversation:
    id: str
    frames: list[str] = field(default_factory=list)  # sent after auth (raw text frames)
    status: str = "idle"


@dataclass
class StubAgentServer:
    """Speaks the agent server's observer protocol: ``GET
    /api/conversations/search`` (pages of ``page_size``), ``GET
    /api/conversations/{id}``, the events socket with first-message auth
    (close 4001 on a wrong/missing key, 4004 for an unknown id) and the five
    POST routes. Faults are switches:

    - ``search_status``: answer search with this HTTP status;
      ``search_forever``: every page names a next page (a server that pages
      forever); ``search_garbage``: a 200 that is not a page.
    - ``socket_close_on_auth``: accept, read the auth frame, close 4001;
      ``socket_garbage``: send non-JSON frames first.
    - ``post_status``: answer every POST with this status;
      ``post_hang``: never answer a POST (until the server stops).

    Records every socket frame received per connection (``inbound``), every
    POST (``posts``), every HTTP request line (``requests``) and every socket
    URL (``socket_urls``)."""

    key: str | None = SESSION_KEY
    page_size: int = 100
    conversations: dict[str, StubConversation] = field(default_factory=dict)
    search_status: int = 200
    #: seconds between the connect snapshot (the first frame) and the rest
    #: (a loaded server reading its event files late)
    replay_delay: float = 0.0
    search_forever: bool = False
    search_garbage: bool = False
    socket_close_on_auth: bool = False
    socket_garbage: bool = False
    post_status: int = 200
    post_hang: bool = False
    inbound: list[list[str]] = field(default_factory=list)
    posts: list[tuple[str, Any]] = field(default_factory=list)
    socket_urls: list[str] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    searches: int = 0
    url: str | None = None
    open_sockets: int = 0

    def add(self, cid: str | None = None, frames: list[Any] | None = None,
            status: str = "idle") -> StubConversation:
        cid = cid or new_conversation_id()
        conv = StubConversation(cid, [f if isinstance(f, str) else json.dumps(f) for f in frames or []], status)
        self.conversations[cid] = conv
        return conv

    async def serve(self, *, port: int = 0, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(partial(
                serve_loopback, self._app, port=port,
                websocket_max_message_size=64 * 1024 * 1024))
            task_status.started(self.url)

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":
            await self._socket(scope, receive, send)
            return
        raw = await http_body(scope, receive, send)
        if raw is None:
            return
        path, method = scope["path"], scope["method"]
        self.requests.append((method, path + "?" + scope.get("query_string", b"").decode()))
        if self.key and headers(scope).get("x-session-api-key") != self.key:
            await send_json(send, 401, {"detail": "Unauthorized"})
            return
        if method == "GET" and path == "/api/conversations/search":
            self.searches += 1
            if self.search_status != 200:
                await send_json(send, self.search_status, {"detail": "stub failure"})
                return
            if self.search_garbage:
                await send_json(send, 200, ["not", "a", "page"])
                return
            qs = dict(p.split("=", 1) for p in scope.get("query_string", b"").decode().split("&") if "=" in p)
            start = int(qs.get("page_id") or 0) if (qs.get("page_id") or "0").isdigit() else 0
            ids = list(self.conversations)
            items = [{"id": c, "execution_status": self.conversations[c].status}
                     for c in ids[start:start + self.page_size]]
            nxt = start + self.page_size
            body = {"items": items,
                    "next_page_id": str(nxt) if (nxt < len(ids) or self.search_forever) else None}
            await send_json(send, 200, body)
            return
        if method == "GET" and path.startswith("/api/conversations/") and \
                path.endswith("/events/search"):
            # the persisted events (not the full_state snapshots), newest first
            conv = self.conversations.get(path.split("/")[3])
            if conv is None:
                await send_json(send, 404, {"detail": "Not Found"})
                return
            evs = [json.loads(f) for f in conv.frames if f.startswith("{")]
            evs = [e for e in evs if isinstance(e, dict) and e.get("key") != "full_state"]
            evs.sort(key=lambda e: str(e.get("timestamp")), reverse=True)
            await send_json(send, 200, {"items": evs[:1], "next_page_id": None})
            return
        if method == "GET" and path.startswith("/api/conversations/"):
            cid = path.rsplit("/", 1)[-1]
            conv = self.conversations.get(cid)
            if conv is None:
                await send_json(send, 404, {"detail": "Not Found"})
            else:
                await send_json(send, 200, {"id": cid, "execution_status": conv.status})
            return
        if method == "POST":
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            self.posts.append((path, body))
            if self.post_hang:
                await trio.sleep_forever()
            await send_json(send, self.post_status,
                             {"success": True} if self.post_status < 300 else {"detail": f"stub {self.post_status}"})
            return
        await send_json(send, 404, {"detail": "Not Found"})

    async def _socket(self, scope, receive, send) -> None:
        msg = await receive()
        if msg["type"] != "websocket.connect":
            return
        path = scope["path"]
        self.socket_urls.append(path + "?" + scope.get("query_string", b"").decode())
        await send({"type": "websocket.accept"})
        got: list[str] = []
        self.inbound.append(got)
        self.open_sockets += 1
        try:
            with trio.move_on_after(10) as cs:
                first = await receive()
            if cs.cancelled_caught or first["type"] != "websocket.receive":
                await send({"type": "websocket.close", "code": 4001})
                return
            text = first.get("text") or ""
            got.append(text)
            try:
                auth = json.loads(text)
            except ValueError:
                auth = None
            ok = isinstance(auth, dict) and auth.get("type") == "auth" and \
                (not self.key or auth.get("session_api_key") == self.key)
            if self.socket_close_on_auth or not ok:
                await send({"type": "websocket.close", "code": 4001, "reason": "Authentication failed"})
                return
            cid = path.rsplit("/", 1)[-1]
            conv = self.conversations.get(cid)
            if conv is None:
                await send({"type": "websocket.close", "code": 4004, "reason": "Conversation not found"})
                return
            if self.socket_garbage:
                for junk in ("not json", "{truncated", "[1, 2", "\x00\x01"):
                    await send({"type": "websocket.send", "text": junk})
            for i, frame in enumerate(list(conv.frames)):
                if i == 1 and self.replay_delay:
                    await trio.sleep(self.replay_delay)
                await send({"type": "websocket.send", "text": frame})
            while True:
                m = await receive()
                if m["type"] == "websocket.disconnect":
                    return
                got.append(m.get("text") or "")
        finally:
            self.open_sockets -= 1


def state_frame(key: str, value: Any, ts: str, eid: str | None = None) -> dict:
    return {"kind": "ConversationStateUpdateEvent", "id": eid or new_conversation_id(), "timestamp": ts,
            "source": "environment", "key": key, "value": value}


def stub_frames(i: int, n_events: int = 6) -> list[dict]:
    """A small realistic conversation history for the stub: the connect
    snapshot, a run with one confirmed tool call, finished."""
    base = f"2026-11-30T10:{i // 3600 % 60:02d}:{i // 60 % 60:02d}.{i % 60:06d}"
    frames = [state_frame("full_state", {"execution_status": "finished"}, "2026-11-30T23:59:59.000000"),
              state_frame("execution_status", "running", base),
              {"kind": "ActionEvent", "id": new_conversation_id(), "timestamp": base, "source": "agent",
               "tool_name": "terminal", "tool_call_id": f"call_{i}", "llm_response_id": f"resp_{i}",
               "action": {"command": "ls", "kind": "TerminalAction"}},
              {"kind": "ObservationEvent", "id": new_conversation_id(), "timestamp": base,
               "source": "environment", "tool_name": "terminal", "tool_call_id": f"call_{i}",
               "observation": {"content": [{"type": "text", "text": "README.md"}], "is_error": False}},
              state_frame("execution_status", "finished", base)]
    return frames[: max(1, n_events)]


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.openhands stub --conversations N [--port P]``:
    serve a :class:`StubAgentServer` with N finished conversations; prints
    its URL on the first stdout line (for benchmarks)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tests.support.openhands")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stub")
    st.add_argument("--conversations", type=int, default=10)
    st.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    stub = StubAgentServer()
    for i in range(args.conversations):
        stub.add(frames=stub_frames(i), status="finished")

    async def serve() -> None:
        async with trio.open_nursery() as n:
            url = await n.start(partial(stub.serve, port=args.port))
            print(url, flush=True)

    trio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
