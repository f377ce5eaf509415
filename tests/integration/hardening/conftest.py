"""Shared daemons for the hardening tests: the real ``aep-bridges`` as a
subprocess on loopback (``tests/support/daemon.py``)."""
from __future__ import annotations

import pytest

from tests.support.daemon import DaemonProcess

TOKEN = "hardening-token"


@pytest.fixture(scope="module")
def relay_daemon(tmp_path_factory):
    """``aep-bridges relay`` (the embedded relay alone), no token."""
    d = DaemonProcess(tmp_path_factory.mktemp("relay") / "state", args=("relay",))
    d.start()
    yield d
    d.stop(timeout=20)


@pytest.fixture(scope="module")
def fleet_daemon(tmp_path_factory):
    """``aep-bridges run`` with the OTLP bridge (Codex profile, primary) and a
    token, so authorized ``/healthz`` shows the counts."""
    d = DaemonProcess(tmp_path_factory.mktemp("fleet") / "state",
                      {"AEP_OTLP_PRIMARY": "1"}, token=TOKEN)
    d.start()
    yield d
    d.stop(timeout=20)
