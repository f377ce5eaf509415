"""Shared machinery every bridge uses exactly once: envelope stamping,
capture gating and redaction, vendor fallback naming, and the command ledger.

Nothing in this package performs I/O except :mod:`bridges.core.envelope`'s
epoch store (one small file under the state directory)."""
