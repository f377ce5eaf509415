"""``aep-bridges doctor``: is this machine ready for the configured daemon?
Each finding with the fix for a failure (the ecosystem's ``aep doctor``).

What it looks at, for the configuration ``check`` would validate (the same
environment, ``--env-file`` and ``--config``):

- the state directory: writable, or creatable (``check``'s own probe), and
  its lock (``daemon.lock``) free, or held by our own running daemon (fine);
  held by another daemon is ``run``'s refusal, with the same words;
- every port the daemon would bind (``AEP_LISTEN``, each bridge's
  listeners): free, held by our own running daemon (fine), or taken by
  something else;
- each enabled bridge's vendor surface: the server it dials out to
  answers (OpenCode, Kilo Code, OpenHands, the AG-UI upstream, a set
  ``kimi web`` URL), and the credential it presents is accepted (a 401/403
  is a wrong password or key); Kimi's token file readable; a bridge that
  only listens (OTLP, ACP) needs its port, nothing else;
- each enabled hook bridge (Claude Code, Codex): its hooks installed,
  trusted, pointing at this daemon, sending its token, their shim
  resolvable, its spool, its control gate (:mod:`.hookdoctor`);
- ``AEP_RELAY_URL`` (an uplink): the remote relay answers its discovery
  document;
- every configuration problem ``check`` reports (control asked for without
  ``AEP_TOKEN``, a bad value), each a failure.

Pure of the daemon's top modules (``supervisor.cli`` hands in the parsed
config, the bridges, the configuration problems and a ``ours(listen)``
test); the probes are plain ``httpx`` requests with a short timeout, one at
a time. Exit 0 when nothing failed, 1 otherwise."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

__all__ = ["Finding", "bridge_findings", "port", "reachable", "report", "run"]

_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Finding:
    """One line of the report: ``ok`` (or a failure, then ``fix`` says what
    to do), ``what`` it looked at and saw."""

    ok: bool
    what: str
    fix: str = ""


def port(label: str, addr: tuple[str, int], *, ours: Callable[[], bool],
         setting: str) -> Finding:
    """``addr`` bindable now, or held by our running daemon (``ours()``: it
    answers on ``AEP_LISTEN`` and runs the bridge the port is for; ok both),
    or taken by another program (a failure naming ``setting``)."""
    from bridges.core.settings import bindable
    host, p = addr
    where = f"{host}:{p}"
    if p == 0 or bindable(host, p):
        return Finding(True, f"{label} {where}: free")
    if ours():
        return Finding(True, f"{label} {where}: held by the running aep-bridges daemon")
    return Finding(False, f"{label} {where}: in use by another program",
                   f"stop it (ss -ltnp 'sport = :{p}' names it), or give {setting} another port")


def reachable(label: str, url: str, *, start: str, setting: str,
              auth: tuple[str, str] | None = None, headers: dict[str, str] | None = None,
              credential: str = "", path: str = "") -> Finding:
    """``url`` (+ ``path``) answers HTTP at all (any status but 401/403: a
    server is there); a 401/403 is a refused ``credential``. The status
    line is the answer: the body is never read (a server answering an
    endless one would hold the check, and its memory, for as long as it
    sends)."""
    import httpx
    target = url.rstrip("/") + path
    try:
        with httpx.stream("GET", target, auth=auth, headers=headers or {}, timeout=_TIMEOUT_S,
                          trust_env=False, follow_redirects=False) as r:
            pass
    except httpx.HTTPError as e:
        return Finding(False, f"{label}: {url} unreachable ({type(e).__name__})",
                       f"start {start} there, or point {setting} at where it runs")
    if r.status_code in (401, 403):
        return Finding(False, f"{label}: {url} answers, but refuses our credential "
                              f"(HTTP {r.status_code})",
                       f"set {credential} to the server's own" if credential else
                       "give the bridge the server's credential")
    return Finding(True, f"{label}: {url} answers (HTTP {r.status_code})")


def _readable(label: str, path: Path, fix: str) -> Finding:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        return Finding(False, f"{label}: {path} not readable ({e.strerror or e})", fix)
    return Finding(True, f"{label}: {path} readable")


def _kimi(bridge: Any) -> list[Finding]:
    cfg = bridge.config
    out: list[Finding] = []
    if cfg.token is None:
        out.append(_readable(f"{bridge.name} token", Path(cfg.home) / "server.token",
                             "start `kimi web` once (it writes the token), give the daemon the "
                             "same KIMI_CODE_HOME, or set AEP_KIMI_WEB_TOKEN"))
    if cfg.url:
        out.append(reachable(bridge.name, cfg.url, start="`kimi web`", setting="AEP_KIMI_WEB_URL",
                             headers={"authorization": f"Bearer {cfg.token}"} if cfg.token else None,
                             credential="AEP_KIMI_WEB_TOKEN"))
    else:
        live = list((Path(cfg.home) / "server" / "instances").glob("*.json"))
        out.append(Finding(bool(live), f"{bridge.name}: {len(live)} kimi web server(s) registered "
                                       f"under {cfg.home}/server/instances",
                           "" if live else "start `kimi web` (or set AEP_KIMI_WEB_URL)"))
    return out


def bridge_findings(bridge: Any) -> list[Finding]:
    """The vendor-surface findings of one bridge (its ports are looked at
    by :func:`run`); ``[]`` for a bridge that only listens."""
    name = str(bridge.name)
    cfg: Any = getattr(bridge, "config", None)
    profile: Any = getattr(bridge, "profile", None)
    if hasattr(profile, "serve_command") and hasattr(cfg, "password"):  # OpenCode, Kilo Code
        auth = (cfg.username, cfg.password) if cfg.password else None
        return [reachable(name, cfg.url, start=f"`{profile.serve_command}`",
                          setting=f"{profile.env}_URL", auth=auth,
                          credential=f"{profile.env}_PASSWORD", path="/session")]
    if name == "openhands":
        headers = {"X-Session-API-Key": cfg.key} if cfg.key else None
        return [reachable(name, cfg.url, start="`openhands-agent-server`",
                          setting="AEP_OPENHANDS_URL", headers=headers,
                          credential="AEP_OPENHANDS_SESSION_API_KEY",
                          path="/api/conversations/search")]
    if name == "agui":
        return [reachable(f"{name} upstream", cfg.upstream, start="the AG-UI agent server",
                          setting="AEP_AGUI_UPSTREAM")]
    if name == "kimi_web":
        return _kimi(bridge)
    return []


def run(cfg: Any, bridges: Sequence[Any], problems: Iterable[str], *,
        ours: Callable[[str | None], bool], out: TextIO | None = None,
        lock: Any = None, hooks: Callable[..., list[Finding]] | None = None) -> int:
    """Look at everything (module docstring), print the report, return 0
    (nothing failed) or 1. ``ours(bridge)``: our daemon answers on
    ``AEP_LISTEN`` (and, given a bridge's name, runs that bridge).
    ``lock``: the state directory's live holder
    (:class:`~supervisor.sessionlog.StateDirBusy`: its ``pid`` and
    ``refusal()``), ``None`` when free. ``hooks(bridge, cfg, ours=...)``:
    the findings of an enabled hook bridge (one with a ``/hooks/`` path:
    :func:`supervisor.tools.hookdoctor.findings`)."""
    out = out or sys.stdout
    problems = list(problems)
    findings = [Finding(False, f"configuration: {p}",
                        "make it a directory the daemon's user may write, or set AEP_STATE_DIR "
                        "to one" if p.startswith("AEP_STATE_DIR") else
                        "fix the setting (aep-bridges check says the same)") for p in problems]
    state = Path(cfg.state_dir)
    if lock is not None:  # run would refuse, unless it is the daemon this configuration runs
        what, fix = lock.refusal()
        pid = f" pid {lock.pid}" if lock.pid else ""
        findings.append(Finding(True, f"state directory {state}: held by the running "
                                      f"aep-bridges daemon{pid}") if ours(None) else
                        Finding(False, what, fix))
    elif not any(p.startswith("AEP_STATE_DIR") for p in problems):
        findings.append(Finding(True, f"state directory {state}: " + (
            "writable" if state.is_dir() else "created by the first run")))
    if cfg.relay_url is None:
        findings.append(port("AEP_LISTEN", tuple(cfg.listen), ours=lambda: ours(None),
                             setting="AEP_LISTEN"))
    else:
        findings.append(reachable("AEP_RELAY_URL", cfg.relay_url, start="the AEP relay",
                                  setting="AEP_RELAY_URL", path="/.well-known/aep",
                                  headers={"authorization": f"Bearer {cfg.token}"} if cfg.token
                                  else None, credential="AEP_TOKEN"))
    for b in bridges:
        try:
            listens = b.listeners()
        except ValueError:
            listens = {}
        for kind, addr in listens.items():
            if addr is not None:
                findings.append(port(f"{b.name} {kind}", addr, ours=partial(ours, str(b.name)),
                                     setting=f"{b.name}'s {kind} listener setting"))
        findings += bridge_findings(b)
        if hooks is not None and str(getattr(b, "path", "")).startswith("/hooks/"):
            findings += hooks(b, cfg, ours=ours(str(b.name)))
    return report(findings, out)


def report(findings: Sequence[Finding], out: TextIO) -> int:
    """Print ``ok``/``FAIL`` lines, each failure's ``fix:`` under it, and a
    summary; 0 when nothing failed, else 1."""
    for f in findings:
        print(f"{'ok  ' if f.ok else 'FAIL'}  {f.what}", file=out)
        if not f.ok and f.fix:
            print(f"      fix: {f.fix}", file=out)
    failed = sum(1 for f in findings if not f.ok)
    print(f"aep-bridges doctor: {len(findings)} checked, "
          + (f"{failed} to fix" if failed else "all good"), file=out)
    return 1 if failed else 0
