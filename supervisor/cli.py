"""``aep-bridges``: the console script (DESIGN.md "The operator's interface").

- ``aep-bridges run``: the fleet (bridges + embedded relay or uplink).
- ``aep-bridges relay``: the embedded AEP relay alone.
- ``aep-bridges check``: validate the configuration and exit (0 or 2).
- ``aep-bridges acp [--daemon URL] [--name NAME] -- AGENT_CMD...``: the ACP
  tee an editor runs as its agent command (:mod:`bridges.acp.tee`); exits
  with the agent's status.

Bad configuration is refused before anything binds: one line per problem on
stderr, exit status 2."""
from __future__ import annotations

import argparse
import sys

import trio

from . import config as config_mod
from . import logs


def _refuse(problems: list[str]) -> int:
    for p in problems:
        print(f"aep-bridges: config: {p}", file=sys.stderr)
    return 2


def _load(*, relay_only: bool = False, check_ports: bool = True):
    """Config + bridges with every problem collected (core and bridge
    settings alike); warnings (misspelt names) printed, not fatal."""
    from .daemon import build_bridges
    cfg, problems = config_mod.load(relay_only=relay_only, check_ports=check_ports)
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
    from .daemon import run_daemon
    cfg, bridges, problems = _load()
    if problems:
        return _refuse(problems)
    logs.setup(cfg.environ)
    raise_fd_limit()
    return trio.run(run_daemon, cfg, bridges)


def _cmd_relay(args: argparse.Namespace) -> int:
    from .daemon import run_daemon
    cfg, _, problems = _load(relay_only=True)
    if problems:
        return _refuse(problems)
    logs.setup(cfg.environ)
    raise_fd_limit()
    return trio.run(run_daemon, cfg, [])


def _cmd_check(args: argparse.Namespace) -> int:
    cfg, _, problems = _load(check_ports=not args.no_ports)
    if problems:
        return _refuse(problems)
    print("aep-bridges: configuration ok: bridges "
          + (", ".join(s.key for s in cfg.enabled) or "none"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aep-bridges",
        description="Bridge coding-agent vendor surfaces to the Agent Event Protocol (AEP 0.1). "
                    "Configured from the environment; see the README.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="run the bridge fleet (and the embedded relay unless AEP_RELAY_URL is set)")
    sub.add_parser("relay", help="run the embedded AEP relay alone on AEP_LISTEN")
    chk = sub.add_parser("check", help="validate the configuration and exit")
    chk.add_argument("--no-ports", action="store_true", help="skip the port-in-use checks")
    from bridges.acp import tee
    tee.add_arguments(sub.add_parser(
        "acp", help="the ACP tee: run as an editor's agent command, "
                    "aep-bridges acp [--daemon URL] [--name NAME] -- AGENT_CMD..."))
    args = parser.parse_args(argv)
    if args.cmd == "acp":
        return tee.main(args)
    handler = {"run": _cmd_run, "relay": _cmd_relay, "check": _cmd_check}[args.cmd]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
