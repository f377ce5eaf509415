"""The embedded AEP relay (AEP-0003 bindings, AEP-0004 §4 command routing)
in the reference relay's frozen ceiling: ingest, attr-match fan-out, bounded
replay, token auth; plus the roster frame (AEP-0003 §4.1).

- :mod:`.attrmatch`: the filter dialect (pure).
- :mod:`.envelope`: relay-grade envelope validation (pure).
- :mod:`.buffer`: per-session replay buffers (pure).
- :mod:`.core`: :class:`Relay`, connections, outlets, routing.
- :mod:`.app`: the ASGI app (:func:`make_app`).
- :mod:`.serve`: hypercorn serving with orderly shutdown (:func:`serve_relay`).
"""
from .core import CommandRefused, LocalEmitter, Relay, RelayClosed  # noqa: F401
from .envelope import InvalidEvent  # noqa: F401

__all__ = ["Relay", "LocalEmitter", "CommandRefused", "RelayClosed", "InvalidEvent"]
