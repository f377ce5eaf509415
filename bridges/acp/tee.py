"""The ACP tee: ``aep-bridges acp [--daemon URL] [--name NAME] -- AGENT_CMD...``.

The editor runs this instead of its agent command. It spawns the real agent
and copies bytes both ways on raw file descriptors: the editor's stdin to
the agent's stdin, the agent's stdout to the editor's stdout, byte for byte,
as they arrive (never re-serialized, never held for a line end, never
delayed by observation work); stderr is inherited untouched. The tee exits
with the agent's status (a signal death: 128+N) and forwards SIGTERM,
SIGINT and SIGHUP to the agent. Design record:
``shared/aep/docs/bridge-acp-design.md`` ("Attach shape": transparency is
the contract; transparency outranks delivery).

Observation works on a copy, after the bytes went out, and costs O(1)
Python work per pipe read: the piece goes as one record into a bounded
:class:`ObservationQueue` (oldest dropped first, drops counted, the gap
marked so the daemon resynchronizes at the next ``\n``); the daemon splits
the lines (``\n`` only: U+2028/U+2029 inside JSON strings are not line
ends). The parse cap holds on the way: of a line longer than ``--max-line``
the tee ships the cap and one byte, then nothing until its ``\n``
(:class:`bridges.acp.wire.Shipper`), so the daemon counts it as passed
through unparsed and no line costs more than the cap in memory. A
:class:`DaemonLink` carries the records over one WebSocket to the daemon's
ACP bridge (``ws(s)://HOST:PORT/bridges/acp/{name}``, see
:mod:`bridges.acp.wire`), reconnecting with the shared backoff. The daemon
down, slow or restarting never touches the pumps: they never wait on the
queue or the link (fail-open). Queued observations die with the process
when the agent exits, after a short bounded flush. Pipes to the agent are
enlarged to 1 MiB (``F_SETPIPE_SZ``): fewer, larger copies.

Transparency cases, each a test (``tests/integration/acp/test_tee.py``):
the client SIGTERMs without closing stdin (no thread is ever blocked on
stdin: the pumps are trio tasks on non-blocking descriptors, cancelled when
the agent exits, so interpreter shutdown finds nothing to kill); the
client closes stdin, waits, then SIGTERMs; escape sequences before a
frame, U+2028/U+2029 in strings, invalid UTF-8, a trailing partial line at
EOF, a 50 MB line, a line that never ends.

Descriptors: a FIFO or tty is re-opened through ``/proc/self/fd`` (a fresh
open file description, so making it non-blocking cannot leak to a process
sharing ours, e.g. an agent whose stderr is the same pipe); a socket is
dup()ed; a regular file or ``/dev/null`` is read/written synchronously (it
never blocks).
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Sequence

import trio

from . import wire
from .link import DEFAULT_QUEUE_BYTES, DaemonLink, ObservationQueue, to_stderr

DEFAULT_DAEMON = "http://127.0.0.1:8787"
"""The daemon's default ``AEP_LISTEN``."""
DEFAULT_NAME = "acp"
DEFAULT_MAX_LINE = wire.DEFAULT_MAX_LINE
DEFAULT_OBSERVE_RATE = 32.0
"""MB/s of observations at most (the sender paces itself; beyond it the
queue drops): observation CPU (WebSocket framing and masking here, line
parsing in the daemon) stays bounded however fast the session runs. ACP
sessions move kilobytes per second; a bulk transfer is what gets dropped."""
CHUNK = 1 << 20
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_CANNOT_RUN = 127
DRAIN_AFTER_EXIT = 2.0
"""Seconds the agent's stdout may stay open after it exited (a grandchild
holding it) before the tee stops copying."""
FLUSH_TIMEOUT = 0.5
"""Seconds the tee may spend, after the agent's streams closed, handing the
last observations to a connected daemon (0 when not connected)."""


@dataclass
class TeeOptions:
    """What the command line gives the tee (ACP clients trim the agent
    command's environment, so arguments are the configuration)."""

    command: list[str]
    daemon: str = DEFAULT_DAEMON
    name: str = DEFAULT_NAME
    token: str | None = None
    max_line: int = DEFAULT_MAX_LINE
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    observe_rate: float = DEFAULT_OBSERVE_RATE
    verbose: bool = False
    #: False when the tee's own observation settings are unusable: the agent
    #: still runs, piped through untouched, and nothing is sent anywhere
    observe: bool = True
    tee_id: str = field(default_factory=lambda: wire.new_tee_id())


