"""Shared machinery every bridge (and the supervisor) uses from below:
the protocol vocabulary (:mod:`.aep`), envelope stamping, capture gating
and redaction, vendor fallback naming, the mappers' one posture
(:mod:`.posture`) and their tolerant JSON readers (:mod:`.readers`), the command ledger and control shape, settings, the
HTTP machinery (:mod:`.asgi`, :mod:`.http`), the bounds on what a peer
may cost (:mod:`.limits`: the new-session bucket, rate-limited log lines;
:mod:`.pacing`: a loop over untrusted input yielding by work done;
:mod:`.rest`: a vendor's REST answer read within bounds), the hook
shim's signed requests (:mod:`.signed`).

The layers point one way: ``bridges.core`` -> the bridges -> ``supervisor``
(``tests/unit/test_layers.py``). Nothing here performs I/O except
:mod:`.paths` (atomic state-file writes, used by the epoch store and the
bridges' state), :mod:`.statefile` (the bridges' journaled state document),
:mod:`.http` (serving sockets it is handed) and :mod:`.rest` (reading an
answer on a client it is handed)."""

__all__ = [
    "aep", "asgi", "backoff", "bridge", "captable", "cappolicy", "capture", "capwalk", "control", "envelope", "errors",
    "http", "ledger", "limits", "naming", "pacing", "paths", "posture", "readers", "redaction", "rest", "settings",
    "signed", "statefile",
]
