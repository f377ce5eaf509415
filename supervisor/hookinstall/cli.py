"""``aep-bridges hooks install|uninstall|status``: the argparse wiring and the
output (one line per change; ``--dry-run`` prints the diff and writes
nothing; a malformed file is refused with its line and column, exit 2)."""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from . import claude, codex, record
from .common import AGENTS, Plan, Refused, hold_seconds, write_in_place

__all__ = ["add_parser", "bad_input", "daemon_url", "plans", "project_trusted", "restore", "run",
           "spool_dir"]

_DEFAULT_DAEMON = "http://127.0.0.1:8787"


def add_parser(sub: Any, settings: argparse.ArgumentParser | None = None) -> None:
    """``hooks`` and its three actions on the console script's subparsers;
    ``install`` and ``uninstall`` take ``settings``' options (``--config`` /
    ``--env-file``, read as the client commands read them: the default
    ``--daemon``, ``--spool`` and ``--hold-s``, and the state directory
    where install keeps the record uninstall reads)."""
    hooks = sub.add_parser("hooks", help="install, remove or show the hook entries that send "
                                         "Claude Code's or Codex's hooks to this daemon")
    act = hooks.add_subparsers(dest="action", required=True)
    for name, text in (("install", "merge our hook entries into the vendor's config"),
                       ("uninstall", "remove the entries install added (only those)")):
        p = act.add_parser(name, help=text,
                           parents=[settings] if settings is not None else [])
        p.add_argument("agent", choices=sorted(AGENTS))
        where = p.add_mutually_exclusive_group()
        where.add_argument("--project", metavar="DIR",
                           help="the project's config (.claude/settings.json, .codex/config.toml)")
        where.add_argument("--user", action="store_true",
                           help="the user's config (the default): ~/.claude/settings.json, "
                                "$CODEX_HOME/config.toml (default ~/.codex)")
        p.add_argument("--dry-run", action="store_true", help="print the change, write nothing")
        if name == "install":
            p.add_argument("--transport", choices=("http", "command"), default=None,
                           help="claude-code: http hooks where Claude Code runs them (the "
                                "default) or the command shim everywhere; codex: command only")
            p.add_argument("--daemon", metavar="URL", default=None,
                           help="the daemon's base URL, http(s):// (default http:// + "
                                "AEP_LISTEN of the environment, --env-file or --config / "
                                "$AEP_CONFIG, else http://127.0.0.1:8787)")
            p.add_argument("--spool", metavar="DIR", default=None,
                           help="the spool directory written into the command hooks (default "
                                "the daemon's: $AEP_STATE_DIR/hooks-spool, else "
                                "$XDG_STATE_HOME/aep-bridges/hooks-spool, else "
                                "~/.local/state/aep-bridges/hooks-spool, as of the install)")
            p.add_argument("--hold-s", type=int, default=None, metavar="N",
                           help="the bridge's hold limit, 1 to 3600: holdable hooks get a "
                                "vendor timeout of N + 10 s (default AEP_<AGENT>_HOLD_S, else "
                                "120)")
    st = act.add_parser("status", help="say which of our hook entries are installed where")
    st.add_argument("agent", nargs="?", choices=sorted(AGENTS))
    st.add_argument("--project", metavar="DIR", default=None,
                    help="the project to look in (default: the current directory)")


def daemon_url(given: str | None, env: Mapping[str, str]) -> str:
    """``--daemon``, else ``http://`` + ``AEP_LISTEN`` (a wildcard host as
    loopback), else ``http://127.0.0.1:8787``."""
    if given:
        return given.rstrip("/")
    listen = env.get("AEP_LISTEN", "").strip()
    if not listen:
        return _DEFAULT_DAEMON
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def spool_dir(given: str | None, env: Mapping[str, str]) -> str:
    """``--spool``, else the spool directory of a daemon started with ``env``
    (``bridges.hooks_common.config.spool_dir``: ``$AEP_STATE_DIR/hooks-spool``
    or the default state directory's), absolute. Written into every command
    hook, so the shim spools where the daemon ingests even when the agent
    runs with another environment (a daemon run as a service)."""
    from bridges.hooks_common.config import spool_dir as daemon_spool
    return str(Path(given).expanduser().resolve() if given else daemon_spool(env))


def _codex_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("CODEX_HOME") or Path.home() / ".codex").expanduser()


