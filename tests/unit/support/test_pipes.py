"""tests.support.pipes: the rest of a child's output after a readline()."""
from __future__ import annotations

import subprocess
import sys
import time

from tests.support.pipes import rest_of

TWO_LINES = [sys.executable, "-c", "print('OPEN'); print('{\"a\": 1}')"]


def _started() -> subprocess.Popen[str]:
    p = subprocess.Popen(TWO_LINES, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.wait(timeout=30)  # both lines in the pipe before the first readline()
    time.sleep(0.05)
    return p


def test_communicate_loses_what_readline_buffered_and_rest_of_does_not():
    p = _started()
    assert p.stdout is not None and p.stdout.readline() == "OPEN\n"
    assert p.communicate(timeout=30)[0] == ""  # the pitfall this module exists for
    p = _started()
    assert p.stdout is not None and p.stdout.readline() == "OPEN\n"
    assert rest_of(p, 30) == ('{"a": 1}\n', "")


def test_a_child_past_its_time_is_killed_and_said_so():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True)
    try:
        rest_of(p, 0.5)
    except subprocess.TimeoutExpired:
        assert p.poll() is not None
    else:
        raise AssertionError("no TimeoutExpired")
