"""The command shim: ``aep-bridges hook <agent> [--daemon URL] [--token-file F] [--spool DIR]``.

A vendor (Claude Code, Codex) runs it for each hook moment: it reads the
vendor's hook JSON on stdin, POSTs it to ``<daemon>/hooks/<agent>``, prints
the daemon's decision JSON on stdout and exits 0 (the wire contract,
``hooks-contract.md`` sections 2 and 3; issue 27).

Fail-open, always exit 0 (exit 2 means "block" to both vendors): when the
daemon is down (connection refused), silent for 1 s (connect + response
headers) or answers anything but 200 or 400, the shim prints nothing and
appends the moment to the spool, ``<spool dir>/<agent>.jsonl``, which the
bridge ingests when it runs. After response headers with ``AEP-Hold-Ms: N``
(a held permission moment) the body is waited for up to N ms + 2 s;
without it, up to 1 s. A body that is not a JSON object is not printed.
Nothing is ever written to stdout but a decision; problems are one line on
stderr, never a traceback.

Its start-up is on the agent's critical path, so this module imports only
what ``python -S -E`` has already loaded (``posix``, ``sys``, ``time``; not
even ``os``, which only ``site`` loads) plus the ``_socket`` extension
(``socket.py`` would pull in ``enum`` and ``selectors``); ``os``, ``json``
and ``fcntl`` are imported only off the fast path (a decision other than
``{}``; spooling). The installer runs it with ``-S -E`` from its cached
bytecode (:func:`supervisor.hookinstall.common.shim_command`; measured in
``benchmarks/hook_shim_bench.py``); ``aep-bridges hook`` reaches it before
the console script imports anything else (``supervisor/cli.py``)."""
import _socket
import posix
import sys
import time

__all__ = ["CONNECT_BUDGET_S", "DEFAULT_DAEMON", "HOLD_GRACE_S", "MAX_RESPONSE",
           "default_spool_dir", "main", "spool_line", "spool_write"]

#: the daemon the shim posts to without ``--daemon`` (``AEP_LISTEN``'s default)
DEFAULT_DAEMON = "http://127.0.0.1:8787"
#: seconds for connect + request + response headers before the shim gives up
CONNECT_BUDGET_S = 1.0
#: seconds past ``AEP-Hold-Ms`` the shim waits for a held body
HOLD_GRACE_S = 2.0
#: the largest response the shim reads (a decision is a few hundred bytes)
MAX_RESPONSE = 8 << 20
_USAGE = "usage: aep-bridges hook <agent> [--daemon URL] [--token-file F] [--spool DIR]"


class _GiveUp(Exception):
    """The daemon did not answer in time (or at all): spool the moment."""


class _Refused(_GiveUp):
    """The daemon refused the hook's credentials (HTTP 401/403): spooled
    like any give-up, but said as what it is (a token mismatch), since the
    spooled moment is later ingested unheld: the gate was bypassed."""


