"""Pure building blocks the hook vendors' mappers share (AEP-0002 Annex A).

Each returns emissions in the pins' shape (``{type, data, subject?}``,
plus ``gating`` hints for the stamper's capture gate). Content rides in the
fields the type's table grades (``args`` full, ``prompt`` redacted...): the
stamper's gate drops or redacts it to the ceiling and computes the
``*_digest`` fields from the original. ``transcript_path`` is never read.
Every vendor string a mapper puts in a ``metadata`` field (or the
subject) goes through :func:`~.bounds.meta`: the run's redaction and
:data:`~.bounds.META_MAX` characters. No I/O, no clock, never raises for a
JSON-shaped moment.
"""
from __future__ import annotations

from typing import Any

from bridges.core.bridge import Emission
from bridges.core.naming import fallback_type
from bridges.core.posture import Posture

from .bounds import meta

__all__ = ["ALLOW_DENY", "PROMPT_ARG_MAX", "elapsed_ms", "fallback", "moment_ms", "obj",
           "permission_ask", "permission_prompt", "s", "spooled_ms", "tool_emission", "tool_ref"]

ALLOW_DENY = ({"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"})
"""A permission ask's two options; their labels are structural."""

PROMPT_ARG_MAX = 200


def obj(v: object) -> dict[str, Any]:
    """``v`` when it is a JSON object, else ``{}``."""
    return v if isinstance(v, dict) else {}


def s(v: object) -> str | None:
    """``v`` when it is a non-empty string, else ``None``."""
    return v if isinstance(v, str) and v else None


def moment_ms(received_ms: int, spooled_at_ms: object = None) -> int:
    """When a moment happened, Unix ms: a spooled moment's ``spooled_at_ms``
    (contract §3: the shim's clock when the daemon could not take it) when
    it is a positive integer, never later than ``received_ms`` (a shim
    clock ahead of ours must not put an event in the future); a live
    moment (or a nonsense spool time): ``received_ms``, when it arrived.
    Every event of the moment carries it as ``time``, and the run, tool and
    ask durations are differences of these (issue 27)."""
    if isinstance(spooled_at_ms, int) and not isinstance(spooled_at_ms, bool) \
            and spooled_at_ms > 0:
        return min(spooled_at_ms, received_ms)
    return received_ms


def spooled_ms(header: str | None) -> int | None:
    """The ``X-AEP-Hook-Spooled`` header's Unix ms (contract §1), ``None``
    when absent or not a decimal integer (the moment is still spooled:
    :func:`moment_ms` then takes its arrival time)."""
    if header is None:
        return None
    h = header.strip()
    return int(h) if h.isascii() and h.isdigit() and len(h) <= 18 else None


def elapsed_ms(t0_ms: int, t1_ms: int) -> int:
    """``t1_ms - t0_ms``, never negative (a spooled moment ingested after a
    later live one, a wall clock stepped back)."""
    return max(0, t1_ms - t0_ms)


def fallback(posture: Posture, event: str, data: dict[str, Any] | None = None,
             **extra: Any) -> Emission:
    """``x.{agent}.session.{snake(event)}`` (AEP-0001 §6, the fallback the
    Claude Code and Codex pins name): a moment with no core equivalent."""
    em: Emission = {"type": fallback_type(posture.agent, "session", event or "unknown"),
                    "data": dict(data or {})}
    em.update(extra)  # type: ignore[typeddict-item]
    return em


def tool_ref(moment: dict[str, Any], posture: Posture) -> dict[str, Any]:
    """``{name, call_id?}`` from ``tool_name`` / ``tool_use_id`` (each
    through :func:`~.bounds.meta`)."""
    ref: dict[str, Any] = {"name": meta(posture, moment.get("tool_name")) or "unknown"}
    call = meta(posture, moment.get("tool_use_id"))
    if call:
        ref["call_id"] = call
    return ref


def tool_emission(type_: str, moment: dict[str, Any], posture: Posture,
                  **data: Any) -> Emission:
    """A ``tool.*`` emission with ``tool`` and ``subject`` = the tool name."""
    ref = tool_ref(moment, posture)
    return {"type": type_, "data": {"tool": ref, **data}, "subject": ref["name"]}


def permission_prompt(tool: str, tool_input: object) -> str:
    """``Permission requested: shell — rm -rf build (clean build dir)``
    (mappings/codex.json): the tool, then its command (or file path, URL,
    pattern) and description when the input has them. Content: gated
    ``[metadata*]`` by the stamper (a structural synthesis at metadata)."""
    inp = obj(tool_input)
    what = next((str(inp[k]) for k in ("command", "file_path", "path", "url", "pattern", "query")
                 if s(inp.get(k))), "")
    text = f"Permission requested: {tool}"
    if what:
        text += f" \u2014 {what[:PROMPT_ARG_MAX]}"
    desc = s(inp.get("description"))
    if desc:
        text += f" ({desc[:PROMPT_ARG_MAX]})"
    return text


def permission_ask(posture: Posture, moment: dict[str, Any]) -> Emission:
    """``attention.requested`` ``kind: permission`` for a tool moment, with
    the allow/deny options and ``respond_via`` (``control`` when the ask is
    answerable here, else ``oob``: answered in the agent's own UI)."""
    tool = s(moment.get("tool_name")) or "unknown"
    name = meta(posture, tool) or "unknown"
    return {"type": "attention.requested",
            "data": {"kind": "permission",
                     "prompt": permission_prompt(tool, moment.get("tool_input")),
                     "options": [dict(o) for o in ALLOW_DENY],
                     "respond_via": ["control" if posture.answerable else "oob"]},
            "subject": name,
            "gating": {"structural": ("options[].label",)}}
