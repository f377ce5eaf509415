"""The real Codex 0.171.0 with command hooks, offline against
:class:`tests.support.mock_responses.MockResponsesServer`.

Hooks are declared in ``$CODEX_HOME/config.toml`` (``[[hooks.<Event>]]`` matcher
groups, each with ``[[hooks.<Event>.hooks]]`` handlers ``type = "command"``) and
must be **trusted** or Codex 0.171.0 skips them without a word. Trust lives in the
same user config as ``[hooks.state."<key>"] trusted_hash = "sha256:..."``
(:func:`hook_key`, :func:`trusted_hash`; the algorithm and how it was checked are
in ``tests/fixtures/codex_hooks_real/README.md``). :func:`hooks_toml` writes both,
so every live run here is also a check of the trust algorithm: the hooks fire
without ``--dangerously-bypass-hook-trust``.

``python -m tests.support.codex_hooks [OUTDIR]`` regenerates
``tests/fixtures/codex_hooks_real/`` (one file per hook delivery).
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from tests.support import codex as cx
from tests.support.hook_capture import Hooked, command_capture, read_command_captures

#: Codex 0.171.0's hook events (config name -> the snake_case label of trust keys)
HOOK_EVENTS = {
    "SessionStart": "session_start", "SessionEnd": "session_end",
    "UserPromptSubmit": "user_prompt_submit", "PreModelRequest": "pre_model_request",
    "PostModelRequest": "post_model_request", "PreToolUse": "pre_tool_use",
    "PermissionRequest": "permission_request", "PostToolUse": "post_tool_use",
    "PreCompact": "pre_compact", "PostCompact": "post_compact", "Stop": "stop",
    "SubagentStart": "subagent_start", "SubagentStop": "subagent_stop",
    "Interrupt": "interrupt",
}
DEFAULT_TIMEOUT_S = 600
#: events whose hooks default to another timeout (s) in 0.171.0 (from its hooks/list)
DEFAULT_TIMEOUT_S_BY_EVENT = {"SessionEnd": 1, "Interrupt": 1}
#: events whose written timeout Codex clamps (with a warning), and the hash uses the clamp
MAX_TIMEOUT_S_BY_EVENT = {"SessionEnd": 3, "Interrupt": 3}


def hook_key(source: Path, event: str, group: int = 0, handler: int = 0) -> str:
    """The ``hooks.state`` key of a hook: ``<source file>:<label>:<group>:<handler>``."""
    return f"{source}:{HOOK_EVENTS[event]}:{group}:{handler}"


def normalised_timeout(event: str, timeout: int | None) -> int:
    """The timeout (s) Codex 0.171.0 runs and hashes: the written one or the event's
    default, at least 1, at most 3 for SessionEnd/Interrupt."""
    value = max(1, timeout or DEFAULT_TIMEOUT_S_BY_EVENT.get(event, DEFAULT_TIMEOUT_S))
    return min(value, MAX_TIMEOUT_S_BY_EVENT.get(event, value))


def trusted_hash(event: str, command: str, *, matcher: str | None = None,
                 timeout: int | None = None, is_async: bool = False,
                 status_message: str | None = None) -> str:
    """The ``trusted_hash`` Codex 0.171.0 computes for one command handler:
    sha256 of the canonical JSON (sorted keys, compact) of the normalised identity
    (``timeout``: :func:`normalised_timeout`)."""
    handler: dict[str, Any] = {"type": "command", "command": command,
                               "timeout": normalised_timeout(event, timeout),
                               "async": is_async}
    if status_message is not None:
        handler["statusMessage"] = status_message
    ident: dict[str, Any] = {"event_name": HOOK_EVENTS[event], "hooks": [handler]}
    if matcher is not None:
        ident["matcher"] = matcher
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


def hooks_toml(source: Path, commands: dict[str, str], *, timeout: int | None = None,
               trust: bool = True) -> str:
    """``[[hooks.<Event>]]`` blocks running ``commands[event]`` (no matcher), and the
    ``[hooks.state]`` entries trusting each (``source``: the config file they go in)."""
    out, state = [], []
    for event, command in commands.items():
        out.append(f"[[hooks.{event}]]\n[[hooks.{event}.hooks]]\ntype = \"command\"\n"
                   f"command = {_toml_str(command)}\n"
                   + (f"timeout = {timeout}\n" if timeout else ""))
        if trust:
            state.append(f"[hooks.state.{_toml_str(hook_key(source, event))}]\n"
                         f"trusted_hash = {_toml_str(trusted_hash(event, command, timeout=timeout))}\n")
    return "\n".join(out + state)


async def hooks_list(binary: Path, home: Path, cwd: Path, timeout: float = 30) -> dict:
    """Codex's own view of the hooks (``codex app-server``, JSON-RPC ``hooks/list``):
    the ``data[0]`` entry for ``cwd`` (``hooks`` with ``key``, ``currentHash``,
    ``trustStatus``...; ``warnings``; ``errors``)."""
    env = cx.codex_env(binary, home, None)
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    reqs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"clientInfo": {"name": "aep-test", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "hooks/list", "params": {"cwds": [str(cwd)]}}]
    proc = await trio.lowlevel.open_process(
        [str(binary), "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, cwd=str(cwd))
    try:
        assert proc.stdin is not None and proc.stdout is not None
        await proc.stdin.send_all(b"".join(json.dumps(r).encode() + b"\n" for r in reqs))
        buf = b""
        with trio.fail_after(timeout):
            while True:
                chunk = await proc.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"app-server ended without answering: {buf[-2000:]!r}")
                buf += chunk
                for line in buf.split(b"\n"):
                    if line.startswith(b"{") and b'"id":2' in line:
                        return json.loads(line)["result"]["data"][0]
    finally:
        proc.kill()
        await proc.wait()


def base_config(model_base_url: str, *, approval_policy: str = "never",
                sandbox_mode: str = "danger-full-access") -> str:
    """``config.toml`` for one offline run against the Responses mock (no telemetry)."""
    features = "\n".join(f"{f} = false" for f in cx.OFFLINE_FEATURES_OFF)
    from tests.support.mock_responses import MODEL
    return f'''# written by tests/support/codex_hooks.py for codex {cx.CODEX_VERSION}
model = "{MODEL}"
model_provider = "mock"
approval_policy = "{approval_policy}"
sandbox_mode = "{sandbox_mode}"
check_for_update_on_startup = false

[model_providers.mock]
name = "mock"
base_url = "{model_base_url}"
env_key = "{cx.API_KEY_ENV}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
{features}

'''


@dataclass
class HookRun:
    """One hooked ``codex exec``: the run, the deliveries (oldest first), the mock."""

    run: cx.CodexRun
    hooked: list[Hooked]
    mock: Any


async def run_hooked_exec(binary: Path, root: Path, *, command: str = "echo hello",
                          events: tuple[str, ...] = tuple(HOOK_EVENTS),
                          stdout: dict[str, str] | None = None, trust: bool = True,
                          approval_policy: str = "never",
                          sandbox_mode: str = "danger-full-access",
                          extra_args: dict | None = None, args: tuple[str, ...] = (),
                          timeout: float = 120) -> HookRun:
    """``codex exec`` (the mock: one shell call running ``command``, then a final
    message) with a capture command hook on each of ``events`` (``stdout[event]``:
    what that hook prints back, e.g. a decision; ``extra_args``: merged into the
    shell call's arguments; ``args``: more ``codex exec`` flags)."""
    from tests.support.mock_responses import MockResponsesServer
    home, cmd_dir = root / "home", root / "cmd"
    cmd_dir.mkdir(parents=True)
    (home / ".codex").mkdir(parents=True)
    source = home / ".codex" / "config.toml"
    commands = {ev: command_capture(cmd_dir, ev, (stdout or {}).get(ev, "")) for ev in events}
    mock = MockResponsesServer(command=command, extra_args=dict(extra_args or {}))
    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        assert mock.base_url
        cfg = (base_config(mock.base_url, approval_policy=approval_policy,
                           sandbox_mode=sandbox_mode)
               + hooks_toml(source, commands, trust=trust))
        proxy = mock.base_url.rsplit("/v1", 1)[0]
        run = await cx.run_codex_exec(binary, home, cx.PROMPT, cfg, proxy_url=proxy,
                                      timeout=timeout, args=args)
        nursery.cancel_scope.cancel()
    return HookRun(run, read_command_captures(cmd_dir), mock)


def tui_config(model_base_url: str, work: Path) -> str:
    """``config.toml`` for the Codex TUI offline: on-request + workspace-write (so an
    escalation asks), the work dir trusted (no folder-trust screen), no background
    app-server (``features.daemon_auto_start = false``: one process, which runs the
    hooks and exits with the TUI), no tooltips (their announcement tip is fetched
    from raw.githubusercontent.com)."""
    cfg = base_config(model_base_url, approval_policy="on-request",
                      sandbox_mode="workspace-write")
    cfg = cfg.replace("[features]\n", "[features]\ndaemon_auto_start = false\n")
    return cfg + (f"[tui]\nshow_tooltips = false\n\n"
                  f"[projects.{_toml_str(str(work))}]\ntrust_level = \"trusted\"\n\n")


def start_tui(tmux: str, binary: Path, root: Path, mock: Any, commands: dict[str, str]):
    """Codex's TUI in ``root/home/work`` under tmux (a
    :class:`tests.support.claude_code.Tui`), with ``commands`` as trusted hooks;
    ``mock``: a started Responses mock (also the proxy tripwire)."""
    from tests.support.claude_code import Tui
    home = root / "home"
    work = home / "work"
    for d in (home / ".codex", home / "tmp", work):
        d.mkdir(parents=True, exist_ok=True)
    source = home / ".codex" / "config.toml"
    source.write_text(tui_config(mock.base_url, work) + hooks_toml(source, commands))
    env = cx.codex_env(binary, home, mock.base_url.rsplit("/v1", 1)[0])
    return Tui.launch(tmux, home / "tmux.sock", work, env, (str(binary),), session="cx")


async def capture_tui(binary: Path, root: Path, tmux: str = "tmux") -> HookRun:
    """The TUI scenario of the fixtures: every event hooked (empty answers), an
    escalation request whose dialog is answered "Yes" at the terminal, then Ctrl-C
    twice (exit)."""
    from tests.support.mock_responses import MockResponsesServer
    cmd_dir = root / "cmd"
    cmd_dir.mkdir(parents=True)
    commands = {ev: command_capture(cmd_dir, ev) for ev in HOOK_EVENTS}
    mock = MockResponsesServer(command=f"touch {root}/outside.txt && echo made",
                               extra_args=ESCALATE)

    def events() -> list[str]:
        return [h.event for h in read_command_captures(cmd_dir)]

    async def wait_event(event: str) -> None:
        with trio.fail_after(60):
            while event not in events():
                await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        await nursery.start(mock.serve)
        with start_tui(tmux, binary, root, mock, commands) as tui:
            await tui.wait_for("Ask Codex to do anything", timeout=90)
            tui.type_line("run it")
            await tui.wait_for("Would you like to run the following command?")
            tui.send("Enter")
            await wait_event("Stop")
            tui.send("C-c")
            await trio.sleep(0.5)
            tui.send("C-c")
            with trio.move_on_after(20):
                await wait_event("SessionEnd")
        nursery.cancel_scope.cancel()
    run = cx.CodexRun(0, "", "", [], root / "home")
    return HookRun(run, read_command_captures(cmd_dir), mock)


def scrub(value: Any, root: Path) -> Any:
    text = json.dumps(value).replace(str(root), "/TMP")
    return json.loads(re.sub(r"/tmp/aep-cxh-[A-Za-z0-9_]+", "/TMP", text))


ESCALATE = {"sandbox_permissions": "require_escalated",
            "justification": "write outside the workspace"}
ESCALATED_FLAGS = {"approval_policy": "on-request", "sandbox_mode": "workspace-write",
                   "extra_args": ESCALATE, "args": ("--approve-for-me",)}


def permission_decision(behavior: str, message: str = "") -> str:
    """A PermissionRequest hook's stdout: Claude Code's decision shape."""
    decision = {"behavior": behavior, **({"message": message} if message else {})}
    return json.dumps({"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                                              "decision": decision}})


#: name -> (how it was made, run_hooked_exec keyword arguments; "@ROOT@" in the
#: command is the temp root)
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "exec-shell": ("codex exec, approval never, danger-full-access; the mock runs "
                   "`echo hello` then answers; every event hooked", {}),
    "exec-shell-failure": ("the same with a command that exits 3",
                           {"command": "echo oops >&2; exit 3"}),
    "exec-permission-allow": (
        "codex exec --approve-for-me, on-request + workspace-write, the shell call asks "
        "sandbox_permissions=require_escalated (a file outside the workspace); the "
        "PermissionRequest hook prints behavior allow",
        {"command": "touch @ROOT@/outside.txt && echo made", **ESCALATED_FLAGS,
         "stdout": {"PermissionRequest": permission_decision("allow")}}),
    "exec-permission-deny": (
        "the same; the PermissionRequest hook prints behavior deny + message",
        {"command": "touch @ROOT@/outside.txt && echo made", **ESCALATED_FLAGS,
         "stdout": {"PermissionRequest": permission_decision("deny", "AEP: not now")}}),
}


def write_fixtures(outdir: Path) -> None:
    """Regenerate ``outdir``: ``<scenario>/<NN>-<Event>.json`` and ``manifest.json``."""
    binary = cx.codex_binary()
    manifest: dict[str, Any] = {"codex_version": cx.CODEX_VERSION, "scenarios": {}}

    async def main() -> None:
        for name, (how, kwargs) in SCENARIOS.items():
            with tempfile.TemporaryDirectory(prefix="aep-cxh-") as tmp:
                kw = dict(kwargs)
                if "command" in kw:
                    kw["command"] = kw["command"].replace("@ROOT@", tmp)
                hr = await run_hooked_exec(binary, Path(tmp), **kw)
                if hr.run.returncode != 0 or hr.mock.egress():
                    raise RuntimeError(f"{name}: {hr.run.describe()}")
                d = outdir / name
                d.mkdir(parents=True, exist_ok=True)
                for old in d.glob("*.json"):
                    old.unlink()
                order = []
                for i, h in enumerate(hr.hooked):
                    (d / f"{i:02d}-{h.event}.json").write_text(
                        json.dumps(scrub(h.body, Path(tmp)), indent=1) + "\n")
                    order.append(h.event)
                outputs = scrub([o.get("output") for o in hr.mock.tool_outputs()], Path(tmp))
            manifest["scenarios"][name] = {
                "how": how, "command": kwargs.get("command", "echo hello"),
                "exec_args": list(kwargs.get("args", ())),
                "hook_stdout": kwargs.get("stdout", {}), "events": order,
                "tool_outputs_to_model": outputs}
            print(name, order, flush=True)
        name = "tui-permission-terminal"
        with tempfile.TemporaryDirectory(prefix="aep-cxh-") as tmp:
            hr = await capture_tui(binary, Path(tmp))
            d = outdir / name
            d.mkdir(parents=True, exist_ok=True)
            for old in d.glob("*.json"):
                old.unlink()
            order = []
            for i, h in enumerate(hr.hooked):
                (d / f"{i:02d}-{h.event}.json").write_text(
                    json.dumps(scrub(h.body, Path(tmp)), indent=1) + "\n")
                order.append(h.event)
        manifest["scenarios"][name] = {
            "how": "the TUI under tmux (on-request + workspace-write, daemon_auto_start off), "
                   "an escalation request, every hook answering nothing, the dialog answered "
                   "'Yes, proceed' at the terminal, then Ctrl-C twice",
            "events": order,
            "egress": [r.path for r in hr.mock.egress()]}
        print(name, order, flush=True)
    trio.run(main)
    (outdir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    import sys
    write_fixtures(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/fixtures/codex_hooks_real"))
