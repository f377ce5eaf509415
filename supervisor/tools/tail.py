"""``aep-bridges tail``: a human consumer of any AEP endpoint.

Reads ``GET /stream`` (AEP-0003 §4 SSE binding) with the protocol's own SDK
consumer (``aep_sdk.subscribe``: reconnect with backoff, ``(source, id)``
dedupe, ``(session, epoch, seq)`` resume, ``from=all`` replay, AEP-0003
§5-7) and prints one aligned line per event::

    09:31:02.118  opencode  …c2f9a1  attention.requested  permission: bash  [once|always|reject]  PENDING

Columns: the event's ``time`` (its clock, shown ``HH:MM:SS.mmm``), ``agent``,
the session (its last 7 characters), the ``type`` colored by family, and the
one-line *gist* (:func:`gist`): the tool name and status, the attention
prompt and options, the run outcome, a vendor event's telling attributes.
An ``attention.requested`` nothing has resolved yet is highlighted (and
marked ``PENDING``); its ``attention.resolved`` line names how it ended.
A replay (``--from all``, a resumed position) is looked at first for the
asks it already settles (:func:`.tailstream.settled`, one replay-only
request): a replayed ask that was answered, dismissed or timed out is
shown with its outcome (``→ answered``), never as ``PENDING``.

``--json`` prints each event as one compact JSON line instead (for ``jq``).

The pure parts (:func:`gist`, :func:`parse_filter`, :class:`Timeline`) take
events as dicts and return text; :func:`run` owns the subscription thread
(:mod:`supervisor.tools.tailstream`, the SDK consumer's behaviour plus a defined
answer to an endpoint that sends what is not AEP: each bad event skipped,
counted and named once on stderr; an answer that is no event stream ends
``tail`` with exit 1) and the terminal (``rich``)."""
from __future__ import annotations

import json
import os
import queue
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, TextIO

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.text import Text

from .gist import AskKey, _obj, _s, _safe, _tables, ask_key, gist

__all__ = ["run", "gist", "parse_filter", "default_url", "Timeline", "DEFAULT_LISTEN",
           "FAMILY_STYLE", "OUTCOME_STYLE", "TIME_W", "AGENT_W", "SESSION_W", "TYPE_W"]

DEFAULT_LISTEN = "127.0.0.1:8787"

#: column widths (characters) of the aligned timeline
TIME_W, AGENT_W, SESSION_W, TYPE_W = 12, 10, 8, 28

#: the style of each type family (the type's first dotted segment)
FAMILY_STYLE = {
    "session": "blue", "run": "cyan", "tool": "magenta", "attention": "bold yellow",
    "control": "green", "error": "bold red", "progress": "white", "agent": "dim cyan",
    "delegation": "cyan", "state": "dim", "assessment": "white", "resource": "white",
}
#: outcomes worth seeing from across the room: the type and the gist in this style
OUTCOME_STYLE = {"tool.failed": "bold red", "run.failed": "bold red", "tool.denied": "yellow",
                 "run.cancelled": "yellow", "control.rejected": "red",
                 "attention.timeout": "yellow"}
_SEVERITY_STYLE = {"error": "bold red", "critical": "bold white on red", "warning": "yellow"}

