"""The hook family (issue 27): what every hook vendor's bridge shares, and
the command shim (:mod:`.shim`) a vendor runs for each hook.

:mod:`.profile` (everything vendor-specific: a :class:`~.profile.HookProfile`),
:mod:`.config` (the ``AEP_<VENDOR>_*`` settings generated from a profile),
:mod:`.mapping` (pure emission builders) and :mod:`.handlers` (the shared
event handlers, :data:`~.handlers.CORE`, and :func:`~.handlers.dispatch`),
:mod:`.forms` (AEP-0006 forms), :mod:`.bounds` (what one moment may put
into events: nesting, size, ``metadata`` strings), :mod:`.answers` (an answer -> a decision),
:mod:`.session` (per-session state, no I/O), :mod:`.hub` (a moment's path:
dedupe, pairing, holds), :mod:`.runs` (the runs, kept across a restart),
:mod:`.endpoint` (``POST /hooks/<agent>``),
:mod:`.spool` (ingesting what the shim spooled), :mod:`.control` (the
controller) and :mod:`.bridge` (the :class:`~.bridge.HookBridge`). A vendor
package imports the modules listed here, never another vendor.

Import-free on purpose: the shim is started once per hook on the agent's
critical path, and importing this package must cost nothing."""

__all__ = ["answers", "bounds", "bridge", "config", "control", "endpoint", "forms", "handlers", "hub",
           "mapping", "profile", "runs", "session", "shim", "spool"]
