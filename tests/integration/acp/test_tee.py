"""The tee's transparency contract, each known way real clients and agents
break tees a test (issue 9, "The tee: transparency is the contract").

The tee runs as the real console script (``aep-bridges acp -- AGENT``) with
the daemon unreachable (fail-open) unless a test says otherwise; agents are
small Python programs; the client is this test, holding the tee's stdio
pipes the way an editor does. No timing assertions: "promptly" is a
generous bound (a hang fails, a slow machine does not)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.support.daemon import console_script

UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens (fail-open)
BOUND = 20.0  # seconds: "promptly" (a hang fails; a slow machine does not)


def tee_cmd(agent: list[str], *extra: str, daemon: str = UNREACHABLE) -> list[str]:
    return console_script() + ["acp", "--daemon", daemon, *extra, "--", *agent]


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


CAT = py("""
    import os
    while True:
        b = os.read(0, 65536)
        if not b:
            break
        os.write(1, b)
""")


def spawn(cmd, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, **kw)


def run_through(agent: list[str], data: bytes, *extra: str) -> tuple[bytes, bytes, int]:
    p = spawn(tee_cmd(agent, *extra))
    out, err = p.communicate(data, timeout=120)
    return out, err, p.returncode


NASTY = (
    b"\x1b[?25l\x1b[2K" + b'{"jsonrpc":"2.0","method":"x","params":{}}\n'  # escapes before a frame
    + json.dumps({"t": "a\u2028b\u2029c"}, ensure_ascii=False).encode() + b"\n"  # U+2028/9 raw
    + b'{"bad":"\xff\xfe\xc3\x28"}\n'  # invalid UTF-8
    + b"\r\n\n\n"  # CR, empty lines
    + b'{"jsonrpc":"2.0","id":1,"result":{}}'  # trailing partial line at EOF
)


def test_bytes_pass_through_unchanged_both_ways():
    """stdin -> agent -> stdout through a byte echo: exactly the same bytes,
    including everything a line-oriented re-serializer would damage."""
    out, err, rc = run_through(CAT, NASTY)
    assert out == NASTY
    assert rc == 0
    assert b"Traceback" not in err and b"Fatal Python error" not in err


def test_agent_stdout_passes_unchanged_and_stderr_is_inherited():
    agent = py(r"""
        import os, sys
        os.write(1, b"\x1b[0m{\"a\":\"\xe2\x80\xa8\"}\n\xff\xfe partial")
        os.write(2, b"agent log line\n")
    """)
    out, err, rc = run_through(agent, b"")
    assert out == b"\x1b[0m{\"a\":\"\xe2\x80\xa8\"}\n\xff\xfe partial"
    assert b"agent log line\n" in err
    assert rc == 0


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set of a live process (``VmHWM``, KiB)."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1])
    raise AssertionError("no VmHWM")


def test_a_50_mb_line_passes_through_with_bounded_memory():
    """One 50 MB line (over the 4 MiB parse cap) and more after it: through
    unchanged; the tee's peak RSS grows by far less than what it carried
    (parse cap 4 MiB + queue 8 MiB + pump chunks)."""
    first = b'{"jsonrpc":"2.0","method":"hello"}\n'
    line = b'{"jsonrpc":"2.0","method":"big","params":{"blob":"' + b"x" * (50 << 20) + b'"}}\n'
    data = line + b'{"after":1}\n'
    p = spawn(tee_cmd(CAT))
    p.stdin.write(first)
    p.stdin.flush()
    assert p.stdout.readline() == first
    baseline = vm_hwm_kib(p.pid)
    digest = hashlib.sha256()
    size = [0]

    def reader():
        while True:
            b = p.stdout.read1(1 << 20)
            if not b:
                return
            digest.update(b)
            size[0] += len(b)

    t = threading.Thread(target=reader)
    t.start()
    p.stdin.write(data)
    p.stdin.flush()
    deadline = time.monotonic() + 120
    while size[0] < len(data) and time.monotonic() < deadline:
        time.sleep(0.05)
    peak = vm_hwm_kib(p.pid)
    p.stdin.close()
    t.join(120)
    assert p.wait(60) == 0
    assert size[0] == len(data)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert peak - baseline < 24 << 10, f"RSS grew {peak - baseline} KiB carrying 50 MB"


def test_a_line_that_never_ends_is_not_held():
    """The agent writes 8 MB with no newline and keeps running: the client
    gets every byte while the agent is still alive (nothing waits for a
    line end), then the tee exits with the agent's status."""
    agent = py("""
        import os, sys, time
        os.write(1, b"y" * (8 << 20))
        sys.stdin.read()
        sys.exit(5)
    """)
    p = spawn(tee_cmd(agent))
    got = 0
    deadline = time.monotonic() + 60
    while got < 8 << 20 and time.monotonic() < deadline:
        got += len(p.stdout.read1(1 << 20))
    assert got == 8 << 20
    assert p.poll() is None  # the agent is still running
    p.stdin.close()
    assert p.wait(BOUND) == 5


