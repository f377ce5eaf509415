"""``aep-bridges service install``: the systemd unit or launchd agent for
THIS install of the console script, plus its two settings files: the
config file (``config.toml``, TOML, mode 0644, :mod:`supervisor.configfile`)
for the settings, and the environment file (``env``, mode 0600) for the
secrets only (``AEP_TOKEN``, vendor passwords), which wins over the config
file. The service runs ``aep-bridges run --config <config.toml>``.

The shipped files (``supervisor/service/aep-bridges.service``,
``supervisor/service/dev.aep.bridges.plist``) are the templates: the unit is
rewritten only in its ``ExecStart=`` line (``Type=notify``, the watchdog and
the hardening options stay as shipped); the plist's ``ProgramArguments``
become ``[<script>, run, --env-file, <env file>, --config, <config file>]`` (launchd has no
``EnvironmentFile``; the daemon reads the same ``KEY=VALUE`` file itself,
:func:`read_env_file`).

Nothing is started or enabled: the commands to do that are printed.
``--prefix DIR`` writes under ``DIR`` instead of ``/`` (or ``~`` for
launchd), ``--dry-run`` writes nothing and prints what it would write, so
the tests never touch the real system."""
from __future__ import annotations

import os
import plistlib
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Mapping

__all__ = ["install", "plan", "Planned", "read_env_file", "console_script", "render_unit",
           "render_plist", "default_manager", "unreachable", "UNIT_NAME", "PLIST_LABEL", "SYSTEMD_ENV_FILE", "SYSTEMD_UNIT_DIR",
           "ENV_TEMPLATE", "CONFIG_TEMPLATE", "SYSTEMD_CONFIG_FILE"]

UNIT_NAME = "aep-bridges.service"
PLIST_LABEL = "dev.aep.bridges"

#: the environment file both service managers read (systemd natively)
SYSTEMD_ENV_FILE = Path("/etc/aep-bridges/env")
SYSTEMD_UNIT_DIR = Path("/etc/systemd/system")

#: the config file both service managers run with (``--config``)
SYSTEMD_CONFIG_FILE = Path("/etc/aep-bridges/config.toml")

ENV_TEMPLATE = """\
# aep-bridges secrets, one KEY=VALUE a line: AEP_TOKEN and vendor passwords.
# Keep this file mode 0600. Every other setting goes in config.toml beside it
# (the values here win over the ones there).
#AEP_TOKEN=
#AEP_OPENCODE_PASSWORD=
"""

CONFIG_TEMPLATE = """\
# aep-bridges settings (TOML), by the names of the tables in the project's
# docs/configuration.md: AEP_NAME = "value", true/false, or a number. Secrets (AEP_TOKEN,
# vendor passwords) go in the environment file beside it (mode 0600), which
# wins over this file, as the process environment does. Check with
#   aep-bridges check --config <this file>
#AEP_LISTEN = "127.0.0.1:8787"
#AEP_BRIDGE_OTLP_IN = true
#AEP_BRIDGE_OPENCODE_SSE = false
#AEP_OPENCODE_URL = "http://127.0.0.1:4096"
#AEP_LOG_MAX_TOTAL_BYTES = "1G"
"""

_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def read_env_file(path: Path) -> dict[str, str]:
    """Parse a systemd-style ``EnvironmentFile``: ``KEY=VALUE`` lines,
    ``#``/``;`` comments and blank lines skipped, one pair of surrounding
    quotes removed, an optional ``export``. Raises ``ValueError`` naming the
    line for anything else, ``OSError`` when the file cannot be read."""
    out: dict[str, str] = {}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith(("#", ";")):
            continue
        m = _LINE.match(raw)
        if not m:
            raise ValueError(f"{path}:{n}: expected KEY=VALUE")
        key, value = m.group(1), m.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def default_manager(platform: str | None = None, *, systemd_booted: bool | None = None
                    ) -> str | None:
    """The service manager of this host: ``"launchd"`` on macOS,
    ``"systemd"`` on Linux booted with systemd (``/run/systemd/system``
    exists, ``sd_booted(3)``'s test), ``None`` otherwise (a container, a
    Linux with another init, any other platform: the caller asks for
    ``--systemd`` or ``--launchd``). ``platform`` (default ``sys.platform``)
    and ``systemd_booted`` are for tests."""
    platform = sys.platform if platform is None else platform
    if platform == "darwin":
        return "launchd"
    if platform.startswith("linux"):
        if systemd_booted is None:
            systemd_booted = Path("/run/systemd/system").is_dir()
        return "systemd" if systemd_booted else None
    return None


