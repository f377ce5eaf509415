"""The Hypothesis profiles of ``tests/conftest.py`` (issue 29): a plain
run (CI: ``.ci/run`` sets ``CI``, so ``scripts/dev test`` passes no
profile) runs every example a property asks for; the ``dev`` profile a
fifth, ``--quick-properties`` a tenth, neither below 20."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PROPERTIES = '''
from hypothesis import given, settings, strategies as st

SEEN = {"explicit": 0, "default": 0, "small": 0}

@settings(max_examples=300, database=None)
@given(st.integers())
def test_explicit(n):
    SEEN["explicit"] += 1

@settings(database=None)
@given(st.integers())
def test_default(n):
    SEEN["default"] += 1

@settings(max_examples=40, database=None)
@given(st.integers())
def test_small(n):
    SEEN["small"] += 1

def test_zz_report():
    print("SEEN", SEEN["explicit"], SEEN["default"], SEEN["small"])
'''


@pytest.mark.parametrize("args, expected", [
    ((), ["300", "100", "40"]),
    (("--hypothesis-profile=dev",), ["60", "20", "20"]),
    (("--quick-properties",), ["30", "20", "20"]),
])
def test_each_profile_runs_its_share_of_examples(tmp_path, args, expected):
    """Examples counted per property in a child pytest with the suite's
    conftest as a plugin (``-p tests.conftest``)."""
    (tmp_path / "test_props.py").write_text(PROPERTIES)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p",
                          "no:cacheprovider", "-p", "no:xdist", "-q", "-s", "--rootdir",
                          str(tmp_path), *args, str(tmp_path / "test_props.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    seen = [line.split("SEEN", 1)[1].split() for line in out.stdout.splitlines() if "SEEN" in line]
    assert seen == [expected], out.stdout + out.stderr


def test_ci_runs_every_example():
    """``.ci/run`` sets ``CI`` before it runs ``scripts/dev test``, and
    ``scripts/dev test`` chooses the dev profile only when ``CI`` is unset,
    empty, 0 or false (bash, run here on both sides of that choice)."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("export CI=true") < ci.index("exec scripts/dev test")
    dev = (ROOT / "scripts" / "dev").read_text()
    choice = next(line for line in dev.splitlines() if "--hypothesis-profile=dev" in line)
    for value, profile in (("", True), ("0", True), ("false", True), ("true", False),
                           ("1", False)):
        out = subprocess.run(["bash", "-c", f'props=(); {choice.strip()}; echo "${{props[@]}}"'],
                             env={"CI": value, "PATH": "/usr/bin:/bin"}, capture_output=True,
                             text=True, timeout=30)
        assert (out.stdout.strip() == "--hypothesis-profile=dev") is profile, (value, out)
