"""The real-server harness's own rules: the 3.12 interpreter search, the loud
skip when none exists, and the version-keyed cache outside the checkout."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from tests.support import openhands as oh


def test_no_python312_means_a_loud_skip(monkeypatch, tmp_path):
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.delenv("AEP_PYTHON312", raising=False)
    assert oh.find_python312() is None
    with pytest.raises(oh.VendorUnavailable, match="Python >= 3.12"):
        oh.install_agent_server("0.0.0-test")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(pytest.skip.Exception) as skip:
            oh.require_agent_server("0.0.0-test")
    assert "REAL VENDOR UNAVAILABLE" in str(skip.value) and "3.12" in str(skip.value)
    assert any("REAL VENDOR UNAVAILABLE" in str(w.message) for w in caught)
    assert not (tmp_path / "cache" / "openhands-agent-server@0.0.0-test").exists()


def test_an_explicit_interpreter_must_really_be_312(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setenv("AEP_PYTHON312", sys.executable)  # the test venv's 3.11
    if sys.version_info >= (3, 12):
        assert oh.find_python312() == sys.executable
    else:
        assert oh.find_python312() is None


def test_cache_is_outside_the_checkout_and_keyed_by_version(monkeypatch, tmp_path):
    monkeypatch.delenv("AEP_VENDOR_CACHE", raising=False)
    d = oh.install_dir("9.9.9")
    root = Path(oh.__file__).resolve().parents[2]
    assert d.name == "openhands-agent-server@9.9.9" and root not in d.parents
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path))
    assert oh.install_dir() == tmp_path / f"openhands-agent-server@{oh.OH_VERSION}"


def test_the_server_is_always_bound_to_loopback_with_offline_switches(tmp_path):
    srv = oh.AgentServer(Path("/nonexistent/python"), scratch=tmp_path)
    env = srv.env()
    assert env["SESSION_API_KEY"] == oh.SESSION_KEY
    for k, v in {"OH_PRELOAD_TOOLS": "false", "OH_ENABLE_VSCODE": "false", "OH_ENABLE_BROWSER": "false",
                 "DO_NOT_TRACK": "1", "OH_TELEMETRY_CONSENT": "denied"}.items():
        assert env[k] == v
    assert all(env[k].startswith(str(tmp_path)) for k in
               ("HOME", "OH_CONVERSATIONS_PATH", "OH_WORKSPACE_PATH", "OH_BASH_EVENTS_DIR", "OH_PERSISTENCE_DIR"))
    argv = srv.argv()
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and srv.url.startswith("http://127.0.0.1:")
