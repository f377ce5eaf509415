"""tests/support/vendors.py: the version-keyed npm cache, the native-binary finder and
the loud-skip-vs-fail policy (no network: npm is replaced where it would run)."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support import vendors

ELF = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 56


def _exe(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o755)
    return path


def test_find_binary_skips_node_shims_and_takes_the_native_program(tmp_path):
    nm = tmp_path / "node_modules"
    _exe(nm / "@openai/codex/bin/codex.js", b"#!/usr/bin/env node\n")
    _exe(nm / ".bin/codex", b"#!/usr/bin/env node\n")  # npm's shim
    _exe(nm / "@openai/codex/bin/codex", b"#!/bin/sh\nexec node codex.js\n")  # a script
    native = _exe(nm / "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex", ELF)
    assert vendors.find_binary(nm, "codex") == native


def test_find_binary_ignores_non_executable_files_and_says_what_is_missing(tmp_path):
    p = tmp_path / "pkg/bin/tool"
    p.parent.mkdir(parents=True)
    p.write_bytes(ELF)  # native but not executable
    with pytest.raises(vendors.VendorInstallError, match="tool"):
        vendors.find_binary(tmp_path, "tool")


def _fake_npm(monkeypatch, returncode=0, stderr="", calls=None, delay=0.0):
    """Replace the npm run: on success, lay out what npm would have installed."""
    monkeypatch.setattr(vendors.shutil, "which", lambda name: "/usr/bin/npm")

    def run(cmd, **kw):
        if calls is not None:
            calls.append(cmd)
        time.sleep(delay)
        if returncode == 0:
            prefix = Path(cmd[cmd.index("--prefix") + 1])
            name = cmd[-1].rsplit("@", 1)[0]
            pj = prefix / "node_modules" / name / "package.json"
            pj.parent.mkdir(parents=True, exist_ok=True)
            pj.write_text("{}")
        return subprocess.CompletedProcess(cmd, returncode, "", stderr)

    monkeypatch.setattr(vendors.subprocess, "run", run)


def test_install_goes_to_the_version_keyed_cache_once(tmp_path, monkeypatch):
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    calls: list = []
    _fake_npm(monkeypatch, calls=calls)
    prefix = vendors.npm_install("@openai/codex", "0.171.0")
    assert prefix == tmp_path / "cache" / "openai-codex@0.171.0"
    assert calls == [["/usr/bin/npm", "install", "--no-audit", "--no-fund", "--prefix",
                      str(prefix), "@openai/codex@0.171.0"]]
    assert vendors.npm_install("@openai/codex", "0.171.0") == prefix
    assert vendors.npm_package("@openai/codex", "0.171.0") == \
        prefix / "node_modules" / "@openai/codex"
    assert len(calls) == 1, "a completed install is reused, npm is not run again"


def test_parallel_workers_install_once(tmp_path, monkeypatch):
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    calls: list = []
    _fake_npm(monkeypatch, calls=calls, delay=0.3)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        vendors.npm_install("opencode-ai", "1.0.0"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert len(calls) == 1


def test_an_interrupted_install_is_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    half = tmp_path / "cache" / "opencode-ai@1.0.0" / "node_modules" / "junk"
    half.mkdir(parents=True)  # no marker: npm died half-way last time
    calls: list = []
    _fake_npm(monkeypatch, calls=calls)
    prefix = vendors.npm_install("opencode-ai", "1.0.0")
    assert len(calls) == 1 and not half.exists() and (prefix / vendors.MARKER).is_file()


def test_missing_npm_is_a_loud_skip(tmp_path, monkeypatch):
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vendors.shutil, "which", lambda name: None)
    with pytest.warns(UserWarning, match="npm is not on PATH"):
        with pytest.raises(pytest.skip.Exception, match="REAL VENDOR UNAVAILABLE"):
            vendors.npm_install("@openai/codex", "0.171.0")


def test_registry_unreachable_is_a_loud_skip(tmp_path, monkeypatch):
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    _fake_npm(monkeypatch, returncode=1, stderr=(
        "npm error code ENOTFOUND\nnpm error network request to "
        "https://registry.npmjs.org/@openai%2fcodex failed, reason: getaddrinfo ENOTFOUND"))
    with pytest.warns(UserWarning, match="registry unavailable"):
        with pytest.raises(pytest.skip.Exception):
            vendors.npm_install("@openai/codex", "0.171.0")
    assert not (tmp_path / "cache" / "openai-codex@0.171.0").exists()


def test_a_wrong_pin_fails_instead_of_skipping(tmp_path, monkeypatch):
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    _fake_npm(monkeypatch, returncode=1, stderr=(
        "npm error code ETARGET\nnpm error notarget No matching version found for "
        "@openai/codex@9.9.9."))
    with pytest.raises(vendors.VendorInstallError, match="ETARGET"):
        vendors.npm_install("@openai/codex", "9.9.9")
    with pytest.raises(vendors.VendorInstallError, match="exact version"):
        vendors.npm_install("@openai/codex", "latest")


def test_a_postinstall_writes_its_xdg_directories_inside_the_install(tmp_path, monkeypatch):
    # a fresh-user review: opencode-ai's postinstall runs ``opencode --version``,
    # which made ~/.config/opencode, ~/.local/share/opencode... in the user's HOME
    monkeypatch.setenv("AEP_VENDOR_CACHE", str(tmp_path / "cache"))
    envs: list = []
    _fake_npm(monkeypatch)
    fake = vendors.subprocess.run

    def run(cmd, **kw):
        envs.append(kw.get("env"))
        return fake(cmd, **kw)
    monkeypatch.setattr(vendors.subprocess, "run", run)
    prefix = vendors.npm_install("opencode-ai", "1.0.0")
    env = envs[0]
    assert env is not None and env["PATH"] == os.environ["PATH"]
    for k in ("CONFIG", "DATA", "STATE", "CACHE"):
        assert Path(env[f"XDG_{k}_HOME"]).is_relative_to(prefix)