def _warn(msg: str) -> None:
    try:
        posix.write(2, f"aep-bridges hook: {msg}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def default_spool_dir(env: dict[str, str]) -> str:
    """``${AEP_STATE_DIR:-${XDG_STATE_HOME:-~/.local/state}/aep-bridges}/hooks-spool``
    (the state directory rule of ``bridges.core.paths.state_dir``, restated
    here because the shim imports nothing of the package)."""
    import os
    base = env.get("AEP_STATE_DIR") or ""
    if base:
        base = os.path.expanduser(base)
    else:
        xdg = env.get("XDG_STATE_HOME") or ""
        if not os.path.isabs(xdg):
            xdg = os.path.join(env.get("HOME", "~"), ".local", "state")
        base = os.path.join(os.path.expanduser(xdg), "aep-bridges")
    return os.path.join(base, "hooks-spool")


def _parse_args(argv: list[str]) -> tuple[str, str, str | None, str | None]:
    """``(agent, daemon url, token file, spool dir)``; ``ValueError`` on a bad line."""
    agent, daemon, token_file, spool = None, DEFAULT_DAEMON, None, None
    it = iter(argv)
    for arg in it:
        name, eq, val = arg.partition("=")
        if name in ("--daemon", "--token-file", "--spool"):
            if not eq:
                val = next(it, None)  # type: ignore[assignment]
                if val is None:
                    raise ValueError(f"{name} needs a value")
            if name == "--daemon":
                daemon = val
            elif name == "--token-file":
                token_file = val
            else:
                spool = val
        elif arg.startswith("-") or agent is not None:
            raise ValueError(f"unexpected argument {arg!r}")
        else:
            agent = arg
    if not agent or "/" in agent or agent.startswith("."):
        raise ValueError("an agent id is required (claude-code, codex)")
    return agent, daemon, token_file, spool


def _split_url(url: str) -> tuple[bool, str, int, str, str]:
    """``(tls, host, port, host header, path prefix)`` of an ``http(s)://`` URL."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"--daemon {url!r}: expected http://HOST:PORT")
    hostport, _, path = rest.partition("/")
    tls = scheme == "https"
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port_s = tail[1:] if tail.startswith(":") else ""
    elif ":" in hostport:
        host, _, port_s = hostport.rpartition(":")
    else:
        host, port_s = hostport, ""
    if not host:
        raise ValueError(f"--daemon {url!r}: no host")
    port = int(port_s) if port_s else (443 if tls else 80)
    prefix = "/" + path.strip("/") if path.strip("/") else ""
    return tls, host, port, hostport, prefix


class _Conn:
    """One HTTP/1.1 exchange on a raw socket with a deadline per phase."""

    def __init__(self, sock, deadline: float) -> None:
        self.sock, self.deadline, self.buf = sock, deadline, b""

    def _fill(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline")
        self.sock.settimeout(left)
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        self.buf += data
        if len(self.buf) > MAX_RESPONSE:
            raise ValueError("response too large")

    def until(self, sep: bytes) -> bytes:
        while (i := self.buf.find(sep)) < 0:
            self._fill()
        out, self.buf = self.buf[:i], self.buf[i + len(sep):]
        return out

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self) -> bytes:
        try:
            while True:
                self._fill()
        except ConnectionError:
            pass
        out, self.buf = self.buf, b""
        return out


def _connect(tls: bool, host: str, port: int, deadline: float):
    err: Exception = ConnectionError(f"{host}:{port}: no address")
    # an ASCII host as bytes: a str would load the idna codec (and re, enum) first
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    for family, kind, proto, _, addr in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.connect(addr)
            if tls:  # a remote daemon behind TLS: off the loopback fast path
                import socket
                import ssl
                sock = ssl.create_default_context().wrap_socket(
                    socket.socket(fileno=sock.detach()), server_hostname=host)
            return sock
        except OSError as e:
            sock.close()
            err = e
    raise err


def _budget_s() -> float:
    """The give-up budget in seconds: :data:`CONNECT_BUDGET_S`, or
    ``AEP_HOOK_BUDGET_MS`` (an integer, 100..600000 ms) for a host so loaded
    that the daemon cannot answer within a second; anything else is ignored."""
    raw = posix.environ.get(b"AEP_HOOK_BUDGET_MS", b"")
    if raw.isdigit() and len(raw) <= 6 and 100 <= int(raw) <= 600_000:
        return int(raw) / 1000
    return CONNECT_BUDGET_S


def _exchange(url: str, agent: str, body: bytes, token: str | None,
              hook_id: str) -> tuple[int, bytes | None]:
    """POST ``body``; ``(status, decision body or None)``. Raises ``_GiveUp``
    when the daemon is unreachable or silent past :func:`_budget_s`
    (:data:`CONNECT_BUDGET_S` unless ``AEP_HOOK_BUDGET_MS`` says otherwise)."""
    tls, host, port, hostport, prefix = _split_url(url)
    budget = _budget_s()
    deadline = time.monotonic() + budget
    head = (f"POST {prefix}/hooks/{agent} HTTP/1.1\r\nHost: {hostport}\r\n"
            "Content-Type: application/json\r\nX-AEP-Hook-Transport: command\r\n"
            f"X-AEP-Hook-Id: {hook_id}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n")
    if token:  # signed, never the token itself (bridges/core/signed.py)
        digest = _sha256(body).hexdigest()
        t = int(time.time())
        mac = _hmac(token, f"aep-hook-v1\n{t}\n{hook_id}\n{prefix}/hooks/{agent}\n{digest}")
        head += (f"X-AEP-Hook-Digest: {digest}\r\n"
                 f"Authorization: AEP-HMAC-SHA256 {t}:{mac}\r\n")
    try:
        sock = _connect(tls, host, port, deadline)
    except OSError as e:
        raise _GiveUp(f"{hostport}: {e.strerror or type(e).__name__}") from None
    try:
        conn = _Conn(sock, deadline)
        try:
            sock.sendall(head.encode("latin-1") + b"\r\n" + body)
            lines = conn.until(b"\r\n\r\n").decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
        except (OSError, ValueError, IndexError) as e:
            raise _GiveUp(f"{hostport}: no answer ({type(e).__name__})") from None
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if status in (401, 403):  # before the proof: a daemon that refuses us cannot prove
            raise _Refused(f"HTTP {status}")
        if status not in (200, 400):  # 5xx; 404 before the bridge mounts
            raise _GiveUp(f"{hostport}: HTTP {status}")
        if token and headers.get("aep-proof") != _hmac(
                token, f"aep-hook-daemon-v2\n{hook_id}\n{status}\n{headers.get('aep-hold-ms', '')}"):
            # not the daemon (a process squatting its port): nothing it says is printed
            raise _GiveUp(f"{hostport}: the listener did not prove it holds AEP_TOKEN")
        if status != 200:
            return status, None
        hold = headers.get("aep-hold-ms")
        try:
            wait = int(hold) / 1000 + HOLD_GRACE_S if hold else budget
        except ValueError:
            wait = budget
        conn.deadline = time.monotonic() + wait
        try:
            body = _read_body(conn, headers)
        except (OSError, ValueError) as e:  # the daemon has the moment: nothing to spool
            _warn(f"{hostport}: the answer did not arrive ({type(e).__name__}); no decision")
            return status, None
        if token:  # "<proof>\n<decision>": the decision is the daemon's, unchanged
            proof, _, decision = body.partition(b"\n")
            want = _hmac(token, f"aep-hook-answer-v1\n{hook_id}\n".encode() + decision)
            if proof.decode("latin-1") != want:
                _warn(f"{hostport}: the answer's proof does not match; no decision")
                return status, None
            body = decision
        return status, body
    finally:
        sock.close()


def _sha256(data: bytes):
    try:  # CPython 3.11; 3.12 renamed it (both load in well under a millisecond)
        from _sha256 import sha256
    except ImportError:
        from _sha2 import sha256
    return sha256(data)


def _hmac(token: str, msg: "str | bytes") -> str:
    """HMAC-SHA256 (RFC 2104) of ``msg`` under ``token``, hex: the
    :mod:`hmac` module is off limits on the fast path (it imports
    ``_hashlib``, OpenSSL: milliseconds); a test pins it to :mod:`hmac`."""
    key = token.encode("utf-8")
    if len(key) > 64:
        key = _sha256(key).digest()
    key = key + bytes(64 - len(key))
    if isinstance(msg, str):
        msg = msg.encode("utf-8", "surrogateescape")
    inner = _sha256(bytes(b ^ 0x36 for b in key) + msg)
    return _sha256(bytes(b ^ 0x5C for b in key) + inner.digest()).hexdigest()


def _read_body(conn: _Conn, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while size := int(conn.until(b"\r\n").split(b";", 1)[0], 16):
            parts.append(conn.exact(size))
            conn.exact(2)
        return b"".join(parts)
    if "content-length" in headers:
        return conn.exact(int(headers["content-length"]))
    return conn.rest()


def _decision(body: bytes) -> bytes | None:
    """``body`` when it is a JSON object (what the vendor reads), else ``None``."""
    text = body.strip()
    if text in (b"", b"{}"):  # "no decision", the common answer: no json import
        return text
    import json
    try:
        ok = isinstance(json.loads(text), dict)
    except ValueError:
        ok = False
    return text if ok else None


def spool_line(hook_id: str, agent: str, raw: bytes, now_ms: int) -> bytes:
    """One spool line (contract section 3): ``{"id", "agent", "spooled_at_ms",
    "payload"}``; ``payload`` is the vendor's JSON object, or the raw stdin
    text (undecodable bytes replaced) when it is not one. ASCII, ends in ``\\n``."""
    import json
    payload: object
    try:
        payload = json.loads(raw)
        if not isinstance(payload, dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError):  # too deep to decode: kept as text, not lost
        payload = raw.decode("utf-8", "replace")
    return (json.dumps({"id": hook_id, "agent": agent, "spooled_at_ms": now_ms,
                        "payload": payload}, separators=(",", ":")) + "\n").encode("ascii")


def _open_dir_at(parent: int, name: str, path: str, last: bool) -> int:
    """``name`` in the directory ``parent`` opened ``O_DIRECTORY |
    O_NOFOLLOW``, made first when missing (``0700`` when ``last``, else as
    ``os.makedirs`` makes a parent); ``path``: the path so far, for the
    message. A symlink there is followed only when root owns it, this user
    is not root and it is not ``last``: a system layout's (``/home ->
    /var/home``, macOS' ``/tmp``), planted by no one who could not write
    the target anyway. Raises ``OSError``."""
    import os
    import stat
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        try:
            os.mkdir(name, 0o700 if last else 0o777, dir_fd=parent)
        except FileExistsError:
            pass  # made meanwhile (or a symlink planted: the open below sees it)
        except OSError as e:
            raise OSError(f"the spool directory cannot be made: {e.strerror or e}") from None
    except OSError:
        pass
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as e:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or not stat.S_ISLNK(st.st_mode):
            raise OSError(f"the spool directory cannot be opened: {e.strerror or e}") from None
        if last or st.st_uid != 0 or os.geteuid() == 0:
            raise OSError(f"the spool directory's path has a symlink at {path} "
                          "(refused, never followed)") from None
        return os.open(name, flags & ~os.O_NOFOLLOW, dir_fd=parent)


def _walk_dir(spool_dir: str) -> int:
    """``spool_dir`` opened one component at a time from ``/`` (or the
    working directory) with :func:`_open_dir_at`, each missing one made on
    the way: a symlink anywhere in the path is refused, not only at its
    last component (a sixth outside attack on issue 25: ``LINK/.``,
    ``LINK/./`` and ``LINK/sub`` followed the link). A few system calls a
    component; only when spooling."""
    import os
    parts = [p for p in spool_dir.split("/") if p and p != "."]
    absolute = spool_dir.startswith("/")
    fd = os.open("/" if absolute else ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = "/" if absolute else ""
    try:
        for i, name in enumerate(parts):
            path = os.path.join(path, name)
            nxt = _open_dir_at(fd, name, path, i == len(parts) - 1)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _spool_dir_fd(spool_dir: str) -> int:
    """The spool directory opened (``O_DIRECTORY``, never through a symlink
    anywhere in its path: :func:`_walk_dir`, which also makes it) once it
    passes the rules ssh holds its own directories to: a real directory,
    owned by this user, not group- or world-writable (else anyone who may
    write there could rename our file away or plant one; a ``--spool``
    symlink would send the moments wherever it points). Raises ``OSError``
    saying which rule failed."""
    import os
    import stat
    fd = _walk_dir(spool_dir)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user"
    elif st.st_mode & 0o022:
        problem = f"is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}; chmod 700 it)"
    else:
        return fd
    os.close(fd)
    raise OSError(f"the spool directory {problem} (refused)")


def spool_write(spool_dir: str, agent: str, line: bytes, attempts: int = 8) -> str:
    """Append ``line`` to ``<spool_dir>/<agent>.jsonl`` under ``flock`` and
    return the path. The file may be renamed away for ingestion between our
    ``open`` and our lock: the inode check sees it and we reopen, so the line
    lands in the file the ingester has not taken. A symlink or anything but
    a regular file there is refused, never followed or waited on; so is a
    directory that is a symlink, another user's, or group- or
    world-writable (:func:`_spool_dir_fd`; the file is opened relative to
    the directory checked, so it cannot be swapped between). Raises
    ``OSError``."""
    import fcntl
    import os
    import stat
    path = os.path.join(spool_dir, f"{agent}.jsonl")
    name = f"{agent}.jsonl"
    dir_fd = _spool_dir_fd(spool_dir)
    try:
        for _ in range(attempts):
            # no symlink (it would append anywhere we may write), no FIFO wait
            # (O_NONBLOCK; ENXIO without a reader), a regular file only
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=dir_fd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(f"{path}: not a regular file")
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                mine = os.fstat(fd)
                if (mine.st_ino, mine.st_dev) != (st.st_ino, st.st_dev):
                    continue  # taken for ingestion after our open
                view = memoryview(line)
                while view:  # one write unless the disk is full; the lock keeps it whole
                    view = view[os.write(fd, view):]
                return path
            finally:
                os.close(fd)  # releases the lock
    finally:
        os.close(dir_fd)
    raise OSError(f"{path}: replaced {attempts} times while appending")


def _read_stdin() -> bytes:
    chunks = []
    try:
        while chunk := posix.read(0, 1 << 20):
            chunks.append(chunk)
    except OSError:
        pass
    return b"".join(chunks)


def _write_stdout(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[posix.write(1, view):]


def _run(argv: list[str]) -> int:
    try:
        agent, daemon, token_file, spool = _parse_args(argv)
    except ValueError as e:
        _warn(f"{e}\n{_USAGE}")
        return 0
    body = _read_stdin()
    raw_token = posix.environ.get(b"AEP_TOKEN")  # os.environ would import os
    token = raw_token.decode("utf-8", "replace") if raw_token else None
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip() or None
        except OSError as e:
            _warn(f"--token-file {token_file}: {e.strerror or e}")
    hook_id = posix.urandom(16).hex()
    try:
        status, answer = _exchange(daemon, agent, body, token, hook_id)
    except _GiveUp as e:
        import os
        spool_dir = spool or default_spool_dir(dict(os.environ))
        why = (f"the daemon refused the hook's credentials ({e}): the agent's AEP_TOKEN / "
               "--token-file does not match the daemon's") if isinstance(e, _Refused) \
            else f"daemon unavailable ({e})"
        try:
            where = spool_write(spool_dir, agent,
                                spool_line(hook_id, agent, body, int(time.time() * 1000)))
            _warn(f"{why}; spooled to {where}")
        except OSError as oe:
            _warn(f"{why}; could not spool to {spool_dir}: {oe.strerror or oe}")
        return 0
    except ValueError as e:  # a bad --daemon
        _warn(str(e))
        return 0
    if status != 200:  # 400: the daemon logged the moment and has no decision for it
        _warn(f"daemon answered HTTP {status}; no decision")
        return 0
    if answer is not None:
        decision = _decision(answer)
        if decision is None:
            _warn("the daemon's answer is not a JSON object; no decision")
        elif decision and token is None and decision.strip() != b"{}":
            # a daemon decides only with AEP_TOKEN set (its control gate needs one), and
            # without a token the shim cannot tell the daemon from a process holding its
            # port: a decision then is never the agent's
            _warn("a decision came back, but with no AEP_TOKEN (or --token-file) the daemon "
                  "makes none (control needs a token) and its listener is unproven; ignored")
        elif decision:
            _write_stdout(decision)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The shim's whole life; returns 0 whatever happens (a daemon problem
    must never block the agent) and prints no traceback."""
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except BaseException as e:  # noqa: BLE001 - fail-open is the contract
        _warn(f"internal error, no decision: {type(e).__name__}: {e}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