def default_url(environ: Mapping[str, str] | None = None) -> str:
    """The local relay: ``http://`` + ``AEP_LISTEN`` (default ``127.0.0.1:8787``;
    the client commands' ``--config`` has put the file's value there). A
    wildcard listener is reached on loopback (``0.0.0.0`` -> ``127.0.0.1``,
    ``::`` -> ``[::1]``), an IPv6 host in brackets."""
    env = os.environ if environ is None else environ
    listen = (env.get("AEP_LISTEN") or DEFAULT_LISTEN).strip()
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def parse_filter(specs: list[str]) -> dict[str, Any]:
    """``--filter`` values -> one attr-match filter object (AEP-0003 §6).

    Each value is either a JSON object (``'{"type": ["attention.*"]}'``) or
    ``key=value[,value...]`` (``agent=codex``, ``type=tool.*,attention.*``,
    ``severity>=warning``). Keys repeat across values: later wins.
    Raises ``ValueError`` with a readable message on anything else."""
    out: dict[str, Any] = {}
    for spec in specs:
        spec = spec.strip()
        if spec.startswith("{"):
            try:
                obj = json.loads(spec)
            except ValueError as e:
                raise ValueError(f"--filter {spec!r}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"--filter {spec!r}: expected a JSON object")
            out.update(obj)
        elif ">=" in spec:
            key, _, value = spec.partition(">=")
            out[key.strip()] = {"gte": value.strip()}
        elif "=" in spec:
            key, _, value = spec.partition("=")
            values = [v.strip() for v in value.split(",") if v.strip()]
            if not key.strip() or not values:
                raise ValueError(f"--filter {spec!r}: expected key=value")
            out[key.strip()] = values if len(values) > 1 or "*" in value else values[0]
        else:
            raise ValueError(f"--filter {spec!r}: expected key=value or a JSON object")
    return out


def _clock(ts: Any) -> str:
    """``2026-12-01T09:31:02.118Z`` -> ``09:31:02.118`` (the event's own clock)."""
    if not isinstance(ts, str) or "T" not in ts:
        return "?"
    t = ts.split("T", 1)[1].rstrip("Z")
    for sep in ("+", "-"):
        t = t.split(sep, 1)[0]
    hms, _, frac = t.partition(".")
    return f"{hms}.{(frac + '000')[:3]}"


def _short_session(sid: Any) -> str:
    if not isinstance(sid, str) or not sid:
        return "-"
    return sid if len(sid) <= SESSION_W else "…" + sid[-(SESSION_W - 1):]


def _cell(value: str, width: int) -> str:
    """``value`` in exactly ``width`` terminal cells (a wide character takes
    two, a combining mark none), cut with an ellipsis."""
    if cell_len(value) > width:
        return set_cell_size(value, width - 1) + "…"
    return set_cell_size(value, width)


def _day(ts: Any) -> str | None:
    """The UTC date (``YYYY-MM-DD``) of an event's ``time``; ``None`` when unreadable."""
    if not isinstance(ts, str):
        return None
    try:
        when = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc)
    return when.date().isoformat()


@dataclass
class Timeline:
    """The timeline's state: which attention requests are still open, and
    the day of the last event shown.

    :meth:`line` renders one event as a ``rich.text.Text`` (plain text via
    ``.plain``); ``pending`` maps an open request (:func:`.gist.ask_key`:
    its source, session and id) to its event.
    :meth:`date_line` is the ``── 2026-12-01 ──`` line to show before an
    event from another day than the one before it (or, first, from another
    day than today, UTC), so a recorded event does not read as a clock bug
    and the columns stay aligned. ``full_types``: the type column is not cut
    (a pipe or a file, where the whole name is what a reader greps for)."""

    pending: dict[AskKey, dict[str, Any]] = field(default_factory=dict)
    full_types: bool = False
    day: str | None = None
    #: asks known to be settled already (:func:`.gist.ask_key` -> how: ``answered``, ``timed out``...):
    #: a replayed ``attention.requested`` among them is not pending
    settled: dict[AskKey, str] = field(default_factory=dict)
    #: the settled asks shown, by :func:`.gist.ask_key` (for their outcome line's ``← prompt``)
    asked: dict[AskKey, dict[str, Any]] = field(default_factory=dict)

    def date_line(self, ev: Mapping[str, Any], *, today: str | None = None) -> Text | None:
        day = _day(ev.get("time"))
        if day is None:
            return None
        before = self.day if self.day is not None else (
            today or datetime.now(timezone.utc).date().isoformat())
        self.day = day
        if day == before:
            return None
        return Text(f"── {day} ──", style="bold", no_wrap=True)

    def line(self, ev: Mapping[str, Any]) -> Text:
        type_ = str(ev.get("type") or "?")
        family = type_.split(".", 1)[0]
        style = OUTCOME_STYLE.get(type_) or _SEVERITY_STYLE.get(str(ev.get("severity") or "")) or (
            "dim" if family == "x" else FAMILY_STYLE.get(family, ""))
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(_cell(_safe(_clock(ev.get("time"))), TIME_W), "dim")
        t.append(" ")
        t.append(_cell(_safe(str(ev.get("agent") or "?")), AGENT_W), "bold")
        t.append(" ")
        t.append(_cell(_safe(_short_session(ev.get("session"))), SESSION_W), "dim")
        t.append(" ")
        shown = _safe(type_)
        if self.full_types and cell_len(shown) > TYPE_W:
            t.append(shown, style)
        else:
            t.append(_cell(shown, TYPE_W), style)
        t.append(" ")
        summary = gist(ev)
        key = ask_key(ev)  # an ask, or what an outcome settles: in its own session (issue 25)
        if type_ == "attention.requested" and key is not None and key in self.settled:
            self.asked[key] = dict(ev)
            t.append(summary, style)
            t.append(f"  → {_safe(self.settled[key])}", "green")
        elif type_ == "attention.requested" and key is not None:
            self.pending[key] = dict(ev)
            t.append(summary, "bold black on yellow")
            t.append("  PENDING", "bold yellow")
        elif type_ in ("attention.resolved", "attention.timeout") and key is not None and (
                key in self.pending or key in self.asked):
            asked = self.pending.pop(key, None) or self.asked.pop(key)
            t.append(f"{summary} ← {_s(_obj(asked.get('data')).get('prompt') or '', 40)}",
                     "bold green")
            left = len(self.pending)
            if left:
                t.append(f"  ({left} still pending)", "yellow")
        else:
            loud = family in ("error", "control") or type_ in OUTCOME_STYLE
            t.append(summary, style if loud else "")
        return t