def _inside(path: Path, project: Path | None) -> None:
    """Raise :class:`Refused` when a project's config file or its directory
    (``.claude`` / ``.codex``) is a symlink leading out of the project (its
    real path), or nowhere: a repository may ship ``.claude/settings.json ->
    ~/.gitconfig``, and writing through it would change a file outside the
    project (a user config merged with "project" hooks, a created dotfile)."""
    if project is None:
        return
    for p in (path.parent, path):
        if not os.path.islink(p):
            continue
        target = os.readlink(p)
        real = Path(os.path.realpath(p))
        if not real.exists():
            raise Refused(f"{p} is a symlink to {target}, which does not exist; "
                          "remove the link or install with --user")
        if not real.is_relative_to(project):
            raise Refused(f"{p} is a symlink to {real}, outside the project {project}; "
                          "remove the link or install with --user")


def plans(args: argparse.Namespace, env: Mapping[str, str]) -> list[Plan]:
    """The plans of one install/uninstall (raises :class:`Refused`)."""
    project = Path(args.project).resolve() if args.project else None
    if args.agent == "claude-code":
        path = claude.settings_path(project=project, home=Path.home())
        _inside(path, project)
        if args.action == "uninstall":
            rec = record.load(env, path)
            return [claude.uninstall(path, keep_hooks=_had_hooks(rec))]
        url = daemon_url(args.daemon, env)
        return [claude.install(path, transport=args.transport or "http", daemon=url,
                               hold_s=hold_seconds("claude-code", args.hold_s, env),
                               daemon_given=url != _DEFAULT_DAEMON,
                               spool=spool_dir(args.spool, env))]
    home = _codex_home(env)
    path = codex.config_path(project=project, codex_home=home)
    _inside(path, project)
    state_path = codex.config_path(project=None, codex_home=home)
    if args.action == "uninstall":
        return codex.uninstall(path, state_path=state_path)
    if args.transport == "http":
        raise Refused("codex runs command hooks only: --transport command (the default)")
    url = daemon_url(args.daemon, env)
    out = codex.install(path, state_path=state_path,
                        hold_s=hold_seconds("codex", args.hold_s, env),
                        daemon=url if url != _DEFAULT_DAEMON else None,
                        spool=spool_dir(args.spool, env))
    if project is not None and not project_trusted(state_path, project):
        out[0].notes.append(
            f"Codex reads {path} only for a trusted project: trust {project} when Codex "
            f"asks, or add [projects.\"{project}\"] trust_level = \"trusted\" to {state_path}")
    return out


def _had_hooks(rec: dict[str, Any] | None) -> bool:
    """Whether a record's ``before`` (a Claude Code settings file) had a ``hooks`` key."""
    try:
        doc = json.loads(rec["before"]) if rec and rec["before"] else None
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and "hooks" in doc


def _raw(path: Path) -> str | None:
    """``path``'s exact text (no newline translation), ``None``: no file."""
    try:
        return Path(os.path.realpath(path)).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None


def _fresh(agent: str, path: Path) -> bool:
    """Whether ``path`` holds none of our entries (``Refused``: treated as not)."""
    try:
        return not (claude.ours(path)[0] if agent == "claude-code" else codex.ours(path))
    except Refused:
        return False


def _same(path: Path, a: str, b: str) -> bool:
    """Whether two texts of ``path`` (a Claude Code settings file, JSON, or a
    Codex ``config.toml``) say the same thing: ``json.loads`` equal, or
    tomlkit ``unwrap()`` equal with an empty ``[hooks.state]`` / ``[hooks]``
    counted as absent (uninstall drops them). Unparsable: not the same."""
    if path.suffix == ".toml":
        import tomlkit

        def norm(text: str) -> Any:
            doc = tomlkit.parse(text).unwrap()
            hooks = doc.get("hooks")
            if isinstance(hooks, dict):
                if hooks.get("state") == {}:
                    del hooks["state"]
                if not hooks:
                    del doc["hooks"]
            return doc
        try:
            return bool(norm(a) == norm(b))
        except Exception:  # noqa: BLE001 - tomlkit raises several kinds: not the same
            return False
    try:
        return bool(json.loads(a or "{}") == json.loads(b or "{}"))
    except (ValueError, RecursionError):  # (nested past the parser's recursion)
        return False