# --------------------------------------------------------------------------- descriptors

def _fresh_fd(fd: int, write: bool) -> tuple[int, bool]:
    """A descriptor for ``fd`` that trio may make non-blocking, and whether
    it can be polled (see the module docstring, "Descriptors")."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and not os.isatty(fd)):
        return fd, False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        try:
            return os.open(f"/proc/self/fd/{fd}", (os.O_WRONLY if write else os.O_RDONLY)
                           | os.O_CLOEXEC), True
        except OSError:
            pass
    return os.dup(fd), True


class _SyncFd:
    """A never-blocking descriptor (regular file, ``/dev/null``) with the
    stream methods the pumps use."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    async def receive_some(self, n: int) -> bytes:
        await trio.lowlevel.checkpoint()
        return os.read(self.fd, n)

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except BrokenPipeError:
                raise trio.BrokenResourceError from None

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


PIPE_SIZE = 1 << 20
"""Pipe capacity asked for (``F_SETPIPE_SZ``, Linux; 1 MiB is the default
unprivileged maximum): fewer, larger copies per megabyte. Best effort."""


def _grow_pipe(fd: int) -> None:
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ
    except OSError:
        pass


def _stream(fd: int, write: bool) -> Any:
    _grow_pipe(fd)
    new, pollable = _fresh_fd(fd, write)
    if not pollable:
        return _SyncFd(new)
    return trio.lowlevel.FdStream(new)


def _die_with_parent() -> None:
    """In the agent, before exec: SIGKILL when the tee dies (Linux
    ``PR_SET_PDEATHSIG``), so a client that SIGKILLs the tee kills the agent
    exactly as it would without the tee."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _ensure_std_fds() -> None:
    """A closed fd 0/1/2 becomes ``/dev/null`` first: else the agent's pipes
    would be created on it and the tee would copy its own pipes."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # the agent gets it too


async def _wait_exit(proc: subprocess.Popen) -> None:
    """Wait for the agent to exit without a thread: its pidfd (Linux >= 5.3)
    becomes readable, else poll."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
        proc.wait()
        return
    while proc.poll() is None:  # noqa: ASYNC110 -- no pidfd: nothing to wait on but the clock
        await trio.sleep(0.05)


def exit_status(returncode: int | None) -> int:
    """The shell's convention: a signal death is ``128 + N``."""
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------------- the tee

