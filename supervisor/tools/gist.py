"""The one-line *gist* of an AEP event (:func:`gist`), as ``aep-bridges
tail`` and ``timeline`` print it: the tool name and status, the attention
prompt and options, the run outcome, a vendor event's telling attributes;
and the terminal-safe escaping every printed string goes through
(:func:`_safe`: no control, format or bidi character reaches the terminal;
``--json`` lines escape the same set). Pure: an event dict in, text out."""
from __future__ import annotations

import json
from functools import cache
from typing import Any, Mapping

__all__ = ["gist", "ask_key", "AskKey", "OUTCOMES"]

OUTCOMES = ("attention.answered", "attention.resolved", "attention.timeout")
"""The types that settle an ``attention.requested`` (its ``subject``, in its
own session, from its own emitter: :func:`ask_key`)."""

# vendor (x.*) payload keys worth a glance, in the order shown
_TELLING = ("tool_name", "tool", "decision", "success", "status", "outcome", "model", "kind",
            "event.kind", "name", "state", "reason", "startup.phase", "startup.status",
            "http.response.status_code", "endpoint", "duration_ms")
#: payload keys a one-line gist leaves out: the vendor's bookkeeping
_QUIET = frozenset({"vendor_ts", "vendor_event_id"})
#: the token counts a gist reads (the OTel GenAI names, Codex's own), and their word
_TOKENS = {"gen_ai.usage.input_tokens": "in", "input_token_count": "in",
           "gen_ai.usage.output_tokens": "out", "output_token_count": "out"}


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


AskKey = tuple[Any, Any, str]
"""An ask's identity: ``(source, session, id)`` of its ``attention.requested``."""


def ask_key(ev: Any) -> AskKey | None:
    """The ask an event is or settles, as ``(source, session, ask id)``: an
    ``attention.requested`` its own id, an outcome (:data:`OUTCOMES`) its
    ``subject``; ``None`` for any other event or one without that id.

    An outcome settles only the ask of its own session and emitter:
    session identity is emitter-scoped and per-session state is keyed by
    ``(source, session)`` (AEP-0001 §5.2), the emitter owns resolution and
    its lifecycle events carry the ask's id in ``subject`` (AEP-0002 §7).
    So an ``attention.resolved`` posted by anyone else, in a session of its
    own, with a fleet ask's id as ``subject``, settles nothing (issue 25)."""
    if not isinstance(ev, Mapping):
        return None
    type_ = ev.get("type")
    ref = ev.get("id") if type_ == "attention.requested" else \
        ev.get("subject") if type_ in OUTCOMES else None
    if not isinstance(ref, str):
        return None
    source, session = ev.get("source"), ev.get("session")
    # a hostile line's source or session may be any JSON value: only strings key an ask
    return (source if isinstance(source, str) else None,
            session if isinstance(session, str) else None, ref)