def restore(plan: Plan, rec: dict[str, Any] | None, now_sha: str | None) -> bool:
    """Turn an uninstall ``plan`` (our entries out of the file as it is now)
    into giving the file back (module :mod:`.record`). The recorded text is
    put back only when the file is exactly what install wrote (``now_sha``:
    its SHA-256) AND the plan's result says the same as that text (the record
    is per file: a Codex project install also trusts its hooks in the user
    config, so the user config's record may predate another scope's or
    project's entries, which must stay); the file is removed when install
    created it and nothing else is left in it; else the plan's result is
    written. Returns whether the record must be kept (the file written is
    still install's lineage, with other entries in it: a later uninstall
    gives the recorded text back)."""
    if rec is None or plan.before is None:
        return False
    exact = now_sha == rec["after_sha256"]
    if rec["before"] is None:
        if plan.after.strip() in ("", "{}"):
            plan.after, plan.remove = "", True
            plan.changes = (["removed the file install created"] if exact else
                            plan.changes + ["removed the file install created "
                                            "(nothing else is in it)"])
            return False
        return exact
    if exact and _same(plan.path, plan.after, rec["before"]):
        plan.after = rec["before"]
        plan.changes = ["put back as it was before install"]
        return False
    if plan.changes:
        # the blank lines tomlkit (or the JSON dump) put after the file's last
        # line for ours: back to the file's own ending (only line breaks go)
        core, was = plan.after.rstrip("\r\n"), rec["before"]
        tail = was[len(was.rstrip("\r\n")):]
        if len(plan.after) - len(core) > len(tail):
            plan.after = core + tail
    return exact


