"""Issue 25, re-attack: files planted in the hook spool directory.

The spool directory is shared with the agent's user (the README: give the
agent the same ``AEP_STATE_DIR``, writable by it, or ``--spool DIR``), and
the bridge already refuses a symlink or another user's file there. But a
FIFO named ``<agent>.jsonl`` (or ``<agent>.jsonl.ingesting-*``) made the
spool sweep block in ``open(2)`` on the event loop's thread: the WHOLE
daemon froze (``/healthz``, the relay, OTLP acks, every bridge) until
someone opened the FIFO for writing."""
from __future__ import annotations

import contextlib
import os
import time

import httpx

from tests.support.daemon import DaemonProcess

TOKEN = "hooks-spool-token"


def _release(fifo: str) -> None:
    """Open the FIFO for writing once, so a reader blocked on it goes on."""
    with contextlib.suppress(OSError):
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)


def test_a_fifo_in_the_spool_does_not_freeze_the_daemon(tmp_path):
    state = tmp_path / "state"
    spool = state / "hooks-spool"
    d = DaemonProcess(state, {"AEP_BRIDGE_CODEX_HOOKS": "1", "AEP_BRIDGE_CLAUDE_CODE": "1"},
                      token=TOKEN)
    d.start()
    fifos = [str(spool / "codex.jsonl"), str(spool / "claude-code.jsonl.ingesting-01M97BKPJ5STE21K4E39PNQD6M")]
    try:
        spool.mkdir(mode=0o700, exist_ok=True)
        for f in fifos:
            os.mkfifo(f, 0o600)
        time.sleep(7)  # two sweeps (every 3 s), a restart of the claude-code bridge included
        answered = 0
        for _ in range(3):  # bounded
            try:
                r = httpx.get(f"{d.url}/healthz", headers={"authorization": f"Bearer {TOKEN}"},
                              timeout=5)
                answered += r.status_code == 200
            except httpx.TimeoutException:
                pass
        assert answered == 3, "the daemon froze on a FIFO in the spool"
        counters = d.healthz(TOKEN)["bridges"]
        assert counters["codex_hooks"]["counters"]["hooks_spool_foreign"] >= 1
        assert counters["claude_code"]["counters"]["hooks_spool_foreign"] >= 1
        assert "bridge claude_code crashed" not in d.log()
    finally:
        for f in fifos:
            _release(f)
        d.stop(timeout=20)
        for f in fifos:
            with contextlib.suppress(OSError):
                os.unlink(f)
