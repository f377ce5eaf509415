"""Issue 10, configuration and posture (#11, #12), through the console
script itself (``aep-bridges check`` / ``run``): refusals are exit 2 with
one line naming the setting, never its value; exposure is warned loudly."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.daemon import ROOT, DaemonProcess, console_script
from tests.support.net import free_port


def _check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    return subprocess.run(console_script() + ["check", "--no-ports", *args],
                          env={**base, "AEP_STATE_DIR": "/tmp/aep-hardening-check", **env},
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("token", ["tökén-non-ascii", "has space", "tab\there", "quote\"d",
                                   "comma,sep", "semi;colon", "=leading-equals"])
def test_a_token_outside_rfc6750_characters_is_refused_at_start(token):
    p = _check({"AEP_TOKEN": token})
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "AEP_TOKEN" in p.stderr
    assert token not in p.stderr and token not in p.stdout  # never echo a credential


@pytest.mark.parametrize("token", ["abc", "A-Z_a.z~09+/", "dG9rZW4=", "x" * 200])
def test_a_token_of_rfc6750_characters_is_accepted(token):
    p = _check({"AEP_TOKEN": token})
    assert p.returncode == 0, p.stderr


def test_run_refuses_a_bad_token_with_exit_2(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_TOKEN": "näh"}, args=("relay",))
    d.start(wait=False)
    try:
        assert d.proc.wait(timeout=60) == 2
        assert "AEP_TOKEN" in d.log() and "näh" not in d.log()
    finally:
        d.kill()


def _warned(text: str, what: str) -> bool:
    return any("WARNING" in ln and what in ln for ln in text.splitlines())


@pytest.mark.parametrize("setting", ["AEP_LISTEN", "AEP_OTLP_HTTP_LISTEN", "AEP_OTLP_GRPC_LISTEN"])
def test_a_non_loopback_listener_without_a_token_is_warned_loudly(setting):
    addr = f"0.0.0.0:{free_port()}"
    p = _check({setting: addr})
    assert p.returncode == 0, p.stderr
    assert _warned(p.stderr, setting), p.stderr
    with_token = _check({setting: addr, "AEP_TOKEN": "secret-token"})
    if setting == "AEP_LISTEN":
        assert not _warned(with_token.stderr, setting), with_token.stderr


def test_loopback_listeners_start_without_an_exposure_warning():
    p = _check({})
    assert p.returncode == 0 and "WARNING" not in p.stderr, p.stderr


def test_run_warns_at_start_when_the_relay_listens_on_all_interfaces(tmp_path):
    d = DaemonProcess(tmp_path / "state", {"AEP_LISTEN": f"0.0.0.0:{free_port()}"},
                      args=("relay",))
    d.start(healthy=False)
    try:
        assert _warned(d.log(), "AEP_LISTEN"), d.log()[-2000:]
    finally:
        d.stop(timeout=20)