def test_sigterm_without_closing_stdin_exits_promptly_and_cleanly():
    """The TypeScript SDK's example client SIGTERMs the agent command and
    never closes stdin: the tee forwards it, exits with the agent's status,
    and no thread is left blocked on stdin (no "Fatal Python error")."""
    agent = py("""
        import sys, time
        print('{"jsonrpc":"2.0","method":"ready"}', flush=True)
        time.sleep(600)
    """)
    p = spawn(tee_cmd(agent))
    assert p.stdout.readline() == b'{"jsonrpc":"2.0","method":"ready"}\n'
    p.send_signal(signal.SIGTERM)
    rc = p.wait(BOUND)
    err = p.stderr.read()
    assert rc == 128 + signal.SIGTERM  # the agent died of the forwarded SIGTERM
    assert b"Fatal Python error" not in err and b"Traceback" not in err
    p.stdin.close()


def test_sigterm_when_the_agent_exits_cleanly_on_it():
    agent = py("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        print("up", flush=True)
        time.sleep(600)
    """)
    p = spawn(tee_cmd(agent))
    assert p.stdout.readline() == b"up\n"
    p.send_signal(signal.SIGTERM)
    assert p.wait(BOUND) == 0
    assert b"Fatal Python error" not in p.stderr.read()


def test_close_stdin_wait_then_sigterm_like_the_python_sdk():
    """``spawn_stdio_transport``'s shutdown: close stdin, wait, then
    SIGTERM. An agent that exits at EOF ends the tee before any signal."""
    agent = py("""
        import sys
        for line in sys.stdin:
            sys.stdout.write(line); sys.stdout.flush()
        sys.exit(0)
    """)
    p = spawn(tee_cmd(agent))
    p.stdin.write(b'{"jsonrpc":"2.0","id":0,"method":"initialize"}\n')
    p.stdin.flush()
    assert p.stdout.readline() == b'{"jsonrpc":"2.0","id":0,"method":"initialize"}\n'
    p.stdin.close()
    try:
        rc = p.wait(2.0)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(BOUND)
    assert rc == 0
    assert b"Fatal Python error" not in p.stderr.read()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_signals_are_forwarded(sig):
    agent = py("""
        import os, signal, sys, time
        def got(n, f):
            os.write(1, f"got {n}\\n".encode())
            sys.exit(7)
        for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(s, got)
        os.write(1, b"up\\n")
        time.sleep(600)
    """)
    p = spawn(tee_cmd(agent))
    assert p.stdout.readline() == b"up\n"
    p.send_signal(sig)
    assert p.stdout.readline() == f"got {int(sig)}\n".encode()
    assert p.wait(BOUND) == 7


@pytest.mark.parametrize("code,want", [("sys.exit(3)", 3), ("os.kill(os.getpid(), 9)", 137),
                                       ("os.kill(os.getpid(), 15)", 143)])
def test_exit_status_is_the_agents(code, want):
    out, err, rc = run_through(py(f"import os, sys\n{code}"), b"")
    assert rc == want


def test_an_agent_that_cannot_start():
    out, err, rc = run_through(["/nonexistent/agent"], b"")
    assert rc == 127 and b"cannot run" in err and out == b""


def test_sigkill_of_the_tee_takes_the_agent_with_it(tmp_path):
    """A client that SIGKILLs its agent command kills the agent: with the
    tee in between, the agent must die too (PR_SET_PDEATHSIG)."""
    pidfile = tmp_path / "pid"
    agent = py(f"""
        import os, time
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        print("up", flush=True)
        time.sleep(600)
    """)
    p = spawn(tee_cmd(agent))
    assert p.stdout.readline() == b"up\n"
    pid = int(pidfile.read_text())
    p.kill()
    p.wait(BOUND)
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the agent outlived its SIGKILLed tee")


def test_the_client_closing_stdout_gives_the_agent_epipe():
    """The editor stops reading (closes its end): the agent sees a broken
    pipe on its stdout, as it would without the tee."""
    agent = py("""
        import os, sys, time
        try:
            for _ in range(100000):
                os.write(1, b"x" * 65536)
                time.sleep(0.001)
        except BrokenPipeError:
            os.write(2, b"EPIPE\\n")
            sys.exit(9)
        sys.exit(0)
    """)
    p = spawn(tee_cmd(agent))
    p.stdout.read(1 << 16)
    p.stdout.close()
    assert p.wait(BOUND) == 9
    assert b"EPIPE" in p.stderr.read()


def test_no_thread_is_left_at_exit_in_process(tmp_path):
    """Run the tee in a Python process that reports its threads after the
    tee returned (SIGTERM, stdin never closed): only the main thread."""
    script = tmp_path / "tee_threads.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from bridges.acp.tee import run_argv
        rc = run_argv(sys.argv[1:])
        sys.stderr.write("THREADS %d\\n" % threading.active_count())
        sys.exit(rc)
    """))
    agent = py("""
        import time
        print("up", flush=True)
        time.sleep(600)
    """)
    p = spawn([sys.executable, str(script), "--daemon", UNREACHABLE, "--", *agent])
    assert p.stdout.readline() == b"up\n"
    p.send_signal(signal.SIGTERM)
    assert p.wait(BOUND) == 143
    err = p.stderr.read()
    assert b"THREADS 1\n" in err, err
    assert b"Fatal Python error" not in err


