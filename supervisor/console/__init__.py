"""The console (issue 28): a single-page browser console over the relay's
own bindings, served by the daemon's listener (and ``aep-bridges relay``)
at ``/``. :func:`console_app` wraps the relay's ASGI app; the page itself
is ``static/`` (plain JavaScript, no build step, no network but this origin)."""
from __future__ import annotations

from .app import BEARER_PREFIX, CSP, SUBPROTOCOL, console_app, static_files

__all__ = ["BEARER_PREFIX", "CSP", "SUBPROTOCOL", "console_app", "static_files"]
