"""The one implementation behind the OpenCode-family SSE bridges
(``bridges/opencode_sse``, ``bridges/kilocode_sse``: each only a
:class:`~.profile.SseProfile`): :mod:`.profile` (everything vendor-specific),
:mod:`.config` (the ``AEP_<VENDOR>_*`` settings generated from a profile),
:mod:`.frames` (one SSE payload -> a bus event, pure), :mod:`.mapping` (bus
event -> emissions, pure), :mod:`.tracker` (the per-session logic: runs,
pairing, pending attention, control notes, reconcile; pure) over
:mod:`.sessions` (the per-session state and what survives a restart), :mod:`.receiver` (the
stream, reconnects, reconcile: the I/O), :mod:`.control` (the
:class:`~.control.ControlGate` controller), :mod:`.state` (the state file,
re-exported from :mod:`bridges.core.statefile`) and :mod:`.bridge` (the
:class:`~.bridge.SseBridge` and its per-run handle). A profile package imports
the modules listed here; this ``__init__`` imports none of them.
"""

__all__ = ["bridge", "config", "control", "frames", "mapping", "profile", "receiver", "sessions",
           "state", "tracker"]
