"""``aep-bridges doctor`` for the hook bridges (issue 27's trial, finding 3):
what stands between an enabled ``claude_code`` / ``codex_hooks`` bridge and
the agent's hooks reaching it. For each enabled hook bridge:

- **installed**: our entries in the agent's user and project config (the
  ``hooks status`` reading, :mod:`supervisor.hookinstall`; the project is
  the current directory), and for Codex whether they are trusted (Codex
  skips an untrusted hook without a word); a malformed file is a failure
  with its line; hooks in both the user's and the project's file fail (the
  agent runs both: every moment reaches the daemon twice);
- **this daemon**: every installed entry points at this daemon's
  ``AEP_LISTEN`` (an HTTP hook's URL, a command hook's ``--daemon``, else
  the shim's default ``http://127.0.0.1:8787``);
- **the token**: with ``AEP_TOKEN`` set on the daemon, an HTTP hook sends
  ``Authorization: Bearer $AEP_TOKEN`` with ``AEP_TOKEN`` in its
  ``allowedEnvVars`` (and in ``httpHookAllowedEnvVars`` when the file keeps
  that list); a literal bearer token or a command hook's ``--token-file``
  holds the daemon's token (compared, never printed);
- **the spool**: moments waiting in the daemon's spool directory (and in
  one a command hook names, which must be the daemon's), counted;
- **the shim**: each command hook's interpreter and shim file exist (or
  ``aep-bridges`` is on ``PATH``);
- **the gate**: the bridge's control gate on or off, said (not a failure).

Each failure carries its fix, as the rest of ``doctor``, runnable as
printed: an install fix names this daemon's ``--daemon``, the file's
``--user`` / ``--project DIR`` and the daemon's ``--spool``."""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from .doctor import Finding

__all__ = ["LOOPBACK", "command_parts", "findings", "spool_count"]

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""})
"""Hosts that name this machine's loopback from a hook's side (a wildcard
``AEP_LISTEN`` is reached there)."""
_SHIM_DIR = re.compile(r'sys\.path\[0\] = ("(?:[^"\\]|\\.)*")')


