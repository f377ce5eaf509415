"""``aep-bridges service install``: the unit and plist rendered from the
shipped templates, the environment file parser, ``--prefix``/``--dry-run``
never touching the real system."""
from __future__ import annotations

import io
import os
import plistlib
from pathlib import Path

import pytest

from supervisor.tools.install import (
    CONFIG_TEMPLATE,
    ENV_TEMPLATE,
    _template,
    default_manager,
    install,
    plan,
    read_env_file,
    render_plist,
    render_unit,
    unreachable,
)

EXE = Path("/opt/pipx/venvs/aep-bridges/bin/aep-bridges")


def test_the_unit_keeps_everything_but_execstart():
    shipped = _template("aep-bridges.service")
    rendered = render_unit(EXE)
    assert f"ExecStart={EXE} run --config /etc/aep-bridges/config.toml" in rendered.splitlines()
    diff = [(a, b) for a, b in zip(shipped.splitlines(), rendered.splitlines(), strict=True) if a != b]
    assert diff == [  # the header's note on ExecStart follows it
        ("# As shipped, ExecStart is where a system-wide install puts the script:",
         "# ExecStart names the console script of the install that wrote this file"),
        ("#   sudo PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install .",
         "# (as shipped: /usr/local/bin/aep-bridges, a system-wide pipx install)."),
        ("ExecStart=/usr/local/bin/aep-bridges run --config /etc/aep-bridges/config.toml",
         f"ExecStart={EXE} run --config /etc/aep-bridges/config.toml")]
    for kept in ("Type=notify", "WatchdogSec=30", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "EnvironmentFile=-/etc/aep-bridges/env", "RestartPreventExitStatus=2",
                 "StateDirectoryMode=0700"):
        assert kept in rendered.splitlines()


def test_the_plist_runs_this_install_with_the_env_file(tmp_path):
    agent = plistlib.loads(render_plist(EXE, tmp_path / "env", tmp_path / "log", tmp_path / "c.toml"))
    assert agent["ProgramArguments"] == [str(EXE), "run", "--env-file", str(tmp_path / "env"),
                                         "--config", str(tmp_path / "c.toml")]
    assert agent["Label"] == "dev.aep.bridges" and agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["StandardErrorPath"] == str(tmp_path / "log")


def test_install_under_a_prefix_writes_unit_and_env_and_keeps_an_existing_env(tmp_path):
    out = io.StringIO()
    assert install("systemd", prefix=tmp_path, exe=EXE, out=out) == 0
    unit = tmp_path / "etc/systemd/system/aep-bridges.service"
    env = tmp_path / "etc/aep-bridges/env"
    assert f"ExecStart={EXE} run --config /etc/aep-bridges/config.toml" in unit.read_text()
    assert env.read_text() == ENV_TEMPLATE and (env.stat().st_mode & 0o777) == 0o600
    conf = tmp_path / "etc/aep-bridges/config.toml"
    assert conf.read_text() == CONFIG_TEMPLATE and (conf.stat().st_mode & 0o777) == 0o644
    # the shipped config file is what --config reads: TOML, nothing set, no problem
    from supervisor.config import known_settings
    from supervisor.configfile import read
    assert read(conf, known=known_settings()) == ({}, [], [])
    # each commented line, uncommented, is a setting the config file takes
    lines = [ln[1:] for ln in CONFIG_TEMPLATE.splitlines() if ln.startswith("#AEP_")]
    conf.write_text("\n".join(lines) + "\n")
    values, problems, warnings = read(conf, known=known_settings())
    assert len(values) == len(lines) and not problems and not warnings
    assert "systemctl enable --now aep-bridges" in out.getvalue()
    env.write_text("AEP_TOKEN=mine\n")
    assert install("systemd", prefix=tmp_path, exe=EXE, out=io.StringIO()) == 0
    assert env.read_text() == "AEP_TOKEN=mine\n"  # the operator's settings survive a reinstall


def test_dry_run_writes_nothing(tmp_path):
    out = io.StringIO()
    assert install("launchd", prefix=tmp_path, exe=EXE, out=out, dry_run=True) == 0
    assert list(tmp_path.iterdir()) == []
    assert "would write" in out.getvalue() and "--env-file" in out.getvalue()


def test_launchd_paths_are_in_the_home(tmp_path):
    files, then = plan("launchd", exe=EXE, prefix=tmp_path, home=Path("/Users/me"))
    assert [f.path for f in files] == [
        tmp_path / "Users/me/Library/LaunchAgents/dev.aep.bridges.plist",
        tmp_path / "Users/me/.config/aep-bridges/env",
        tmp_path / "Users/me/.config/aep-bridges/config.toml"]
    assert any("launchctl bootstrap" in t for t in then)
    with pytest.raises(ValueError):
        plan("upstart", exe=EXE)


def test_read_env_file(tmp_path):
    p = tmp_path / "env"
    p.write_text("# comment\n; also\n\nAEP_TOKEN=abc\nexport AEP_LISTEN = 127.0.0.1:9\n"
                 "AEP_X=\"quoted value\"\nAEP_Y='single'\nAEP_EMPTY=\n")
    assert read_env_file(p) == {"AEP_TOKEN": "abc", "AEP_LISTEN": "127.0.0.1:9",
                                "AEP_X": "quoted value", "AEP_Y": "single", "AEP_EMPTY": ""}
    p.write_text("AEP_OK=1\nnot a setting\n")
    with pytest.raises(ValueError, match=":2: expected KEY=VALUE"):
        read_env_file(p)


