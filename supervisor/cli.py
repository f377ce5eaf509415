"""``aep-bridges``: the console script (DESIGN.md "The operator's interface").

- ``aep-bridges run``: the fleet (bridges + embedded relay or uplink).
- ``aep-bridges relay``: the embedded AEP relay alone.
- ``aep-bridges check``: validate the configuration and exit (0 or 2).
- ``aep-bridges acp [--daemon URL] [--name NAME] -- AGENT_CMD...``: the ACP
  tee an editor runs as its agent command (:mod:`bridges.acp.tee`); exits
  with the agent's status.
- ``aep-bridges tail``: follow an AEP endpoint as a human timeline
  (:mod:`supervisor.tools.tail`); ``respond``, ``cancel``, ``pause``,
  ``resume``: one command to it (:mod:`supervisor.tools.control`). These
  client commands take ``--config``/``--env-file``/``AEP_CONFIG`` as ``run``
  does, for their default ``--url`` (``AEP_LISTEN``) and ``--token``.
- ``aep-bridges doctor``: the machine against the configuration
  (:mod:`supervisor.tools.doctor`).
- ``aep-bridges service install [--systemd|--launchd]``: write the service
  unit for this install (:mod:`supervisor.tools.install`).
- ``aep-bridges hook <agent> ...``: the command shim a vendor runs per hook
  (:mod:`bridges.hooks_common.shim`); dispatched first, before this module
  imports anything heavy (it is on the agent's critical path).
- ``aep-bridges hooks install|uninstall|status``: write the hook entries
  into Claude Code's or Codex's own config (:mod:`supervisor.hookinstall`).

Bad configuration is refused before anything binds: one line per problem on
stderr, exit status 2."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

# trio, argparse, json and the config stack are imported where used: `aep-bridges
# hook` (once per vendor hook, on the agent's critical path) must reach the shim
# without them (tests/unit/hooks_common/test_shim_spool.py pins it)
from .cliconfig import apply_settings, refuse
from .clientcli import (
    cmd_control,
    cmd_tail,
    cmd_timeline,
    cmd_validate,
    control_parsers,
    tail_parser,
)

if TYPE_CHECKING:
    import argparse

    from . import config as config_mod


def _load(*, relay_only: bool = False, check_ports: bool = True, create: bool = True):
    """Config + bridges with every problem collected (core and bridge
    settings alike); warnings (misspelt names) printed, not fatal.
    ``create=False``: probe without creating the state directory."""
    from . import config as config_mod
    from .daemon import build_bridges
    cfg, problems = config_mod.load(relay_only=relay_only, check_ports=check_ports, create=create)
    for w in cfg.warnings:
        print(f"aep-bridges: config: warning: {w}", file=sys.stderr)
    bridges, more = ([], []) if relay_only else build_bridges(cfg, check_ports=check_ports)
    if not problems and not more:
        from .posture import exposure_warnings
        for w in exposure_warnings(cfg, bridges):
            print(f"aep-bridges: WARNING: {w}", file=sys.stderr)
    return cfg, bridges, problems + more


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft open-files limit to the hard one (issue 10 #6:
    systemd's default soft limit, 1024, is what one slow-body flood
    exhausted). Returns ``(soft, hard)`` as now in force; never raises."""
    import resource
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        return (-1, -1)


