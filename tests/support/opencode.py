"""Real OpenCode / Kilo Code servers for the tests, plus the mock model provider.

Two pieces, both used by the integration tests, the capture script
(``tests/fixtures/opencode_real/README.md``) and the benchmark:

* :class:`MockChatProvider`: an OpenAI-compatible **chat-completions**
  provider (``POST /v1/chat/completions``, streaming SSE) served by hypercorn
  (trio worker) in-process on ``127.0.0.1``. It plays a script chosen by a
  directive in the latest user message:

  - ``AEP_BASH <command>``: one ``bash`` tool call (the servers' own tool),
    then, once the tool result comes back, a final text;
  - ``AEP_QUESTION``: one ``question`` tool call (the ask-the-user tool);
  - ``AEP_TODO``: one ``todowrite`` call (a two-item plan, one completed);
  - ``AEP_SLOW``: a text stream that trickles one chunk every 0.2 s for up to
    60 s (for abort tests); it stops when the client disconnects;
  - anything else: a short final text.

  Requests without ``tools`` (title generation, summaries) get a short plain
  text, so the script never leaks into side calls. Every request is recorded
  (the tests assert, e.g., that a reject message reached the model).

* :class:`VendorServer`: runs the vendor's **native** binary (the PID we hold
  is the server's) as ``serve --hostname 127.0.0.1 --port P`` with isolated
  ``HOME``/XDG directories, a basic-auth password, the vendor's offline
  switches (no auto-update, no model-catalog fetch, no default plugins, no
  LSP downloads, no share/telemetry/presence) and a config that points at the
  mock provider and makes ``bash`` ask for permission (it does not by default).

Binaries come from npm into the version-keyed cache outside the checkout
(:mod:`tests.support.vendors`).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from bridges.core.asgi import send_json
from tests.support.daemon import DaemonProcess
from tests.support.net import free_port, http_body, serve_loopback

log = logging.getLogger("tests.opencode")

MODEL = "mock-model"
FINAL_TEXT = "All done."
PLAIN_TEXT = "Hello from the mock provider."
TITLE_TEXT = "Mock title"


# --------------------------------------------------------------------------
# the mock chat-completions provider
# --------------------------------------------------------------------------

@dataclass
class RecordedRequest:
    method: str
    path: str
    json: Any = None


@dataclass
class MockChatProvider:
    """See the module docstring. ``base_url`` is ``http://127.0.0.1:P/v1``
    once :meth:`serve` has started; ``requests`` records every request;
    ``slow_chunks`` counts chunks sent by slow streams (a test can wait for the
    stream to be running before aborting it)."""

    requests: list[RecordedRequest] = field(default_factory=list)
    base_url: str | None = None
    slow_chunks: int = 0
    slow_interval: float = 0.2
    _seq: int = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.base_url = await nursery.start(serve_loopback, self._app) + "/v1"
            task_status.started(self.base_url)

    # -- queries ---------------------------------------------------------
    def chat_requests(self) -> list[dict]:
        return [r.json for r in self.requests
                if r.path.endswith("/chat/completions") and isinstance(r.json, dict)]

    def tool_results(self) -> list[str]:
        """The text of every ``role: tool`` message the servers sent back."""
        return tool_results(self.chat_requests())

    # -- ASGI ------------------------------------------------------------
    def _next_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}_{self._seq}"

    async def _app(self, scope, receive, send) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        if not scope["path"].startswith("/_aep/"):
            self.requests.append(RecordedRequest(scope["method"], scope["path"], parsed))
        path = scope["path"].rstrip("/")
        if path == "/_aep/requests":  # the recorder, for a test in another process
            await send_json(send, 200, {"chat": self.chat_requests(),
                                         "slow_chunks": self.slow_chunks})
            return
        if scope["method"] == "POST" and path.endswith("/chat/completions"):
            await self._chat(parsed if isinstance(parsed, dict) else {}, receive, send)
        elif scope["method"] == "GET" and path.endswith("/models"):
            await send_json(send, 200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "mock"}]})
        else:
            await send_json(send, 404, {"error": {"message": "mock: no route", "type": "nf"}})

    async def _chat(self, body: dict, receive, send) -> None:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        tools = {((t.get("function") or {}).get("name")) for t in body.get("tools") or []
                 if isinstance(t, dict)}
        last = messages[-1] if messages else {}
        user_text = ""
        for m in reversed(messages):
            if m.get("role") == "user":
                user_text = _text_of(m.get("content"))
                break
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        cid = self._next_id("chatcmpl")
        if not tools:
            await self._text(send, cid, [TITLE_TEXT])
        elif last.get("role") == "tool":
            await self._text(send, cid, [FINAL_TEXT])
        elif "AEP_BASH" in user_text and "bash" in tools:
            cmd = user_text.split("AEP_BASH", 1)[1].strip().splitlines()[0] or "echo hi"
            await self._tool(send, cid, "bash", {"command": cmd, "description": "Run it"})
        elif "AEP_QUESTION" in user_text and "question" in tools:
            await self._tool(send, cid, "question", {"questions": [{
                "question": "Which database should the new service use?",
                "header": "Database",
                "options": [{"label": "PostgreSQL", "description": "relational"},
                            {"label": "SQLite", "description": "embedded"}]}]})
        elif "AEP_TODO" in user_text and "todowrite" in tools:
            await self._tool(send, cid, "todowrite", {"todos": [
                {"content": "write the fix", "status": "completed", "priority": "high"},
                {"content": "run the suite", "status": "pending", "priority": "medium"}]})
        elif "AEP_SLOW" in user_text:
            await self._slow(send, receive, cid)
        else:
            await self._text(send, cid, [PLAIN_TEXT])

    async def _chunk(self, send, cid: str, delta: dict, finish: str | None = None,
                     usage: dict | None = None) -> None:
        obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": 0,
                               "model": MODEL,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            obj["usage"] = usage
        await send({"type": "http.response.body",
                    "body": f"data: {json.dumps(obj)}\n\n".encode(), "more_body": True})

    async def _done(self, send, cid: str, finish: str) -> None:
        await self._chunk(send, cid, {}, finish, usage={
            "prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _text(self, send, cid: str, parts: list[str]) -> None:
        await self._chunk(send, cid, {"role": "assistant", "content": ""})
        for p in parts:
            await self._chunk(send, cid, {"content": p})
        await self._done(send, cid, "stop")

    async def _tool(self, send, cid: str, name: str, args: dict) -> None:
        call = self._next_id("call")
        await self._chunk(send, cid, {"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": call, "type": "function",
             "function": {"name": name, "arguments": ""}}]})
        await self._chunk(send, cid, {"tool_calls": [
            {"index": 0, "function": {"arguments": json.dumps(args)}}]})
        await self._done(send, cid, "tool_calls")

    async def _slow(self, send, receive, cid: str) -> None:
        async def stream(cancel: trio.CancelScope) -> None:
            await self._chunk(send, cid, {"role": "assistant", "content": ""})
            deadline = trio.current_time() + 60
            while trio.current_time() < deadline:
                await self._chunk(send, cid, {"content": "tick "})
                self.slow_chunks += 1
                await trio.sleep(self.slow_interval)
            await self._done(send, cid, "stop")
            cancel.cancel()

        async def watch(cancel: trio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            cancel.cancel()

        try:
            async with trio.open_nursery() as n:
                n.start_soon(stream, n.cancel_scope)
                n.start_soon(watch, n.cancel_scope)
        except Exception:  # the client went away mid-send
            pass


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def tool_results(chat_requests: list[dict]) -> list[str]:
    """The text of every ``role: tool`` message in these chat-completions bodies."""
    return [_text_of(m.get("content")) for body in chat_requests
            for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "tool"]


class MockProviderProcess:
    """:class:`MockChatProvider` in its own process (for module-scoped
    fixtures, which cannot hold a trio task): ``start()`` launches
    ``python -m tests.support.opencode mock`` and reads its base URL;
    :meth:`chat_requests` / :meth:`tool_results` / :meth:`slow_chunks` ask
    the process over HTTP; :meth:`stop` ends it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.base_url: str | None = None

    def start(self, timeout: float = 30) -> "MockProviderProcess":
        import sys
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.opencode", "mock"],
                                     cwd=str(root), stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"mock provider did not start: {line!r}")
        self.base_url = line
        return self

    def _recorded(self) -> dict:
        assert self.base_url is not None
        root = self.base_url.rsplit("/v1", 1)[0]
        return httpx.get(f"{root}/_aep/requests", timeout=10).json()

    def chat_requests(self) -> list[dict]:
        return self._recorded()["chat"]

    def tool_results(self) -> list[str]:
        """The text of every ``role: tool`` message the servers sent back."""
        return tool_results(self.chat_requests())

    def slow_chunks(self) -> int:
        return self._recorded()["slow_chunks"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None


async def _serve_mock_forever() -> None:
    import sys
    mock = MockChatProvider()
    async with trio.open_nursery() as n:
        url = await n.start(mock.serve)
        sys.stdout.write(url + "\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------
# vendor binaries
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class VendorSpec:
    """How to install and run one vendor's server.

    ``package``/``version``: the npm package pinned for the tests;
    ``binary``: the native binary's path inside ``node_modules`` (the
    platform package; the JS shim is never run); ``env``: the vendor's
    environment prefix (``OPENCODE`` / ``KILO``); ``user``: the vendor's
    default basic-auth user; ``offline``: the switches that keep the server
    off the network."""

    name: str
    package: str
    version: str
    binary: str
    env: str
    user: str
    offline: tuple[tuple[str, str], ...]


OPENCODE = VendorSpec(
    name="opencode", package="opencode-ai", version="1.18.33",
    binary="node_modules/opencode-linux-x64/bin/opencode", env="OPENCODE", user="opencode",
    offline=(("OPENCODE_DISABLE_AUTOUPDATE", "1"), ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
             ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1"), ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1"),
             ("OPENCODE_DISABLE_SHARE", "1"), ("OPENCODE_DISABLE_CLAUDE_CODE", "1"),
             ("OPENCODE_DISABLE_EXTERNAL_SKILLS", "1"), ("OPENCODE_DISABLE_PROJECT_CONFIG", "1"),
             ("OPENCODE_ENABLE_QUESTION_TOOL", "1")),
)

# @kilocode/cli 7.8.1 (latest) has no linux-x64 platform package on npm;
# 7.7.7 is the newest release whose platform binary installs.
KILOCODE = VendorSpec(
    name="kilocode", package="@kilocode/cli", version="7.7.7",
    binary="node_modules/@kilocode/cli-linux-x64/bin/kilo", env="KILO", user="kilo",
    offline=(("KILO_DISABLE_AUTOUPDATE", "1"), ("KILO_DISABLE_MODELS_FETCH", "1"),
             ("KILO_DISABLE_DEFAULT_PLUGINS", "1"), ("KILO_DISABLE_LSP_DOWNLOAD", "1"),
             ("KILO_DISABLE_SHARE", "1"), ("KILO_DISABLE_SESSION_INGEST", "1"),
             ("KILO_DISABLE_CLAUDE_CODE", "1"), ("KILO_DISABLE_EXTERNAL_SKILLS", "1"),
             ("KILO_DISABLE_PROJECT_CONFIG", "1"), ("KILO_DISABLE_PRESENCE", "1"),
             ("KILO_DISABLE_CODEBASE_INDEXING", "1"), ("KILO_TELEMETRY_LEVEL", "off"),
             ("KILO_NO_DAEMON", "1"), ("KILO_ENABLE_QUESTION_TOOL", "1")),
)

VENDORS = {"opencode": OPENCODE, "kilocode": KILOCODE}


def install(spec: VendorSpec) -> Path:
    """The vendor's native binary, installing ``spec.package@spec.version``
    with npm into the shared version-keyed cache when missing
    (:mod:`tests.support.vendors`: a loud skip when npm or the registry is
    unavailable, a failure for a wrong pin)."""
    from tests.support import vendors
    prefix = vendors.npm_install(spec.package, spec.version)
    path = prefix / spec.binary
    if vendors.is_native_executable(path):
        return path
    return vendors.find_binary(prefix / "node_modules", Path(spec.binary).name)


# --------------------------------------------------------------------------
# the server runner
# --------------------------------------------------------------------------

def vendor_config(provider_url: str) -> dict:
    """The server config: the mock provider as the only provider, ``bash``
    asking for permission, snapshots/sharing/updates off."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "enabled_providers": ["mock"],
        "provider": {"mock": {
            "npm": "@ai-sdk/openai-compatible", "name": "Mock",
            "options": {"baseURL": provider_url, "apiKey": "mock-key"},
            "models": {MODEL: {"name": "Mock model", "tool_call": True,
                               "limit": {"context": 100000, "output": 4096}}}}},
        "model": f"mock/{MODEL}",
        "small_model": f"mock/{MODEL}",
        "permission": {"bash": "ask", "edit": "allow", "question": "allow"},
    }


class VendorServer:
    """One vendor server process (see the module docstring).

    The process is a plain ``subprocess.Popen`` of the native binary (its
    own session, so a kill reaches only it): module-scoped fixtures start it
    synchronously (:meth:`start_sync`), trio tests drive it asynchronously
    (:meth:`start`, :meth:`restart`). ``url``, ``username``, ``password`` and
    ``directory`` (the project dir, the server's cwd) are what a bridge
    needs; :meth:`client` is an httpx client with the credentials, for
    driving the server like a user."""

    def __init__(self, spec: VendorSpec, binary: Path, workdir: Path, provider_url: str,
                 *, password: str = "s3cret-test-pw", port: int | None = None) -> None:
        self.spec = spec
        self.binary = binary
        self.workdir = Path(workdir)
        self.provider_url = provider_url
        self.password = password
        self.username = spec.user
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.directory = self.workdir / "project"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "server.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def env(self) -> dict[str, str]:
        home = self.workdir / "home"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "TMPDIR": str(self.workdir / "tmp"),
            f"{self.spec.env}_SERVER_PASSWORD": self.password,
            f"{self.spec.env}_CONFIG_CONTENT": json.dumps(vendor_config(self.provider_url)),
        }
        env.update(dict(self.spec.offline))
        return env

    def client(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, auth=(self.username, self.password),
                                 params={"directory": str(self.directory)},
                                 timeout=kw.pop("timeout", 30), **kw)

    # -- process ----------------------------------------------------------
    def spawn(self) -> None:
        """Start the process (returns at once; see :meth:`start`)."""
        for d in ("home", "tmp", "project"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        argv = [str(self.binary), "serve", "--hostname", "127.0.0.1", "--port", str(self.port)]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(argv, env=self.env(), cwd=str(self.directory),
                                         stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                         start_new_session=True)

    def _ready_once(self, c: httpx.Client) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.spec.name} exited {self.proc.returncode}: {self.tail()}")
        try:
            return c.get(f"{self.url}/global/health").status_code == 200
        except httpx.HTTPError:
            return False

    def start_sync(self, *, timeout: float = 90) -> None:
        self.spawn()
        t0 = time.monotonic()
        with httpx.Client(auth=(self.username, self.password), timeout=5) as c:
            while not self._ready_once(c):
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"{self.spec.name} not ready in {timeout}s: {self.tail()}")
                time.sleep(0.2)

    async def start(self, *, timeout: float = 90) -> None:
        self.spawn()
        await self.wait_ready(timeout)

    async def wait_ready(self, timeout: float = 90) -> None:
        t0 = time.monotonic()
        async with httpx.AsyncClient(auth=(self.username, self.password), timeout=5) as c:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"{self.spec.name} exited {self.proc.returncode}: "
                                       f"{self.tail()}")
                try:
                    if (await c.get(f"{self.url}/global/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"{self.spec.name} not ready in {timeout}s: {self.tail()}")
                await trio.sleep(0.2)

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, *, kill: bool = False) -> None:
        """Terminate (or kill) the process and reap it (SIGKILL after 5 s)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    async def restart(self, *, kill: bool = True) -> None:
        """Kill the server (SIGKILL by default: a crash) and start it again
        on the same port with the same state directories."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill() if kill else proc.terminate()
            with trio.fail_after(10):
                while proc.poll() is None:
                    await trio.sleep(0.05)
        await self.start()

    # -- driving the server like a user ---------------------------------
    async def new_session(self, c: httpx.AsyncClient, *, directory: str | None = None) -> str:
        params = {"directory": directory} if directory else None
        r = await c.post("/session", json={}, params=params)
        r.raise_for_status()
        return r.json()["id"]

    async def prompt_async(self, c: httpx.AsyncClient, session: str, text: str) -> None:
        """``POST /session/{id}/prompt_async``: queue a user prompt, return at once."""
        r = await c.post(f"/session/{session}/prompt_async", json={
            "parts": [{"type": "text", "text": text}],
            "model": {"providerID": "mock", "modelID": MODEL}})
        r.raise_for_status()

    async def pending_permissions(self, c: httpx.AsyncClient) -> list[dict]:
        r = await c.get("/permission")
        r.raise_for_status()
        return r.json()


# --------------------------------------------------------------------------
# capture: record what a real server sends (tests/fixtures/*_real/)
# --------------------------------------------------------------------------

async def _record_stream(srv: VendorServer, path: str, out: list, t0: float,
                         headers: dict | None = None) -> None:
    from httpx_sse import aconnect_sse
    async with httpx.AsyncClient(auth=(srv.username, srv.password), timeout=None) as c:
        try:
            async with aconnect_sse(c, "GET", srv.url + path, headers=headers or {}) as es:
                async for sse in es.aiter_sse():
                    out.append({"t": round(time.monotonic() - t0, 3), "stream": path,
                                "event": sse.event, "id": sse.id or None, "data": sse.data})
        except httpx.HTTPError as e:
            out.append({"t": round(time.monotonic() - t0, 3), "stream": path,
                        "error": type(e).__name__})


async def _wait_for(frames: list, pred, timeout: float = 30, start: int = 0) -> dict:
    """The first frame at index >= ``start`` whose payload satisfies ``pred``."""
    with trio.fail_after(timeout):
        seen = start
        while True:
            for f in frames[seen:]:
                try:
                    j = json.loads(f.get("data") or "null")
                except ValueError:
                    continue
                if isinstance(j, dict) and pred(j.get("payload", j)):
                    return j.get("payload", j)
            seen = len(frames)
            await trio.sleep(0.05)


async def capture(vendor: str, dest: Path, *, heartbeat_wait: float = 35) -> None:
    """Drive a real server through the scenarios and write ``dest/*.json``:
    ``frames.json`` (every SSE frame of ``/global/event`` and ``/event``, in
    arrival order, with a relative time), ``rest.json`` (the REST requests
    and the servers' answers) and ``meta.json`` (versions). Secrets are not
    recorded (the password is a throwaway test value and never written)."""
    spec = VENDORS[vendor]
    binary = install(spec)
    import tempfile
    mock = MockChatProvider()
    frames: list = []
    rest: list = []
    t0 = time.monotonic()

    mark = [0]

    async def call(c: httpx.AsyncClient, label: str, method: str, path: str, body=None):
        if label.startswith("prompt"):
            mark[0] = len(frames)
        r = await c.request(method, path, json=body)
        try:
            answer = r.json()
        except ValueError:
            answer = r.text[:2000]
        rest.append({"t": round(time.monotonic() - t0, 3), "label": label, "method": method,
                     "path": path, "body": body, "status": r.status_code, "answer": answer})
        return r

    def of_type(t, sid=None):
        return lambda p: p.get("type") == t and (sid is None or _sid(p) == sid)

    srv: VendorServer | None = None
    with tempfile.TemporaryDirectory(prefix=f"aep-capture-{vendor}-") as tmp:
        try:
            async with trio.open_nursery() as n:
                await n.start(mock.serve)
                srv = VendorServer(spec, binary, Path(tmp), mock.base_url)
                await srv.start()
                n.start_soon(_record_stream, srv, "/global/event", frames, t0)
                n.start_soon(_record_stream, srv, f"/event?directory={srv.directory}", frames, t0)
                await trio.sleep(1.0)
                async with srv.client() as c:
                    await call(c, "health", "GET", "/global/health")
                    # 1. plain prompt
                    r = await call(c, "create session", "POST", "/session", {})
                    sid = r.json()["id"]
                    await call(c, "prompt", "POST", f"/session/{sid}/prompt_async",
                               {"parts": [{"type": "text", "text": "say hi"}]})
                    await _wait_for(frames, of_type("session.idle", sid), start=mark[0])
                    await call(c, "status idle", "GET", "/session/status")
                    # 2. bash ask -> reply once (current route)
                    await call(c, "prompt bash", "POST", f"/session/{sid}/prompt_async",
                               {"parts": [{"type": "text", "text": "AEP_BASH echo captured-once"}]})
                    ask = await _wait_for(frames, of_type("permission.asked", sid), start=mark[0])
                    await call(c, "status busy", "GET", "/session/status")
                    await call(c, "pending permissions", "GET", "/permission")
                    await call(c, "reply once", "POST", f"/permission/{ask['properties']['id']}/reply",
                               {"reply": "once"})
                    await _wait_for(frames, of_type("session.idle", sid), start=mark[0])
                    # 3. bash ask -> legacy reply route
                    await call(c, "prompt bash 2", "POST", f"/session/{sid}/prompt_async",
                               {"parts": [{"type": "text", "text": "AEP_BASH echo captured-legacy"}]})
                    ask = await _wait_for(frames, of_type("permission.asked", sid), start=mark[0])
                    await call(c, "legacy reply", "POST",
                               f"/session/{sid}/permissions/{ask['properties']['id']}",
                               {"response": "once"})
                    await _wait_for(frames, of_type("session.idle", sid), start=mark[0])
                    # 4. bash ask -> reject with a message
                    await call(c, "prompt bash 3", "POST", f"/session/{sid}/prompt_async",
                               {"parts": [{"type": "text", "text": "AEP_BASH rm -rf build"}]})
                    ask = await _wait_for(frames, of_type("permission.asked", sid), start=mark[0])
                    await call(c, "reject with message", "POST",
                               f"/permission/{ask['properties']['id']}/reply",
                               {"reply": "reject", "message": "not on this branch, use make clean"})
                    await _wait_for(frames, of_type("session.idle", sid), start=mark[0])
                    await call(c, "reply unknown id", "POST", "/permission/per_unknown/reply",
                               {"reply": "once"})
                    await call(c, "legacy reply unknown id", "POST",
                               f"/session/{sid}/permissions/per_unknown", {"response": "once"})
                    # 5. question -> reply
                    await call(c, "prompt question", "POST", f"/session/{sid}/prompt_async",
                               {"parts": [{"type": "text", "text": "AEP_QUESTION"}]})
                    q = None
                    with trio.move_on_after(20):
                        q = await _wait_for(frames, of_type("question.asked", sid), start=mark[0])
                    if q is not None:
                        await call(c, "pending questions", "GET", "/question")
                        await call(c, "question reply", "POST",
                                   f"/question/{q['properties']['id']}/reply",
                                   {"answers": [["SQLite"]]})
                    await _wait_for(frames, of_type("session.idle", sid), start=mark[0])
                    # 6. slow stream -> abort
                    await call(c, "prompt slow", "POST", f"/session/{sid}/prompt_async",
                               {"parts": [{"type": "text", "text": "AEP_SLOW"}]})
                    with trio.fail_after(30):
                        while mock.slow_chunks < 5:
                            await trio.sleep(0.05)
                    await call(c, "status busy slow", "GET", "/session/status")
                    await call(c, "abort", "POST", f"/session/{sid}/abort")
                    await _wait_for(frames, of_type("session.idle", sid), start=mark[0])
                    await call(c, "abort idle", "POST", f"/session/{sid}/abort")
                    # 7. a second directory (the per-instance stream scoping)
                    other = Path(tmp) / "other"
                    other.mkdir()
                    r = await c.post("/session", json={}, params={"directory": str(other)})
                    rest.append({"t": round(time.monotonic() - t0, 3),
                                 "label": "create session other dir", "method": "POST",
                                 "path": "/session?directory=<other>",
                                 "status": r.status_code, "answer": r.json()})
                    await call(c, "sessions", "GET", "/session")
                    await call(c, "delete other-dir session", "DELETE",
                               f"/session/{r.json()['id']}?directory={other}")
                    # heartbeats
                    await trio.sleep(heartbeat_wait)
                srv.stop()
                n.cancel_scope.cancel()
        finally:
            if srv is not None:
                srv.stop()
            _write_capture(dest, tmp, spec, mock, frames, rest)


def _write_capture(dest, tmp, spec, mock, frames, rest) -> None:
    vendor = spec.name
    dest.mkdir(parents=True, exist_ok=True)
    scrub = lambda s: s.replace(tmp, "/tmp/capture")  # noqa: E731
    (dest / "frames.json").write_text(scrub(json.dumps(frames, indent=1)) + "\n")
    (dest / "rest.json").write_text(scrub(json.dumps(rest, indent=1)) + "\n")
    (dest / "meta.json").write_text(json.dumps({
        "vendor": vendor, "package": spec.package, "version": spec.version,
        "binary": spec.binary, "mock_requests": len(mock.requests),
        "tool_results_seen_by_model": mock.tool_results(),
        "chat_requests": [[(m.get("role"), str(m.get("content"))[:80]) for m in b.get("messages", [])][-2:] + [bool(b.get("tools"))] for b in mock.chat_requests()]}, indent=1) + "\n")


def _sid(p: dict) -> str | None:
    props = p.get("properties") or {}
    return props.get("sessionID") or (props.get("info") or {}).get("sessionID")


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 2 and sys.argv[1] == "mock":  # the provider, for another process
        trio.run(_serve_mock_forever)
    elif len(sys.argv) == 4 and sys.argv[1] == "capture":
        trio.run(capture, sys.argv[2], Path(sys.argv[3]))
    else:
        raise SystemExit("usage: python -m tests.support.opencode mock\n"
                         "       python -m tests.support.opencode capture opencode|kilocode DEST")


# --------------------------------------------------------------------------
# the daemon under test: ``aep-bridges run`` with one SSE bridge
# --------------------------------------------------------------------------

class SseDaemon(DaemonProcess):
    """``aep-bridges run`` with only the OpenCode or Kilo Code SSE bridge
    enabled (``AEP_BRIDGE_OTLP_IN=0``), a token, and the bridge pointed at
    ``server``. ``primary`` / ``control`` set the bridge's mode and gate;
    ``password`` overrides the server's (scenario 7); ``env`` goes on top
    (:class:`tests.support.daemon.DaemonProcess`: free ports, restartable on
    ``state``). Synchronous (subprocess), so a module can share one."""

    token = "daemon-test-token-0123456789"
    scrub = ("AEP_", "OPENCODE_", "KILO_")

    def __init__(self, server: VendorServer, state: Path, *, primary: bool = True,
                 control: bool = True, password: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.server = server
        self.primary = primary
        self.control = control
        self.password = server.password if password is None else password
        self.prefix = "AEP_OPENCODE" if server.spec.name == "opencode" else "AEP_KILOCODE"
        self.bridge = "opencode_sse" if server.spec.name == "opencode" else "kilocode_sse"
        super().__init__(state, env)

    def vendor_env(self) -> dict[str, str]:
        return {
            f"AEP_BRIDGE_{self.bridge.upper()}": "1", "AEP_BRIDGE_OTLP_IN": "0",
            f"{self.prefix}_URL": self.server.url, f"{self.prefix}_PASSWORD": self.password,
            f"{self.prefix}_SSE_PRIMARY": "1" if self.primary else "0",
            f"{self.prefix}_SSE_CONTROL": "1" if self.control else "0",
        }

    def bridge_health(self) -> dict:
        return self.healthz()["bridges"][self.bridge]

    def wait_source(self, timeout: float = 30.0) -> "SseDaemon":
        """Until the bridge reads the server's event stream (``source`` true
        in ``/healthz`` and a frame read): a session created before that is seen only from
        its later events (under a parallel run's load the first test's
        session came before the subscription: ``run.started`` first, no
        ``session.started``). Raises ``AssertionError`` with the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.bridge_health()
            # and its first frame read (the server's `server.connected`, written as
            # it subscribes): the response headers alone (source true) came before
            # the subscription under load, and a session created then was missed
            if h.get("source") is True and h.get("counters", {}).get("frames", 0) >= 1:
                return self
            time.sleep(0.05)
        raise AssertionError(f"{self.bridge} not connected within {timeout}s:\n{self.log()[-4000:]}")


# --------------------------------------------------------------------------
# a stub server speaking the OpenCode protocol (faults and benchmarks only;
# never instead of the real servers)
# --------------------------------------------------------------------------

def sse_frame(obj: Any, *, directory: str = "/stub") -> bytes:
    """One ``/global/event`` frame for ``obj`` (a bus event dict, wrapped)."""
    return f"data: {json.dumps({'directory': directory, 'payload': obj})}\n\n".encode()


@dataclass
class StubSseServer:
    """Serves ``GET /global/event`` from scripts and the REST routes from a
    table, on ``127.0.0.1`` with hypercorn (trio).

    ``streams``: one script per connection, in order (the last repeats);
    a script is a list of steps: ``bytes`` (sent as is), ``("sleep", s)``,
    ``("wait", trio.Event)``, ``("close",)`` (end the response),
    ``("hang",)`` (send nothing more, keep the connection open), and as the
    first step ``("noheaders",)`` (accept, never answer: a server
    mid-restart). A script that runs out ends the response.
    ``stream_status`` / ``stream_type``: the stream's HTTP status and
    content type. ``rest``: ``{(method, path): (status, json) | "hang" |
    callable(request_body) -> (status, json)}``; unknown GETs answer ``{}``
    (``[]`` for list routes), unknown writes 404. ``requests`` records
    ``(method, path, query, body)``; ``connections`` counts stream opens."""

    streams: list[list[Any]] = field(default_factory=list)
    stream_status: int = 200
    stream_type: str = "text/event-stream"
    rest: dict[tuple[str, str], Any] = field(default_factory=dict)
    requests: list[tuple[str, str, str, Any]] = field(default_factory=list)
    connections: int = 0
    url: str | None = None

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(partial(serve_loopback, self._app,
                                                   graceful_timeout=0.1))
            task_status.started(self.url)

    def writes(self) -> list[tuple[str, str, str, Any]]:
        return [r for r in self.requests if r[0] != "GET"]

    async def _app(self, scope, receive, send) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        method, path = scope["method"], scope["path"]
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body
        self.requests.append((method, path, scope["query_string"].decode(), parsed))
        if method == "GET" and path == "/global/event":
            await self._stream(send)
            return
        handler = self.rest.get((method, path))
        if handler == "hang":
            await trio.sleep_forever()
        if callable(handler):
            handler = handler(parsed)
        if handler is None:
            if method != "GET":
                handler = (404, {"_tag": "NotFound", "message": f"no route {path}"})
            elif path in ("/permission", "/question", "/session") or path.endswith("/message"):
                handler = (200, [])
            else:
                handler = (200, {})
        status, obj = handler
        await send_json(send, status, obj)

    async def _stream(self, send) -> None:
        script = self.streams[min(self.connections, len(self.streams) - 1)] if self.streams \
            else [("hang",)]
        self.connections += 1
        if script[:1] == [("noheaders",)]:
            await trio.sleep_forever()
        await send({"type": "http.response.start", "status": self.stream_status,
                    "headers": [(b"content-type", self.stream_type.encode()),
                                (b"cache-control", b"no-cache")]})
        for step in script:
            if isinstance(step, (bytes, bytearray)):
                await send({"type": "http.response.body", "body": bytes(step), "more_body": True})
            elif step[0] == "sleep":
                await trio.sleep(step[1])
            elif step[0] == "close":
                break
            elif step[0] == "hang":
                await trio.sleep_forever()
            elif step[0] == "wait":  # a trio.Event the test sets
                await step[1].wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