@pytest.mark.parametrize("extra,needle", [(("--token-file", "/nonexistent/aep-token"), b"--token-file"),
                                          (("--name", "not a name"), b"--name")])
def test_a_bad_observation_setting_runs_the_agent_unobserved(extra, needle):
    """Fail-open: an unusable observation setting of the tee itself (a
    missing token file) never stops the editor's agent: it runs piped
    through byte for byte with its own exit status, and stderr says why
    once."""
    data = b"".join(b'{"jsonrpc":"2.0","method":"n","params":{"i":%d}}\n' % i for i in range(200))
    agent = py("""
        import os, sys
        while True:
            b = os.read(0, 65536)
            if not b:
                break
            os.write(1, b)
        sys.exit(4)
    """)
    out, err, rc = run_through(agent, data, *extra)
    assert out == data and rc == 4, err
    lines = [ln for ln in err.splitlines() if ln.startswith(b"aep-bridges acp:")]
    assert len(lines) == 1 and needle in lines[0] and b"without observation" in lines[0], err


def test_fail_open_when_the_daemon_accepts_and_never_answers():
    """A listener that accepts TCP and never speaks (a hung daemon): the
    session is unaffected and the tee exits promptly with the agent."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []
    threading.Thread(target=lambda: held.extend(srv.accept() for _ in range(1)), daemon=True).start()
    try:
        data = b"".join(b'{"jsonrpc":"2.0","method":"n","params":{"i":%d}}\n' % i
                        for i in range(20000))
        p = spawn(tee_cmd(CAT, daemon=f"http://127.0.0.1:{srv.getsockname()[1]}"))
        out, err = p.communicate(data, timeout=120)
        assert out == data and p.returncode == 0
    finally:
        srv.close()


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_closed_standard_descriptor(closed):
    """An editor that spawns the agent command with fd 0, 1 or 2 closed:
    the tee never copies its own pipes (the closed one becomes /dev/null
    before anything else opens a descriptor) and exits with the agent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    # the shell closes the descriptor, then execs the tee. Not preexec_fn:
    # that runs Python in a fork of this multi-threaded process, where
    # grpc's at-fork handler (a test before this one in the same process
    # used gRPC) started a poller whose epoll descriptor close_fds then
    # closed: the child aborted (SIGABRT) before the tee ever ran
    cmd = tee_cmd(py("import sys; sys.stdout.write('hi'); sys.stderr.write('e')"))
    p = subprocess.run(["/bin/sh", "-c", f'exec "$@" {closed}>&-', "sh", *cmd],
                       stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert b"Traceback" not in p.stderr
    assert p.stdout == (b"" if closed == 1 else b"hi")


@pytest.mark.parametrize("daemon", ["unreachable", "blackholed"])
def test_the_tee_leaves_without_the_interpreters_teardown(tmp_path, daemon):
    """Once the agent exited, ``aep-bridges acp`` ends its process with the
    agent's status at once (``bridges.acp.tee.leave``): the interpreter's
    teardown (freeing ~450 modules, 0.4-0.55 s under load, while the editor
    waited: an ACP client SIGTERMs its agent 2 s after closing its stdin)
    never runs, so an atexit handler of the process never fires; also with
    the daemon link blackholed (a listener that accepts and never answers).
    The console script's own ``main`` is driven, as the entry point does."""
    script = tmp_path / "tee_atexit.py"
    script.write_text(textwrap.dedent(f"""
        import atexit, os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        atexit.register(os.write, 2, b"INTERPRETER TEARDOWN\\n")
        from supervisor.cli import main
        sys.exit(main(sys.argv[1:]))
    """))
    url, hole = UNREACHABLE, None
    if daemon == "blackholed":
        hole = socket.socket()
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    try:
        p = spawn([sys.executable, str(script), "acp", "--daemon", url, "--"] + py("""
            import sys
            sys.stdin.buffer.read()
            sys.exit(7)
        """))
        _, err = p.communicate(b'{"jsonrpc":"2.0","method":"x"}\n', timeout=BOUND * 3)
    finally:
        if hole is not None:
            hole.close()
    assert p.returncode == 7, err
    assert b"INTERPRETER TEARDOWN" not in err
