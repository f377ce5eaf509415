"""The AG-UI bridge's configuration (the one config shape, issue 7;
``ARCHITECTURE.md`` "Configuration"): :class:`AguiConfig`, a frozen typed
dataclass; :func:`from_env` ``(env) -> (config, problems)``, never raising
(a bad value is one problem line and keeps its default); :data:`SETTINGS`,
the metadata the README knob table and the supervisor's known-settings list
are generated from.

Names: ``shared/aep/docs/bridge-agui-design.md`` (``AEP_AGUI_UPSTREAM``,
``AEP_AGUI_DELTAS``, ``AEP_AGENT_NAME``) and issue 12 (``AEP_AGUI_LISTEN``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import httpx

from bridges.core.limits import BURST_S
from bridges.core.settings import EnvReader, Setting, check_fields, parse_hostport, url_problem

from .sse import DEFAULT_MAX_BUFFERED, DEFAULT_MAX_EVENT
from .target import Upstream

DEFAULT_LISTEN = "127.0.0.1:8790"
DEFAULT_AGENT = "agui"
NEW_SESSIONS_PER_S = 20
"""New sessions (each a ``threadId``) a second the tee maps, by default (bursts of
:data:`bridges.core.limits.BURST_S` seconds of it; issue 25, fifth outside attack)."""

SETTINGS: tuple[Setting, ...] = (
    Setting("AEP_AGUI_UPSTREAM", "unset (required when enabled)",
            "the real AG-UI agent server's base URL (`http://127.0.0.1:8000`); the proxy "
            "appends each request's path and query to it, below its path; its scheme, host, "
            "port and `user:password@` (sent as `Authorization: Basic` to it only, never "
            "logged) are fixed"),
    Setting("AEP_AGUI_LISTEN", f"`{DEFAULT_LISTEN}`",
            "where the proxy listens: point the AG-UI frontend here instead of at the agent"),
    Setting("AEP_AGUI_DELTAS", "`0`",
            "`1`: also map token and argument deltas (`x.agui.text_message.content`...) at "
            "`debug`"),
    Setting("AEP_AGUI_MAX_EVENT", f"`{DEFAULT_MAX_EVENT}`",
            "bytes of one SSE event the tee parses; a bigger one still passes through to the UI "
            "untouched, counted `agui.oversize`"),
    Setting("AEP_AGUI_MAX_BUFFERED", f"`{DEFAULT_MAX_BUFFERED}`",
            "bytes of unfinished SSE events the tee holds across all streams; an event that "
            "would go past it still passes through to the UI untouched, unparsed, counted "
            "`agui.over_budget`"),
    Setting("AEP_AGUI_NEW_SESSIONS_PER_S", f"`{NEW_SESSIONS_PER_S}`",
            f"new sessions (`threadId`s, each a session log file) a second the tee maps, in "
            f"bursts of {BURST_S} seconds of it; past it a new session's stream still passes "
            "through to the UI untouched but is not mapped or logged, counted "
            "`sessions_refused`; known sessions always pass"),
    Setting("AEP_AGENT_NAME", f"`{DEFAULT_AGENT}`",
            "the AEP agent id the AG-UI bridge emits as (a proxy cannot know the agent's name)"),
)
"""This bridge's knobs, in README order (its enable flag ``AEP_BRIDGE_AGUI``
is the fleet's: ``supervisor/config.py`` ``FLEET``)."""


@dataclass(frozen=True)
class AguiConfig:
    """``upstream``: base URL without trailing slash (``""`` when unset);
    ``listen``: ``(host, port)``; ``deltas``: the delta opt-in;
    ``max_event``: the SSE parse cap in bytes; ``max_buffered``: the bytes
    of unfinished events held across streams; ``new_sessions_per_s``: the
    new-session budget; ``agent``: the AEP agent id.
    Raises ``TypeError`` for a field of the wrong type."""

    upstream: str = ""
    listen: tuple[str, int] = ("127.0.0.1", 8790)
    deltas: bool = False
    max_event: int = DEFAULT_MAX_EVENT
    max_buffered: int = DEFAULT_MAX_BUFFERED
    new_sessions_per_s: int = NEW_SESSIONS_PER_S
    agent: str = DEFAULT_AGENT

    def __post_init__(self) -> None:
        check_fields(self)


def from_env(env: Mapping[str, str]) -> tuple[AguiConfig, list[str]]:
    """The config and one problem line per bad setting (empty: usable).
    ``AEP_AGUI_UPSTREAM`` is required: the proxy has nothing to forward to
    without it."""
    r = EnvReader(env)
    upstream = (r.text("AEP_AGUI_UPSTREAM") or "").strip().rstrip("/")
    if not upstream:
        r.problems.append("AEP_AGUI_UPSTREAM: not set; the AG-UI bridge needs the agent server's "
                          "base URL (e.g. http://127.0.0.1:8000)")
    elif (p := url_problem("AEP_AGUI_UPSTREAM", upstream,
                           hint=" (the AG-UI agent server's base URL)")) is not None:
        r.problems.append(p)
    else:
        try:
            Upstream.parse(upstream)
        except (httpx.InvalidURL, ValueError):  # what the proxy could never send to
            r.problems.append("AEP_AGUI_UPSTREAM: not a URL the proxy can send requests to")
    listen = r.hostport("AEP_AGUI_LISTEN", DEFAULT_LISTEN) or parse_hostport(DEFAULT_LISTEN)
    deltas = r.flag("AEP_AGUI_DELTAS")
    max_event = r.integer("AEP_AGUI_MAX_EVENT", DEFAULT_MAX_EVENT, minimum=1024,
                          maximum=1 << 30, unit="bytes")
    max_buffered = r.integer("AEP_AGUI_MAX_BUFFERED", DEFAULT_MAX_BUFFERED, minimum=1024,
                             maximum=1 << 40, unit="bytes")
    rate = r.integer("AEP_AGUI_NEW_SESSIONS_PER_S", NEW_SESSIONS_PER_S, minimum=1,
                     maximum=100_000)
    agent = (r.text("AEP_AGENT_NAME") or DEFAULT_AGENT).strip() or DEFAULT_AGENT
    return AguiConfig(upstream=upstream, listen=listen, deltas=deltas, max_event=max_event,
                      max_buffered=max_buffered, new_sessions_per_s=rate, agent=agent), r.problems
