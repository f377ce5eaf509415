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

``--json`` prints each event as one compact JSON line instead (for ``jq``).

The pure parts (:func:`gist`, :func:`parse_filter`, :class:`Timeline`) take
events as dicts and return text; :func:`run` owns the subscription thread
(the SDK consumer is thread-based) and the terminal (``rich``)."""
from __future__ import annotations

import json
import os
import queue
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cache
from typing import Any, Callable, Mapping, TextIO

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.text import Text

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

# vendor (x.*) payload keys worth a glance, in the order shown
_TELLING = ("tool_name", "tool", "decision", "success", "status", "outcome", "model", "kind",
            "event.kind", "name", "state", "reason", "startup.phase", "startup.status",
            "http.response.status_code", "endpoint", "duration_ms")
#: payload keys a one-line gist leaves out: the vendor's bookkeeping
_QUIET = frozenset({"vendor_ts", "vendor_event_id"})
#: the token counts a gist reads (the OTel GenAI names, Codex's own), and their word
_TOKENS = {"gen_ai.usage.input_tokens": "in", "input_token_count": "in",
           "gen_ai.usage.output_tokens": "out", "output_token_count": "out"}


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """The local relay: ``http://`` + ``AEP_LISTEN`` (default ``127.0.0.1:8787``);
    a wildcard listener is reached on loopback."""
    env = os.environ if environ is None else environ
    listen = (env.get("AEP_LISTEN") or DEFAULT_LISTEN).strip()
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


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


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _invisible() -> dict[int, str]:
    """The code points a timeline shows as escapes: C0/C1 controls and DEL
    (ESC starts a terminal command), every format character (Unicode
    category Cf: the bidi controls that make text read reordered, the
    zero-width ones that make two names look alike, the tag characters)
    and the surrogates (a lone one cannot be written as UTF-8)."""
    import unicodedata
    table = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
    # planes 0, 1 and 14 hold every format character Unicode has assigned
    for c in (*range(0xA0, 0x20000), *range(0xE0000, 0xE1000)):
        if 0xD800 <= c <= 0xDFFF or unicodedata.category(chr(c)) == "Cf":
            table[c] = f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"
    # ... and the characters str.split() breaks lines or words at: one space each
    table.update({ord(c): " " for c in "\t\n\v\f\r\x1c\x1d\x1e\x1f\x85\u2028\u2029"})
    return table


def _json_escape(c: int) -> str:
    """``c`` as a JSON string escape: ``\\uXXXX``, a surrogate pair above
    U+FFFF (RFC 8259 §7)."""
    if c < 0x10000:
        return f"\\u{c:04x}"
    c -= 0x10000
    return f"\\u{0xD800 + (c >> 10):04x}\\u{0xDC00 + (c & 0x3FF):04x}"


@cache
def _tables() -> tuple[dict[int, str], dict[int, str]]:
    """The translate tables, made at first use, not at import: every
    ``aep-bridges`` command imports this module for its ``tail`` options,
    and the Unicode scan costs ~30 ms. The timeline's
    (:func:`_invisible`), and the same for ``--json`` lines as JSON escapes
    (what json.dumps leaves raw)."""
    unsafe = _invisible()
    return unsafe, {c: _json_escape(c) for c in unsafe if c >= 0x7F}


def _safe(text: str) -> str:
    """``text`` fit for one terminal line: each line break, tab or other
    whitespace control a space, every other control, format character or
    surrogate shown as its escape (``\\x1b``, ``\\u202e``, ``\\u200b``), so an
    event's content can neither start a terminal command, forge a line of
    the timeline, reorder or hide text, nor stop the output (:func:`_s`
    also makes whitespace runs one space)."""
    return text.translate(_tables()[0])


def _s(v: Any, limit: int = 60) -> str:
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    text = _safe(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tool_name(data: Mapping[str, Any]) -> str:
    tool = data.get("tool")
    if isinstance(tool, dict):
        return str(tool.get("name") or "?")
    return str(tool or "?")


def _ms(data: Mapping[str, Any]) -> str:
    d = data.get("duration_ms")
    return f" ({d} ms)" if isinstance(d, (int, float)) else ""


def _options(data: Mapping[str, Any]) -> str:
    opts = data.get("options")
    if not isinstance(opts, list) or not opts:
        fields = data.get("fields")
        if isinstance(fields, list) and fields:
            names = [str(f.get("label") or f.get("id")) for f in fields if isinstance(f, dict)]
            return "  {" + ", ".join(names) + "}"
        return ""
    ids = [str(o.get("id") or o.get("label")) for o in opts if isinstance(o, dict)]
    return "  [" + "|".join(ids) + "]"


def _vendor_gist(data: Mapping[str, Any]) -> str:
    """``k=v`` bits of a payload no family gist reads (vendor types and the
    rest): the telling keys in their order, or, when it has none, its
    other keys in the payload's order; token counts as ``tokens <in> in /
    <out> out``; a nested object or list as ``k{n}`` / ``k[n]`` (its
    size). The vendor's own bookkeeping (:data:`_QUIET`) is left out: it
    is in ``--json``. At most four bits, keys and values shortened and made
    :func:`_safe`; ``""`` for an empty payload."""
    bits: list[str] = []
    keys = [k for k in _TELLING if data.get(k) is not None]
    if not keys:
        keys = [k for k in data if k not in _QUIET and k not in _TOKENS]
    for k in keys:
        if len(bits) == 4:
            break
        v = data[k]
        if v is None:
            continue
        name = _s(k, 30)
        if k == "tool" and isinstance(v, dict) and isinstance(v.get("name"), str):
            bits.append(f"tool={_s(v['name'], 30)}")
        elif isinstance(v, dict):
            bits.append(f"{name}{{{len(v)}}}")
        elif isinstance(v, list):
            bits.append(f"{name}[{len(v)}]")
        else:
            bits.append(f"{name}={_s(v, 30)}")
    tokens = _tokens(data)
    if tokens and len(bits) < 4:
        bits.append(tokens)
    return " ".join(bits)


def _tokens(data: Mapping[str, Any]) -> str:
    """``tokens <in> in / <out> out`` from the counts a payload holds under
    :data:`_TOKENS`' names (the first name present per word); ``""`` for none."""
    counts: dict[str, str] = {}
    for k, w in _TOKENS.items():
        if w not in counts and data.get(k) is not None:
            counts[w] = _s(data[k], 12)
    return "tokens " + " / ".join(f"{n} {w}" for w, n in counts.items()) if counts else ""