def _cmd_run(args: argparse.Namespace) -> int:
    from functools import partial

    import trio

    from .daemon import run_daemon
    from .tools import logs
    refused, sources = apply_settings(args)
    if refused is not None:
        return refused
    cfg, bridges, problems = _load()
    from .sessionlog.statelock import StateDirBusy, hold
    if problems:
        problems = _explain_in_use(cfg, problems, "stop it first (or give this one other "
                                                  "ports: AEP_LISTEN, AEP_OTLP_*_LISTEN)")
        if (held := _lock_holder(cfg.state_dir)) is not None:  # the same daemon on its ports
            problems = ["; ".join(held.refusal()), *problems]  # and its state directory
        return refuse(problems)
    try:  # one daemon per state directory: the session logs and state files have one writer
        lock = hold(cfg.state_dir)
    except StateDirBusy as e:
        return refuse(["; ".join(e.refusal())])
    except OSError as e:
        return refuse([f"AEP_STATE_DIR={str(cfg.state_dir)!r}: cannot lock "
                        f"{e.filename or 'daemon.lock'}: {e.strerror or e}"])
    logs.setup(cfg.environ, secrets=[t for _, t in cfg.emitter_tokens])
    raise_fd_limit()
    try:
        return trio.run(partial(run_daemon, cfg, bridges, settings_from=sources.read))
    finally:
        lock.release()


def _lock_holder(state_dir: Any) -> Any:
    """The :class:`~supervisor.sessionlog.statelock.StateDirBusy` of a live
    holder of ``state_dir``'s lock, or ``None`` (free, absent, unreadable:
    ``run`` reports the last when it tries). Never takes the lock."""
    from .sessionlog.statelock import StateDirBusy, probe
    try:
        probe(state_dir)
    except StateDirBusy as e:
        return e
    except OSError:
        pass
    return None


def _cmd_relay(args: argparse.Namespace) -> int:
    from functools import partial

    import trio

    from .daemon import run_daemon
    from .tools import logs
    refused, sources = apply_settings(args)
    if refused is not None:
        return refused
    cfg, _, problems = _load(relay_only=True)
    if problems:  # a port held by our own daemon is named, as run and check do
        return refuse(_explain_in_use(cfg, problems, "stop it first (or give this relay "
                                                      "another AEP_LISTEN)"))
    logs.setup(cfg.environ, secrets=[t for _, t in cfg.emitter_tokens])
    raise_fd_limit()
    # AEP_NATS_URL: serve the AEP bindings from JetStream ("Past one machine")
    return trio.run(partial(run_daemon, cfg, [], nats=cfg.nats, settings_from=sources.read))


def running_daemon(listen: tuple[str, int], token: str | None) -> dict | None:
    """The ``/healthz`` body of an aep-bridges daemon answering on
    ``listen``, or ``None`` (nothing there, or something that is not us)."""
    import httpx

    from .tools.tail import default_url
    from .tools.tailstream import get_json
    url = default_url({"AEP_LISTEN": f"{listen[0]}:{listen[1]}"}) + "/healthz"
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        body = get_json(url, headers, timeout=2)  # bounded: whatever answers there
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) and "ok" in body and "bridges" in body else None


def _name_holder(problem: str, lock: Any) -> str:
    """``NAME=host:port: address in use or not bindable`` -> ``...: in use
    by aep-bridges pid N`` when an aep-bridges process holds that port
    (:mod:`supervisor.tools.holder`; the state directory's holder ``lock``
    looked at first), as the state directory's refusal names its holder."""
    import re

    from .tools.holder import aep_bridges_holder
    m = re.match(r"\w+=.*:(\d+): address in use or not bindable$", problem)
    if m is None:
        return problem
    first = [lock.pid] if lock is not None and lock.pid else []
    pid = aep_bridges_holder(int(m.group(1)), first=first)
    return problem if pid is None else problem.replace(
        "address in use or not bindable", f"in use by aep-bridges pid {pid}")


