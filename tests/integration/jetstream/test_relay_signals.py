"""``aep-bridges relay`` with AEP_NATS_URL started while no NATS server
answers: it says it is connecting and a SIGTERM ends it with status 0 (it
used to sit in the connect loop with the default handler: killed, 143)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.net import free_ports
from tests.support.pipes import rest_of


def test_sigterm_while_connecting_to_nats_exits_0(tmp_path: Path) -> None:
    nats_port, listen = free_ports(2)
    env = {**os.environ, "AEP_NATS_URL": f"nats://u:hunter2@127.0.0.1:{nats_port}",
           "AEP_LISTEN": f"127.0.0.1:{listen}", "AEP_STATE_DIR": str(tmp_path / "state"),
           "AEP_LOG_FORMAT": "text"}
    exe = Path(sys.executable).parent / "aep-bridges"
    p = subprocess.Popen([str(exe), "relay"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "cannot connect" in line or "no server" in line:
                break
        assert any("connecting to NATS" in ln for ln in lines), lines
        p.send_signal(signal.SIGTERM)
        out, _ = rest_of(p, 30)  # not communicate(): it loses what readline() buffered
        lines.append(out)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, "".join(lines)
    text = "".join(lines)
    assert "while connecting to NATS: exiting" in text
    assert "hunter2" not in text
