"""The production install, as a user does it: ``pip install .`` into a
fresh environment puts ``aep-bridges`` on that environment's PATH;
``aep-bridges service install --systemd --prefix`` writes a unit whose
``ExecStart`` is that script, and ``systemd-analyze verify`` (Debian's
``systemd``) accepts it; ``aep-bridges check`` beside a running daemon says
the ports are the daemon's and suggests ``--no-ports``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.daemon import ROOT, console_script, run_daemon
from tests.support.net import free_port
from tests.support.system import require


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """``pip install --no-deps .`` (a built wheel, not editable) into a new
    venv whose dependencies come from this one's site-packages (a ``.pth``
    line, so the test does not download the world again). Returns the venv's
    ``bin/aep-bridges``."""
    venv = tmp_path_factory.mktemp("prod") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "dev-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    build = tmp_path_factory.mktemp("src")
    src = shutil.copytree(ROOT, build / "src", ignore=shutil.ignore_patterns(
        ".venv", ".git", "tests", "benchmarks", "*.egg-info", "build", "__pycache__"))
    # the new venv's own interpreter runs pip (importable through the .pth),
    # so the script's shebang is that venv's python, as with pipx
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                          "--disable-pip-version-check", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    exe = venv / "bin" / "aep-bridges"
    assert exe.is_file() and os.access(exe, os.X_OK), sorted(p.name for p in (venv / "bin").iterdir())
    return exe


def test_the_installed_script_runs_from_the_install_not_the_checkout(installed, tmp_path):
    out = subprocess.run([str(installed.with_name("python")), "-c",
                          "import supervisor, sys; print(supervisor.__file__)"],
                         capture_output=True, text=True, cwd=tmp_path, check=True)
    assert str(installed.parents[1]) in out.stdout and str(ROOT) not in out.stdout
    r = subprocess.run([str(installed), "check", "--no-ports"], capture_output=True, text=True,
                       cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0 and "configuration ok" in r.stdout, r.stderr


def test_service_install_writes_a_unit_systemd_accepts(installed, tmp_path):
    analyze = require("systemd-analyze")
    r = subprocess.run([str(installed), "service", "install", "--systemd", "--prefix", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    unit = tmp_path / "etc/systemd/system/aep-bridges.service"
    lines = unit.read_text().splitlines()
    assert f"ExecStart={installed} run --config /etc/aep-bridges/config.toml" in lines
    for kept in ("Type=notify", "WatchdogSec=30", "EnvironmentFile=-/etc/aep-bridges/env",
                 "DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes"):
        assert kept in lines
    env_file = tmp_path / "etc/aep-bridges/env"
    assert env_file.is_file() and (env_file.stat().st_mode & 0o777) == 0o600
    assert f"wrote  {unit}" in r.stdout and "systemctl enable --now aep-bridges" in r.stdout
    v = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and not v.stderr.strip(), v.stderr
    # the check can fail: a unit whose ExecStart is not executable is refused
    broken = tmp_path / "broken" / "aep-bridges.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace(str(installed), str(tmp_path / "nope")))
    v = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert v.returncode != 0 and "not executable" in v.stderr


def test_the_env_file_feeds_run_and_check(installed, tmp_path):
    env_file = tmp_path / "env"
    env_file.write_text("AEP_LOG_LEVEL=loud\n")
    r = subprocess.run([str(installed), "check", "--no-ports", "--env-file", str(env_file)],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin",
                                                            "HOME": str(tmp_path)})
    assert r.returncode == 2 and "AEP_LOG_LEVEL='loud'" in r.stderr
    r = subprocess.run([str(installed), "check", "--env-file", str(tmp_path / "missing")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--env-file" in r.stderr


def test_check_beside_a_running_daemon_names_it(tmp_path):
    with run_daemon(tmp_path, {"AEP_BRIDGE_OTLP_IN": "0"}, healthy=True) as d:
        env = {k: v for k, v in d.env.items()}
        # the running daemon of this same configuration: ok with notes, as doctor says
        r = subprocess.run(console_script() + ["check"], capture_output=True, text=True,
                           env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "note: AEP_LISTEN=" in r.stdout and "held by the running aep-bridges daemon" \
            in r.stdout, r.stdout
        # another configuration (other bridges) on its port and state directory: problems
        r = subprocess.run(console_script() + ["check"], capture_output=True, text=True,
                           env={**env, "AEP_BRIDGE_OTLP_IN": "1"}, timeout=60)
        assert r.returncode == 2
        assert "held by the running aep-bridges daemon" in r.stderr, r.stderr
        assert "not this configuration's" in r.stderr and "aep-bridges check --no-ports" in r.stderr
        assert f"in use by aep-bridges pid {d.proc.pid}" in r.stderr, r.stderr
        r = subprocess.run(console_script() + ["check", "--no-ports"], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr


def test_relay_beside_a_running_daemon_names_it(tmp_path):
    # issue 29: run and check named the holder of a taken port, relay did not
    with run_daemon(tmp_path, {"AEP_BRIDGE_OTLP_IN": "0"}, healthy=True) as d:
        r = subprocess.run(console_script() + ["relay"], capture_output=True, text=True,
                           env=dict(d.env), timeout=60)
        assert r.returncode == 2
        assert "held by the running aep-bridges daemon" in r.stderr, r.stderr


def test_run_and_check_from_a_config_file(tmp_path):
    # issue 29: settings from a TOML file with the environment's names; the
    # environment wins; check says where each one came from
    conf = tmp_path / "config.toml"
    conf.write_text('AEP_BRIDGE_OTLP_IN = false\nAEP_BUFFER = 77\nAEP_LOG_LEVEL = "info"\n')
    with run_daemon(tmp_path, {"AEP_LOG_LEVEL": "warning"}, args=("run", "--config", str(conf)),
                    healthy=True) as d:
        assert d.healthz()["bridges"] == {}  # the file switched the default bridge off
        env = {k: v for k, v in d.env.items() if k != "AEP_LISTEN"}
        r = subprocess.run(console_script() + ["check", "--no-ports"], capture_output=True,
                           text=True, env={**env, "AEP_CONFIG": str(conf)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"AEP_BUFFER=77  (config file {conf})" in r.stdout
    assert "AEP_LOG_LEVEL=warning  (environment)" in r.stdout
    assert "bridges none" in r.stdout
    conf.write_text('AEP_BUFER = 77\nAEP_BUFFER = "many"\n')
    r = subprocess.run(console_script() + ["check", "--no-ports", "--config", str(conf)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert "AEP_BUFER (in" in r.stderr and "did you mean AEP_BUFFER?" in r.stderr
    assert "AEP_BUFFER='many'" in r.stderr  # the environment's own validation
    r = subprocess.run(console_script() + ["check", "--config", str(tmp_path / "none.toml")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "none.toml" in r.stderr


def test_doctor_names_each_failure_with_its_fix(tmp_path):
    # issue 29: a vendor that does not answer, a port someone else holds, a
    # port our running daemon holds, a vendor that answers
    import socket

    dead = f"http://127.0.0.1:{free_port()}"
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    try:
        with run_daemon(tmp_path, {"AEP_BRIDGE_OTLP_IN": "0"}, healthy=True) as d:
            base = {k: v for k, v in d.env.items()}
            env = {**base, "AEP_BRIDGE_OPENCODE_SSE": "1", "AEP_OPENCODE_URL": dead,
                   "AEP_BRIDGE_OTLP_IN": "1", "AEP_OTLP_GRPC_LISTEN": f"127.0.0.1:{taken}",
                   "AEP_OTLP_HTTP_LISTEN": "off",
                   "AEP_BRIDGE_AGUI": "1", "AEP_AGUI_UPSTREAM": d.url,
                   "AEP_AGUI_LISTEN": f"127.0.0.1:{free_port()}"}
            r = subprocess.run(console_script() + ["doctor"], capture_output=True, text=True,
                               env=env, timeout=60)
            ok = subprocess.run(console_script() + ["doctor"], capture_output=True, text=True,
                                env=base, timeout=60)
    finally:
        squatter.close()
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()

    def after(text: str) -> str:
        i = next(i for i, line in enumerate(lines) if text in line)
        return lines[i + 1]
    assert f"FAIL  opencode_sse: {dead} unreachable (ConnectError)" in lines
    assert "start `opencode serve` there, or point AEP_OPENCODE_URL" in after("opencode_sse:")
    assert f"FAIL  otlp_in.codex grpc 127.0.0.1:{taken}: in use by another program" in lines
    assert f"sport = :{taken}" in after(f"127.0.0.1:{taken}")
    assert any(line.startswith("ok    AEP_LISTEN") and "held by the running aep-bridges daemon"
               in line for line in lines), lines
    assert any(line.startswith(f"ok    agui upstream: {d.url} answers") for line in lines), lines
    assert r.stdout.rstrip().endswith("2 to fix")
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith("all good"), ok.stdout
