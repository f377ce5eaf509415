"""Claude Code's hook entries in its ``settings.json`` (issue 27 "Setup").

Claude Code 2.1.197 runs hooks of ``type: "http"`` (the hook JSON POSTed,
the decision the 200 body) for every event but ``SessionStart`` and
``Setup``, which run only ``type: "command"`` hooks. ``install`` writes:

- an HTTP hook to ``<daemon>/hooks/claude-code`` per event (``--transport
  http``, the default), with ``headers: {"Authorization": "Bearer
  $AEP_TOKEN"}`` and ``allowedEnvVars: ["AEP_TOKEN"]`` (Claude Code expands
  ``$VAR`` in headers only for the variables a hook lists there; unset, the
  header is ``Bearer `` and a daemon without a token ignores it);
- the command shim (:func:`supervisor.hookinstall.common.shim_command`) for
  ``SessionStart`` and ``Setup``, or for every event with ``--transport
  command``;
- ``timeout`` (seconds): the hold + 10 s for the holdable events
  (:data:`HOLDABLE`), 2 s for ``SessionEnd`` (Claude Code waits for it at
  exit; its own default is 1.5 s), :data:`QUICK_TIMEOUT_S` for the rest (the
  daemon answers those at once; the shim gives up in 1 s);
- our URL into ``allowedHttpHookUrls`` and ``AEP_TOKEN`` into
  ``httpHookAllowedEnvVars`` only when the file already sets them: unset,
  Claude Code allows every URL and variable, and creating the list would
  block the user's other HTTP hooks.

Ours are recognized by the URL's ``/hooks/claude-code`` path or the shim's
command line, so a re-install replaces them in place and ``uninstall``
removes only them. The file's key order and indentation are kept; a file
whose content does not change is not rewritten."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .common import EXTRA_TIMEOUT_S, Plan, Refused, is_our_command, shim_command

__all__ = ["AGENT", "COMMAND_ONLY", "EVENTS", "EXIT_TIMEOUT_S", "HOLDABLE", "MAX_DEPTH", "NOT_HOOKED",
           "QUICK_TIMEOUT_S",
           "entries",
           "install", "is_ours", "ours", "settings_path", "status", "uninstall"]

AGENT = "claude-code"
#: the hook events of Claude Code 2.1.197 we hook (its settings schema's list
#: but :data:`NOT_HOOKED`)
EVENTS = ("PreToolUse", "PostToolUse", "PostToolUseFailure", "PostToolBatch", "Notification",
          "UserPromptSubmit", "UserPromptExpansion", "SessionStart", "SessionEnd", "Stop",
          "StopFailure", "SubagentStart", "SubagentStop", "PreCompact", "PostCompact",
          "PermissionRequest", "PermissionDenied", "Setup", "TeammateIdle", "TaskCreated",
          "TaskCompleted", "Elicitation", "ElicitationResult", "ConfigChange",
          "InstructionsLoaded", "CwdChanged", "FileChanged", "MessageDisplay")
#: events never hooked: a ``WorktreeCreate`` hook *replaces* Claude Code's own
#: worktree creation and must answer a ``worktreePath`` (``{}`` makes every
#: ``EnterWorktree`` fail); ``WorktreeRemove`` is its pair. A re-install
#: removes ours from them.
NOT_HOOKED = ("WorktreeCreate", "WorktreeRemove")
#: events Claude Code runs no HTTP hook for (command hooks only)
COMMAND_ONLY = ("SessionStart", "Setup")
#: events the daemon may hold (a permission moment, a form, the gated PreToolUse)
HOLDABLE = ("PreToolUse", "PermissionRequest", "Elicitation")
#: the vendor timeout (s) of an event the daemon never holds
QUICK_TIMEOUT_S = 10
#: events Claude Code waits for at exit: its own default is 1.5 s, ours stays near it
EXIT_TIMEOUT_S = {"SessionEnd": 2}
#: the deepest a settings file may nest its arrays and objects (the file's
#: object is one level): Python's parser recurses, and a cloned repo's
#: ``{"a": [[[...]]]}`` 100,000 deep made install and status die with a
#: RecursionError (round 11 of issue 25, finding 5). As tomlkit's bound on
#: TOML (Codex's config); Claude Code's own settings nest a handful.
MAX_DEPTH = 100
#: a JSON string (or an unterminated one, to the end: the parser then says
#: where), or a bracket; possessive, so the scan is linear
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\Z)|[\[\]{}]', re.DOTALL)


def settings_path(*, project: Path | None, home: Path) -> Path:
    """``<project>/.claude/settings.json`` or ``<home>/.claude/settings.json``."""
    return (project if project is not None else home) / ".claude" / "settings.json"


def _url(daemon: str) -> str:
    return f"{daemon.rstrip('/')}/hooks/{AGENT}"


def entries(*, transport: str, daemon: str, hold_s: int, daemon_given: bool = False,
            python: str | None = None, spool: str | None = None) -> dict[str, dict[str, Any]]:
    """The hook object per event: ``{"PreToolUse": {"type": "http", ...}, ...}``
    (the command shim with ``--spool spool`` when given)."""
    out: dict[str, dict[str, Any]] = {}
    command = shim_command(AGENT, daemon=daemon if daemon_given else None, python=python,
                           spool=spool)
    for event in EVENTS:
        timeout = (hold_s + EXTRA_TIMEOUT_S if event in HOLDABLE
                   else EXIT_TIMEOUT_S.get(event, QUICK_TIMEOUT_S))
        if transport == "http" and event not in COMMAND_ONLY:
            out[event] = {"type": "http", "url": _url(daemon),
                          "headers": {"Authorization": "Bearer $AEP_TOKEN"},
                          "allowedEnvVars": ["AEP_TOKEN"], "timeout": timeout}
        else:
            out[event] = {"type": "command", "command": command, "timeout": timeout}
    return out


def is_ours(hook: object) -> bool:
    """An HTTP hook to ``.../hooks/claude-code`` or the shim for ``claude-code``."""
    if not isinstance(hook, dict):
        return False
    if hook.get("type") == "http":
        url = hook.get("url")
        return isinstance(url, str) and url.rstrip("/").endswith(f"/hooks/{AGENT}")
    return hook.get("type") == "command" and is_our_command(hook.get("command"), AGENT)


def _load(path: Path) -> tuple[str | None, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, {}
    if not text.strip():
        return text, {}
    _check_depth(text, path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise Refused(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    if not isinstance(doc, dict):
        raise Refused(f"{path}:1:1: not a JSON object")
    return text, doc


def _check_depth(text: str, path: Path) -> None:
    """Raise :class:`Refused` (``path:line:col``, the container that opens
    the level past :data:`MAX_DEPTH`) for JSON nested deeper than that;
    brackets inside strings do not count."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth = 0
    for m in _TOKEN.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                at = m.start()
                raise Refused(f"{path}:{text.count(chr(10), 0, at) + 1}:"
                              f"{at - text.rfind(chr(10), 0, at)}: nested more than {MAX_DEPTH} "
                              "levels deep (a settings file needs a handful); fix it by hand first")
        elif c in "]}":
            depth -= 1


