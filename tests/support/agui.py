"""The real AG-UI peers for the tests, all on loopback:

- :class:`AguiServer`: the real pydantic-ai AG-UI server
  (:mod:`tests.support.agui_server`: ``pydantic-ai-slim[ag-ui]``'s
  ``AGUIAdapter`` over its ``TestModel``, no LLM) as a process; ``tap`` is the
  directory where it writes the exact bytes of each run's response.
- :func:`node_client_run`: one run with the real ``@ag-ui/client``
  :data:`CLIENT_VERSION` ``HttpAgent`` on Node (installed into the vendor
  cache through :mod:`tests.support.vendors`); returns what the client
  decoded and rebuilt.
- :func:`run_input`: a ``RunAgentInput`` body; :func:`post_run`: POST one
  with httpx and return the raw response bytes (the byte-level UI).
- :class:`AguiDaemon`: the daemon with the AG-UI bridge in front of an
  upstream.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.daemon import ROOT, DaemonProcess
from tests.support.net import free_port
from tests.support.vendors import npm_install, skip_loudly

CLIENT_VERSION = "1.0.0"

STORY = (
    "run.started",
    "x.agui.text_message.start",        # the empty parent of the tool calls: no end, no reply
    "tool.requested", "tool.requested",  # lookup, plan
    "tool.completed", "tool.completed",  # names joined from the starts
    "run.step.started",                 # planning: the events inside carry step=planning
    "state.snapshot", "state.delta", "x.agui.activity.snapshot", "x.agui.custom.event",
    "run.step.finished",
    "x.agui.text_message.start", "x.agui.text_message.end",  # the answer
    "run.finished",
)
"""The AEP story of one run of :mod:`tests.support.agui_server`'s agent (the
event sequence in ``tests/fixtures/agui_real/pydantic_ai_tool_run.sse``, each
event mapped per the design record's table), at the default posture."""
CLIENT_SCRIPT = Path(__file__).with_name("agui_client.js")


def require_pydantic_ai() -> str:
    """The installed ``pydantic-ai-slim`` version; skips loudly when the
    test dependency is missing."""
    try:
        from importlib.metadata import version

        import pydantic_ai.ui.ag_ui  # noqa: F401
        return version("pydantic-ai-slim")
    except ImportError as e:  # pragma: no cover - the test extra installs it
        skip_loudly(f"pydantic-ai-slim[ag-ui] is not installed ({e}); pip install -e '.[test]'")
        raise


class AguiServer:
    """``python -m tests.support.agui_server PORT`` with ``AGUI_TAP_DIR`` =
    :attr:`tap`. ``url`` is its base (``http://127.0.0.1:P``)."""

    def __init__(self, workdir: Path) -> None:
        require_pydantic_ai()
        self.workdir = Path(workdir)
        self.tap = self.workdir / "tap"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / f"agui-server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "AguiServer":
        self.tap.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
        env.update(AGUI_TAP_DIR=str(self.tap), PYTHONUNBUFFERED="1")
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.agui_server",
                                          str(self.port)], cwd=str(ROOT), env=env,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/healthz", timeout=2, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"pydantic-ai AG-UI server not up within {timeout}s:\n"
                             f"{self.log_path.read_text(errors='replace')[-4000:]}")

    def sent(self, run_id: str) -> bytes:
        """The exact body bytes the server sent for ``run_id``."""
        return (self.tap / f"{run_id}.sse").read_bytes()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def run_input(thread: str, run: str, text: str = "What is the weather in Paris?") -> dict[str, Any]:
    """A minimal AG-UI 1.0 ``RunAgentInput``."""
    return {"threadId": thread, "runId": run, "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [{"id": f"u-{run}", "role": "user", "content": text}]}


def post_run(base: str, thread: str, run: str, *, timeout: float = 60.0) -> tuple[int, dict, bytes]:
    """POST a run as the UI does (``Accept: text/event-stream``); returns
    ``(status, headers, raw body bytes)``, the bytes as they arrived."""
    body = json.dumps(run_input(thread, run)).encode()
    with httpx.Client(trust_env=False, timeout=timeout) as c:
        with c.stream("POST", base + "/", content=body, headers={
                "content-type": "application/json", "accept": "text/event-stream"}) as r:
            data = b"".join(r.iter_raw())
            return r.status_code, dict(r.headers), data


def node_client_run(url: str, thread: str, run: str,
                    prompt: str = "What is the weather in Paris?", timeout: float = 90.0) -> dict:
    """One run with the real ``@ag-ui/client`` ``HttpAgent`` against ``url``;
    ``{ok, events, messages, newMessages, error}`` (see agui_client.js)."""
    node = shutil.which("node")
    if node is None:
        skip_loudly("node is not on PATH: the @ag-ui/client test cannot run")
    prefix = npm_install("@ag-ui/client", CLIENT_VERSION)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AEP_")},
           "NODE_PATH": str(prefix / "node_modules"), "SUPPRESS_TRANSFORMATION_WARNINGS": "true"}
    proc = subprocess.run([node, str(CLIENT_SCRIPT), url, thread, run, prompt], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"@ag-ui/client printed nothing (exit {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(lines[-1])


class AguiDaemon(DaemonProcess):
    """The daemon with ``AEP_BRIDGE_AGUI=1`` in front of ``upstream``, its
    proxy on a free port (:attr:`proxy_url`)."""

    def __init__(self, state: Path, upstream: str, env: dict[str, str] | None = None, *,
                 token: str | None = None) -> None:
        self.upstream = upstream
        self.proxy_port = free_port()
        super().__init__(state, env, token=token)

    def vendor_env(self) -> dict[str, str]:
        return {"AEP_BRIDGE_AGUI": "1", "AEP_BRIDGE_OTLP_IN": "0",
                "AEP_AGUI_UPSTREAM": self.upstream,
                "AEP_AGUI_LISTEN": f"127.0.0.1:{self.proxy_port}"}

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"


def capture(out_dir: Path) -> None:
    """Regenerate ``tests/fixtures/agui_real/`` from a live pydantic-ai
    server: ``python -m tests.support.agui capture`` (see its README)."""
    import tempfile
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = AguiServer(Path(tmp)).start()
        try:
            status, headers, data = post_run(server.url, "thread-capture-1", "run-capture-1")
            assert status == 200, (status, data[:500])
            (out_dir / "pydantic_ai_tool_run.sse").write_bytes(data)
            (out_dir / "pydantic_ai_tool_run.headers.json").write_text(json.dumps(
                {k: v for k, v in headers.items() if k not in ("date",)}, indent=1) + "\n")
        finally:
            server.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["capture"]:
        capture(ROOT / "tests" / "fixtures" / "agui_real")
    else:
        sys.exit("usage: python -m tests.support.agui capture")
