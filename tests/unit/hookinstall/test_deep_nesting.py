"""Deeply nested config files (round 11 of issue 25, finding 5): a cloned
repo's ``.claude/settings.json`` of ``{"a": [[[...]]]}`` 100,000 deep made
``hooks install --project`` and ``hooks status`` die with a RecursionError
traceback (exit 1). Every reader of the files install, status, uninstall
and ``doctor`` read refuses such a file (exit 2, the file and where, nothing
written) or, for what the installer keeps itself (its record), ignores it;
never a traceback."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.hookinstall import claude, cli, codex, record
from supervisor.hookinstall.common import Refused
from tests.unit.supervisor.test_hookdoctor import check, world

DEEP = 100_000
DEEP_JSON = '{"a":' + "[" * DEEP + "]" * DEEP + "}\n"
DEEP_TOML = "a = " + "[" * DEEP + "]" * DEEP + "\n"


def _install(path: Path) -> object:
    return claude.install(path, transport="http", daemon="http://127.0.0.1:8787", hold_s=120)


def test_a_deep_settings_file_is_refused_with_where(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(DEEP_JSON)
    for read in (_install, claude.status, claude.ours, claude.uninstall):
        with pytest.raises(Refused) as e:
            read(path)
        assert str(e.value).startswith(f"{path}:1:105: ") and "nested" in str(e.value), e.value


def test_the_depth_rule_counts_containers_outside_strings_only(tmp_path):
    path = tmp_path / "settings.json"
    at_most = claude.MAX_DEPTH - 1  # the settings object is one level
    path.write_text('{"a": ' + "[" * at_most + "]" * at_most + ', "b": "' + "[{" * 500 + '\\""}')
    assert _install(path).changes  # read and planned
    path.write_text('{\n "a": ' + "[" * (at_most + 1) + "]" * (at_most + 1) + "}")
    with pytest.raises(Refused) as e:
        _install(path)
    assert f"{path}:2:{7 + at_most}: " in str(e.value)


def _project(tmp_path: Path, monkeypatch, text: str, name: str = ".claude/settings.json") -> Path:
    home, project = tmp_path / "home", tmp_path / "proj"
    home.mkdir()
    (project / name).parent.mkdir(parents=True)
    (project / name).write_text(text)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AEP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CODEX_HOME", str(home / ".codex"))
    monkeypatch.chdir(project)
    return project


def test_install_and_status_exit_2_with_one_line_and_write_nothing(tmp_path, monkeypatch, capsys):
    """The attack's repro (f5_install_recursion.sh), in process."""
    project = _project(tmp_path, monkeypatch, DEEP_JSON)
    path = project / ".claude" / "settings.json"
    assert main(["hooks", "install", "claude-code", "--project", "."]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aep-bridges hooks: {path}:1:105: ") and err.count("\n") == 1, err
    assert path.read_text() == DEEP_JSON and not (tmp_path / "state").exists()
    assert main(["hooks", "status", "claude-code"]) == 2
    out = capsys.readouterr().out
    assert f"claude-code (project) {path}:1:105: " in out and "Traceback" not in out
    assert main(["hooks", "uninstall", "claude-code", "--project", "."]) == 2
    assert path.read_text() == DEEP_JSON


def test_a_deep_codex_config_is_refused_too(tmp_path, monkeypatch, capsys):
    """(tomlkit refuses TOML past 100 levels itself: this held in the attack)"""
    project = _project(tmp_path, monkeypatch, DEEP_TOML, ".codex/config.toml")
    path = project / ".codex" / "config.toml"
    with pytest.raises(Refused) as e:
        codex.status(path, state_path=path)
    assert str(e.value).startswith(f"{path}:1:") and "nested" in str(e.value)
    assert main(["hooks", "install", "codex", "--project", "."]) == 2
    assert main(["hooks", "status", "codex"]) == 2
    assert path.read_text() == DEEP_TOML


def test_a_deep_user_config_is_no_trust(tmp_path):
    """``project_trusted`` reads Codex's user config with tomllib, which
    recursed (RecursionError at 500 levels)."""
    user = tmp_path / "config.toml"
    user.write_text(DEEP_TOML)
    assert cli.project_trusted(user, tmp_path) is False


def test_a_deep_install_record_is_ignored(tmp_path):
    """The install record is the installer's own JSON: one that cannot be
    read is no record (uninstall just edits the file), deep or not."""
    env = {"AEP_STATE_DIR": str(tmp_path / "state")}
    target = tmp_path / "settings.json"
    target.write_text("{}\n")
    rec = record.record_path(env, target)
    rec.parent.mkdir(parents=True, mode=0o700)
    rec.write_text(DEEP_JSON)
    os.chmod(rec, 0o600)
    assert record.load(env, target) is None
    rec.write_text(json.dumps({"path": str(target), "before": DEEP_JSON, "after_sha256": "x"}))
    assert record.load(env, target) is not None
    assert cli._had_hooks(record.load(env, target)) is False  # its "before" is not read either
    assert cli._same(target, DEEP_JSON, DEEP_JSON) is False  # unreadable: not the same


@pytest.mark.parametrize("agent, name, text", [
    ("claude-code", ".claude/settings.json", DEEP_JSON),
    ("codex", ".codex/config.toml", DEEP_TOML),
])
def test_doctor_reports_a_deep_file_as_a_finding(tmp_path, agent, name, text):
    w = world(tmp_path, agent=agent)
    path = w.project / name
    path.parent.mkdir(parents=True)
    path.write_text(text)
    _, fails = check(w)
    assert any(f"{path}:1:" in f.what and "nested" in f.what for f in fails), fails
