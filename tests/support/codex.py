"""The real Codex CLI, headless and offline, exporting its OpenTelemetry logs.

Pinned: npm ``@openai/codex`` :data:`CODEX_VERSION`. The npm package's
``bin/codex.js`` is only a launcher: it finds the native binary in the
per-platform optional dependency (``@openai/codex-linux-x64`` ->
``vendor/x86_64-unknown-linux-musl/bin/codex``), sets
``CODEX_MANAGED_BY_NPM=1`` and ``CODEX_MANAGED_PACKAGE_ROOT``, and
``execve``s it. We run that native binary directly (so the PID we hold is
Codex itself) and set the same two variables the launcher would.

What one run does (:func:`run_codex_exec`): ``codex exec --json`` with an
isolated ``HOME`` and ``CODEX_HOME`` under a temp dir, whose ``config.toml``
(:func:`config_toml`) selects

- a custom model provider ``mock`` (``wire_api = "responses"``, ``base_url``
  = the in-process :class:`tests.support.mock_responses.MockResponsesServer`,
  a dummy key from ``env_key``), no retries;
- ``approval_policy = "never"`` and ``sandbox_mode = "danger-full-access"``
  so the shell tool runs without asking (``workspace-write`` also works on a
  host where bubblewrap can create namespaces, but CI containers often cannot,
  and the harmless ``echo`` needs no sandbox to prove the telemetry path);
- ``[otel]`` with ``environment``, ``log_user_prompt`` and exactly one log
  exporter (:data:`EXPORTER_KINDS`), traces and metrics exporters off;
- the startup features that reach the internet switched off (curated
  plugin sync to github.com / chatgpt.com, apps); update checks off.

As a tripwire for anything else that phones home, ``HTTPS_PROXY``/
``HTTP_PROXY``/``ALL_PROXY`` point at the mock server (loopback exempted via
``NO_PROXY``): an outbound attempt shows up there as a ``CONNECT`` request
(:meth:`MockResponsesServer.egress`) instead of leaving the machine.

Exporter flushing, observed on 0.171.0: the log exporter is a batch exporter
and ``codex exec`` flushes it on exit: every record of the run arrives in one
export request before the process exits (no sleep needed after it).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import trio

from tests.support import vendors

#: the @openai/codex release these tests pin (npm ``latest`` on 2026-11-30)
CODEX_VERSION = "0.171.0"
CODEX_PACKAGE = "@openai/codex"

#: the three exporter kinds Codex offers for OTLP logs
EXPORTER_KINDS = ("otlp-grpc", "otlp-http-protobuf", "otlp-http-json")

#: the env var carrying the dummy provider key (its value is never a real secret)
API_KEY_ENV = "AEP_MOCK_PROVIDER_KEY"

#: Codex features switched off because they reach the internet at startup
OFFLINE_FEATURES_OFF = ("plugins", "remote_plugin", "apps")


def codex_binary(version: str = CODEX_VERSION) -> Path:
    """The native Codex executable for this platform (installs into the vendor cache).

    Loud skip when npm/the registry is unavailable; ``VendorInstallError`` otherwise.
    """
    import subprocess
    prefix = vendors.npm_install(CODEX_PACKAGE, version)
    binary = vendors.find_binary(prefix / "node_modules", "codex")
    # the cache entry must hold the release we pin, and the binary must run here
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                         timeout=60, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    if out.returncode != 0 or out.stdout.split()[-1:] != [version]:
        raise vendors.VendorInstallError(
            f"{binary} --version: exit {out.returncode}, {out.stdout.strip()!r} "
            f"{out.stderr.strip()[-300:]!r} (expected codex-cli {version})")
    return binary


def exporter_toml(kind: str, endpoint: str) -> str:
    """The inline-table value of ``[otel] exporter`` for one exporter kind.

    ``endpoint`` is the receiver's base URL (``http://127.0.0.1:PORT``): gRPC
    uses it as is, OTLP/HTTP appends ``/v1/logs`` (Codex posts to the
    endpoint verbatim, it does not add the signal path itself).
    """
    endpoint = endpoint.rstrip("/")
    if kind == "otlp-grpc":
        return f'{{ otlp-grpc = {{ endpoint = "{endpoint}" }} }}'
    if kind in ("otlp-http-protobuf", "otlp-http-json"):
        protocol = "json" if kind.endswith("json") else "binary"
        return (f'{{ otlp-http = {{ endpoint = "{endpoint}/v1/logs", '
                f'protocol = "{protocol}" }} }}')
    raise ValueError(f"unknown exporter kind {kind!r}; one of {EXPORTER_KINDS}")


def config_toml(*, model_base_url: str, model: str, exporter_kind: str, otlp_endpoint: str,
                log_user_prompt: bool = False, environment: str = "aep-test",
                sandbox_mode: str = "danger-full-access") -> str:
    """The complete ``$CODEX_HOME/config.toml`` for one headless, offline run.

    Every key is accepted by ``codex exec --strict-config`` on the pinned version.
    """
    features = "\n".join(f"{f} = false" for f in OFFLINE_FEATURES_OFF)
    return f'''# written by tests/support/codex.py for codex {CODEX_VERSION}
model = "{model}"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "{sandbox_mode}"
check_for_update_on_startup = false

[model_providers.mock]
name = "mock"
base_url = "{model_base_url}"
env_key = "{API_KEY_ENV}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[otel]
environment = "{environment}"
log_user_prompt = {"true" if log_user_prompt else "false"}
exporter = {exporter_toml(exporter_kind, otlp_endpoint)}
trace_exporter = "none"
metrics_exporter = "none"

[analytics]
enabled = false

[features]
{features}
'''


@dataclass
class CodexRun:
    """The result of one ``codex exec --json``.

    Attributes:
        returncode: the process exit status.
        stdout / stderr: decoded output (stdout is JSONL with ``--json``).
        events: the parsed JSONL events (``thread.started``, ``item.*``, ``turn.*``).
        home: the isolated ``HOME`` (``CODEX_HOME`` is ``home/.codex``).
    """

    returncode: int
    stdout: str
    stderr: str
    events: list[dict] = field(default_factory=list)
    home: Path | None = None

    @property
    def thread_id(self) -> str | None:
        """The id Codex reported in ``thread.started``: the OTel ``conversation.id``."""
        for ev in self.events:
            if ev.get("type") == "thread.started":
                return ev.get("thread_id")
        return None

    def commands(self) -> list[dict]:
        """Completed ``command_execution`` items (the shell tool runs)."""
        return [ev["item"] for ev in self.events
                if ev.get("type") == "item.completed"
                and (ev.get("item") or {}).get("type") == "command_execution"]

    def describe(self) -> str:
        return (f"codex exit {self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n"
                f"--- stderr ---\n{self.stderr[-4000:]}")


def codex_env(binary: Path, home: Path, proxy_url: str | None) -> dict[str, str]:
    """The whole environment of the Codex process (nothing inherited but PATH/locale)."""
    package_root = binary
    for parent in binary.parents:  # the launcher passes the @openai/codex package root
        if parent.name == "node_modules":
            package_root = parent / "@openai" / "codex"
            break
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TMPDIR": str(home / "tmp"),
        API_KEY_ENV: "dummy-key-for-the-mock-provider",
        "CODEX_MANAGED_BY_NPM": "1",
        "CODEX_MANAGED_PACKAGE_ROOT": str(package_root),
        "RUST_LOG": os.environ.get("AEP_CODEX_RUST_LOG", "warn"),
        "NO_COLOR": "1",
    }
    if proxy_url:
        for k in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
                  "all_proxy"):
            env[k] = proxy_url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    return env


async def run_codex_exec(binary: Path, home: Path, prompt: str, config: str, *,
                         proxy_url: str | None = None, timeout: float = 90,
                         args: tuple[str, ...] = (),
                         env_extra: dict[str, str] | None = None) -> CodexRun:
    """Write ``config`` to ``home/.codex/config.toml`` and run ``codex exec --json``.

    ``home`` is created (with ``.codex/``, ``tmp/`` and a ``work/`` directory used
    as the working root); ``args`` go before the prompt; ``env_extra`` is
    added to the environment (what the person's shell would export, e.g.
    ``AEP_TOKEN`` for the hook shim). Raises ``trio.TooSlowError`` after ``timeout`` s (the
    process is killed by trio's cancellation).
    """
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    work = home / "work"
    work.mkdir(exist_ok=True)
    (home / ".codex" / "config.toml").write_text(config)
    cmd = [str(binary), "exec", "--strict-config", "--json", "--skip-git-repo-check",
           "--color", "never", "-C", str(work), *args, prompt]
    with trio.fail_after(timeout):
        proc = await trio.run_process(cmd, env={**codex_env(binary, home, proxy_url),
                                                **(env_extra or {})},
                                      stdin=b"", capture_stdout=True, capture_stderr=True,
                                      check=False, cwd=str(work))
    out = proc.stdout.decode(errors="replace")
    events = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return CodexRun(proc.returncode, out, proc.stderr.decode(errors="replace"), events, home)


# --------------------------------------------------------------------------
# capture scenarios (the fixtures in tests/fixtures/codex_otel_real/)
# --------------------------------------------------------------------------

#: the prompt every scenario sends (the mock ignores it and plays its script)
PROMPT = "Run `echo hello` in the shell, then tell me what it printed."

#: an execpolicy rule file making ``rm`` forbidden (``$CODEX_HOME/rules/default.rules``)
FORBID_RM_RULES = 'prefix_rule(pattern=["rm"], decision="forbidden", justification="aep test")\n'


@dataclass(frozen=True)
class Scenario:
    """One recorded Codex run: the exporter kind and what the mock makes Codex do.

    ``command``: the shell command of the mock's single tool call;
    ``log_user_prompt``: Codex's ``[otel] log_user_prompt``;
    ``rules``: an execpolicy ``.rules`` file written into ``CODEX_HOME/rules``.
    """

    name: str
    kind: str
    command: str = "echo hello"
    log_user_prompt: bool = False
    rules: str = ""


SCENARIOS = (
    Scenario("otlp-grpc", "otlp-grpc"),
    Scenario("otlp-http-protobuf", "otlp-http-protobuf"),
    Scenario("otlp-http-json", "otlp-http-json"),
    # the vendor prompt flag on: the prompt text travels in codex.user_prompt
    Scenario("otlp-http-json-log-user-prompt", "otlp-http-json", log_user_prompt=True),
    # a config-forbidden command: codex.tool_result success=false, no tool_decision
    Scenario("otlp-http-protobuf-forbidden", "otlp-http-protobuf",
             command="rm -rf ./aep-nothing-here", rules=FORBID_RM_RULES),
)


async def run_scenario(binary: Path, home: Path, scenario: Scenario, *, otlp_endpoint: str,
                       mock, timeout: float = 90) -> CodexRun:
    """Run ``scenario`` against a started ``MockResponsesServer`` (``mock``), exporting
    to ``otlp_endpoint`` (the receiver's base URL; see :func:`exporter_toml`)."""
    mock.command = scenario.command
    if scenario.rules:
        (home / ".codex" / "rules").mkdir(parents=True, exist_ok=True)
        (home / ".codex" / "rules" / "default.rules").write_text(scenario.rules)
    from tests.support.mock_responses import MODEL
    cfg = config_toml(model_base_url=mock.base_url, model=MODEL, exporter_kind=scenario.kind,
                      otlp_endpoint=otlp_endpoint, log_user_prompt=scenario.log_user_prompt)
    proxy = mock.base_url.rsplit("/v1", 1)[0]
    return await run_codex_exec(binary, home, PROMPT, cfg, proxy_url=proxy, timeout=timeout)


async def capture_scenario(binary: Path, home: Path, scenario: Scenario, timeout: float = 90):
    """Run one scenario against a fresh mock provider and a fresh
    :class:`~tests.support.otlp_capture.OtlpCapture`; return ``(run, mock, capture)``."""
    from tests.support.mock_responses import MockResponsesServer
    from tests.support.otlp_capture import OtlpCapture
    mock, cap = MockResponsesServer(), OtlpCapture()
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        await nursery.start(cap.serve)
        endpoint = cap.grpc_url if scenario.kind == "otlp-grpc" else cap.http_url
        run = await run_scenario(binary, home, scenario, otlp_endpoint=endpoint, mock=mock,
                                 timeout=timeout)
        nursery.cancel_scope.cancel()
    return run, mock, cap


def write_fixtures(outdir: Path) -> None:
    """Regenerate ``tests/fixtures/codex_otel_real/`` (every scenario, raw bodies +
    ``manifest.json``). Run: ``.venv/bin/python -m tests.support.codex OUTDIR``."""
    import tempfile
    binary = codex_binary()
    manifest = {"codex_version": CODEX_VERSION, "package": CODEX_PACKAGE, "prompt": PROMPT,
                "scenarios": {}}

    async def main():
        for sc in SCENARIOS:
            with tempfile.TemporaryDirectory(prefix="aep-codex-") as tmp:
                run, mock, cap = await capture_scenario(binary, Path(tmp) / "home", sc)
            if run.returncode != 0 or not cap.logs():
                raise RuntimeError(f"{sc.name}: no usable capture\n{run.describe()}")
            if mock.egress():
                raise RuntimeError(f"{sc.name}: codex tried to leave the machine: "
                                   f"{[(r.method, r.path) for r in mock.egress()]}")
            d = outdir / sc.name
            if d.exists():
                for old in d.iterdir():
                    old.unlink()
            d.mkdir(parents=True, exist_ok=True)
            files = []
            for i, c in enumerate(cap.logs()):
                ext = "json" if c.is_json() else "pb"
                fname = f"export-{i:03d}.{ext}"
                (d / fname).write_bytes(c.body)
                files.append({"file": f"{sc.name}/{fname}", "transport": c.transport,
                              "path": c.path, "content_type": c.content_type,
                              "content_encoding": c.content_encoding})
            manifest["scenarios"][sc.name] = {
                "exporter_kind": sc.kind, "command": sc.command,
                "log_user_prompt": sc.log_user_prompt, "rules": sc.rules,
                "conversation_id": run.thread_id, "exports": files,
                "config_toml": config_toml(model_base_url="http://127.0.0.1:MOCK_PORT/v1",
                                           model="mock-codex-model", exporter_kind=sc.kind,
                                           otlp_endpoint="http://127.0.0.1:OTLP_PORT",
                                           log_user_prompt=sc.log_user_prompt),
            }
    trio.run(main)
    (outdir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    import sys
    write_fixtures(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/codex_otel_real"))
