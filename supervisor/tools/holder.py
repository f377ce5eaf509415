"""Which aep-bridges process holds a TCP port, so ``run``, ``relay`` and
``check`` can name it when a port they need is taken, as they name the
state directory's holder (``in use by aep-bridges pid N``).

Linux only, and best effort: the listening socket's inode is read from
``/proc/net/tcp`` and ``/proc/net/tcp6``, and its process found among
``/proc/<pid>/fd`` (the processes this user may read: a daemon of another
user is not found). Elsewhere, or when nothing is found, the answer is
``None`` and the caller keeps its plain "in use" line. Never raises."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

__all__ = ["aep_bridges_holder", "is_aep_bridges", "listening_inodes"]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's ``st`` column
_PROC = Path("/proc")


def listening_inodes(port: int, proc: Path = _PROC) -> set[str]:
    """The socket inodes listening on TCP ``port`` (any address, IPv4 or
    IPv6), from ``/proc/net/tcp{,6}``; empty where there is no ``/proc``."""
    out: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            try:
                if int(cols[1].rpartition(":")[2], 16) == port and cols[9] != "0":
                    out.add(cols[9])
            except ValueError:
                continue
    return out


def is_aep_bridges(pid: int, proc: Path = _PROC) -> bool:
    """``pid``'s command line is aep-bridges: the console script
    (``.../aep-bridges ...``, run directly or by its interpreter) or
    ``python -m supervisor.cli``."""
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [a.decode("utf-8", "replace") for a in argv[:3]]
    return any(os.path.basename(a) == "aep-bridges" for a in args[:2]) or \
        args[1:3] == ["-m", "supervisor.cli"]


def _pids(first: Iterable[int], proc: Path) -> Iterable[int]:
    seen = set()
    for pid in first:
        seen.add(pid)
        yield pid
    try:
        entries = list(proc.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.isdigit() and int(entry.name) not in seen:
            yield int(entry.name)


def aep_bridges_holder(port: int, *, first: Iterable[int] = (),
                       proc: Path = _PROC) -> int | None:
    """The pid of the aep-bridges process listening on TCP ``port``, or
    ``None`` (nothing listens, another program does, or it cannot be
    told). ``first``: pids to look at before the rest (the state
    directory's holder)."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in _pids(first, proc):
        try:
            fds = os.listdir(proc / str(pid) / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(proc / str(pid) / "fd" / fd)
            except OSError:
                continue
            if link in wanted:
                return pid if is_aep_bridges(pid, proc) else None
    return None