def _tool_gist(type_: str, data: Mapping[str, Any]) -> str | None:
    name = _tool_name(data)
    if type_ == "tool.requested":
        return f"{name} requested"
    if type_ == "tool.completed":
        return f"{name} ✓ {data.get('status') or 'completed'}{_ms(data)}"
    if type_ == "tool.failed":
        err = data.get("error")
        msg = err.get("message") or err.get("type") if isinstance(err, dict) else err
        return f"{name} ✗ failed{': ' + _s(msg) if msg else ''}{_ms(data)}"
    if type_ == "tool.denied":
        return f"{name} ⊘ denied" + (f" by {data['by']}" if data.get("by") else "")
    return None


def _run_gist(type_: str, data: Mapping[str, Any]) -> str | None:
    if type_ == "run.started":
        return "started" + (f" ({data['trigger']})" if data.get("trigger") else "")
    if type_ == "run.finished":
        tokens = _tokens(data)
        return "finished ok" + _ms(data) + (f"  {tokens}" if tokens else "")
    if type_ == "run.failed":
        return f"failed: {data.get('reason') or '?'}{_ms(data)}"
    if type_ == "run.cancelled":
        return "cancelled" + (f" by {data['by']}" if data.get("by") else "")
    return None


def _attention_gist(type_: str, data: Mapping[str, Any]) -> str | None:
    if type_ == "attention.requested":
        return f"{data.get('kind') or 'ask'}: {_s(data.get('prompt') or '')}{_options(data)}"
    if type_ == "attention.answered":
        ans = data.get("answer")
        ans = (ans.get("option") or ans.get("text") or ans.get("values")) if isinstance(ans, dict) else ans
        return f"answered {_s(ans, 40)}" + (f" via {data['via']}" if data.get("via") else "")
    if type_ == "attention.resolved":
        return f"resolved: {data.get('resolution') or '?'}"
    if type_ == "attention.timeout":
        return "timed out"
    return None


