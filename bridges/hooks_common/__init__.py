"""The hook family: vendors that run a command (or POST to a URL) at each
lifecycle moment and, for some moments, wait for a decision (Claude Code,
Codex; then Qwen Code, Gemini CLI, Kimi Code, VS Code, Cline, Hermes, pi,
Antigravity). Contract: ``/work/hooks-contract.md`` (issue 27).

This package file imports nothing on purpose: the command shim
(``bridges.hooks_common.shim``, stdlib only) is started once per hook on the
agent's critical path, and importing it must not pull the bridge in.
Modules: :mod:`.profile` (what a vendor package declares),
:mod:`.mapping` / :mod:`.forms` / :mod:`.answers` (pure), :mod:`.config`,
:mod:`.session` (per-session state, no I/O), :mod:`.hub` (the endpoint,
the held gate, steering delivery, dedupe), :mod:`.spool` (ingestion),
:mod:`.control` (the gated controller), :mod:`.bridge`.
"""
