"""The shim's pure parts and its spool writer (the wire contract, section 3):
the line's shape, the default directory, and the locking that keeps every
line whole while many shims append and an ingester takes the file away."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridges.hooks_common import shim

SHIM = str(Path(shim.__file__).resolve())


def test_spool_line_shape():
    line = shim.spool_line("a" * 32, "codex", b'{"x": "\xc3\xa9"}', 1234)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"id": "a" * 32, "agent": "codex", "spooled_at_ms": 1234,
                                "payload": {"x": "\u00e9"}}


@pytest.mark.parametrize("raw, payload", [(b"[1]", "[1]"), (b"\xff{", "\ufffd{"), (b"", "")])
def test_spool_line_keeps_what_is_not_a_json_object_as_text(raw, payload):
    assert json.loads(shim.spool_line("b" * 32, "codex", raw, 1))["payload"] == payload


@pytest.mark.parametrize("payload", [
    "[" + ",".join(["[]"] * 70_000) + "]",  # over MAX_CONTAINERS
    "[" + ",".join(["0.5"] * 70_000) + "]",  # over MAX_FLOATS
])
def test_a_spool_line_past_the_endpoints_json_bounds_is_malformed(payload):
    """A body the daemon never saw (it was down) is held to the endpoint's
    bounds when the sweep reads it (:func:`bridges.core.aep.check_json`):
    the sweep's parse holds the loop as the endpoint's would."""
    from bridges.hooks_common.spool import parse_line
    moment = '{"session_id": "s", "hook_event_name": "PostToolUse", "tool_response": %s}'
    line = shim.spool_line("c" * 32, "claude-code", (moment % payload).encode(), 1)
    assert parse_line(line, "claude-code") is None  # the payload: an object (parsed)
    text = json.dumps({"id": "d" * 32, "agent": "claude-code", "payload": moment % payload})
    assert parse_line(text.encode(), "claude-code") is None  # the payload: JSON text
    ok = shim.spool_line("e" * 32, "claude-code", (moment % "[1]").encode(), 1)
    assert parse_line(ok, "claude-code") is not None


def test_default_spool_dir_follows_the_state_dir_rule():
    assert shim.default_spool_dir({"AEP_STATE_DIR": "/s", "HOME": "/h"}) == "/s/hooks-spool"
    assert (shim.default_spool_dir({"XDG_STATE_HOME": "/x", "HOME": "/h"})
            == "/x/aep-bridges/hooks-spool")
    assert (shim.default_spool_dir({"XDG_STATE_HOME": "rel", "HOME": "/h"})
            == "/h/.local/state/aep-bridges/hooks-spool")


def test_a_writer_that_opened_the_file_before_an_ingester_took_it_writes_to_the_new_one(
        tmp_path):
    """The ingester holds the lock, renames the file, unlocks: a writer that
    opened the old file meanwhile must not append to it (the ingester is
    reading it and will delete it): the inode check sends it to a new file."""
    path = tmp_path / "codex.jsonl"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the ingester's lock
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import shim; "
            "shim.spool_write(sys.argv[2], 'codex', b'{\"id\":\"late\"}\\n')")
    writer = subprocess.Popen([sys.executable, "-S", "-E", "-c", code, str(Path(SHIM).parent),
                               str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while not any(os.path.realpath(f"/proc/{writer.pid}/fd/{n}") == str(path)
                      for n in _fds(writer.pid)):  # the writer has the old file open
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.01)
        taken = tmp_path / "codex.jsonl.ingesting-1"
        os.rename(path, taken)
        path.write_bytes(b"")  # another shim made the next file meanwhile
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert writer.wait(60) == 0
    assert taken.read_bytes() == b""
    assert path.read_bytes() == b'{"id":"late"}\n'


def _fds(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return []


def test_concurrent_shims_and_an_ingester_lose_and_tear_nothing(tmp_path):
    """Eight writer processes append large lines (past the pipe-atomic size)
    while this process ingests as the contract says (lock, rename, unlock,
    read): every line arrives once and whole."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import shim\n"
            "for i in range(40):\n"
            "    shim.spool_write(sys.argv[2], 'codex', shim.spool_line("
            "f'{sys.argv[3]}-{i}', 'codex', b'{\"pad\": \"' + b'x' * 200000 + b'\"}', 1))\n")
    writers = [subprocess.Popen([sys.executable, "-S", "-E", "-c", code,
                                 str(Path(SHIM).parent), str(tmp_path), f"w{w}"])
               for w in range(8)]
    lines: list[bytes] = []
    path = tmp_path / "codex.jsonl"
    n = 0
    while True:
        done = all(w.poll() is not None for w in writers)
        if path.exists():
            fd = os.open(path, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            taken = tmp_path / f"codex.jsonl.ingesting-{n}"
            os.rename(path, taken)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            lines += taken.read_bytes().splitlines(keepends=True)
            taken.unlink()
            n += 1
        if done and not path.exists():
            break
        time.sleep(0.005)
    assert all(w.returncode == 0 for w in writers)
    ids = [json.loads(line)["id"] for line in lines]  # a torn line fails to parse here
    assert sorted(ids) == sorted(f"w{w}-{i}" for w in range(8) for i in range(40))
    assert n > 1  # the ingester did take the file away while writers ran


def test_hook_dispatch_skips_trio_and_argparse(tmp_path):
    code = ("import sys; from supervisor.cli import main; "
            "rc = main(['hook', 'codex', '--daemon', 'http://127.0.0.1:9', '--spool', "
            "sys.argv[1]]); "
            "bad = sorted({'trio', 'httpx', 'argparse', 'supervisor.config'} & set(sys.modules)); "
            "print(rc, bad)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], input=b"{}",
                         capture_output=True, timeout=60)
    assert out.stdout.decode().split("\n")[0] == "0 []", out.stderr.decode()


def test_spool_write_neither_follows_a_symlink_nor_blocks_on_a_fifo(tmp_path):
    """A spool directory shared with another user (README: the agent's
    ``AEP_STATE_DIR`` or ``--spool``): a planted ``<agent>.jsonl`` symlink
    made the shim append to whatever it points at (any file the agent's user
    may write), and a FIFO made it block in ``open(2)`` until the vendor's
    hook timeout."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (tmp_path / "codex.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        shim.spool_write(str(tmp_path), "codex", b'{"id":"x"}\n')
    assert victim.read_bytes() == b"precious\n"
    os.mkfifo(tmp_path / "claude-code.jsonl")
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path[0] = sys.argv[1]; import shim\n"
         "try:\n    shim.spool_write(sys.argv[2], 'claude-code', b'{}\\n')\n"
         "except OSError:\n    print('refused')", str(Path(SHIM).parent), str(tmp_path)],
        capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "refused", done.stderr


# -- the spool directory itself (a fifth outside attack on issue 25) -------------
def _shim_run(spool: str) -> subprocess.CompletedProcess:
    """The shim as the installer runs it (``-S -E``, stdin a hook moment)
    with its daemon down: it spools, or says on stderr why it could not."""
    from tests.support.net import free_ports
    port, = free_ports(1)  # nothing listens there: connection refused, so the shim spools
    code = (f"import sys; sys.path[0] = {str(Path(SHIM).parent)!r}; from shim import main; "
            "sys.exit(main())")
    return subprocess.run([sys.executable, "-S", "-E", "-c", code, "codex", "--daemon", f"http://127.0.0.1:{port}", "--spool", spool],
                          input=b'{"hook_event_name": "Stop", "session_id": "s"}',
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("trailing", ["", "/"])
def test_a_symlinked_spool_directory_is_refused_and_the_hook_still_exits_0(tmp_path, trailing):
    """``--spool`` naming a planted symlink to a directory: the shim wrote its
    moments wherever the link pointed (the spool FILE was already refused
    as a symlink, the directory was followed)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "spool-link"
    link.symlink_to(elsewhere, target_is_directory=True)
    out = _shim_run(str(link) + trailing)
    assert out.returncode == 0 and out.stdout == b""
    err = out.stderr.decode()
    assert "could not spool" in err and "symlink" in err and "Traceback" not in err, err
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("under", ["/.", "/./", "/sub", "/sub/", "/./sub", "/new", "/new/deeper"])
def test_a_symlink_anywhere_in_the_spool_path_is_refused(tmp_path, under):
    """Sixth outside attack on issue 25: only the last component was held to
    the rule, so ``LINK/.``, ``LINK/./`` and ``LINK/sub`` followed the link
    (and ``os.makedirs`` made ``LINK/new`` where it pointed)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(mode=0o700, parents=True)
    os.chmod(elsewhere, 0o700)
    link = tmp_path / "spool-link"
    link.symlink_to(elsewhere, target_is_directory=True)
    out = _shim_run(str(link) + under)
    assert out.returncode == 0 and out.stdout == b""
    err = out.stderr.decode()
    assert "could not spool" in err and "symlink" in err and "Traceback" not in err, err
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["sub"]
    with pytest.raises(OSError, match=f"symlink at {link}"):
        shim.spool_write(str(link) + under, "codex", b'{"id":"x"}\n')


def test_a_relative_spool_path_is_walked_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError, match="symlink at link"):
        shim.spool_write("link/sub", "codex", b'{"id":"x"}\n')
    assert shim.spool_write("./real/../real/spool", "codex", b'{"id":"x"}\n') == \
        "./real/../real/spool/codex.jsonl"
    assert (tmp_path / "real" / "spool" / "codex.jsonl").read_bytes() == b'{"id":"x"}\n'
    assert list((tmp_path / "real").iterdir()) == [tmp_path / "real" / "spool"]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o720])
def test_a_group_or_world_writable_spool_directory_is_refused(tmp_path, mode):
    spool = tmp_path / "spool"
    spool.mkdir()
    os.chmod(spool, mode)
    out = _shim_run(str(spool))
    assert out.returncode == 0 and out.stdout == b""
    err = out.stderr.decode()
    assert "could not spool" in err and "writable" in err and "Traceback" not in err, err
    assert list(spool.iterdir()) == []
    with pytest.raises(OSError, match="writable"):
        shim.spool_write(str(spool), "codex", b'{"id":"x"}\n')


def test_another_users_spool_directory_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a directory another user owns needs root")
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    os.chown(spool, 65534, 65534)
    out = _shim_run(str(spool))
    assert out.returncode == 0 and out.stdout == b""
    err = out.stderr.decode()
    assert "could not spool" in err and "owned by uid 65534" in err, err
    assert list(spool.iterdir()) == []


def test_an_own_private_spool_directory_still_spools(tmp_path):
    """The rule refuses only what it must: a 0700 directory of this user
    (made by the shim, or there already with 0755) takes the moment."""
    made = tmp_path / "state" / "hooks-spool"
    out = _shim_run(str(made))
    assert out.returncode == 0 and b"spooled to" in out.stderr, out.stderr
    assert oct(made.stat().st_mode & 0o777) == oct(0o700 & ~_umask())
    assert json.loads((made / "codex.jsonl").read_bytes())["payload"]["hook_event_name"] == "Stop"
    shared_read = tmp_path / "readable"
    shared_read.mkdir()
    os.chmod(shared_read, 0o755)
    assert _shim_run(str(shared_read) + "/").returncode == 0
    assert (shared_read / "codex.jsonl").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_root_owned_symlink_above_the_spool_is_followed_for_another_user(tmp_path, monkeypatch):
    """A system layout's symlink (``/home -> /var/home``: root's) above the
    spool directory is followed for a user who is not root; for root every
    symlink is refused (nothing tells its links apart). Run as root, the
    link below is root's; the first ``geteuid`` (the link's rule) answers
    another user's id, the second (the directory's owner rule) root's."""
    if os.geteuid() != 0:
        pytest.skip("a root-owned symlink needs root to make")
    real = tmp_path / "var-home"
    real.mkdir(mode=0o700)
    (tmp_path / "home").symlink_to(real, target_is_directory=True)
    with pytest.raises(OSError, match="symlink at"):
        shim.spool_write(str(tmp_path / "home" / "spool"), "codex", b'{"id":"x"}\n')
    answers = iter([1000, 0])
    monkeypatch.setattr(os, "geteuid", lambda: next(answers))
    shim.spool_write(str(tmp_path / "home" / "spool"), "codex", b'{"id":"x"}\n')
    assert (real / "spool" / "codex.jsonl").read_bytes() == b'{"id":"x"}\n'


@pytest.mark.parametrize("raw, want", [
    (None, 1.0), (b"", 1.0), (b"30000", 30.0), (b"100", 0.1), (b"600000", 600.0),
    (b"99", 1.0), (b"600001", 1.0), (b"-5", 1.0), (b"1e3", 1.0), (b" 500", 1.0),
    ("٣٠٠".encode(), 1.0),  # Arabic-Indic digits: not an ASCII number
    (b"9" * 5000, 1.0),
])
def test_the_give_up_budget_comes_from_aep_hook_budget_ms_within_bounds(monkeypatch, raw, want):
    import posix

    from bridges.hooks_common import shim
    env = dict(posix.environ)
    env.pop(b"AEP_HOOK_BUDGET_MS", None)
    if raw is not None:
        env[b"AEP_HOOK_BUDGET_MS"] = raw
    monkeypatch.setattr(posix, "environ", env)
    assert shim._budget_s() == want
