"""Every vendor the selected tests need, installed into the vendor cache
BEFORE the suite runs, one progress line per package (issue 29, "a quick
loop for contributors").

Without this step the first test that needs a vendor installs it inside
the test (minutes of silence in a fresh checkout, and with pytest-xdist
several workers waiting on the same file lock). :func:`prepare` is called
by ``tests/conftest.py``'s ``pytest_sessionstart`` in the controller process
(with ``-n``: before any worker starts); ``python -m tests.support.prepare
[PATH...]`` runs it alone. Each line reads::

    vendor openai/codex 0.171.0: cached (0.0 s)
    vendor openhands-agent-server 1.58.2: installing (pip into its own venv) ...
    vendor openhands-agent-server 1.58.2: installed (71.3 s)

A vendor that cannot be installed here is reported on its line and left to
the tests that need it: they skip loudly (registry unreachable, npm or
Python 3.12 missing) or fail (a wrong pin), exactly as without this step.
The install functions are the tests' own (:mod:`tests.support.vendors`,
file-locked), so this step and a test never install the same thing twice.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from tests.support import vendors

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Vendor:
    """One package of the vendor cache: ``install`` installs it (or returns at
    once when present), ``cached`` says whether it is present without
    installing, ``how`` names the installer for the progress line, ``needed_by``
    the test directories (relative to the checkout) that use it."""
    name: str
    version: str
    how: str
    install: Callable[[], object]
    cached: Callable[[], bool]
    needed_by: tuple[str, ...]


def _npm(name: str, version: str, *needed_by: str) -> Vendor:
    def cached() -> bool:
        return (vendors.cache_root() / vendors.entry_name(name, version) / vendors.MARKER).is_file()
    return Vendor(name, version, "npm", lambda: vendors.npm_install(name, version),
                  cached, needed_by)


def _acp_sdist() -> Vendor:
    from tests.support import acp
    return Vendor(acp.ACP_PY + " (sdist goldens)", acp.ACP_PY_VERSION, "pip download",
                  acp.golden_dir, lambda: acp.golden_path().is_dir(),
                  ("tests/unit/acp", "tests/integration/acp"))


def _openhands() -> Vendor:
    from tests.support import openhands as oh

    def install() -> object:
        try:
            return oh.install_agent_server()
        except oh.VendorUnavailable as e:
            vendors.skip_loudly(str(e))
            raise  # unreachable: skip_loudly raises

    def cached() -> bool:
        return (oh.install_dir() / oh.MARKER).is_file()
    return Vendor(oh.PACKAGE, oh.OH_VERSION, "pip into its own venv", install, cached,
                  ("tests/integration/openhands",))


def all_vendors() -> list[Vendor]:
    """The cache's packages, cheapest first. The pins are the support
    modules' own constants (one place each)."""
    from tests.support import acp, agui, claude_code, codex, hardening, kimi
    from tests.support.opencode import KILOCODE, OPENCODE
    node_user = ("tests/integration/hardening", "tests/integration/jetstream",
                 "tests/integration/kimi_web")
    return [
        _acp_sdist(),
        _npm(acp.ACP_TS, acp.ACP_TS_VERSION, "tests/integration/acp", "tests/integration/hardening"),
        _npm("@ag-ui/client", agui.CLIENT_VERSION, "tests/integration/agui",
             "tests/integration/hardening"),
        _npm(hardening.NODE_PACKAGE, hardening.NODE_VERSION, *node_user),
        _npm(kimi.KIMI_PACKAGE, kimi.KIMI_VERSION, "tests/integration/kimi_web"),
        _npm(codex.CODEX_PACKAGE, codex.CODEX_VERSION, "tests/integration/otlp_in",
             "tests/integration/hooks", "tests/integration/hooks_live",
             "tests/integration/hookinstall", "tests/integration/supervisor"),
        _npm(claude_code.CLAUDE_CODE_PACKAGE, claude_code.CLAUDE_CODE_VERSION,
             "tests/integration/hooks", "tests/integration/hooks_live",
             "tests/integration/hookinstall"),
        _npm(OPENCODE.package, OPENCODE.version, "tests/integration/sse_common",
             "tests/integration/console", "tests/integration/supervisor"),
        _npm(KILOCODE.package, KILOCODE.version, "tests/integration/sse_common"),
        _openhands(),
    ]


def _rel(arg: str) -> str | None:
    """A pytest argument as a checkout-relative POSIX path (``None``: not a
    path, e.g. an option or a ``-k`` expression)."""
    path = arg.split("::", 1)[0]
    if not path or path.startswith("-"):
        return None
    p = Path(path)
    p = (p if p.is_absolute() else Path.cwd() / p).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return None


def needed(paths: Sequence[str], candidates: Iterable[Vendor] | None = None) -> list[Vendor]:
    """The vendors the tests under ``paths`` use (pytest's positional
    arguments: directories, files, node ids). No path, or a path that is not
    inside the checkout's ``tests``, selects every vendor: collection may
    reach any test."""
    pool = list(all_vendors() if candidates is None else candidates)
    rels = [_rel(a) for a in paths]
    if not rels or any(r is None or not r.startswith("tests") for r in rels):
        return pool

    def under(a: str, b: str) -> bool:  # a is b or inside it
        return a == b or a.startswith(b.rstrip("/") + "/")
    return [v for v in pool
            if any(under(r, d) or under(d, r) for r in rels if r for d in v.needed_by)]


def prepare(paths: Sequence[str], say: Callable[[str], None] = print) -> list[tuple[str, str]]:
    """Install (or verify) every vendor :func:`needed` by ``paths``, one
    ``say`` line per package (two while installing: before and after).
    Returns ``[(name, outcome)]``, outcome ``cached`` / ``installed`` /
    ``unavailable: ...`` / ``failed: ...``; never raises for one package."""
    import pytest
    out: list[tuple[str, str]] = []
    for v in needed(paths):
        label = f"vendor {v.name} {v.version}"
        t0 = time.monotonic()
        if v.cached():
            say(f"{label}: cached ({time.monotonic() - t0:.1f} s)")
            out.append((v.name, "cached"))
            continue
        say(f"{label}: installing ({v.how}) ...")
        try:
            v.install()
            outcome = "installed"
        except pytest.skip.Exception as e:
            outcome = f"unavailable: {e.msg}"
        except Exception as e:  # reported; the tests that need it fail on it
            outcome = f"failed: {type(e).__name__}: {str(e)[-400:]}"
        say(f"{label}: {outcome} ({time.monotonic() - t0:.1f} s)")
        out.append((v.name, outcome))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.prepare [PATH...]``: exit 1 when a package failed."""
    got = prepare(sys.argv[1:] if argv is None else argv,
                  say=lambda line: print(line, flush=True))
    return 1 if any(o.startswith("failed") for _, o in got) else 0


if __name__ == "__main__":
    sys.exit(main())