def project_trusted(user_config: Path, project: Path) -> bool:
    """Whether Codex's user config trusts ``project`` (``[projects."<dir>"]
    trust_level = "trusted"``): Codex reads a project's config only then."""
    import tomllib
    try:
        doc = tomllib.loads(user_config.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # (tomllib recurses: 500 levels deep is too deep)
        return False
    entry = (doc.get("projects") or {}).get(str(project)) or {}
    return isinstance(entry, dict) and entry.get("trust_level") == "trusted"


def _show(plan: Plan, dry_run: bool, agent: str) -> None:
    if not plan.changed:
        print(f"aep-bridges hooks: {agent}: {plan.path}: nothing to change")
    else:
        for line in plan.changes or ["rewritten"]:
            print(f"aep-bridges hooks: {agent}: {plan.path}: {line}")
        if dry_run:
            sys.stdout.writelines(difflib.unified_diff(
                (plan.before or "").splitlines(keepends=True), plan.after.splitlines(keepends=True),
                str(plan.path), f"{plan.path} (after)"))
    for note in plan.notes:
        print(f"aep-bridges hooks: {agent}: note: {note}")


def _status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print one line per agent and scope; 0, or 2 when a file could not be read
    (a script's ``hooks status && ...`` must not pass over a malformed file)."""
    project = Path(args.project or os.getcwd()).resolve()
    home = _codex_home(env)
    rc = 0
    for agent in [args.agent] if args.agent else sorted(AGENTS):
        for scope, proj in (("user", None), ("project", project)):
            try:
                if agent == "claude-code":
                    path = claude.settings_path(project=proj, home=Path.home())
                    found = claude.status(path)
                else:
                    path = codex.config_path(project=proj, codex_home=home)
                    found = codex.status(path, state_path=codex.config_path(
                        project=None, codex_home=home))
            except Refused as e:
                print(f"{agent} ({scope}) {e}")
                rc = 2
                continue
            if not found:
                print(f"{agent} ({scope}) {path}: not installed")
                continue
            kinds: dict[str, int] = {}
            for what in found.values():
                kinds[what] = kinds.get(what, 0) + 1
            summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            untrusted_project = (agent == "codex" and proj is not None and not project_trusted(
                codex.config_path(project=None, codex_home=home), proj))
            print(f"{agent} ({scope}) {path}: {len(found)} events: {summary}"
                  + (" (the project is not trusted: Codex does not read this file)"
                     if untrusted_project else ""))
    return rc


def bad_input(args: argparse.Namespace) -> str | None:
    """Why an install/uninstall's options cannot be used, or ``None``: a
    ``--project`` that is not a directory (never created: a typo would
    install hooks nobody reads), a ``--hold-s`` outside 1 ..
    ``HOLD_MAX_S`` (the bridge's own bound on ``AEP_<AGENT>_HOLD_S``; the
    vendor timeout is the hold + 10 s), a ``--daemon`` that is not an
    ``http(s)://host[:port][/path]`` URL (no query, fragment or user@)."""
    from bridges.hooks_common.config import HOLD_MAX_S
    if args.project and not Path(args.project).expanduser().is_dir():
        return f"--project {args.project}: no such directory"
    hold = getattr(args, "hold_s", None)
    if hold is not None and not 1 <= hold <= HOLD_MAX_S:
        return f"--hold-s {hold}: the hold must be 1 to {HOLD_MAX_S:g} s"
    given = getattr(args, "daemon", None)
    if given is not None:
        try:
            parts = urlsplit(given)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            return f"--daemon {given}: not an http:// or https:// URL"
        # a path prefix is joined by the HTTP hook's URL and the shim alike
        # (``<daemon>/hooks/<agent>``); a query, fragment or user:password is not
        if parts.query or parts.fragment or "?" in given or "#" in given or "@" in parts.netloc:
            return (f"--daemon {given}: a query, fragment or user@ cannot be used: "
                    "give http(s)://host[:port][/path]")
    return None


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Do ``args.action``; 0, or 2 when a file is refused or an option is
    bad (:func:`bad_input`; nothing written). An install says the daemon URL
    its hooks send to."""
    env = os.environ if env is None else env
    if args.action == "status":
        return _status(args, env)
    if (why := bad_input(args)) is not None:
        print(f"aep-bridges hooks {args.action}: {why}; nothing written", file=sys.stderr)
        return 2
    try:
        todo = plans(args, env)
    except Refused as e:
        print(f"aep-bridges hooks: {e}; nothing written", file=sys.stderr)
        return 2
    for plan in todo:
        if (why := record.distrust(env, plan.path)) is not None:
            print(f"aep-bridges hooks: {args.agent}: warning: install record ignored: {why}",
                  file=sys.stderr)
    keep: set[Path] = set()
    if args.action == "uninstall":
        for plan in todo:
            if restore(plan, record.load(env, plan.path), record.sha256_of(plan.path)):
                keep.add(plan.path)
    for plan in todo:
        _show(plan, args.dry_run, args.agent)
    if args.action == "install":
        print(f"aep-bridges hooks: {args.agent}: the hooks send to the daemon at "
              f"{daemon_url(args.daemon, env)}")
    if args.dry_run:
        print("aep-bridges hooks: dry run: nothing written")
        return 0
    return _write(todo, args, env, keep)


def _missing_dirs(path: Path) -> list[str]:
    """The directories above ``path`` that do not exist yet (the deepest
    first): the ones writing it creates (``~/.claude``, ``<project>/.codex``)."""
    out = []
    d = Path(os.path.realpath(path)).parent
    while not d.exists() and d != d.parent:
        out.append(str(d))
        d = d.parent
    return out


def _remove_dirs(path: Path, dirs: object) -> None:
    """After removing the file install created: remove the directories it
    created for it (a record's ``made_dirs``, deepest first), while empty,
    and only directories above ``path``."""
    if not isinstance(dirs, list):
        return
    above = {str(p) for p in Path(os.path.realpath(path)).parents}
    for d in dirs:
        if not isinstance(d, str) or d not in above:
            return
        try:
            os.rmdir(d)
        except OSError:  # not empty (the user's files), or gone: it stays
            return


def _write(todo: list[Plan], args: argparse.Namespace, env: Mapping[str, str],
           keep: set[Path]) -> int:
    """Write the plans and keep the records in step (``keep``: the files whose
    record an uninstall keeps, :func:`restore`); 0, or 2 on an ``OSError``."""
    fresh = args.action == "install" and _fresh(args.agent, todo[0].path)
    for plan in todo:
        try:
            if plan.changed:
                before = _raw(plan.path)
                made = _missing_dirs(plan.path) if args.action == "install" else []
                if plan.remove:
                    rec = record.load(env, plan.path)
                    os.unlink(os.path.realpath(plan.path))
                    _remove_dirs(plan.path, (rec or {}).get("made_dirs"))
                else:
                    write_in_place(plan.path, plan.after)
                if args.action == "install" or plan.path in keep:
                    record.remember(env, plan.path, before, fresh=fresh, made_dirs=made)
            if args.action == "uninstall" and plan.path not in keep:
                record.forget(env, plan.path)
        except OSError as e:
            print(f"aep-bridges hooks: {plan.path}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0
