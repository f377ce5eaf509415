"""Codex's hook entries in its ``config.toml`` (issue 27 "Setup"), left trusted.

Codex 0.171.0 runs command hooks declared as ``[[hooks.<Event>]]`` /
``[[hooks.<Event>.hooks]]`` (``type = "command"``, ``command``, ``timeout``
in seconds) for its 14 events (:data:`EVENTS`), and **skips a hook it does
not trust, silently**. Trust is per hook, in the *user* config only
(``$CODEX_HOME/config.toml``; project layers cannot write it)::

    [hooks.state."<abs path of the declaring config.toml>:<event_label>:<group>:<handler>"]
    trusted_hash = "sha256:<hex>"

- the key: the declaring file's absolute path, the event's snake_case label
  (``pre_tool_use``), the matcher group's and the handler's positions;
- the hash (:func:`trusted_hash`): SHA-256 of the compact, key-sorted JSON of
  ``{"event_name": <label>, "matcher": <if any>, "hooks": [<the handler,
  normalized>]}``, the handler as Codex serializes it (``type``,
  ``command``, ``timeout`` (default 600, at least 1), ``async``,
  ``statusMessage`` when set; absent options dropped). Read from
  openai/codex ``codex-rs/hooks/src/engine/discovery.rs``
  (``command_hook_hash``) and ``codex-rs/config/src/fingerprint.rs``
  (``version_for_toml``), and checked against the real 0.171.0: its
  app-server's ``hooks/list`` reports our key with this ``currentHash`` and
  ``trustStatus: trusted`` (``tests/integration/hookinstall/test_codex_live.py``).
  Codex caps ``SessionEnd`` and ``Interrupt`` at 3 s (and hashes the capped
  value), so those get 3.

Positions are part of the key: a re-install replaces our handler where it
is, and ``uninstall`` moves the trust of every handler after ours to its
new key. Everything else in both files (comments, order, other hooks, their
trust) is kept (``tomlkit``)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import ParseError
from tomlkit.items import AoT, Array, Table

from .common import EXTRA_TIMEOUT_S, Plan, Refused, is_our_command, shim_command

__all__ = ["AGENT", "CAPPED_S", "EVENTS", "HOLDABLE", "QUICK_TIMEOUT_S", "config_path",
           "event_label", "handler", "hook_key", "install", "ours", "status", "trusted_hash",
           "uninstall"]

AGENT = "codex"
#: the hook events of Codex 0.171.0 (its ``[hooks]`` table's keys)
EVENTS = ("SessionStart", "SessionEnd", "UserPromptSubmit", "PreModelRequest",
          "PostModelRequest", "PreToolUse", "PermissionRequest", "PostToolUse", "PreCompact",
          "PostCompact", "Stop", "SubagentStart", "SubagentStop", "Interrupt")
#: events the daemon may hold (the permission moment and the gated PreToolUse)
HOLDABLE = ("PreToolUse", "PermissionRequest")
#: events whose timeout Codex caps at 3 s
CAPPED_S = {"SessionEnd": 3, "Interrupt": 3}
#: the vendor timeout (s) of an event the daemon never holds
QUICK_TIMEOUT_S = 10


def config_path(*, project: Path | None, codex_home: Path) -> Path:
    """``<project>/.codex/config.toml`` or ``$CODEX_HOME/config.toml``."""
    return (project / ".codex" if project is not None else codex_home) / "config.toml"


def event_label(event: str) -> str:
    """``PreToolUse`` -> ``pre_tool_use`` (Codex's key label)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", event).lower()


def hook_key(source: Path, event: str, group: int, index: int) -> str:
    """The ``hooks.state`` key of one handler (``source``: the declaring file)."""
    return f"{source}:{event_label(event)}:{group}:{index}"


def trusted_hash(event: str, hook: dict[str, Any], matcher: str | None = None) -> str:
    """The ``sha256:<hex>`` Codex 0.171.0 computes for one command handler."""
    norm: dict[str, Any] = {"type": "command", "command": hook["command"],
                            "timeout": max(int(hook.get("timeout") or 600), 1),
                            "async": bool(hook.get("async", False))}
    if hook.get("statusMessage") is not None:
        norm["statusMessage"] = hook["statusMessage"]
    identity: dict[str, Any] = {"event_name": event_label(event), "hooks": [norm]}
    if matcher is not None:
        identity["matcher"] = matcher
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def handler(event: str, *, hold_s: int, daemon: str | None = None,
            python: str | None = None, spool: str | None = None) -> dict[str, Any]:
    """Our handler for ``event``: the shim (``--spool`` when given), with its timeout."""
    timeout = CAPPED_S.get(event) or (hold_s + EXTRA_TIMEOUT_S if event in HOLDABLE
                                      else QUICK_TIMEOUT_S)
    return {"type": "command", "command": shim_command(AGENT, daemon=daemon, python=python,
                                                          spool=spool),
            "timeout": timeout}


def _is_ours(h: object) -> bool:
    return isinstance(h, dict) and h.get("type") == "command" and is_our_command(
        h.get("command"), AGENT)


def _load(path: Path) -> tuple[str | None, tomlkit.TOMLDocument]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, tomlkit.document()
    try:
        return text, tomlkit.parse(text)
    except ParseError as e:
        raise Refused(f"{path}:{e.line}:{e.col}: not valid TOML: "
                      f"{str(e).split(' at line ')[0]}") from None


def _table(doc: Any, key: str, path: Path, where: str) -> Any:
    if key not in doc:
        doc[key] = tomlkit.table(is_super_table=True)
    if not isinstance(doc[key], Table):
        raise Refused(f"{path}: {where}{key} is not a table; fix it by hand first")
    return doc[key]


def _edit_event(hooks: Any, event: str, want: dict[str, Any] | None,
                path: Path) -> tuple[tuple[int, int] | None, dict[tuple[int, int], tuple[int, int]], bool]:
    """Put ``want`` (or nothing) where our handler is in ``hooks.<event>``.
    Returns (our position, {old position: new position} of the others, changed)."""
    groups = hooks.get(event)
    if groups is None:
        if want is None:
            return None, {}, False
        aot = tomlkit.aot()
        hooks[event] = aot
        groups = hooks[event]
    if not isinstance(groups, (AoT, Array)):
        raise Refused(f"{path}: hooks.{event} is not an array of tables; fix it by hand first")
    ours: tuple[int, int] | None = None
    moved: dict[tuple[int, int], tuple[int, int]] = {}
    changed = False
    new_gi = 0
    for gi in range(len(groups)):
        group = groups[new_gi]
        handlers = group.get("hooks") if isinstance(group, (Table, dict)) else None
        if not isinstance(handlers, (AoT, Array)):
            new_gi += 1
            continue
        hi = new_hi = 0
        for hi in range(len(handlers)):
            h = handlers[new_hi]
            if not _is_ours(h):
                moved[(gi, hi)] = (new_gi, new_hi)
                new_hi += 1
            elif want is not None and ours is None:
                if {k: h.get(k) for k in want} != want or len(h) != len(want):
                    handlers[new_hi] = _item(want, inline=isinstance(handlers, Array))
                    changed = True
                ours = (new_gi, new_hi)
                new_hi += 1
            else:
                del handlers[new_hi]
                changed = True
        if new_hi == 0 and len(handlers) == 0:
            del groups[new_gi]
        else:
            new_gi += 1
    if want is not None and ours is None:
        inline = isinstance(groups, Array)
        group_item: Any = tomlkit.inline_table() if inline else tomlkit.table()
        if not inline:
            group_item.trivia.indent = "\n"  # a blank line before each [[hooks.<Event>]]
        inner: Any = tomlkit.array() if inline else tomlkit.aot()
        inner.append(_item(want, inline=inline))
        group_item["hooks"] = inner
        groups.append(group_item)
        ours, changed = (len(groups) - 1, 0), True
    if len(groups) == 0:
        del hooks[event]
    return ours, moved, changed


def _item(h: dict[str, Any], *, inline: bool) -> Any:
    item: Any = tomlkit.inline_table() if inline else tomlkit.table()
    for k, v in h.items():
        item[k] = v
    return item


def _rekey(state: Any, source: Path, event: str, moved: dict[tuple[int, int], tuple[int, int]],
           drop: set[str]) -> None:
    """Move other handlers' trust to their new positions; drop ``drop`` keys."""
    saved = {}
    for (gi, hi), new in moved.items():
        old_key = hook_key(source, event, gi, hi)
        if new != (gi, hi) and old_key in state:
            saved[hook_key(source, event, *new)] = state[old_key].unwrap()
            del state[old_key]
    for key in drop:
        if key in state and key not in saved:
            del state[key]
    for key, value in saved.items():
        entry = tomlkit.table()
        entry.update(value)
        state[key] = entry


def _plans(path: Path, state_path: Path) -> tuple[Plan, Any, Plan, Any]:
    before, doc = _load(path)
    if state_path == path:
        return Plan(path, before, before or ""), doc, Plan(path, before, before or ""), doc
    s_before, s_doc = _load(state_path)
    return (Plan(path, before, before or ""), doc,
            Plan(state_path, s_before, s_before or ""), s_doc)


def install(path: Path, *, state_path: Path, hold_s: int, daemon: str | None = None,
            python: str | None = None, spool: str | None = None) -> list[Plan]:
    """The plans (the hooks file, and the user config when it is another
    file) that put our handler on every event of ``path``, trusted."""
    plan, doc, s_plan, s_doc = _plans(path, state_path)
    source = path.resolve()
    hooks = _table(doc, "hooks", path, "")
    placed = []
    for event in EVENTS:  # the hooks first, so a new file reads hooks, then their trust
        want = handler(event, hold_s=hold_s, daemon=daemon, python=python, spool=spool)
        old_ours = _find(hooks, event)
        ours, moved, changed = _edit_event(hooks, event, want, path)
        assert ours is not None
        placed.append((event, want, ours, moved, old_ours, changed))
    state = _table(_table(s_doc, "hooks", state_path, ""), "state", state_path, "hooks.")
    for event, want, ours, moved, old_ours, changed in placed:
        key = hook_key(source, event, *ours)
        _rekey(state, source, event, moved,
               {hook_key(source, event, *p) for p in old_ours} - {key})
        digest = trusted_hash(event, want)
        if key not in state or not isinstance(state[key], Table):
            state[key] = tomlkit.table()
        if state[key].get("trusted_hash") != digest:
            state[key]["trusted_hash"] = digest
            changed = True
        if changed:
            plan.changes.append(f"hooks.{event}: our command hook, trusted")
    _finish(plan, doc, s_plan, s_doc)
    return [plan] if s_plan.path == plan.path else [plan, s_plan]


def _find(hooks: Any, event: str) -> list[tuple[int, int]]:
    out = []
    groups = hooks.get(event)
    for gi, group in enumerate(groups if isinstance(groups, (AoT, Array)) else []):
        handlers = group.get("hooks") if isinstance(group, (Table, dict)) else None
        for hi, h in enumerate(handlers if isinstance(handlers, (AoT, Array)) else []):
            if _is_ours(h):
                out.append((gi, hi))
    return out


def _finish(plan: Plan, doc: Any, s_plan: Plan, s_doc: Any) -> None:
    for p, d in ((plan, doc), (s_plan, s_doc)):
        hooks = d.get("hooks")
        if isinstance(hooks, Table):
            if isinstance(hooks.get("state"), Table) and len(hooks["state"]) == 0:
                del hooks["state"]
            if len(hooks) == 0:
                del d["hooks"]
        text = tomlkit.dumps(d)
        if tomlkit.parse(text) != tomlkit.parse(p.before or ""):
            p.after = text
    if s_plan.path == plan.path:
        s_plan.after = plan.after


def uninstall(path: Path, *, state_path: Path) -> list[Plan]:
    """The plans that remove our handlers from ``path`` and their trust."""
    plan, doc, s_plan, s_doc = _plans(path, state_path)
    source = path.resolve()
    hooks = doc.get("hooks")
    s_hooks = s_doc.get("hooks")
    state = s_hooks.get("state") if isinstance(s_hooks, Table) else None
    if isinstance(hooks, Table):
        for event in [k for k in hooks if k != "state"]:
            old_ours = _find(hooks, event)
            if not old_ours:
                continue
            _, moved, _ = _edit_event(hooks, event, None, path)
            if isinstance(state, Table):
                _rekey(state, source, event, moved,
                       {hook_key(source, event, *p) for p in old_ours})
            plan.changes.append(f"hooks.{event}: removed our hook and its trust")
    _finish(plan, doc, s_plan, s_doc)
    return [plan] if s_plan.path == plan.path else [plan, s_plan]


def status(path: Path, *, state_path: Path) -> dict[str, str]:
    """``{event: "trusted" | "modified" | "untrusted"}`` for our handlers in ``path``."""
    _, doc = _load(path)
    _, s_doc = (None, doc) if state_path == path else _load(state_path)
    hooks = doc.get("hooks")
    s_hooks = s_doc.get("hooks")
    state = s_hooks.get("state") if isinstance(s_hooks, Table) else None
    found: dict[str, str] = {}
    if not isinstance(hooks, Table):
        return found
    source = path.resolve()
    for event in hooks:
        for gi, hi in _find(hooks, event):
            group = hooks[event][gi]
            h = group["hooks"][hi].unwrap()
            entry = state.get(hook_key(source, event, gi, hi)) if isinstance(state, Table) else None
            got = entry.get("trusted_hash") if isinstance(entry, (Table, dict)) else None
            found[event] = ("untrusted" if got is None
                            else "trusted" if got == trusted_hash(event, h, group.get("matcher"))
                            else "modified")
    return found


def ours(path: Path) -> dict[str, dict[str, Any]]:
    """``{event: our handler (the last one)}`` in ``path`` (``doctor`` reads
    the command). Raises :class:`Refused` for a malformed file."""
    _, doc = _load(path)
    hooks = doc.get("hooks")
    found: dict[str, dict[str, Any]] = {}
    if not isinstance(hooks, Table):
        return found
    for event in hooks:
        for gi, hi in _find(hooks, event):
            found[event] = hooks[event][gi]["hooks"][hi].unwrap()
    return found