def _explain_in_use(cfg: config_mod.Config, problems: list[str], hint: str) -> list[str]:
    """When ports are "in use" and an aep-bridges daemon answers ``/healthz``
    on ``AEP_LISTEN``, say so (and ``hint``) instead of a bare "in use";
    else name each port's holder when it is an aep-bridges process (a
    daemon of another configuration)."""
    import json
    in_use = [p for p in problems if "address in use" in p]
    if not in_use:
        return problems
    if (health := running_daemon(cfg.listen, cfg.token)) is None:
        lock = _lock_holder(cfg.state_dir)
        named = [_name_holder(p, lock) if p in in_use else p for p in problems]
        if (n := sum(a != b for a, b in zip(named, problems, strict=True))):
            named.append(f"another aep-bridges daemon holds {'them' if n > 1 else 'it'}; {hint}")
        return named
    bridges = ", ".join(sorted(health.get("bridges") or {})) or "none"
    out = [p.replace("address in use or not bindable", "held by the running aep-bridges daemon")
           if p in in_use else p for p in problems]
    out.append(f"a daemon is running on {cfg.listen[0]}:{cfg.listen[1]} "
               f"(/healthz ok={json.dumps(health.get('ok'))}, bridges: {bridges}); {hint}")
    return out


def _cmd_check(args: argparse.Namespace) -> int:
    refused, sources = apply_settings(args)
    if refused is not None:
        return refused
    # check creates nothing: a missing state directory is reported, not made
    cfg, bridges, problems = _load(check_ports=not args.no_ports, create=False)
    problems, notes = _held_by_ours(cfg, bridges, problems, _lock_holder(cfg.state_dir),
                                    ports=not args.no_ports)
    if problems:
        return refuse(problems)
    print("aep-bridges: configuration ok: bridges "
          + (", ".join(s.key for s in cfg.enabled) or "none"))
    for note in notes:
        print(f"aep-bridges: note: {note}")
    _print_sources(sources)
    if not cfg.state_dir.exists():
        print(f"aep-bridges: state directory {cfg.state_dir} will be created by the first run")
    if cfg.nats is not None:  # AEP_NATS_URL: say whether the servers answer
        import trio

        from .jetstream.link import probe
        _, lines = trio.run(probe, cfg.nats)
        for line in lines:
            print(f"aep-bridges: {line}")
    return 0


def _held_by_ours(cfg: config_mod.Config, bridges: list[Any], problems: list[str], lock: Any,
                  *, ports: bool) -> tuple[list[str], list[str]]:
    """``check``'s ``(problems, notes)`` for ports in use and the state
    directory's lock (``lock``: its live holder or ``None``), as ``doctor``
    sees them: held by the running daemon of this same configuration (it
    answers ``/healthz`` on ``AEP_LISTEN`` running exactly the configured
    bridges) is a note, not a problem; held by anything else is a problem
    (``run``'s own words for the lock). ``ports=False`` (``--no-ports``):
    nothing held is a problem, a held lock is a note."""
    in_use = [p for p in problems if "address in use" in p]
    if lock is not None and not ports:
        return problems, [f"{lock.refusal()[0]} (not checked: --no-ports)"]
    if not in_use and lock is None:
        return problems, []
    health = running_daemon(cfg.listen, cfg.token)
    names = sorted(str(b.name) for b in bridges)
    if health is not None and sorted(health.get("bridges") or {}) == names:
        notes = [p.replace("address in use or not bindable", "held by the running aep-bridges "
                           "daemon") for p in in_use]
        if lock is not None:
            pid = f" pid {lock.pid}" if lock.pid else ""
            notes.insert(0, f"AEP_STATE_DIR={str(cfg.state_dir)!r}: held by the running "
                            f"aep-bridges daemon{pid}")
        notes.append(f"that daemon runs this configuration on {cfg.listen[0]}:{cfg.listen[1]}; "
                     "run would refuse while it runs")
        return [p for p in problems if p not in in_use], notes
    why = "" if health is None else " (a daemon with other bridges: not this configuration's)"
    problems = _explain_in_use(cfg, problems, f"to validate this configuration beside it{why}: "
                                              "aep-bridges check --no-ports")
    return (problems if lock is None else ["; ".join(lock.refusal()), *problems]), []


