"""The client commands of ``aep-bridges`` (split from :mod:`supervisor.cli`):
``tail`` (:mod:`supervisor.tools.tail`); ``respond``, ``cancel``, ``pause``,
``resume`` (:mod:`supervisor.tools.control`), against any AEP endpoint with
``--url``/``--token`` (defaults from the environment, ``--env-file`` and
``--config`` as ``run`` reads them); ``timeline`` and ``validate`` of session
log files. Each ``cmd_*`` takes the parsed arguments and returns the exit
status."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from .cliconfig import apply_settings

if TYPE_CHECKING:
    import argparse


def tail_parser(sub: Any, settings: argparse.ArgumentParser) -> None:
    from .tools.tail import default_url
    tail = sub.add_parser("tail", parents=[settings],
                          help="follow an AEP endpoint's /stream as a human timeline")
    tail.add_argument("--url", default=None,
                      help="the AEP endpoint (default: the local relay, http:// + AEP_LISTEN of "
                           "the environment or --config; here now without --config "
                           f"{default_url().replace('%', '%%')})")  # argparse %-formats help
    tail.add_argument("--token", default=None,
                      help="bearer token (default: AEP_TOKEN of the environment or --config)")
    tail.add_argument("--filter", action="append", default=[], metavar="F",
                      help="attr-match filter: JSON object or key=value[,value] (agent=codex, "
                           "type=attention.*, severity>=warning); repeatable")
    tail.add_argument("--from", dest="from_", default=None, metavar="all|JSON",
                      help="'all': replay everything the relay holds first; or a JSON array of "
                           "{session, epoch, seq} resume positions")
    tail.add_argument("--json", action="store_true", help="print raw events, one JSON line each")
    tail.add_argument("--limit", type=int, default=None, metavar="N", help="exit after N events")
    tail.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    tail.add_argument("--no-resume", action="store_true",
                      help="neither start from nor save the position kept per endpoint under the "
                           "state directory (tail/); without it a restarted tail shows what it missed")


def cmd_tail(args: argparse.Namespace) -> int:
    import json

    from .tools.tail import parse_filter, run
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
    if (refused := apply_settings(args)[0]) is not None:
        return refused
    from .tools.resume import position_file
    url, token = endpoint(args)
    return run(url, token=token, flt=flt, from_=from_, as_json=args.json,
               limit=args.limit, color=args.color,
               resume_file=None if args.no_resume else position_file(url, os.environ))


def endpoint(args: argparse.Namespace) -> tuple[str, str | None]:
    """A client command's ``--url`` (default: the local relay,
    ``http://`` + ``AEP_LISTEN``) and ``--token`` (default: ``AEP_TOKEN``).
    The defaults come from ``os.environ`` after :func:`~supervisor.cliconfig.apply_settings`:
    the environment wins over ``--env-file``, that over ``--config`` (as
    for ``run``); a flag wins over all."""
    from .tools.tail import default_url
    token = args.token if args.token is not None else os.environ.get("AEP_TOKEN") or None
    return args.url or default_url(), token


def control_parsers(sub: Any, endpoint: argparse.ArgumentParser) -> None:
    """``respond``, ``cancel``, ``pause``, ``resume`` (:mod:`supervisor.tools.control`)."""
    import argparse
    waits = argparse.ArgumentParser(add_help=False, parents=[endpoint])
    waits.add_argument("--wait", type=float, default=30.0, metavar="S",
                       help="seconds to wait for the outcome after the ack (0: only the ack)")
    waits.add_argument("--ack-window", type=int, default=5000, metavar="MS",
                       help="milliseconds to wait for the ack, per try (3 tries)")
    codes = ("exit 0 accepted and the outcome seen, 3 rejected, 4 no ack, 5 no outcome "
             "within --wait, 1 endpoint unreachable, 6 unauthorized (the token), 2 bad arguments")
    rsp = sub.add_parser("respond", parents=[waits], epilog=codes,
                         help="answer an attention request: respond --pending (list the open "
                              "asks); respond --option ID (the one open ask); respond "
                              "[SESSION] REQUEST_ID --option ID (one of several)")
    rsp.add_argument("ids", nargs="*", metavar="[SESSION] REQUEST_ID",
                     help="the attention.requested Event's id (its session is looked up when "
                          "not given; none: the one pending ask, refused with the list if several)")
    rsp.add_argument("--pending", action="store_true",
                     help="list the pending asks (id, agent, session, age, prompt) and exit")
    rsp.add_argument("--option", help="the chosen option's id (as tail shows in [..|..])")
    rsp.add_argument("--text", help="a free-text answer (with --option deny: the reason)")
    rsp.add_argument("--values", metavar="JSON",
                     help="a form's answers (AEP-0006): a JSON object of field id -> answer")
    can = sub.add_parser("cancel", parents=[waits], epilog=codes,
                         help="cancel a session's run: cancel SESSION [--run RUN]")
    can.add_argument("session")
    can.add_argument("--run", help="the run to cancel (default: the target's open run)")
    can.add_argument("--scope", choices=("run", "session"), default="run")
    can.add_argument("--reason", help="why (sent as the command's reason)")
    for verb in ("pause", "resume"):
        p = sub.add_parser(verb, parents=[waits], epilog=codes, help=f"{verb} a session: {verb} SESSION")
        p.add_argument("session")


def cmd_control(args: argparse.Namespace) -> int:
    from .tools import control
    if (refused := apply_settings(args)[0]) is not None:
        return refused
    url, token = endpoint(args)
    name = f"aep-bridges {args.cmd}"
    try:
        if args.cmd == "respond":
            if len(args.ids) > 2 or (args.pending and args.ids):
                raise ValueError("expected [SESSION] REQUEST_ID, or --pending alone")
            if args.pending or not args.ids:
                from .tools.pending import pick
                picked = _read(url, pick, token, args.pending)
                if isinstance(picked, int):
                    return picked  # listed, refused or unreachable: said
                args.ids = list(picked)
            request = args.ids[-1]
            session = args.ids[0] if len(args.ids) == 2 else _read(url, control.find_session, token, request)
            if isinstance(session, int):
                return session  # the endpoint could not be read: said
            if session is None:
                print(f"{name}: {url} holds no attention.requested with id {request}; "
                      "give its session: respond SESSION REQUEST_ID", file=sys.stderr)
                return 2  # a request id that names nothing is a bad argument, not an unreachable endpoint
            command = control.respond(session, request, option=args.option, text=args.text,
                                      values=args.values)
            held = _read(url, control.resolved_as, token, session, request)
            if isinstance(held, int):
                return held  # the endpoint could not be read: said
            ended, ids = held
            if ended is not None:  # nothing to answer: said, not sent (a no-route after a restart)
                from .tools.gist import _safe
                print(_safe(f"{name}: already resolved: {ended}"), file=sys.stderr)
                return control.EXIT_REJECTED
            if args.option is not None and ids is not None and args.option not in ids:
                raise ValueError(f"--option {args.option}: not an option of this ask; "
                                 f"its options: {', '.join(ids)}")
        elif args.cmd == "cancel":
            command = control.cancel(args.session, run=args.run, scope=args.scope,
                                     reason=args.reason)
        else:
            command = getattr(control, args.cmd)(args.session)
    except ValueError as e:
        from .tools.gist import _safe
        print(_safe(f"{name}: {e}"), file=sys.stderr)  # it may name what a peer sent
        return 2
    return control.send(url, token, command, ack_window_ms=args.ack_window, wait_s=args.wait)


def _read(url: str, fn: Any, *args: Any) -> Any:
    """``fn(url, *args)``, or exit status 1 (said on stderr) when the
    endpoint cannot be read: unreachable is not a bad argument (the
    documented exit statuses)."""
    import httpx

    from .tools.control import EXIT_UNAUTHORIZED, EXIT_UNREACHABLE, UNAUTHORIZED
    from .tools.tailstream import refused
    try:
        return fn(url, *args)
    except httpx.HTTPError as e:
        if isinstance(e, httpx.TransportError) and (refused(e) or isinstance(e, httpx.ConnectError)):
            why = "is the daemon running? --url URL, or --config FILE"
        elif getattr(getattr(e, "response", None), "status_code", None) in (401, 403):
            print(f"aep-bridges respond: {UNAUTHORIZED}", file=sys.stderr)
            return EXIT_UNAUTHORIZED  # the token, not the endpoint: not said as unreachable
        else:
            why = f"{e}"
        print(f"aep-bridges respond: cannot reach {url} ({why})", file=sys.stderr)
        return EXIT_UNREACHABLE


def cmd_timeline(args: argparse.Namespace) -> int:
    from .tools.timeline import run
    return run(args.files, color=args.color)


def cmd_validate(args: argparse.Namespace) -> int:
    from .tools.validate import run
    return run(args.files)


__all__ = ["cmd_control", "cmd_tail", "cmd_timeline", "cmd_validate", "control_parsers",
           "endpoint", "tail_parser"]
