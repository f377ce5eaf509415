"""Vendor profiles for the one SSE bridge implementation.

OpenCode and its fork Kilo Code serve the same server surface (a REST API
plus server-sent events); everything vendor-specific the shared code needs is
a field of :class:`SseProfile`, so no module outside ``bridges/opencode_sse``
and ``bridges/kilocode_sse`` (each only a profile) branches on the vendor.
Design: ``shared/aep/docs/adapter-opencode-design.md`` ("Fork portability").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

#: The server routes the bridge uses, identical on both vendors at the
#: verified versions (opencode 1.18.33, kilo 7.7.7: ``GET /doc``).
DEFAULT_ROUTES: Mapping[str, str] = {
    # the event streams: ``global`` carries every directory's instance,
    # each event wrapped as {directory, project, payload}; ``instance`` is
    # scoped to one directory (not used for observation, see receiver.py)
    "global_events": "/global/event",
    "instance_events": "/event",
    "health": "/global/health",
    # REST reads (reconcile, degraded detection)
    "sessions": "/session",
    "status": "/session/status",
    "permissions": "/permission",
    "questions": "/question",
    "messages": "/session/{session}/message",
    # the gated writes (control.py is their only user)
    "permission_reply": "/permission/{request}/reply",
    "permission_reply_legacy": "/session/{session}/permissions/{request}",
    "question_reply": "/question/{request}/reply",
    "abort": "/session/{session}/abort",
}


@dataclass(frozen=True)
class SseProfile:
    """One vendor's identity on the shared implementation.

    ``name``: the bridge's config/health key (``opencode_sse``); ``agent``:
    the AEP agent id, the ``x.{agent}.*`` namespace and
    ``session.started.data.client.name`` (``opencode``); ``env``: the
    operator-interface prefix (``AEP_OPENCODE`` -> ``AEP_OPENCODE_URL``,
    ``AEP_OPENCODE_SSE_PRIMARY``...); ``default_url`` / ``default_user``:
    the vendor's own defaults (``serve`` port 4096, basic-auth user
    ``opencode`` / ``kilo``); ``routes``: :data:`DEFAULT_ROUTES` overrides;
    ``pins``: the mapping fixture it answers to (``mappings/opencode.json``)."""

    name: str
    agent: str
    env: str
    default_url: str
    default_user: str
    pins: str
    routes: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ROUTES))

    @property
    def serve_command(self) -> str:
        """The vendor's server command as an operator types it, for hints:
        its binary has the name of its basic-auth user (``opencode serve``,
        ``kilo serve``)."""
        return f"{self.default_user} serve"

    def route(self, key: str, **params: str) -> str:
        """A route path with ``{session}``/``{request}`` filled in (the ids
        are URL-quoted: they come from the vendor and the command)."""
        from urllib.parse import quote
        path = self.routes[key]
        return path.format(**{k: quote(str(v), safe="") for k, v in params.items()})