def _print_sources(sources: Any) -> None:
    """Each setting set, with where it came from (secrets shown as set, never their value)."""
    from . import config as config_mod
    known = config_mod.known_settings()
    secrets = {st.name for group in config_mod.all_settings().values() for st in group if st.secret}
    names = sorted(n for n in os.environ if n in known)
    print("aep-bridges: settings" + (" (every other one at its default):" if names else
                                     ": every one at its default"))
    from .tools.logs import scrub
    for n in names:
        # a URL's user:password@ is a secret too (issue 25 row 10): the log's own scrubber
        shown = "(set)" if n in secrets else scrub(os.environ[n])
        print(f"  {n}={shown}  ({sources.of_name(n)})")


def _cmd_doctor(args: argparse.Namespace) -> int:
    """The configuration ``check`` validates, then the machine against it
    (:mod:`supervisor.tools.doctor`)."""
    from . import config as config_mod
    from .daemon import build_bridges
    from .tools import doctor, hookdoctor
    refused, _ = apply_settings(args)
    if refused is not None:
        return refused
    cfg, problems = config_mod.load(check_ports=False, create=False)
    for w in cfg.warnings:
        print(f"aep-bridges: config: warning: {w}", file=sys.stderr)
    if (problem := config_mod.state_dir_problem(cfg.state_dir, create=False)) \
            and problem not in problems:
        problems.append(problem)
    bridges, more = build_bridges(cfg, check_ports=False)
    health: list[dict | None] = []

    def ours(bridge: str | None) -> bool:
        # a port is fine when our daemon runs and, for a bridge's, runs that bridge
        if not health:
            health.append(running_daemon(cfg.listen, cfg.token))
        return health[0] is not None and (bridge is None or bridge in health[0]["bridges"])
    return doctor.run(cfg, bridges, problems + more, ours=ours,
                      lock=_lock_holder(cfg.state_dir), hooks=hookdoctor.findings)