def _session_gist(type_: str, data: Mapping[str, Any]) -> str | None:
    if type_ == "session.started":
        client = _obj(data.get("client"))
        bits = [str(client.get("name") or ""), str(data.get("gen_ai.request.model") or ""),
                str(data.get("label") or "")]
        return "started " + " ".join(b for b in bits if b)
    if type_ == "session.ended":
        return f"ended {data.get('reason') or ''}".rstrip()
    return None


def gist(ev: Mapping[str, Any]) -> str:
    """The one-line summary of an event (pure; never raises on odd payloads):
    what :func:`_gist` finds in the payload, else the event's ``subject``,
    else ``(no data)`` for an event without a payload."""
    text = _gist(ev)
    subject = ev.get("subject")
    if not text and isinstance(subject, str):
        return _s(subject)
    if not text and not ev.get("data"):
        # a vendor moment mapped with no payload (the fallback's empty data,
        # e.g. x.opencode.session.updated): say so, not a blank that reads as a bug
        return "(no data)"
    return _safe(text)


def _gist(ev: Mapping[str, Any]) -> str:
    type_ = str(ev.get("type") or "?")
    raw = ev.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    family = type_.split(".", 1)[0]
    try:
        out = {"tool": _tool_gist, "run": _run_gist, "attention": _attention_gist,
               "session": _session_gist}.get(family, lambda t, d: None)(type_, data)
        if out is not None:
            return out
        if type_.startswith("control."):
            if type_ == "control.rejected":
                return f"rejected: {data.get('reason') or '?'}"
            return f"{type_[8:]} → {ev.get('subject') or ''}".rstrip(" →")
        if type_ == "error.raised":
            err = _obj(data.get("error"))
            return _s(err.get("message") or err.get("type") or data.get("code") or "error")
        if type_ == "progress.status":
            return _s(data.get("message") or data.get("phase") or "")
        if type_.startswith("progress.task."):
            task = _obj(data.get("task"))
            return f"{type_[14:]}: {_s(task.get('title') or task.get('id') or '')}"
        return _vendor_gist(data)
    except Exception:  # noqa: BLE001 -- a summary must never take the timeline down
        return _s(data)


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
    ``.plain``); ``pending`` maps an open request's id to its event.
    :meth:`date_line` is the ``── 2026-12-01 ──`` line to show before an
    event from another day than the one before it (or, first, from another
    day than today, UTC), so a recorded event does not read as a clock bug
    and the columns stay aligned. ``full_types``: the type column is not cut
    (a pipe or a file, where the whole name is what a reader greps for)."""

    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    full_types: bool = False
    day: str | None = None

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
        if type_ == "attention.requested" and isinstance(ev.get("id"), str):
            self.pending[ev["id"]] = dict(ev)
            t.append(summary, "bold black on yellow")
            t.append("  PENDING", "bold yellow")
        elif type_ in ("attention.resolved", "attention.timeout") and str(ev.get("subject")) in self.pending:
            asked = self.pending.pop(str(ev.get("subject")))
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


def _sessions(url: str, token: str | None) -> int | None:
    """How many sessions the endpoint holds, when it tells (an aep-bridges
    relay's authorized ``/healthz``); ``None`` otherwise. Never raises."""
    import httpx
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        body = httpx.get(url.rstrip("/") + "/healthz", headers=headers, timeout=2,
                         trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return None
    counts = body.get("relay_counts", body) if isinstance(body, dict) else {}
    n = counts.get("sessions") if isinstance(counts, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


@dataclass
class _Resume:
    """Where the positions are saved (:mod:`.resume`), and when last. The
    positions are those of the events *shown* (the SDK's own run ahead of
    the screen: it has read what ``--limit`` never prints), newest last."""

    path: Any
    url: str
    err: TextIO
    positions: dict[str, dict[str, Any]] = field(default_factory=dict)
    saved_at: float = 0.0
    failed: bool = False

    def shown(self, ev: Mapping[str, Any]) -> None:
        session, seq = ev.get("session"), ev.get("seq")
        if isinstance(session, str) and isinstance(seq, int):
            self.positions.pop(session, None)
            self.positions[session] = {"session": session, "epoch": ev.get("epoch", 0), "seq": seq}

    def save(self, *, now: float, force: bool = False) -> None:
        if self.failed or (not force and now - self.saved_at < 1.0):
            return
        from .resume import save
        self.saved_at = now
        try:
            save(self.path, self.url, list(self.positions.values()))
        except OSError as e:
            self.failed = True  # said once; the tail goes on
            print(_safe(f"aep-bridges tail: cannot save the resume position in {self.path}: "
                        f"{e.strerror or e} (--no-resume to not try)"), file=self.err)


def run(url: str, *, token: str | None = None, flt: dict[str, Any] | None = None,
        from_: str | list[dict[str, Any]] | None = None, as_json: bool = False,
        limit: int | None = None, color: str = "auto", out: TextIO | None = None,
        err: TextIO | None = None, resume_file: Any = None,
        subscribe: Callable[..., Any] | None = None) -> int:
    """Follow ``url``'s ``/stream`` until interrupted (exit 0), ``limit``
    events were printed (exit 0), or the endpoint refuses us (401/403/4xx:
    the reason on stderr, exit 1). On stderr: ``connected to URL (N
    sessions)`` at each connect, and each retry with its reason (the SDK
    retries with backoff). ``resume_file`` (:func:`.resume.position_file`):
    start from the positions saved there when ``from_`` is not given, and
    keep them there (at most once a second, and at the end)."""
    import time

    import aep_sdk

    out = out or sys.stdout
    err = err or sys.stderr
    subscribe = subscribe or aep_sdk.subscribe
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    console = _console(color, out)
    timeline = Timeline(full_types=not console.is_terminal)
    keeper = _Resume(resume_file, url, err) if resume_file is not None else None
    if keeper is not None and from_ is None:
        from .resume import load
        if saved := load(resume_file):
            from_ = saved
            for p in saved:
                keeper.shown(p)
            print(_safe(f"aep-bridges tail: resuming {len(saved)} session(s) from the position "
                        f"saved in {resume_file} (--no-resume: start live)"), file=err)
    sub = subscribe(url, lambda ev: events.put(("event", ev)), filter=flt or {}, token=token,
                    from_=from_, on_error=lambda e: events.put(("error", e)),
                    on_comment=lambda c: events.put(("comment", c)),
                    backoff_initial_ms=250, backoff_max_ms=5000, timeout_ms=60_000)
    printed = 0
    attempts = 0
    connected = False
    try:
        while limit is None or printed < limit:
            try:
                kind, item = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "comment":
                if str(item).startswith("connected") and not connected:
                    connected, attempts = True, 0
                    n = _sessions(url, token)
                    held = f" ({n} session{'s' if n != 1 else ''})" if n is not None else ""
                    print(_safe(f"aep-bridges tail: connected to {url}{held}"), file=err, flush=True)
                continue
            if kind == "error":
                status = getattr(item, "status", None)
                # 400: the SDK falls back by itself (no `from=all` there, a
                # `from` too long), so only these end the tail
                if status in (401, 403, 404):
                    hint = {401: " (pass --token or set AEP_TOKEN)",
                            404: " (is this an AEP endpoint?)"}.get(status, "")
                    print(_safe(f"aep-bridges tail: {url} refused the stream: HTTP {status}"
                                f"{hint}"), file=err)
                    return 1
                # each retry is visible, with its reason (the endpoint's own
                # words, a status line, are its content: made safe)
                connected = False
                attempts += 1
                print(_safe(f"aep-bridges tail: {url}: {item} (retrying, attempt {attempts})"),
                      file=err, flush=True)
                continue
            if as_json:
                line = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
                out.write(line.translate(_tables()[1]) + "\n")  # the same JSON, escaped
                out.flush()
            else:
                if (day := timeline.date_line(item)) is not None:
                    console.print(day, no_wrap=True)
                console.print(timeline.line(item), no_wrap=True, overflow="ellipsis")
                out.flush()
            printed += 1
            if keeper is not None:
                keeper.shown(item)
                keeper.save(now=time.monotonic())
    except KeyboardInterrupt:
        pass
    finally:
        sub.close()
        if keeper is not None:
            keeper.save(now=time.monotonic(), force=True)
    return 0
