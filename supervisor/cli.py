"""``aep-bridges``: the console script (DESIGN.md "The operator's interface").

- ``aep-bridges run``: the fleet (bridges + embedded relay or uplink).
- ``aep-bridges relay``: the embedded AEP relay alone.
- ``aep-bridges check``: validate the configuration and exit (0 or 2).
- ``aep-bridges acp [--daemon URL] [--name NAME] -- AGENT_CMD...``: the ACP
  tee an editor runs as its agent command (:mod:`bridges.acp.tee`); exits
  with the agent's status.
- ``aep-bridges tail``: follow an AEP endpoint as a human timeline
  (:mod:`supervisor.tail`).
- ``aep-bridges service install [--systemd|--launchd]``: write the service
  unit for this install (:mod:`supervisor.install`).

Bad configuration is refused before anything binds: one line per problem on
stderr, exit status 2."""
from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from typing import Any

import trio

from . import config as config_mod
from . import logs


def _refuse(problems: list[str]) -> int:
    for p in problems:
        print(f"aep-bridges: config: {p}", file=sys.stderr)
    return 2


def _load(*, relay_only: bool = False, check_ports: bool = True, create: bool = True):
    """Config + bridges with every problem collected (core and bridge
    settings alike); warnings (misspelt names) printed, not fatal.
    ``create=False``: probe without creating the state directory."""
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


def _apply_env_file(args: argparse.Namespace) -> int | None:
    """``--env-file``: the systemd-style KEY=VALUE file (launchd's way to the
    same settings); the process environment wins over it, as with systemd's
    ``Environment=`` after ``EnvironmentFile=``. Exit 2 when unreadable."""
    path = getattr(args, "env_file", None)
    if not path:
        return None
    from .install import read_env_file
    try:
        values = read_env_file(path)
    except (OSError, ValueError) as e:
        return _refuse([f"--env-file {path}: {getattr(e, 'strerror', None) or e}"])
    for k, v in values.items():
        os.environ.setdefault(k, v)
    return None


def _cmd_run(args: argparse.Namespace) -> int:
    from .daemon import run_daemon
    if (refused := _apply_env_file(args)) is not None:
        return refused
    cfg, bridges, problems = _load()
    from .statelock import StateDirBusy, hold

    def busy(e: StateDirBusy) -> str:
        who = f"aep-bridges pid {e.pid}" if e.pid else "another aep-bridges"
        return (f"AEP_STATE_DIR={str(cfg.state_dir)!r}: in use by {who}; stop it "
                "first, or give this daemon a state directory of its own")
    if problems:
        problems = _explain_in_use(cfg, problems, "stop it first (or give this one other "
                                                  "ports: AEP_LISTEN, AEP_OTLP_*_LISTEN)")
        if cfg.state_dir.is_dir():  # the same daemon on its ports and its state directory
            try:
                hold(cfg.state_dir).release()
            except StateDirBusy as e:
                problems = [busy(e), *problems]
            except OSError:
                pass
        return _refuse(problems)
    try:  # one daemon per state directory: the session logs and state files have one writer
        lock = hold(cfg.state_dir)
    except StateDirBusy as e:
        return _refuse([busy(e)])
    except OSError as e:
        return _refuse([f"AEP_STATE_DIR={str(cfg.state_dir)!r}: cannot lock "
                        f"{e.filename or 'daemon.lock'}: {e.strerror or e}"])
    logs.setup(cfg.environ)
    raise_fd_limit()
    try:
        return trio.run(run_daemon, cfg, bridges)
    finally:
        lock.release()


def _cmd_relay(args: argparse.Namespace) -> int:
    from .daemon import run_daemon
    cfg, _, problems = _load(relay_only=True)
    if problems:
        return _refuse(problems)
    logs.setup(cfg.environ)
    raise_fd_limit()
    # AEP_NATS_URL: serve the AEP bindings from JetStream ("Past one machine")
    return trio.run(partial(run_daemon, cfg, [], nats=cfg.nats))


def running_daemon(listen: tuple[str, int], token: str | None) -> dict | None:
    """The ``/healthz`` body of an aep-bridges daemon answering on
    ``listen``, or ``None`` (nothing there, or something that is not us)."""
    import httpx
    host, port = listen
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    url = f"http://[{host}]:{port}/healthz" if ":" in host else f"http://{host}:{port}/healthz"
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        body = httpx.get(url, headers=headers, timeout=2, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) and "ok" in body and "bridges" in body else None


