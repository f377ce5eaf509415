"""Debian tools some tests drive (``tmux`` for a real terminal,
``systemd-analyze`` to verify the shipped unit): found on ``PATH``, or
installed with ``apt-get install -y`` when the tests run as root on Debian
(the project's setup step: ``scripts/dev system-deps`` does the same), or
else the test is skipped LOUDLY naming the command to run."""
from __future__ import annotations

import os
import shutil
import subprocess

from tests.support.vendors import skip_loudly

#: command -> the Debian package that provides it
DEBIAN_PACKAGES = {"tmux": "tmux", "systemd-analyze": "systemd",
                   # the console's browser tests: headless Chromium driven by selenium
                   "chromium": "chromium", "chromedriver": "chromium-driver"}


def require(command: str) -> str:
    """The path of ``command``, installing its Debian package when missing
    and possible; loud skip (``apt-get install -y <pkg>``) otherwise."""
    found = shutil.which(command)
    if found:
        return found
    package = DEBIAN_PACKAGES[command]
    apt = shutil.which("apt-get")
    if apt and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = [apt, "install", "-y", "--no-install-recommends", package]
        done = subprocess.run(install, env=env, capture_output=True, timeout=900, check=False)
        if done.returncode != 0:  # a fresh image has no package lists yet: update once, retry
            subprocess.run([apt, "update"], env=env, capture_output=True, timeout=600, check=False)
            subprocess.run(install, env=env, capture_output=True, timeout=900, check=False)
        found = shutil.which(command)
        if found:
            return found
    skip_loudly(f"{command} is not installed: run `apt-get install -y {package}` "
                "(or scripts/dev system-deps)")
    raise AssertionError("unreachable")
