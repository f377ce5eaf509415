"""The real Claude Code, offline against :mod:`tests.support.mock_anthropic`: print
mode (``claude -p``) and the interactive TUI under tmux, with hooks.

Pinned: npm ``@anthropic-ai/claude-code`` :data:`CLAUDE_CODE_VERSION` (the release
issue 27 measured; the registry still serves it, ``latest`` was 2.1.332 on
2026-12-07). The npm package's ``bin`` is a launcher; the program is the native
binary in the per-platform optional dependency
(``@anthropic-ai/claude-code-linux-x64/claude``), which we run directly.

What it needs to run offline (found by running it; nothing else reached the
network, checked with the proxy tripwire below):

- ``ANTHROPIC_BASE_URL`` = the mock (it appends ``/v1/messages``), an
  ``ANTHROPIC_API_KEY`` (any string);
- ``HOME`` a temp dir whose ``~/.claude.json`` has ``hasCompletedOnboarding``
  (else the TUI starts the first-run wizard), and for the TUI the project's
  ``hasTrustDialogAccepted`` and the key's last 20 characters in
  ``customApiKeyResponses.approved`` (else it asks about the folder and the key);
- ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (no telemetry, no update check,
  no error reporting), ``CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL=1``
  (no plugin marketplace clone at start);
- ``HTTPS_PROXY``/``HTTP_PROXY`` pointing at the mock as a tripwire (loopback in
  ``NO_PROXY``), so an attempt to leave shows up in
  :meth:`~tests.support.mock_anthropic.MockAnthropicServer.egress`.

Hooks come from ``<project>/.claude/settings.json`` (:func:`write_settings`);
:func:`all_hooks_settings` hooks every one of the 30 events of 2.1.197
(:data:`HOOK_EVENTS`): HTTP hooks to a :class:`tests.support.hook_capture.HookCapture`
(``<url>/<Event>``), and command hooks (stdin to a file) for ``SessionStart`` and
``Setup``, where HTTP hooks do not run.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from tests.support import vendors
from tests.support.hook_capture import command_capture

CLAUDE_CODE_VERSION = "2.1.197"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
#: the dummy key (never a real secret); the TUI is told it was approved
API_KEY = "sk-ant-api03-mock-key-for-the-offline-tests-0123456789abcdef"

#: every hook event Claude Code 2.1.197 knows (its settings schema's list, in its order)
HOOK_EVENTS = (
    "PreToolUse", "PostToolUse", "PostToolUseFailure", "PostToolBatch", "Notification",
    "UserPromptSubmit", "UserPromptExpansion", "SessionStart", "SessionEnd", "Stop",
    "StopFailure", "SubagentStart", "SubagentStop", "PreCompact", "PostCompact",
    "PermissionRequest", "PermissionDenied", "Setup", "TeammateIdle", "TaskCreated",
    "TaskCompleted", "Elicitation", "ElicitationResult", "ConfigChange", "WorktreeCreate",
    "WorktreeRemove", "InstructionsLoaded", "CwdChanged", "FileChanged", "MessageDisplay")
#: events whose hooks run only as commands (HTTP hooks are not run there)
COMMAND_ONLY_EVENTS = ("SessionStart", "Setup")
#: events whose entries take a ``matcher`` (tool name, source...); "" matches all
_NO_MATCHER = {"UserPromptSubmit", "Stop", "TeammateIdle", "TaskCreated", "TaskCompleted",
               "WorktreeCreate", "WorktreeRemove", "CwdChanged", "PostToolBatch",
               "UserPromptExpansion", "MessageDisplay", "StopFailure"}


def claude_binary(version: str = CLAUDE_CODE_VERSION) -> Path:
    """The native ``claude`` for this platform (installed into the vendor cache),
    checked to report ``version``. Loud skip when npm/the registry is unavailable."""
    prefix = vendors.npm_install(CLAUDE_CODE_PACKAGE, version)
    binary = vendors.find_binary(prefix / "node_modules", "claude")
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                              "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
    if out.returncode != 0 or not out.stdout.startswith(version):
        raise vendors.VendorInstallError(
            f"{binary} --version: exit {out.returncode}, {out.stdout.strip()!r} "
            f"{out.stderr.strip()[-300:]!r} (expected {version})")
    return binary


def prepare_home(home: Path, project: Path) -> None:
    """Make ``home`` (``~/.claude.json`` past onboarding, the project trusted, the
    key approved) and ``project``."""
    home.mkdir(parents=True, exist_ok=True)
    project.mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    state = {"hasCompletedOnboarding": True, "lastOnboardingVersion": CLAUDE_CODE_VERSION,
             "theme": "dark", "hasSeenTasksHint": True, "numStartups": 5,
             "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []},
             "projects": {str(project): {"hasTrustDialogAccepted": True,
                                         "hasCompletedProjectOnboarding": True,
                                         "allowedTools": []}}}
    (home / ".claude.json").write_text(json.dumps(state, indent=1))


def claude_env(home: Path, base_url: str, *, proxy_url: str | None = None,
               extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment of the Claude Code process (nothing inherited but
    PATH/locale/TERM)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    if proxy_url:
        for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            env[k] = proxy_url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    env.update(extra or {})
    return env


def http_hook(url: str, timeout_s: int | None = None) -> dict[str, Any]:
    """One ``type: "http"`` hook entry."""
    hook: dict[str, Any] = {"type": "http", "url": url}
    if timeout_s is not None:
        hook["timeout"] = timeout_s
    return hook


def all_hooks_settings(capture_url: str | None, command_dir: Path | None, *,
                       events: tuple[str, ...] = HOOK_EVENTS) -> dict[str, Any]:
    """Settings hooking every event in ``events``: HTTP to ``<capture_url>/<Event>``
    (skipped when ``capture_url`` is None), and for :data:`COMMAND_ONLY_EVENTS` a
    command writing stdin to ``command_dir`` (skipped when None)."""
    hooks: dict[str, list] = {}
    for ev in events:
        entries = []
        if ev in COMMAND_ONLY_EVENTS:
            if command_dir is not None:
                entries.append({"type": "command", "command": command_capture(command_dir, ev)})
        elif capture_url is not None:
            entries.append(http_hook(f"{capture_url}/{ev}"))
        if entries:
            group: dict[str, Any] = {"hooks": entries}
            if ev not in _NO_MATCHER:
                group["matcher"] = ""
            hooks[ev] = [group]
    settings: dict[str, Any] = {"hooks": hooks}
    if capture_url:
        settings["allowedHttpHookUrls"] = [f"{capture_url}/*"]
    return settings


def write_settings(project: Path, settings: dict[str, Any]) -> Path:
    """Write ``<project>/.claude/settings.json``; its path."""
    path = project / ".claude" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=1))
    return path


@dataclass
class ClaudeRun:
    """One ``claude -p`` run: exit status, output, the parsed ``--output-format json``
    result (``None`` when stdout was not one JSON object), the wall time in s."""

    returncode: int
    stdout: str
    stderr: str
    result: dict[str, Any] | None = None
    wall_s: float = 0.0

    def describe(self) -> str:
        return (f"claude exit {self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n"
                f"--- stderr ---\n{self.stderr[-4000:]}")


async def run_print(binary: Path, home: Path, project: Path, prompt: str, *, base_url: str,
                    args: tuple[str, ...] = (), proxy_url: str | None = None,
                    env_extra: dict[str, str] | None = None, timeout: float = 120) -> ClaudeRun:
    """``claude -p PROMPT --output-format json ARGS`` in ``project`` (``home`` made by
    :func:`prepare_home`). Raises ``trio.TooSlowError`` after ``timeout`` s."""
    cmd = [str(binary), "-p", prompt, "--output-format", "json", *args]
    env = claude_env(home, base_url, proxy_url=proxy_url, extra=env_extra)
    t0 = time.monotonic()
    with trio.fail_after(timeout):
        proc = await trio.run_process(cmd, env=env, stdin=b"", capture_stdout=True,
                                      capture_stderr=True, check=False, cwd=str(project))
    wall = time.monotonic() - t0
    out = proc.stdout.decode(errors="replace")
    result = None
    try:
        parsed = json.loads(out)
        result = parsed if isinstance(parsed, dict) else None
    except ValueError:
        pass
    return ClaudeRun(proc.returncode, out, proc.stderr.decode(errors="replace"), result, wall)


@dataclass
class Tui:
    """Claude Code's interactive TUI in a detached tmux session (its own socket
    under ``home``), driven with ``send-keys`` and read with ``capture-pane``.

    Use as ``with Tui.start(...) as tui:``; leaving kills the tmux server this
    object started (by its socket, never by name).
    """

    tmux: str
    socket: Path
    session: str = "cc"
    log: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, tmux: str, binary: Path, home: Path, project: Path, *, base_url: str,
              args: tuple[str, ...] = (), proxy_url: str | None = None,
              env_extra: dict[str, str] | None = None) -> "Tui":
        """Claude Code's TUI in ``project`` (``home`` made by :func:`prepare_home`)."""
        env = claude_env(home, base_url, proxy_url=proxy_url, extra=env_extra)
        return cls.launch(tmux, home / "tmux.sock", project, env, (str(binary), *args))

    @classmethod
    def launch(cls, tmux: str, socket: Path, cwd: Path, env: dict[str, str],
               argv: tuple[str, ...], session: str = "cc") -> "Tui":
        """Any terminal program: ``argv`` with exactly ``env`` (plus ``TERM``) in
        ``cwd``, in a 160x50 pane of a new tmux server on ``socket``."""
        env = {**env, "TERM": "xterm-256color"}
        inner = "env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        inner += " " + " ".join(shlex.quote(a) for a in argv)
        # keep the pane after exit so a crash stays readable
        inner += "; echo AEP-TUI-EXITED $?; sleep 600"
        tui = cls(tmux, socket, session)
        subprocess.run([tmux, "-S", str(socket), "-f", "/dev/null", "new-session", "-d",
                        "-s", session, "-x", "160", "-y", "50", "-c", str(cwd),
                        "sh", "-c", inner], check=True, timeout=30,
                       env={"PATH": env["PATH"], "HOME": env.get("HOME", str(cwd)),
                            "TERM": "xterm-256color"})
        return tui

    def __enter__(self) -> "Tui":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", str(self.socket), "kill-server"], check=False,
                       capture_output=True, timeout=30)

    def screen(self) -> str:
        """The visible pane as text."""
        out = subprocess.run([self.tmux, "-S", str(self.socket), "capture-pane", "-p", "-t",
                              self.session], capture_output=True, text=True, timeout=30)
        return out.stdout

    def send(self, *keys: str, literal: bool = False) -> None:
        """``send-keys`` (``literal``: ``-l``, the text as typed)."""
        flags = ["-l"] if literal else []
        self.log.append(f"send {keys!r} literal={literal}")
        subprocess.run([self.tmux, "-S", str(self.socket), "send-keys", "-t", self.session,
                        *flags, *keys], check=True, timeout=30)

    def type_line(self, text: str) -> None:
        """Type ``text`` and press Enter (Enter sent on its own, after a beat, so a
        paste-detecting input box sees a keypress, not a pasted newline)."""
        self.send(text, literal=True)
        time.sleep(0.3)
        self.send("Enter")

    async def wait_for(self, *needles: str, timeout: float = 60) -> str:
        """Poll the screen until any of ``needles`` shows; the screen. Raises
        ``AssertionError`` with the last screen on timeout."""
        screen = ""
        with trio.move_on_after(timeout):
            while True:
                screen = self.screen()
                if any(n in screen for n in needles):
                    return screen
                await trio.sleep(0.2)
        raise AssertionError(f"none of {needles!r} on screen after {timeout} s:\n{screen}")