def _dump(doc: dict[str, Any], before: str | None) -> str:
    indent: int | str = 2
    if before:
        m = re.search(r"^\{\s*\n([ \t]+)\S", before)
        if m:
            ws = m.group(1)
            indent = len(ws) if set(ws) == {" "} else ws
    return json.dumps(doc, indent=indent, ensure_ascii=False) + "\n"


def _groups(hooks: dict[str, Any], event: str, path: Path) -> list[Any]:
    groups = hooks.get(event)
    if not isinstance(groups, list):
        raise Refused(f"{path}: hooks.{event} is not a list; fix it by hand first")
    return groups


def _strip(hooks: dict[str, Any], event: str, path: Path,
           keep: dict[str, Any] | None) -> tuple[bool, bool]:
    """Remove our hooks from ``event`` (``keep``: put it where the first of
    ours was). Returns ``(found, changed)``. Emptied groups go."""
    groups = _groups(hooks, event, path)
    found = changed = False
    for group in list(groups):
        if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
            continue
        kept = []
        for hook in group["hooks"]:
            if not is_ours(hook):
                kept.append(hook)
            elif keep is not None and not found:
                kept.append(keep)
                found, changed = True, changed or hook != keep
            else:
                changed = True
        group["hooks"] = kept
        if not kept:
            groups.remove(group)
    return found, changed