def console_script() -> Path:
    """The ``aep-bridges`` script of the running install: beside the
    interpreter (a venv, pipx's venv, ``pip install --prefix``), else the one
    on ``PATH``. Raises ``FileNotFoundError`` when neither exists (a bare
    source checkout: install the package first)."""
    import shutil
    beside = Path(sys.executable).with_name("aep-bridges")
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("aep-bridges")
    if found:
        return Path(found).resolve()
    raise FileNotFoundError("no aep-bridges console script: install the package "
                            "(pipx install . / pip install .) first")


def _template(name: str) -> str:
    return resources.files("supervisor").joinpath("service", name).read_text()


_SHIPPED_NOTE = ("# As shipped, ExecStart is where a system-wide install puts the script:\n"
                 "#   sudo PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install .\n")
_WRITTEN_NOTE = ("# ExecStart names the console script of the install that wrote this file\n"
                 "# (as shipped: /usr/local/bin/aep-bridges, a system-wide pipx install).\n")


def render_unit(exe: Path) -> str:
    """The shipped unit with ``ExecStart`` pointing at ``exe`` (and its
    header saying so, in place of the shipped file's note). Raises
    ``RuntimeError`` when the template lacks its single ``ExecStart=``."""
    # systemd splits ExecStart= at whitespace unless the word is quoted
    command = f'"{exe}"' if any(c.isspace() for c in str(exe)) else str(exe)
    text, n = re.subn(r"(?m)^ExecStart=.*$",
                      lambda _: f"ExecStart={command} run --config {SYSTEMD_CONFIG_FILE}",
                      _template(UNIT_NAME))
    if n != 1:
        raise RuntimeError("the shipped unit has no single ExecStart= line")
    return text.replace(_SHIPPED_NOTE, _WRITTEN_NOTE)