class Tee:
    """One tee run (see the module docstring). :meth:`run` returns the exit
    status. ``note`` receives the tee's own stderr lines (tests)."""

    def __init__(self, opts: TeeOptions, *, note: Callable[[str], None] | None = None) -> None:
        self.opts = opts
        self.queue = ObservationQueue(opts.queue_bytes)
        self.shippers = {d: wire.Shipper(opts.max_line) for d in wire.DIRECTIONS}
        self.link = DaemonLink(opts, self.queue, self.stats, note=note)
        self.observed = {d: 0 for d in wire.DIRECTIONS}

    def stats(self) -> dict[str, int]:
        return {"drops": self.queue.drops,
                "skipped_bytes": sum(s.skipped for s in self.shippers.values())}

    def observe(self, direction: str, chunk: bytes) -> None:
        """A copy of bytes that already went out, to the queue (the daemon
        splits the lines): O(1) Python work per pipe read."""
        self.observed[direction] += len(chunk)
        if not self.opts.observe:
            return
        data = self.shippers[direction].cut(chunk)
        if data:
            self.queue.push(wire.piece(direction, data))

    def _spawn(self) -> tuple[subprocess.Popen, Any, Any]:
        """Start the agent from THIS thread (``trio.lowlevel.open_process``
        forks from a worker thread: ``PR_SET_PDEATHSIG`` would then fire when
        that idle thread retires, and the thread outlives the tee's work);
        returns it with trio streams on our ends of its stdin/stdout pipes."""
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        for fd in (w_in, r_out):
            _grow_pipe(fd)
        try:
            proc = subprocess.Popen(
                self.opts.command, stdin=r_in, stdout=w_out,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        except BaseException:
            for fd in (r_in, w_in, r_out, w_out):
                os.close(fd)
            raise
        os.close(r_in)
        os.close(w_out)
        return proc, trio.lowlevel.FdStream(w_in), trio.lowlevel.FdStream(r_out)

    async def run(self) -> int:
        try:
            proc, to_agent, from_agent = self._spawn()
        except OSError as e:
            to_stderr(f"aep-bridges acp: cannot run {self.opts.command[0]!r}: {e.strerror or e}")
            return EXIT_CANNOT_RUN
        stdin, stdout = _stream(0, False), _stream(1, True)
        stdout_done = trio.Event()
        async with trio.open_nursery() as root:
            if self.opts.observe:
                root.start_soon(self.link.run)
            with trio.open_signal_receiver(*FORWARDED) as signals:
                async with trio.open_nursery() as pumps:
                    pumps.start_soon(self._pump_in, stdin, to_agent)
                    pumps.start_soon(self._pump_out, from_agent, stdout, stdout_done)
                    pumps.start_soon(self._forward, signals, proc)
                    await _wait_exit(proc)
                    with trio.move_on_after(DRAIN_AFTER_EXIT):
                        await stdout_done.wait()
                    pumps.cancel_scope.cancel()
            status = exit_status(proc.returncode)
            self.link.finish(status)
            if self.link.connected:
                with trio.move_on_after(FLUSH_TIMEOUT):
                    await self.link.flushed()
            root.cancel_scope.cancel()
        for stream in (stdin, to_agent, from_agent):
            await stream.aclose()
        return status

    async def _pump_in(self, stdin: Any, to_agent: Any) -> None:
        """Editor -> agent. At the editor's EOF the agent's stdin is closed."""
        try:
            while True:
                chunk = await stdin.receive_some(CHUNK)
                if not chunk:
                    break
                try:
                    await to_agent.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # the agent closed its stdin: as without the tee, writes go nowhere
                self.observe(wire.CLIENT, chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        await to_agent.aclose()

    async def _pump_out(self, from_agent: Any, stdout: Any, done: trio.Event) -> None:
        """Agent -> editor, until the agent's stdout ends; then the editor's
        stdout is closed at once (it sees EOF when the agent's ended)."""
        try:
            while True:
                chunk = await from_agent.receive_some(CHUNK)
                if not chunk:
                    break
                try:
                    await stdout.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    # the editor closed its end: the agent must see EPIPE as it would
                    await from_agent.aclose()
                    break
                self.observe(wire.AGENT, chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            done.set()
            await _end_stdout(stdout)

    @staticmethod
    async def _forward(signals: Any, proc: subprocess.Popen) -> None:
        async for signum in signals:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass


async def _end_stdout(stdout: Any) -> None:
    """Close every descriptor of the editor's stdout this process holds
    (ours, then fd 1, which becomes ``/dev/null``), so the editor sees EOF
    when the agent's stdout ended, not after the flush."""
    with trio.CancelScope(shield=True):
        await stdout.aclose()
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:  # pragma: no cover -- nothing else to do
        pass


# --------------------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``acp`` subcommand's arguments (``supervisor/cli.py``)."""
    p.add_argument("--daemon", default=None, metavar="URL",
                   help=f"the aep-bridges daemon (default: $AEP_ACP_DAEMON or {DEFAULT_DAEMON})")
    p.add_argument("--name", default=DEFAULT_NAME,
                   help="the AEP agent id to observe as; the daemon must list it in "
                        "AEP_ACP_AGENTS (default: acp)")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="a file holding the daemon's AEP_TOKEN (default: $AEP_TOKEN)")
    p.add_argument("--max-line", type=int, default=DEFAULT_MAX_LINE, metavar="BYTES",
                   help="parse cap: longer lines pass through unobserved (default 4 MiB)")
    p.add_argument("--queue-bytes", type=int, default=DEFAULT_QUEUE_BYTES, metavar="BYTES",
                   help="observation queue bound; oldest dropped beyond it (default 8 MiB)")
    p.add_argument("--observe-rate", type=float, default=DEFAULT_OBSERVE_RATE, metavar="MB_S",
                   help="at most this many MB/s of observations to the daemon; beyond it the "
                        "queue drops (default 32)")
    p.add_argument("--verbose", action="store_true",
                   help="a stderr line on every daemon connection change, not only the first")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- AGENT_CMD [ARGS...]: the real agent")


def options_from(args: argparse.Namespace, environ: dict[str, str]) -> tuple[TeeOptions | None, str]:
    """``(options, "")``; ``(None, problem)`` when there is no agent to run;
    ``(options with observe=False, problem)`` when only the tee's own
    observation settings are unusable (a bad ``--daemon``/``--name``, an
    unreadable ``--token-file``, bad bounds): the agent must still run
    (fail-open, design record "Attach shape": the tee never affects the
    editor-agent session)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return None, "no agent command: aep-bridges acp [OPTIONS] -- AGENT_CMD [ARGS...]"
    token, problem = _observation_settings(args, environ)
    if problem:
        return TeeOptions(command=command, observe=False), problem
    daemon = args.daemon or environ.get("AEP_ACP_DAEMON") or DEFAULT_DAEMON
    return TeeOptions(command=command, daemon=daemon.rstrip("/"), name=args.name, token=token,
                      max_line=args.max_line, queue_bytes=args.queue_bytes,
                      observe_rate=args.observe_rate, verbose=args.verbose), ""


def _observation_settings(args: argparse.Namespace, environ: dict[str, str]) -> tuple[str | None, str]:
    """``(token, "")``, or ``(None, the first unusable observation setting)``."""
    daemon = args.daemon or environ.get("AEP_ACP_DAEMON") or DEFAULT_DAEMON
    if problem := wire.daemon_problem(daemon):
        return None, problem
    if not wire.valid_name(args.name):
        return None, f"--name {args.name!r}: expected letters, digits, '_' or '-'"
    token = environ.get("AEP_TOKEN") or None
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip() or None
        except (OSError, UnicodeDecodeError) as e:
            return None, f"--token-file {args.token_file!r}: {getattr(e, 'strerror', None) or e}"
    if args.max_line < 1024 or args.queue_bytes < 1024:
        return None, "--max-line and --queue-bytes: at least 1024 bytes"
    if not 0 < args.observe_rate <= 10_000:
        return None, "--observe-rate: MB/s above 0 (at most 10000)"
    return token, ""


def main(args: argparse.Namespace, environ: dict[str, str] | None = None) -> int:
    """Run the tee; returns the agent's exit status (2 when there is no
    agent command, 127 when the agent cannot be started). A bad observation
    setting is said once on stderr and the agent runs unobserved."""
    opts, problem = options_from(args, dict(os.environ if environ is None else environ))
    if opts is None:
        _ensure_std_fds()
        to_stderr(f"aep-bridges acp: {problem}")
        return 2
    if problem:
        _ensure_std_fds()
        to_stderr(f"aep-bridges acp: {problem}; running the agent without observation "
                  "(the session is unaffected)")
    _ensure_std_fds()  # before trio.run: its own descriptors must not land on 0/1/2
    return trio.run(Tee(opts).run)


def leave(status: int) -> NoReturn:
    """End the tee's process with ``status`` at once, skipping the
    interpreter's teardown (``aep-bridges acp`` calls it with
    :func:`main`'s status). The agent has exited and every stream is
    closed by then; what the teardown did was free the heap of the ~450
    modules the console script loads: 0.4-0.55 s under load, spent while
    the editor waits for its agent command to exit (an ACP client closes
    the agent's stdin, waits 2 s, then SIGTERMs it: the tee then died on
    signal 15 instead of exiting with the agent's status). Python's own
    buffered streams are flushed first; nothing else of the tee needs the
    teardown (its notes go to fd 2 unbuffered, :func:`to_stderr`)."""
    for f in (sys.stdout, sys.stderr):
        try:
            if f is not None:
                f.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def run_argv(argv: Sequence[str]) -> int:
    """``aep-bridges acp ARGV...`` without the rest of the CLI (tests)."""
    p = argparse.ArgumentParser(prog="aep-bridges acp")
    add_arguments(p)
    return main(p.parse_args(list(argv)))