def _wildcard(url: str, pattern: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), url) is not None


def install(path: Path, *, transport: str, daemon: str, hold_s: int,
            daemon_given: bool = False, python: str | None = None,
            spool: str | None = None) -> Plan:
    """The plan that puts our entries in ``path`` (nothing written here)."""
    before, doc = _load(path)
    original = json.loads(json.dumps(doc))
    plan = Plan(path, before, before or "")
    hooks = doc.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise Refused(f"{path}: \"hooks\" is not an object; fix it by hand first")
    wanted = entries(transport=transport, daemon=daemon, hold_s=hold_s,
                     daemon_given=daemon_given, python=python, spool=spool)
    for event in list(hooks):
        if event not in wanted:
            if _strip(hooks, event, path, None)[1]:
                plan.changes.append(f"removed an old entry from hooks.{event}")
    for event, hook in wanted.items():
        hooks.setdefault(event, [])
        found, changed = _strip(hooks, event, path, hook)
        if not found:
            _groups(hooks, event, path).append({"hooks": [hook]})
            plan.changes.append(f"hooks.{event}: added a {hook['type']} hook")
        elif changed:
            plan.changes.append(f"hooks.{event}: updated our {hook['type']} hook")
    url = _url(daemon)
    allowed = doc.get("allowedHttpHookUrls")
    if transport == "http" and isinstance(allowed, list) and not any(
            isinstance(p, str) and _wildcard(url, p) for p in allowed):
        allowed.append(url)
        plan.changes.append(f"allowedHttpHookUrls: added {url}")
    env_allowed = doc.get("httpHookAllowedEnvVars")
    if transport == "http" and isinstance(env_allowed, list) and "AEP_TOKEN" not in env_allowed:
        env_allowed.append("AEP_TOKEN")
        plan.changes.append("httpHookAllowedEnvVars: added AEP_TOKEN")
    if doc != original:
        plan.after = _dump(doc, before)
    return plan


def uninstall(path: Path, *, keep_hooks: bool = False) -> Plan:
    """The plan that removes our entries (and only them) from ``path``; a
    ``hooks`` object left empty goes unless ``keep_hooks`` (the file had
    one before install)."""
    before, doc = _load(path)
    original = json.loads(json.dumps(doc))
    plan = Plan(path, before, before or "")
    hooks = doc.get("hooks")
    if isinstance(hooks, dict):
        for event in list(hooks):
            if not isinstance(hooks[event], list):
                continue
            had = bool(hooks[event])
            if _strip(hooks, event, path, None)[1]:
                plan.changes.append(f"hooks.{event}: removed our hook")
                if had and not hooks[event]:
                    del hooks[event]
        if not hooks and original.get("hooks") and not keep_hooks:
            del doc["hooks"]
    allowed = doc.get("allowedHttpHookUrls")
    if isinstance(allowed, list):
        ours = [u for u in allowed if isinstance(u, str) and u.endswith(f"/hooks/{AGENT}")]
        for u in ours:
            allowed.remove(u)
            plan.changes.append(f"allowedHttpHookUrls: removed {u}")
    if doc != original:
        plan.after = _dump(doc, before)
    return plan


def ours(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``({event: our hook object (the last one)}, the whole settings
    document)`` of ``path`` (``doctor`` reads the URL, the command and the
    allow-lists). Raises :class:`Refused` for a malformed file."""
    _, doc = _load(path)
    found: dict[str, dict[str, Any]] = {}
    hooks = doc.get("hooks")
    if not isinstance(hooks, dict):
        return found, doc
    for event, groups in hooks.items():
        for group in groups if isinstance(groups, list) else []:
            for hook in (group.get("hooks") or []) if isinstance(group, dict) else []:
                if is_ours(hook):
                    found[event] = hook
    return found, doc


def status(path: Path) -> dict[str, str]:
    """``{event: "http <url>" | "command"}`` for each of our hooks in ``path``."""
    return {event: (f"http {hook.get('url')}" if hook.get("type") == "http" else "command")
            for event, hook in ours(path)[0].items()}