def _explain_in_use(cfg: config_mod.Config, problems: list[str], hint: str) -> list[str]:
    """When ports are "in use" and an aep-bridges daemon answers ``/healthz``
    on ``AEP_LISTEN``, say so (and ``hint``) instead of a bare "in use"."""
    in_use = [p for p in problems if "address in use" in p]
    if not in_use or (health := running_daemon(cfg.listen, cfg.token)) is None:
        return problems
    bridges = ", ".join(sorted(health.get("bridges") or {})) or "none"
    out = [p.replace("address in use or not bindable", "held by the running aep-bridges daemon")
           if p in in_use else p for p in problems]
    out.append(f"a daemon is running on {cfg.listen[0]}:{cfg.listen[1]} "
               f"(/healthz ok={json.dumps(health.get('ok'))}, bridges: {bridges}); {hint}")
    return out


def _cmd_check(args: argparse.Namespace) -> int:
    if (refused := _apply_env_file(args)) is not None:
        return refused
    # check creates nothing: a missing state directory is reported, not made
    cfg, _, problems = _load(check_ports=not args.no_ports, create=False)
    problems = _explain_in_use(cfg, problems, "to validate this configuration beside it: "
                                              "aep-bridges check --no-ports")
    if problems:
        return _refuse(problems)
    print("aep-bridges: configuration ok: bridges "
          + (", ".join(s.key for s in cfg.enabled) or "none"))
    if not cfg.state_dir.exists():
        print(f"aep-bridges: state directory {cfg.state_dir} will be created by the first run")
    if cfg.nats is not None:  # AEP_NATS_URL: say whether the servers answer
        from .jetstream.link import probe
        _, lines = trio.run(probe, cfg.nats)
        for line in lines:
            print(f"aep-bridges: {line}")
    return 0


def _tail_parser(sub: Any) -> None:
    from .tail import default_url
    tail = sub.add_parser("tail", help="follow an AEP endpoint's /stream as a human timeline")
    tail.add_argument("--url", default=None,
                      help="the AEP endpoint (default: the local relay, http:// + $AEP_LISTEN;"
                           f" here now {default_url().replace('%', '%%')})")  # argparse %-formats help
    tail.add_argument("--token", default=None, help="bearer token (default: $AEP_TOKEN)")
    tail.add_argument("--filter", action="append", default=[], metavar="F",
                      help="attr-match filter: JSON object or key=value[,value] (agent=codex, "
                           "type=attention.*, severity>=warning); repeatable")
    tail.add_argument("--from", dest="from_", default=None, metavar="all|JSON",
                      help="'all': replay everything the relay holds first; or a JSON array of "
                           "{session, epoch, seq} resume positions")
    tail.add_argument("--json", action="store_true", help="print raw events, one JSON line each")
    tail.add_argument("--limit", type=int, default=None, metavar="N", help="exit after N events")
    tail.add_argument("--color", choices=("auto", "always", "never"), default="auto")


def _cmd_tail(args: argparse.Namespace) -> int:
    from .tail import default_url, parse_filter, run
    try:
        flt = parse_filter(args.filter)
        from_ = args.from_
        if from_ not in (None, "all"):
            from_ = json.loads(from_)
            if not isinstance(from_, list):
                raise ValueError("--from: expected 'all' or a JSON array of positions")
    except ValueError as e:
        print(f"aep-bridges tail: {e}", file=sys.stderr)
        return 2
    token = args.token if args.token is not None else os.environ.get("AEP_TOKEN") or None
    return run(args.url or default_url(), token=token, flt=flt, from_=from_, as_json=args.json,
               limit=args.limit, color=args.color)


def _cmd_service(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .install import default_manager, install
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aep-bridges",
        description="Bridge coding-agent vendor surfaces to the Agent Event Protocol (AEP 0.1). "
                    "Configured from the environment; see the README.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    env_file = argparse.ArgumentParser(add_help=False)
    env_file.add_argument("--env-file", metavar="PATH",
                          help="read KEY=VALUE settings from PATH (the environment wins)")
    sub.add_parser("run", parents=[env_file],
                   help="run the bridge fleet (and the embedded relay unless AEP_RELAY_URL is set)")
    sub.add_parser("relay", help="run the embedded AEP relay alone on AEP_LISTEN")
    chk = sub.add_parser("check", parents=[env_file], help="validate the configuration and exit")
    chk.add_argument("--no-ports", action="store_true", help="skip the port-in-use checks")
    from bridges.acp import tee
    tee.add_arguments(sub.add_parser(
        "acp", help="the ACP tee: run as an editor's agent command, "
                    "aep-bridges acp [--daemon URL] [--name NAME] -- AGENT_CMD..."))
    _tail_parser(sub)
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
    args = parser.parse_args(argv)
    if args.cmd == "acp":  # the agent's status, without the interpreter's teardown
        tee.leave(tee.main(args))
    handler = {"run": _cmd_run, "relay": _cmd_relay, "check": _cmd_check, "tail": _cmd_tail,
               "service": _cmd_service}[args.cmd]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
