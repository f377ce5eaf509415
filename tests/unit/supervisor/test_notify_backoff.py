"""sd_notify datagrams and the restart backoff."""
import socket

import trio

from bridges.core.backoff import backoff_delay
from supervisor.fleet import BACKOFF_INITIAL, BACKOFF_MAX
from supervisor.tools.notify import Notifier


async def test_notify_sends_datagrams_to_notify_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.setblocking(False)
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert n.enabled and n.watchdog_interval() == 1.0
    await n.notify("READY=1")
    await trio.lowlevel.wait_readable(srv)
    assert srv.recv(100) == b"READY=1"
    srv.close()


async def test_notify_is_a_noop_outside_systemd():
    n = Notifier({})
    assert not n.enabled and n.watchdog_interval() is None
    await n.notify("READY=1")  # must not raise
    with trio.move_on_after(0.05) as cs:
        await n.watchdog_loop()  # returns at once: nothing armed
    assert not cs.cancelled_caught


def test_watchdog_for_another_pid_is_ignored():
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "10", "WATCHDOG_PID": "1"}
                    ).watchdog_interval() is None


def test_backoff_grows_caps_and_never_hits_zero():
    lo = [backoff_delay(a, BACKOFF_INITIAL, BACKOFF_MAX, rng=lambda: 0.0) for a in range(12)]
    hi = [backoff_delay(a, BACKOFF_INITIAL, BACKOFF_MAX, rng=lambda: 1.0) for a in range(12)]
    assert lo[0] > 0 and all(b >= a for a, b in zip(hi, hi[1:], strict=False))
    assert hi[-1] == BACKOFF_MAX and lo[-1] == BACKOFF_MAX / 2
    assert hi[1] == 2 * hi[0]
