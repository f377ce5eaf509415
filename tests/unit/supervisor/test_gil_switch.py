"""The daemon shortens CPython's GIL switch interval (issue 11): a thread a
library demands (grpcio's handler with an export's answer, a trio worker
thread decoding an OTLP/HTTP body) then waits at most ``GIL_SWITCH_S`` for a
busy event loop, and the loop as long for the thread, not the default 5 ms."""
import sys

import pytest

from supervisor.daemon import GIL_SWITCH_S, _settle_gil


def test_settling_the_gil_sets_the_short_switch_interval():
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)  # CPython's default
        _settle_gil()
        assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_S)
        assert GIL_SWITCH_S <= 0.001
    finally:
        sys.setswitchinterval(before)
