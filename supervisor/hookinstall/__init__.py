"""``aep-bridges hooks install|uninstall|status <agent>`` (issue 27): the hook
entries of Claude Code (``settings.json``) and Codex (``config.toml``) that
send every hook moment to the daemon, written into the vendor's own config
file, idempotently, keeping everything else in it; marked by their URL or
shim command line so ``uninstall`` removes only what ``install`` added."""

__all__ = ["claude", "cli", "codex", "common", "record"]
