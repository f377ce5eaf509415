"""The rest of a child's output after the test has read some of it line by
line: ``Popen.communicate`` reads the raw pipes, so whatever a ``readline()``
on ``proc.stdout`` had already buffered past its line is lost (a Node
client's result, written right behind its ``OPEN`` line, went missing that
way in clean-clone CI runs; the demo's and the relay's tests read the same
way). :func:`rest_of` reads through the same file objects."""
from __future__ import annotations

import subprocess
import threading
from typing import Any

__all__ = ["rest_of"]


def rest_of(proc: subprocess.Popen[Any], timeout: float) -> tuple[Any, Any]:
    """``(rest of stdout, stderr or None)`` once ``proc`` has exited, read
    through ``proc.stdout``/``proc.stderr`` (their buffers included);
    ``subprocess.TimeoutExpired`` (the child killed) past ``timeout`` s."""
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    err: list[Any] = []
    reader = None
    if proc.stderr is not None:  # a separate pipe: read it beside stdout, it may fill
        stderr = proc.stderr
        reader = threading.Thread(target=lambda: err.append(stderr.read()), daemon=True)
        reader.start()
    try:
        out = proc.stdout.read() if proc.stdout is not None else None
        if reader is not None:
            reader.join()
        proc.wait()
    finally:
        timer.cancel()
    if expired.is_set():
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return out, (err[0] if err else None)
