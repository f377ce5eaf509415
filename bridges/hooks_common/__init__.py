"""The hook family (issue 27): what the Claude Code and Codex hook bridges
share, and the command shim (``shim.py``) a vendor runs for each hook.

Import-free on purpose: the shim is started once per hook on the agent's
critical path, and importing this package must cost nothing."""