def _interpreter(script: Path) -> Path | None:
    """The interpreter a script names: its absolute ``#!`` path, or the one
    pip's ``/bin/sh`` trampoline execs (what pip writes when the venv's path
    has a space or is too long for a ``#!`` line); ``None`` for a binary, a
    relative ``#!`` or an unreadable file."""
    try:
        with open(script, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    lines = head.split(b"\n")
    if not lines[0].startswith(b"#!"):
        return None
    words = lines[0][2:].split()
    if words == [b"/bin/sh"] and len(lines) > 1:
        m = _TRAMPOLINE.match(lines[1])
        if m:
            return Path(m.group(1).decode(errors="replace"))
    if words and words[0].startswith(b"/"):
        return Path(words[0].decode(errors="replace"))
    return None


# the second line of pip's trampoline: three quotes, exec', then the quoted interpreter
_TRAMPOLINE = re.compile(rb"^'{3}exec' \"([^\"]+)\" ")


def unreachable(exe: Path) -> str | None:
    """Why the shipped unit's service could not run ``exe``, or ``None``.
    The unit runs as a ``DynamicUser`` with ``PrivateTmp=yes``: a script,
    or the interpreter it names (:func:`_interpreter`; symlinks resolved),
    under ``/tmp`` or ``/var/tmp`` is hidden from it; a script other users
    cannot read and execute, an interpreter they cannot execute, or either
    in a directory they cannot enter (``/root``, a home directory of mode
    0700), it cannot start."""
    interpreter = _interpreter(exe)
    paths = [(Path(exe), 0o005)] + ([(interpreter, 0o001)] if interpreter else [])
    for p, _ in paths:
        for shown in (p, p.resolve()):
            if shown.is_relative_to("/tmp") or shown.is_relative_to("/var/tmp"):
                return f"{shown} is under a temporary directory, which PrivateTmp=yes hides"
    for p, needs in paths:
        real = p.resolve()
        try:
            if real.stat().st_mode & needs != needs:
                what = "readable and executable" if needs == 0o005 else "executable"
                return f"{real} is not {what} by other users"
            for d in real.parents:
                if d.stat().st_mode & 0o001 == 0:
                    return (f"{d} (on the way to {real}) is not open to other users "
                            f"(mode {d.stat().st_mode & 0o777:o})")
        except OSError as e:
            return f"{real}: {e.strerror or e}"
    return None


def render_plist(exe: Path, env_file: Path, log_file: Path, config_file: Path | None = None) -> bytes:
    """The shipped launchd agent running ``exe run --env-file env_file``
    (and ``--config config_file``)."""
    plist = plistlib.loads(_template(f"{PLIST_LABEL}.plist").encode())
    plist["ProgramArguments"] = [str(exe), "run", "--env-file", str(env_file)] + (
        ["--config", str(config_file)] if config_file is not None else [])
    plist["StandardErrorPath"] = str(log_file)
    return plistlib.dumps(plist)


@dataclass(frozen=True)
class Planned:
    """One file to write: ``path`` (already under the prefix), its bytes,
    its mode, and whether an existing file is kept (the environment file:
    it holds the operator's settings)."""

    path: Path
    content: bytes
    mode: int
    keep_existing: bool = False


def plan(manager: str, *, exe: Path, prefix: Path | None = None,
         home: Path | None = None) -> tuple[list[Planned], list[str]]:
    """The files for ``manager`` (``systemd`` or ``launchd``) and the commands
    to run afterwards. ``prefix`` re-roots every path (tests, packaging)."""
    def under(p: Path) -> Path:
        return prefix / p.relative_to(p.anchor) if prefix is not None else p

    if manager == "systemd":
        env = under(SYSTEMD_ENV_FILE)
        conf = under(SYSTEMD_CONFIG_FILE)
        unit = under(SYSTEMD_UNIT_DIR / UNIT_NAME)
        files = [Planned(unit, render_unit(exe).encode(), 0o644),
                 Planned(env, ENV_TEMPLATE.encode(), 0o600, keep_existing=True),
                 Planned(conf, CONFIG_TEMPLATE.encode(), 0o644, keep_existing=True)]
        sudo = "sudo " if os.geteuid() != 0 else ""
        edit = "sudoedit" if sudo else "edit"
        then = [f"{edit} {conf} (the AEP_BRIDGE_* you want) and {env} (AEP_TOKEN)",
                f"{sudo}systemctl daemon-reload", f"{sudo}systemctl enable --now aep-bridges",
                "systemctl status aep-bridges; journalctl -u aep-bridges -f"]
        if prefix is not None:  # staged for another root: the steps are that system's
            then = [then[0], f"then, on the system {prefix} is staged for:", *then[1:]]
        return files, then
    if manager == "launchd":
        home = home or Path.home()
        env = under(home / ".config" / "aep-bridges" / "env")
        conf = under(home / ".config" / "aep-bridges" / "config.toml")
        agent = under(home / "Library" / "LaunchAgents" / f"{PLIST_LABEL}.plist")
        log = home / "Library" / "Logs" / "aep-bridges.log"
        files = [Planned(agent, render_plist(exe, env, log, conf), 0o644),
                 Planned(env, ENV_TEMPLATE.encode(), 0o600, keep_existing=True),
                 Planned(conf, CONFIG_TEMPLATE.encode(), 0o644, keep_existing=True)]
        then = [f"edit {conf} and {env}", f"launchctl bootstrap gui/$(id -u) {agent}",
                f"launchctl print gui/$(id -u)/{PLIST_LABEL}; tail -f {log}"]
        return files, then
    raise ValueError(f"unknown service manager {manager!r}")


def install(manager: str, *, prefix: Path | None = None, dry_run: bool = False,
            exe: Path | None = None, out=None, environ: Mapping[str, str] | None = None) -> int:
    """Write (or with ``dry_run`` print) the files of :func:`plan`; 0 on
    success, 1 when the console script cannot be found or a file cannot be
    written (the reason on stderr)."""
    out = out or sys.stdout
    try:
        exe = exe or console_script()
    except FileNotFoundError as e:
        print(f"aep-bridges service: {e}", file=sys.stderr)
        return 1
    files, then = plan(manager, exe=exe, prefix=prefix)
    why = unreachable(exe) if manager == "systemd" else None
    if why is not None:
        print(f"aep-bridges service: warning: the service could not start {exe}: {why} (the "
              "unit runs as a DynamicUser with PrivateTmp=yes); install system-wide first: "
              "sudo PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install . (docs/operations.md, "
              "Installing it for real)", file=sys.stderr)
    for f in files:
        if f.keep_existing and f.path.exists():
            print(f"keep   {f.path} (exists)", file=out)
            continue
        if dry_run:
            print(f"would write {f.path} (mode {f.mode:o}):", file=out)
            print(f.content.decode(), file=out)
            continue
        try:
            f.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.path.with_name(f.path.name + ".tmp")
            tmp.write_bytes(f.content)
            os.chmod(tmp, f.mode)
            os.replace(tmp, f.path)
        except OSError as e:
            print(f"aep-bridges service: cannot write {f.path}: {e.strerror or e}", file=sys.stderr)
            return 1
        print(f"wrote  {f.path}", file=out)
    print("then:", file=out)
    for step in then:
        print(f"  {step}", file=out)
    return 0
