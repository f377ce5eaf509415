"""The client commands and ``doctor``/``check`` against a real daemon started
from a config file (``aep-bridges run --config FILE``) on free ports: ``tail``
and ``respond`` find it (and its token) through ``--config`` or
``AEP_CONFIG`` alone; ``doctor`` fails on a state directory another daemon
holds, with ``run``'s own words, and says ok for the daemon of its own
configuration; ``check`` is ok (with notes) beside the running daemon of the
same configuration, and refuses with ``run``'s words beside another one."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import DaemonProcess, console_script
from tests.support.net import free_ports

TOKEN = "cli-config-token-0123456789"
SESSION = "ses_cliconfig0001"


def write_config(path: Path, state: Path, ports: tuple[int, int, int], **more: str) -> Path:
    listen, grpc, http = ports
    lines = [f'AEP_LISTEN = "127.0.0.1:{listen}"',
             f'AEP_OTLP_GRPC_LISTEN = "127.0.0.1:{grpc}"',
             f'AEP_OTLP_HTTP_LISTEN = "127.0.0.1:{http}"',
             f'AEP_STATE_DIR = "{state}"', f'AEP_TOKEN = "{TOKEN}"',
             'AEP_LOG_FORMAT = "json"', 'AEP_LOG_SPARES = "64"',
             *(f'{k} = "{v}"' for k, v in more.items())]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)  # a token in a file others can read is warned about
    return path


class ConfigDaemon(DaemonProcess):
    """``run --config FILE``: every setting in the file, none in the environment."""

    token = TOKEN

    def __init__(self, state: Path, config: Path) -> None:
        self.config = config
        super().__init__(state, args=("run", "--config", str(config)))

    def defaults(self) -> dict[str, str]:
        write_config(self.config, self.state, (self.port, self.grpc_port, self.http_port))
        return {"PYTHONUNBUFFERED": "1"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def ev(seq: int, type_: str, **kw) -> dict:
    return {"aep": "0.1", "id": f"01JCLICONFIG{seq:014d}", "type": type_,
            "time": f"2026-12-01T09:31:{seq:02d}.250Z",
            "source": f"aep://box/agent/opencode/session/{SESSION}", "agent": "opencode",
            "session": SESSION, "seq": seq, "capture": "redacted", **kw}


ASK = ev(2, "attention.requested", subject="bash", severity="notice",
         data={"kind": "permission", "prompt": "Permission requested: bash",
               "options": [{"id": "once", "label": "Allow once"}]})


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-config")
    d = ConfigDaemon(tmp / "state", tmp / "config.toml").start()
    r = httpx.post(d.url + "/events", content="\n".join(json.dumps(e) for e in (
        ev(1, "session.started", data={"client": {"name": "opencode"}}), ASK)),
        headers={"content-type": "application/x-ndjson", "aep-version": "0.1",
                 "authorization": f"Bearer {TOKEN}"}, timeout=10, trust_env=False)
    assert r.status_code == 202, r.text
    yield d
    assert d.stop() == 0, d.log()


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    """The console script with no AEP_* setting but ``env``'s (a clean user's shell)."""
    base = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "COLUMNS": "200"}
    return subprocess.run(console_script() + list(args), env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def test_tail_reaches_the_daemon_of_its_config_file(daemon, tmp_path):
    for how, args, env in (("--config", ["--config", str(daemon.config)], {}),
                           ("AEP_CONFIG", [], {"AEP_CONFIG": str(daemon.config)})):
        # the resume positions under the test's own state directory (the
        # environment wins over the file's AEP_STATE_DIR)
        out = cli("tail", *args, "--from", "all", "--limit", "2", "--json",
                  env={**env, "AEP_STATE_DIR": str(tmp_path / how)})
        assert out.returncode == 0, (how, out.stderr)
        assert [json.loads(line)["id"] for line in out.stdout.splitlines()] == \
            [ev(1, "x")["id"], ASK["id"]], (how, out.stdout)
        assert f"connected to {daemon.url}" in out.stderr, (how, out.stderr)


def test_respond_by_request_id_alone_through_the_config_file(daemon):
    out = cli("respond", "--config", str(daemon.config), ASK["id"], "--option", "once",
              "--ack-window", "500", "--wait", "0")
    # the session was found on the daemon of the file (with the file's token),
    # and the command reached its relay; no bridge serves this posted session
    assert "holds no attention.requested" not in out.stderr, out.stderr
    assert "cannot reach" not in out.stderr, out.stderr
    assert out.returncode in (3, 4), (out.returncode, out.stdout, out.stderr)
    assert SESSION in out.stderr + out.stdout, (out.stdout, out.stderr)


def test_doctor_fails_on_a_state_directory_another_daemon_holds(daemon, tmp_path):
    # another configuration (ports of its own) on the running daemon's state directory
    other = write_config(tmp_path / "other.toml", daemon.state, free_ports(3))
    out = cli("doctor", "--config", str(other))
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    what = f"FAIL  AEP_STATE_DIR={str(daemon.state)!r}: in use by aep-bridges pid {daemon.proc.pid}"
    assert what in lines, out.stdout
    fix = lines[lines.index(what) + 1]
    assert fix == "      fix: stop it first, or give this daemon a state directory of its own", fix
    # run refuses it with the same words
    run = cli("run", "--config", str(other), timeout=60)
    assert run.returncode == 2
    assert (f"AEP_STATE_DIR={str(daemon.state)!r}: in use by aep-bridges pid {daemon.proc.pid}; "
            "stop it first, or give this daemon a state directory of its own") in run.stderr, run.stderr


def test_doctor_is_ok_with_the_daemon_of_its_own_configuration(daemon):
    out = cli("doctor", "--config", str(daemon.config))
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert (f"ok    state directory {daemon.state}: held by the running aep-bridges daemon "
            f"pid {daemon.proc.pid}") in out.stdout.splitlines(), out.stdout


def test_check_is_ok_beside_the_running_daemon_of_the_same_configuration(daemon):
    out = cli("check", "--config", str(daemon.config))
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "aep-bridges: configuration ok" in out.stdout
    notes = [line for line in out.stdout.splitlines() if line.startswith("aep-bridges: note: ")]
    assert any(f"AEP_STATE_DIR={str(daemon.state)!r}: held by the running aep-bridges daemon "
               f"pid {daemon.proc.pid}" in n for n in notes), out.stdout
    assert any(f"AEP_LISTEN=127.0.0.1:{daemon.port}: held by the running aep-bridges daemon" in n
               for n in notes), out.stdout
    assert any("run would refuse while it runs" in n for n in notes), out.stdout


def test_check_refuses_beside_another_configurations_daemon(daemon, tmp_path):
    other = write_config(tmp_path / "other.toml", daemon.state, free_ports(3))
    out = cli("check", "--config", str(other))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert (f"AEP_STATE_DIR={str(daemon.state)!r}: in use by aep-bridges pid {daemon.proc.pid}; "
            "stop it first") in out.stderr, out.stderr
    # --no-ports: validating a configuration beside it; the lock is a note
    out = cli("check", "--no-ports", "--config", str(other))
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "(not checked: --no-ports)" in out.stdout, out.stdout


def test_the_start_line_names_the_config_file_it_read(daemon):
    up = [line for line in daemon.log().splitlines() if "aep-bridges up:" in line]
    assert len(up) == 1, daemon.log()[-3000:]
    assert f"settings from config file {daemon.config}" in up[0], up[0]


def test_check_names_the_aep_bridges_daemon_holding_a_port(daemon, tmp_path):
    """Another configuration whose OTLP/gRPC port the running daemon holds
    (its AEP_LISTEN elsewhere, so no /healthz answers there): the port's
    line names the daemon's pid, as the state directory's does (issue 29's
    trial), for check and for run."""
    listen, _, http = free_ports(3)
    other = write_config(tmp_path / "other.toml", daemon.state, (listen, daemon.grpc_port, http))
    pid = daemon.proc.pid
    held = f"AEP_OTLP_GRPC_LISTEN=127.0.0.1:{daemon.grpc_port}: in use by aep-bridges pid {pid}"
    out = cli("check", "--config", str(other))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert held in out.stderr, out.stderr
    assert "another aep-bridges daemon holds it; to validate this configuration beside it: " \
           "aep-bridges check --no-ports" in out.stderr, out.stderr
    run = cli("run", "--config", str(other), timeout=60)
    assert run.returncode == 2 and held in run.stderr, run.stderr