@pytest.mark.parametrize(("platform", "booted", "manager"), [
    ("linux", True, "systemd"), ("linux", False, None), ("darwin", False, "launchd"),
    ("win32", True, None), ("freebsd14", True, None)])
def test_the_default_manager_is_the_hosts(platform, booted, manager):
    assert default_manager(platform, systemd_booted=booted) == manager


def test_service_install_without_a_manager_takes_the_hosts(monkeypatch, capsys):
    from supervisor import cli
    from supervisor.tools import install as install_mod
    asked: list[str] = []
    monkeypatch.setattr(install_mod, "install",
                        lambda manager, **kw: asked.append(manager) or 0)
    # the seam, not sys.platform: what cli.main imports must see the real platform
    found: list[str | None] = ["systemd"]
    monkeypatch.setattr(install_mod, "default_manager", lambda: found[0])
    assert cli.main(["service", "install", "--dry-run"]) == 0
    found[0] = "launchd"
    assert cli.main(["service", "install", "--dry-run"]) == 0
    assert cli.main(["service", "install", "--systemd", "--dry-run"]) == 0
    assert asked == ["systemd", "launchd", "systemd"]
    found[0] = None
    assert cli.main(["service", "install", "--dry-run"]) == 2
    assert "say --systemd or --launchd" in capsys.readouterr().err
    assert asked == ["systemd", "launchd", "systemd"]  # nothing installed


def test_a_script_the_service_could_not_start_is_named(tmp_path):
    """The unit's DynamicUser and PrivateTmp=yes: a script under /tmp, one
    in a directory other users cannot enter, or one whose #! interpreter is
    such, is reported; a system path is not."""
    assert unreachable(Path("/usr/bin/env")) is None
    script = tmp_path / "aep-bridges"
    script.write_text("#!/usr/bin/env python3\n")
    script.chmod(0o755)
    assert "PrivateTmp" in (unreachable(script) or "")
    if os.geteuid() == 0 or not Path("/root").exists():
        return  # root reads /root; the rest needs a directory closed to us
    assert "not open to other users" in (unreachable(Path("/root/x")) or "")


def test_the_shebangs_interpreter_is_looked_at_too(tmp_path, monkeypatch):
    import supervisor.tools.install as install_mod
    script = Path("/usr/local/bin/aep-bridges-test-not-there")
    real_open = open

    def fake_open(path, mode="r", *a, **kw):
        if Path(path) == script:
            return io.BytesIO(b"#!/tmp/venv/bin/python\n")
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr(install_mod, "open", fake_open, raising=False)
    why = unreachable(script)
    assert why is not None and "/tmp/venv/bin/python" in why and "PrivateTmp" in why, why


def test_a_prefix_install_defaults_to_systemd_on_linux(tmp_path, monkeypatch):
    from supervisor import cli
    from supervisor.tools import install as install_mod
    asked: list[str] = []
    monkeypatch.setattr(install_mod, "install", lambda manager, **kw: asked.append(manager) or 0)
    booted: list[bool | None] = []
    real = install_mod.default_manager

    def spy(platform=None, *, systemd_booted=None):
        booted.append(systemd_booted)
        return real("linux", systemd_booted=systemd_booted)

    monkeypatch.setattr(install_mod, "default_manager", spy)
    assert cli.main(["service", "install", "--prefix", str(tmp_path), "--dry-run"]) == 0
    assert asked == ["systemd"] and booted == [True]


def test_the_steps_after_say_sudo_when_not_root(monkeypatch):
    import supervisor.tools.install as install_mod
    monkeypatch.setattr(install_mod.os, "geteuid", lambda: 1000)
    _, then = plan("systemd", exe=EXE)
    assert then[0].startswith("sudoedit /etc/aep-bridges/config.toml")
    assert "and /etc/aep-bridges/env (AEP_TOKEN)" in then[0]
    assert then[1:3] == ["sudo systemctl daemon-reload", "sudo systemctl enable --now aep-bridges"]
    monkeypatch.setattr(install_mod.os, "geteuid", lambda: 0)
    _, then = plan("systemd", exe=EXE)
    assert then[0].startswith("edit /etc/aep-bridges/config.toml") and then[1] == "systemctl daemon-reload"


def test_the_interpreter_of_pips_sh_trampoline_is_found(tmp_path):
    # what pip writes for a venv whose path has a space (or is too long for #!)
    from supervisor.tools.install import _interpreter
    script = tmp_path / "aep-bridges"
    q3 = b"'" * 3
    script.write_bytes(b"#!/bin/sh\n" + q3 + b"exec' \"/root/my venv/bin/python\" \"$0\" \"$@\"\n"
                       b"' " + q3 + b"\nimport sys\n")
    assert _interpreter(script) == Path("/root/my venv/bin/python")
    script.write_bytes(b"#!/usr/bin/env python3\n")
    assert _interpreter(script) == Path("/usr/bin/env")
    script.write_bytes(b"#!python\n")  # relative: nothing to look at
    assert _interpreter(script) is None
    script.write_bytes(b"\x7fELF\x02")
    assert _interpreter(script) is None


def test_execstart_quotes_a_path_with_a_space():
    rendered = render_unit(Path("/opt/my tools/bin/aep-bridges"))
    assert 'ExecStart="/opt/my tools/bin/aep-bridges" run --config /etc/aep-bridges/config.toml' \
        in rendered.splitlines()


def test_a_prefix_install_says_the_steps_are_the_target_systems(tmp_path):
    _, then = plan("systemd", exe=EXE, prefix=tmp_path)
    assert then[1] == f"then, on the system {tmp_path} is staged for:"
    assert then[2].endswith("systemctl daemon-reload")