def _cmd_service(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .tools.install import default_manager, install
    # a --prefix install stages files for another root: this host's init says nothing
    manager = args.manager or (default_manager(systemd_booted=True) if args.prefix
                               else default_manager())
    if manager is None:
        why = ", not booted with systemd" if sys.platform.startswith("linux") else ""
        print("aep-bridges service install: cannot tell which service manager this host runs "
              f"({sys.platform}{why}); say --systemd or --launchd", file=sys.stderr)
        return 2
    return install(manager, prefix=Path(args.prefix) if args.prefix else None,
                   dry_run=args.dry_run)


def _cmd_hooks(args: argparse.Namespace) -> int:
    """``hooks install`` and ``uninstall`` read ``--env-file`` / ``--config``
    / ``AEP_CONFIG`` first (as the client commands do), so install's default
    ``--daemon`` is the configured ``AEP_LISTEN`` (and ``--spool``,
    ``--hold-s`` the configured ones) and both find the install record."""
    from .hookinstall.cli import run
    if args.action in ("install", "uninstall") and (
            refused := apply_settings(args)[0]) is not None:
        return refused
    return run(args)


def _version() -> str:
    """The installed distribution's version, with the AEP version it speaks."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        mine = version("aep-bridges")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        mine = "unknown (not installed)"
    return f"{mine} (AEP 0.1)"


def main(argv: list[str] | None = None) -> int:
    """The console script. ``hook`` goes straight to the shim (no argparse,
    no trio: its start-up is the agent's wait); the rest through argparse."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["hook"]:
        from bridges.hooks_common.shim import main as hook_main
        return hook_main(args_in[1:])
    import argparse
    parser = argparse.ArgumentParser(
        prog="aep-bridges",
        description="Bridge coding-agent vendor surfaces to the Agent Event Protocol (AEP 0.1). "
                    "Configured from the environment or a TOML file (--config); see docs/configuration.md.")
    class _Version(argparse.Action):  # the version read only when asked (importlib.metadata)
        def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
            print(f"aep-bridges {_version()}")
            parser.exit()
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show the version (and the AEP version it speaks) and exit")
    sub = parser.add_subparsers(dest="cmd", required=True)
    env_file = argparse.ArgumentParser(add_help=False)
    env_file.add_argument("--env-file", metavar="PATH",
                          help="read KEY=VALUE settings from PATH (the environment wins)")
    env_file.add_argument("--config", metavar="FILE",
                          help="read settings from a TOML FILE with the environment's names "
                               "(default: $AEP_CONFIG; the environment and --env-file win)")
    sub.add_parser("run", parents=[env_file],
                   help="run the bridge fleet (and the embedded relay unless AEP_RELAY_URL is set)")
    sub.add_parser("relay", parents=[env_file],
                   help="run the embedded AEP relay alone on AEP_LISTEN")
    chk = sub.add_parser("check", parents=[env_file],
                         help="validate the configuration, say where each setting came from, exit")
    chk.add_argument("--no-ports", action="store_true",
                     help="skip the port-in-use checks (and a held state directory is only a note)")
    from bridges.acp import tee
    tee.add_arguments(sub.add_parser(
        "acp", help="the ACP tee: run as an editor's agent command, "
                    "aep-bridges acp [--daemon URL] [--name NAME] -- AGENT_CMD..."))
    tail_parser(sub, env_file)
    endpoint = argparse.ArgumentParser(add_help=False, parents=[env_file])
    endpoint.add_argument("--url", default=None,
                          help="the AEP endpoint (default: the local relay, http:// + AEP_LISTEN "
                               "of the environment or --config)")
    endpoint.add_argument("--token", default=None,
                          help="bearer token (default: AEP_TOKEN of the environment or --config)")
    control_parsers(sub, endpoint)
    sub.add_parser("doctor", parents=[env_file],
                   help="is this machine ready for the configured daemon? each bridge's vendor "
                        "reachable, tokens readable, ports free or ours, state dir writable; "
                        "with the fix for each failure", epilog="exit 0 all good, 1 something to fix")
    tl = sub.add_parser("timeline", help="render session log files (JSONL, .gz, or - for stdin) "
                                         "as tail renders a stream")
    tl.add_argument("files", nargs="+", metavar="FILE")
    tl.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    val = sub.add_parser("validate", help="check events (JSONL, .gz, or - for stdin) against the "
                                          "AEP 0.1 schemas; problems with line numbers",
                         epilog="exit 0 all valid, 1 problems, 2 a file unreadable")
    val.add_argument("files", nargs="+", metavar="FILE")
    svc = sub.add_parser("service", help="install the systemd unit or launchd agent for this install")
    svc_sub = svc.add_subparsers(dest="action", required=True)
    inst = svc_sub.add_parser("install", help="write the unit/plist and the environment file")
    which = inst.add_mutually_exclusive_group()
    which.add_argument("--systemd", dest="manager", action="store_const", const="systemd",
                       help="a systemd unit (the default on a Linux booted with systemd)")
    which.add_argument("--launchd", dest="manager", action="store_const", const="launchd",
                       help="a launchd agent (the default on macOS)")
    inst.add_argument("--prefix", metavar="DIR", help="write under DIR instead of / (or ~ for launchd)")
    inst.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
    sub.add_parser("hook", help="the command shim a vendor runs per hook: "
                                "aep-bridges hook <agent> [--daemon URL] [--token-file F] "
                                "[--spool DIR] (stdin: the hook JSON)")
    from .hookinstall.cli import add_parser as hooks_parser
    hooks_parser(sub, env_file)
    args = parser.parse_args(args_in)
    if args.cmd == "acp":  # the agent's status, without the interpreter's teardown
        tee.leave(tee.main(args))
    handler = {"run": _cmd_run, "relay": _cmd_relay, "check": _cmd_check, "tail": cmd_tail,
               "service": _cmd_service, "hooks": _cmd_hooks, "respond": cmd_control,
               "cancel": cmd_control, "pause": cmd_control, "resume": cmd_control,
               "timeline": cmd_timeline, "validate": cmd_validate, "doctor": _cmd_doctor}[args.cmd]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