def _console(color: str, out: TextIO) -> Console:
    force = {"always": True, "never": False}.get(color)
    console = Console(file=out, force_terminal=force, no_color=(color == "never"),
                      highlight=False, soft_wrap=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        # a pipe or a file: no terminal to fit, keep whole lines
        console = Console(file=out, force_terminal=force, no_color=(color == "never"),
                          highlight=False, soft_wrap=False, width=400)
    return console


class _Stop(Exception):
    """SIGINT, SIGTERM or SIGHUP (a closed terminal): ``tail`` ends, exit 0,
    its position saved."""


class _Stopper:
    """SIGINT, SIGTERM and SIGHUP end ``tail`` alike: :class:`_Stop` is
    raised at once, except while an event is being shown and its position
    noted (``with stopper:``), where it is raised right after, so the
    position saved is that of the last event shown. Installed from the
    main thread only (:meth:`install`), the previous handlers put back by
    :meth:`restore`."""

    def __init__(self) -> None:
        self.held = False
        self.pending = False
        self.old: dict[int, Any] = {}

    def _on(self, signum: int, frame: Any) -> None:
        if self.held:
            self.pending = True
        else:
            raise _Stop(signum)

    def install(self) -> None:
        import signal
        import threading
        if threading.current_thread() is not threading.main_thread():
            return
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            if (signum := getattr(signal, name, None)) is not None:
                self.old[signum] = signal.signal(signum, self._on)

    def restore(self) -> None:
        import signal
        for signum, handler in self.old.items():
            signal.signal(signum, handler)

    def __enter__(self) -> None:
        self.held = True

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.held = False
        if self.pending and kind is None:
            raise _Stop()


def _position(ev: Mapping[str, Any]) -> tuple[int, int] | None:
    """A session event's ``(epoch, seq)`` (``None`` for an agent-scoped one)."""
    session, epoch, seq = ev.get("session"), ev.get("epoch", 0), ev.get("seq")
    if isinstance(session, str) and type(seq) is int and type(epoch) is int:
        return epoch, seq
    return None


@dataclass
class _Screen:
    """Where events are shown (a line each, or ``--json``), counted against
    ``limit``, their positions kept (``keeper``, :class:`.resume.Keeper`);
    ``caught``: the last position per session that catching up showed,
    which the stream then does not show again."""

    out: TextIO
    console: Console
    timeline: Timeline
    as_json: bool
    keeper: Any
    limit: int | None
    stopper: _Stopper = field(default_factory=_Stopper)
    printed: int = 0
    caught: dict[str, tuple[int, int]] = field(default_factory=dict)

    def full(self) -> bool:
        return self.limit is not None and self.printed >= self.limit

    def show(self, item: dict[str, Any], *, catching_up: bool = False) -> None:
        with self.stopper:  # a signal waits until the event is shown and noted
            self._show(item, catching_up)

    def _show(self, item: dict[str, Any], catching_up: bool) -> None:
        import time
        pos = _position(item)
        if pos is not None:
            session = item["session"]
            if catching_up:
                self.caught[session] = max(pos, self.caught.get(session, pos))
            elif pos <= self.caught.get(session, (-1, -1)):
                return  # shown while catching up
        if self.as_json:
            line = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
            self.out.write(line.translate(_tables()[1]) + "\n")  # the same JSON, escaped
            self.out.flush()
        else:
            if (day := self.timeline.date_line(item)) is not None:
                self.console.print(day, no_wrap=True)
            self.console.print(self.timeline.line(item), no_wrap=True, overflow="ellipsis")
            self.out.flush()
        self.printed += 1
        if self.keeper is not None:
            self.keeper.shown(item)
            self.keeper.save(now=time.monotonic())


def _catch_up(screen: _Screen, catch_up: Callable[..., tuple[list[str], Any]], url: str, *,
              token: str | None, flt: dict[str, Any], known: set[str], since: float,
              err: TextIO) -> None:
    """Show the sessions not in the saved position (``known``) with events
    since it was saved (``since``, Unix seconds) from their start
    (:func:`.missed.catch_up`), before what the stream brings."""
    sessions, held = catch_up(url, token=token, flt=flt, known=known, since=since,
                              settled=screen.timeline.settled)
    if not sessions:
        return
    print(_safe(f"aep-bridges tail: {len(sessions)} session(s) not in the saved position have "
                "events since it was saved: shown from their start"), file=err, flush=True)
    for ev in held:
        if screen.full():
            return
        screen.show(ev, catching_up=True)


def run(url: str, *, token: str | None = None, flt: dict[str, Any] | None = None,
        from_: str | list[dict[str, Any]] | None = None, as_json: bool = False,
        limit: int | None = None, color: str = "auto", out: TextIO | None = None,
        err: TextIO | None = None, resume_file: Any = None,
        subscribe: Callable[..., Any] | None = None,
        settled: Callable[..., dict[AskKey, str]] | None = None,
        catch_up: Callable[..., tuple[list[str], Any]] | None = None) -> int:
    """Follow ``url``'s ``/stream`` until interrupted (SIGINT, SIGTERM or
    SIGHUP: exit 0), ``limit`` events were printed (exit 0), or the
    endpoint refuses us (401/403/4xx: the reason on stderr, exit 1) or is
    no AEP event stream (exit 1).
    Transport errors are shown and retried with backoff; an event that is
    not AEP is skipped, its kind named once on stderr, the count on exit.
    On stderr: ``connected to URL (N sessions)`` at each connect, and each
    retry with its reason. ``resume_file`` (:func:`.resume.position_file`):
    when ``from_`` is not given and a position is saved there, start from
    it and, once connected, first show the sessions it does not name that
    have events since it was saved (``catch_up``, default
    :func:`.missed.catch_up`); keep the position there (at most once a
    second, and at the end, however it ends). ``settled`` (default
    :func:`.tailstream.settled` with the default ``subscribe``): the asks
    a replay already settles, looked up before subscribing."""
    import time

    from .resume import Keeper, load_saved
    from .tailstream import Signals
    from .tailstream import settled as _settled
    from .tailstream import subscribe as _subscribe

    out = out or sys.stdout
    err = err or sys.stderr
    if subscribe is None:
        from .missed import catch_up as _catch_up_default
        subscribe, settled = _subscribe, settled or _settled
        catch_up = catch_up or _catch_up_default
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    console = _console(color, out)
    keeper = Keeper(resume_file, url, err) if resume_file is not None else None
    screen = _Screen(out, console, Timeline(full_types=not console.is_terminal), as_json,
                     keeper, limit)
    saved = load_saved(resume_file) if keeper is not None and from_ is None else None
    if saved is not None:  # resume, and catch up at the first connect
        from_ = saved.positions or None
        for p in saved.positions:
            keeper.shown(p)  # type: ignore[union-attr]
        print(_safe(f"aep-bridges tail: resuming {len(saved.positions)} session(s) from the "
                    f"position saved in {resume_file}, and any begun since "
                    "(--no-resume: start live)"), file=err)
    if (from_ is not None or saved is not None) and not as_json and settled is not None:
        # a replay comes first (catching up replays any session held)
        screen.timeline.settled = settled(url, token=token,
                                          from_="all" if saved is not None else from_)
    sub = subscribe(url, lambda ev: events.put(("event", ev)), filter=flt or {}, token=token,
                    from_=from_, on_error=lambda e: events.put(("error", e)),
                    on_comment=lambda c: events.put(("comment", c)),
                    backoff_initial_ms=250, backoff_max_ms=5000, timeout_ms=60_000)
    signals = Signals(url, token, err)
    screen.stopper.install()
    try:
        while not screen.full():
            try:
                kind, item = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "event":
                screen.show(item)
            elif (code := signals.take(kind, item)) is not None:
                return code
            elif signals.connected and saved is not None and catch_up is not None:
                # the stream is registered: what it does not bring, catching up does
                since, saved = saved.saved_at, None
                _catch_up(screen, catch_up, url, token=token, flt=flt or {},
                          known={p["session"] for p in from_ or ()
                                 if isinstance(p, dict)}, since=since, err=err)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        screen.stopper.restore()
        sub.close()
        signals.close()
        if keeper is not None:
            keeper.save(now=time.monotonic(), force=True)
    return 0