def command_parts(command: str, agent: str) -> dict[str, str]:
    """What a shim command line says: ``launcher`` (its first word),
    ``shim_dir`` (the directory a ``-c`` launcher imports ``shim`` from),
    ``shim_file`` (a script launcher's path), ``daemon``, ``token_file``,
    ``spool`` (the options after ``agent``); absent keys were not given."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return {}
    out: dict[str, str] = {"launcher": argv[0]} if argv else {}
    for i, word in enumerate(argv):
        if (m := _SHIM_DIR.search(word)) is not None:
            try:
                out["shim_dir"] = json.loads(m.group(1))
            except ValueError:
                pass
        elif word.endswith("hooks_common/shim.py"):
            out["shim_file"] = word
        if word == agent and i > 0:
            rest = iter(argv[i + 1:])
            for arg in rest:
                name, eq, val = arg.partition("=")
                if name in ("--daemon", "--token-file", "--spool"):
                    value = val if eq else next(rest, "")
                    out[name[2:].replace("-", "_")] = value
            break
    return out


def spool_count(spool: Path, agent: str) -> int:
    """Moments waiting in ``spool`` for ``agent``: the lines of
    ``<agent>.jsonl`` and of any ``.ingesting-*`` left by a crash."""
    n = 0
    try:
        paths = [spool / f"{agent}.jsonl", *sorted(spool.glob(f"{agent}.jsonl.ingesting-*"))]
    except OSError:
        return 0
    for p in paths:
        try:
            with open(p, "rb") as f:
                n += sum(1 for line in f if line.strip())
        except OSError:
            continue
    return n


def _same_daemon(url: str, listen: tuple[str, int]) -> bool:
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    want = listen[0].lower().strip("[]")
    return port == listen[1] and (host == want or (host in LOOPBACK and want in LOOPBACK))


def _where(listen: tuple[str, int]) -> str:
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(listen[0], listen[0])
    return f"http://[{host}]:{listen[1]}" if ":" in host else f"http://{host}:{listen[1]}"


_Installed = tuple[Path, str, dict[str, dict[str, Any]], dict[str, Any]]


def _installed(agent: str, project: Path, home: Path, env: Mapping[str, str], where: str,
               unread: set[Path]) -> tuple[list[_Installed], list[Finding]]:
    """Our entries per config file that has any (``(path, the install flag
    of its scope: `` --user`` / `` --project DIR``, {event: hook}, the
    document)``; a project that is the home is one file), and the findings
    of reading them (malformed files, Codex's trust); adds to ``unread`` a
    file the agent does not read (an untrusted Codex project's)."""
    from supervisor.hookinstall import claude, codex
    from supervisor.hookinstall.cli import project_trusted
    from supervisor.hookinstall.common import Refused
    out: list[_Installed] = []
    notes: list[Finding] = []
    codex_home = Path(env.get("CODEX_HOME") or home / ".codex").expanduser()
    seen: set[Path] = set()
    for proj in (None, project):
        scope = " --user" if proj is None else f" --project {shlex.quote(str(proj))}"
        if agent == "claude-code":
            path = claude.settings_path(project=proj, home=home)
        else:
            path = codex.config_path(project=proj, codex_home=codex_home)
        if Path(os.path.realpath(path)) in seen:  # the project is the home: one file
            continue
        seen.add(Path(os.path.realpath(path)))
        try:
            if agent == "claude-code":
                found, doc = claude.ours(path)
            else:
                found, doc = codex.ours(path), {}
                state = codex.config_path(project=None, codex_home=codex_home)
                untrusted = sorted(e for e, how in codex.status(path, state_path=state).items()
                                   if how != "trusted")
                if untrusted:
                    notes.append(Finding(False, f"{agent} hooks in {path}: {len(untrusted)} not "
                                                f"trusted ({', '.join(untrusted[:4])}): Codex "
                                                "skips them without a word",
                                         f"{_install(agent, where, scope)} "
                                         "(it writes them trusted)"))
        except Refused as e:
            notes.append(Finding(False, f"{agent} hooks: {e}", "fix the file by hand, then "
                                 f"aep-bridges hooks status {agent}"))
            continue
        state = codex.config_path(project=None, codex_home=codex_home)
        if found and agent == "codex" and proj is not None and not project_trusted(state, proj):
            # Codex reads a project's config only for a trusted project: not twice, maybe never
            notes.append(Finding(bool(out), f"{agent} hooks in {path}: the project is not "
                                            "trusted: Codex does not read this file",
                                 f"trust {proj} when Codex asks, or add [projects.\"{proj}\"] "
                                 f"trust_level = \"trusted\" to {state}"))
            unread.add(path)
        if found:
            out.append((path, scope, found, doc))
    return out, notes


def _install(agent: str, where: str, scope: str, extra: str = "") -> str:
    """The ``hooks install`` command line that writes hooks for this daemon
    (``where``) into the file of ``scope`` (`` --user`` / `` --project DIR``)."""
    return f"aep-bridges hooks install {agent} --daemon {where}{scope}{extra}"


def _moments(n: int) -> str:
    return f"{n} moment{'' if n == 1 else 's'} waiting"


def _twice(agent: str, installed: list[_Installed], unread: set[Path]) -> list[Finding]:
    """Hooks for ``agent`` in both the user's and the project's file (but
    ``unread``: an untrusted Codex project's): the agent runs both, so every
    moment reaches the daemon twice (two asks per gated tool)."""
    scopes = {scope.split()[0]: (path, scope) for path, scope, _, _ in installed
              if path not in unread}
    if len(scopes) < 2:
        return []
    (user, _), (project, pscope) = scopes["--user"], scopes["--project"]
    return [Finding(False, f"{agent} hooks installed twice, in {user} and in {project}: the "
                           "agent runs both, so every moment reaches the daemon twice (two "
                           "asks per gated tool)",
                    f"aep-bridges hooks uninstall {agent}{pscope} (or aep-bridges hooks "
                    f"uninstall {agent} --user)")]


def _token(agent: str, path: Path, hooks: dict[str, dict[str, Any]], doc: dict[str, Any],
           token: str, install: str) -> list[Finding]:
    """The daemon requires ``token``: do the hooks of ``path`` send it?
    ``install``: the command that rewrites this file's hooks."""
    bad: list[str] = []
    files: set[str] = set()
    for event, hook in hooks.items():
        if hook.get("type") == "http":
            raw = hook.get("headers")
            headers: dict[str, Any] = raw if isinstance(raw, dict) else {}
            auth = str(headers.get("Authorization") or headers.get("authorization") or "")
            allowed = hook.get("allowedEnvVars")
            if auth == "Bearer $AEP_TOKEN" or auth == "Bearer ${AEP_TOKEN}":
                if not (isinstance(allowed, list) and "AEP_TOKEN" in allowed):
                    bad.append(f"{event} sends $AEP_TOKEN without AEP_TOKEN in its allowedEnvVars")
            elif not auth:
                bad.append(f"{event} sends no Authorization header")
            elif auth.removeprefix("Bearer ") != token:
                bad.append(f"{event} sends a literal token that is not the daemon's")
        elif (tf := command_parts(str(hook.get("command")), agent).get("token_file")):
            try:
                held = Path(tf).expanduser().read_text().strip()
            except OSError as e:
                bad.append(f"{event}'s --token-file {tf} is unreadable ({e.strerror or e})")
                files.add(tf)
                continue
            if held != token:
                bad.append(f"{event}'s --token-file {tf} holds another token than the daemon's")
                files.add(tf)
    listed = doc.get("httpHookAllowedEnvVars")
    if isinstance(listed, list) and "AEP_TOKEN" not in listed and any(
            h.get("type") == "http" for h in hooks.values()):
        bad.append("httpHookAllowedEnvVars lacks AEP_TOKEN (Claude Code sends an empty token)")
    if files:  # the installer writes no --token-file: fill the file, or drop the option
        fix = (f"write the daemon's AEP_TOKEN into {', '.join(sorted(files))} (one line), or "
               f"{install} (its command hooks have no --token-file: the shim sends the "
               "AEP_TOKEN of the agent's environment)")
    else:
        fix = f"{install} (it writes the token header and allow-lists)"
    if bad:
        return [Finding(False, f"{agent} hooks in {path}: the daemon requires AEP_TOKEN, but "
                               + "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3
                                                       else ""), fix)]
    return [Finding(True, f"{agent} hooks in {path}: send the daemon's token (AEP_TOKEN: the "
                          "agent must run with the daemon's AEP_TOKEN in its environment, "
                          "or the hook's --token-file)")]


def _shims(agent: str, path: Path, hooks: dict[str, dict[str, Any]],
           install: str) -> list[Finding]:
    """Each command hook's launcher and shim file resolvable (``install``:
    the command that rewrites this file's hooks)."""
    missing: set[str] = set()
    commands = [str(h.get("command")) for h in hooks.values() if h.get("type") == "command"]
    for command in set(commands):
        parts = command_parts(command, agent)
        launcher = parts.get("launcher", "")
        if not launcher or (shutil.which(launcher) is None and not (
                os.path.isfile(launcher) and os.access(launcher, os.X_OK))):
            missing.add(f"{launcher or '(empty)'} (not found or not executable)")
        if "shim_dir" in parts and not (Path(parts["shim_dir"]) / "shim.py").is_file():
            missing.add(f"{parts['shim_dir']}/shim.py (no such file)")
        if "shim_file" in parts and not Path(parts["shim_file"]).is_file():
            missing.add(f"{parts['shim_file']} (no such file)")
    if not commands:
        return []
    if missing:
        return [Finding(False, f"{agent} hooks in {path}: the shim command does not resolve: "
                               + ", ".join(sorted(missing)[:3]),
                        f"{install} (it writes this install's interpreter and shim path)")]
    return [Finding(True, f"{agent} hooks in {path}: the shim command resolves "
                          f"({len(commands)} command hooks)")]


def findings(bridge: Any, cfg: Any, *, ours: bool, env: Mapping[str, str] | None = None,
             project: Path | None = None, home: Path | None = None) -> list[Finding]:
    """The findings of one enabled hook bridge (module docstring). ``cfg``:
    the daemon's configuration (``listen``, ``token``, ``state_dir``);
    ``ours``: our daemon runs now (it takes the spool within 3 s);
    ``project`` / ``home``: where to look (default: the current directory,
    ``~``)."""
    from bridges.hooks_common.config import HOLD_S, spool_dir
    agent = str(bridge.agent)
    env = os.environ if env is None else env
    project = Path(os.getcwd() if project is None else project).resolve()
    home = Path.home() if home is None else home
    listen = (str(cfg.listen[0]), int(cfg.listen[1]))
    where = _where(listen)
    daemon_spool = Path(bridge.config.spool_dir or spool_dir(env))
    # the fixes write what this daemon's configuration says, whatever the shell's
    spool_flag = f" --spool {shlex.quote(str(daemon_spool))}"
    hold = float(getattr(bridge.config, "hold_s", HOLD_S))
    if hold != HOLD_S:
        spool_flag += f" --hold-s {max(1, math.ceil(hold))}"
    out: list[Finding] = []
    unread: set[Path] = set()
    installed, notes = _installed(agent, project, home, env, where, unread)
    if not installed:
        out.append(Finding(False, f"{agent} hooks: not installed (user or {project} config)",
                           f"{_install(agent, where, ' --user', spool_flag)} (or --project "
                           "DIR for one project)"))
    out += notes
    out += _twice(agent, installed, unread)
    spools = {daemon_spool: " --user"}
    for path, scope, hooks, doc in installed:
        install = _install(agent, where, scope, spool_flag)
        kinds = sorted({str(h.get("type")) for h in hooks.values()})
        out.append(Finding(True, f"{agent} hooks: {len(hooks)} events installed in {path} "
                                 f"({', '.join(kinds)})"))
        elsewhere: set[str] = set()
        for hook in hooks.values():
            if hook.get("type") == "http":
                url = str(hook.get("url") or "")
            else:
                parts = command_parts(str(hook.get("command")), agent)
                url = parts.get("daemon") or "http://127.0.0.1:8787"  # the shim's default
                if parts.get("spool"):
                    spools.setdefault(Path(parts["spool"]).expanduser(), scope)
            if not _same_daemon(url, listen):
                elsewhere.add(url)
        out.append(Finding(False, f"{agent} hooks in {path} point at "
                                  f"{', '.join(sorted(elsewhere)[:2])}, not this daemon ({where})",
                           install)
                   if elsewhere else
                   Finding(True, f"{agent} hooks in {path}: point at this daemon ({where})"))
        if cfg.token:
            out += _token(agent, path, hooks, doc, str(cfg.token), install)
        out += _shims(agent, path, hooks, install)
    for sp in sorted(spools):
        n = spool_count(sp, agent)
        if sp != daemon_spool:
            out.append(Finding(False, f"{agent} spool {sp}: {_moments(n)} (a hook spools here; "
                                      f"the daemon reads {daemon_spool})",
                               f"{_install(agent, where, spools[sp], spool_flag)}, or give the "
                               "daemon that AEP_STATE_DIR"))
        elif n and not ours:
            out.append(Finding(False, f"{agent} spool {sp}: {_moments(n)} (the daemon is "
                                      "not running)",
                               "start the daemon (aep-bridges run): it takes the spool at start"))
        else:
            out.append(Finding(True, f"{agent} spool {sp}: {_moments(n)}"
                                     + (" (the running daemon takes them within 3 s)" if n else "")))
    knob = bridge.profile.knob("CONTROL")
    out.append(Finding(True, f"{agent} control gate: " + (
        "on: asks are answered from AEP while the hook is held" if bridge.config.control_open else
        f"off: asks are observed, never answered from AEP ({knob}=1 with AEP_TOKEN opens it)")))
    return out
