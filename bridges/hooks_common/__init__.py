"""The hook family (issue 27): what the Claude Code and Codex hook bridges
share, and the command shim (``shim.py``) a vendor runs for each hook.

Import-free on purpose: the shim is started once per hook on the agent's
critical path, and importing this package must cost nothing. The profile
packages (:mod:`bridges.claude_code`, :mod:`bridges.codex_hooks`) import
the modules listed here; this ``__init__`` imports none of them."""

__all__ = ["answers", "bridge", "config", "control", "endpoint", "forms", "hub", "mapping",
           "profile", "session", "shim", "spool"]
