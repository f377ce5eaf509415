"""systemd ``Type=notify`` readiness and watchdog (sd_notify(3) protocol: one
datagram of ``KEY=VALUE`` lines to the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET``). A no-op outside systemd (and on launchd).

The protocol is one ``sendto``; a library would add a blocking socket for
nothing, so this stays ten lines on trio's socket API."""
from __future__ import annotations

import logging
import os
from typing import Mapping

import trio

log = logging.getLogger("aep.notify")


class Notifier:
    """``await notify("READY=1")``; :meth:`watchdog_interval` is half of
    ``WATCHDOG_USEC`` in seconds (``None`` when no watchdog is armed)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        addr = environ.get("NOTIFY_SOCKET") or ""
        if addr.startswith("@"):  # abstract namespace
            addr = "\0" + addr[1:]
        self.addr = addr or None
        usec = environ.get("WATCHDOG_USEC")
        pid = environ.get("WATCHDOG_PID")
        armed = usec and usec.isascii() and usec.isdigit() and (not pid or pid == str(os.getpid()))
        self._watchdog = int(usec) / 2e6 if armed else None  # type: ignore[arg-type]

    @property
    def enabled(self) -> bool:
        return self.addr is not None

    def watchdog_interval(self) -> float | None:
        return self._watchdog

    async def notify(self, state: str) -> None:
        if not self.addr:
            return
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_DGRAM)
        try:
            await sock.sendto(state.encode(), self.addr)
        except OSError as e:
            log.warning("sd_notify failed: %s", e)
        finally:
            sock.close()

    async def watchdog_loop(self) -> None:
        """Ping ``WATCHDOG=1`` at half the configured interval, forever."""
        interval = self._watchdog
        if not self.addr or not interval:
            return
        while True:
            await self.notify("WATCHDOG=1")
            await trio.sleep(interval)
