"""``aep-bridges hooks install|uninstall|status claude-code`` on settings files:
what it writes (issue 27 Setup), what it keeps, what it refuses."""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.hookinstall import claude
from supervisor.hookinstall.common import Refused

URL = "http://127.0.0.1:8787/hooks/claude-code"
THEIRS = {"type": "command", "command": "say done"}
EXISTING = {
    "model": "opus",
    "hooks": {"Stop": [{"hooks": [THEIRS]}],
              "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command",
                                                          "command": "./guard.sh"}]}]},
    "permissions": {"allow": ["Bash(ls:*)"]},
}


def plan(path: Path, **kw):
    kw = {"transport": "http", "daemon": "http://127.0.0.1:8787", "hold_s": 120, **kw}
    return claude.install(path, **kw)


def apply(p) -> None:
    p.path.parent.mkdir(parents=True, exist_ok=True)
    p.path.write_text(p.after)


def test_a_new_file_gets_every_event(tmp_path):
    p = plan(tmp_path / "settings.json")
    doc = json.loads(p.after)
    assert set(doc["hooks"]) == set(claude.EVENTS) and len(claude.EVENTS) == 28
    for event, groups in doc["hooks"].items():
        (group,) = groups
        (hook,) = group["hooks"]
        want_timeout = 130 if event in ("PreToolUse", "PermissionRequest", "Elicitation") else (
            2 if event == "SessionEnd" else 10)
        assert hook["timeout"] == want_timeout
        if event in ("SessionStart", "Setup"):  # Claude Code runs no HTTP hook there
            assert hook["type"] == "command"
            argv = shlex.split(hook["command"])
            assert argv[1:4] == ["-S", "-E", "-c"] and argv[-1] == "claude-code"
            assert "bridges/hooks_common" in argv[4] and "from shim import main" in argv[4]
        else:
            assert hook == {"type": "http", "url": URL,
                            "headers": {"Authorization": "Bearer $AEP_TOKEN"},
                            "allowedEnvVars": ["AEP_TOKEN"], "timeout": want_timeout}
    assert "allowedHttpHookUrls" not in doc  # unset: every URL allowed; a list would block others


def test_others_are_kept_in_order_and_a_reinstall_changes_nothing(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(EXISTING, indent=4) + "\n")
    p = plan(path, hold_s=30)
    apply(p)
    doc = json.loads(path.read_text())
    assert list(doc) == ["model", "hooks", "permissions"]
    assert list(doc["hooks"])[:2] == ["Stop", "PreToolUse"]
    assert doc["hooks"]["Stop"][0] == {"hooks": [THEIRS]}
    assert doc["hooks"]["PreToolUse"][0] == EXISTING["hooks"]["PreToolUse"][0]
    assert doc["hooks"]["PreToolUse"][1]["hooks"][0]["timeout"] == 40
    assert path.read_text().startswith('{\n    "model"')  # the file's 4-space indent
    again = plan(path, hold_s=30)
    assert not again.changed and again.changes == []


def test_a_changed_hold_updates_our_entry_in_place(tmp_path):
    path = tmp_path / "settings.json"
    apply(plan(path))
    p = plan(path, hold_s=300)
    assert p.changed
    doc = json.loads(p.after)
    assert len(doc["hooks"]["PermissionRequest"]) == 1
    assert doc["hooks"]["PermissionRequest"][0]["hooks"][0]["timeout"] == 310


def test_uninstall_gives_back_the_original(tmp_path):
    path = tmp_path / "settings.json"
    original = json.dumps(EXISTING, indent=2) + "\n"
    path.write_text(original)
    apply(plan(path))
    apply(claude.uninstall(path))
    assert path.read_text() == original
    assert not claude.uninstall(path).changed


def test_command_transport_puts_the_shim_everywhere(tmp_path):
    doc = json.loads(plan(tmp_path / "s.json", transport="command",
                          daemon="http://127.0.0.1:9999", daemon_given=True).after)
    hooks = [g["hooks"][0] for groups in doc["hooks"].values() for g in groups]
    assert {h["type"] for h in hooks} == {"command"}
    assert all(h["command"].endswith("claude-code --daemon http://127.0.0.1:9999")
               for h in hooks)


def test_allow_lists_are_extended_only_when_the_file_sets_them(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"allowedHttpHookUrls": ["https://hooks.example.com/*"],
                                "httpHookAllowedEnvVars": ["OTHER"]}))
    doc = json.loads(plan(path).after)
    assert doc["allowedHttpHookUrls"] == ["https://hooks.example.com/*", URL]
    assert doc["httpHookAllowedEnvVars"] == ["OTHER", "AEP_TOKEN"]
    path.write_text(json.dumps({"allowedHttpHookUrls": ["http://127.0.0.1:8787/*"]}))
    assert json.loads(plan(path).after)["allowedHttpHookUrls"] == ["http://127.0.0.1:8787/*"]
    apply(plan(tmp_path / "e.json"))
    path.write_text(json.dumps({"allowedHttpHookUrls": []}))
    apply(plan(path))
    apply(claude.uninstall(path))
    assert json.loads(path.read_text()) == {"allowedHttpHookUrls": []}  # [] kept: none allowed


@pytest.mark.parametrize("text, where", [('{\n  "hooks": {,\n}', ":2:13:"),
                                         ('{"a": 1}}', ":1:9:"), ("[1]", ":1:1:")])
def test_malformed_json_is_refused_with_line_and_column(tmp_path, text, where):
    path = tmp_path / "settings.json"
    path.write_text(text)
    with pytest.raises(Refused) as e:
        plan(path)
    assert f"{path}{where}" in str(e.value)


def test_the_cli_refuses_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text('{"model": "opus",\n "hooks": oops}\n')
    assert main(["hooks", "install", "claude-code"]) == 2
    assert path.read_text() == '{"model": "opus",\n "hooks": oops}\n'
    assert f"{path}:2:11:" in capsys.readouterr().err


def test_the_cli_user_and_project_scopes_dry_run_and_status(tmp_path, monkeypatch, capsys):
    home, project = tmp_path / "home", tmp_path / "proj"
    home.mkdir(), project.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("AEP_LISTEN", raising=False)
    monkeypatch.setenv("AEP_CLAUDE_CODE_HOLD_S", "50")
    assert main(["hooks", "install", "claude-code", "--dry-run"]) == 0
    assert not (home / ".claude").exists()
    assert "+++" in capsys.readouterr().out
    assert main(["hooks", "install", "claude-code", "--project", str(project)]) == 0
    doc = json.loads((project / ".claude" / "settings.json").read_text())
    assert doc["hooks"]["PreToolUse"][0]["hooks"][0]["timeout"] == 60
    capsys.readouterr()
    monkeypatch.chdir(project)
    assert main(["hooks", "status", "claude-code"]) == 0
    out = capsys.readouterr().out
    assert f"(user) {home}/.claude/settings.json: not installed" in out
    assert f"(project) {project}/.claude/settings.json: 28 events: 2 command, 26 http" in out


def test_a_symlinked_settings_file_stays_a_link_and_keeps_its_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    real = tmp_path / "dotfiles" / "settings.json"
    real.parent.mkdir()
    real.write_text("{}\n")
    os.chmod(real, 0o640)
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").symlink_to(real)
    assert main(["hooks", "install", "claude-code"]) == 0
    assert (tmp_path / ".claude" / "settings.json").is_symlink()
    assert "hooks" in json.loads(real.read_text())
    assert real.stat().st_mode & 0o777 == 0o640


def test_is_ours_recognizes_only_ours():
    assert claude.is_ours({"type": "http", "url": "http://h:1/hooks/claude-code"})
    assert claude.is_ours({"type": "command",
                           "command": "/v/bin/python -S -E '/x y/bridges/hooks_common/shim.py' "
                                      "claude-code"})
    assert claude.is_ours({"type": "command", "command": "aep-bridges hook claude-code"})
    assert not claude.is_ours({"type": "command", "command": "aep-bridges hook codex"})
    assert not claude.is_ours({"type": "http", "url": "http://h:1/hooks/claude-code-x"})
    assert not claude.is_ours(THEIRS)


def test_worktree_hooks_are_never_installed_and_a_reinstall_removes_ours(tmp_path):
    # a WorktreeCreate hook replaces Claude Code's own worktree creation and
    # must answer a worktreePath: our {} would make every EnterWorktree fail
    doc = json.loads(plan(tmp_path / "a.json").after)
    assert not {"WorktreeCreate", "WorktreeRemove"} & set(doc["hooks"])
    old = tmp_path / "old.json"
    mine = {"type": "command", "command": "./make-worktree.sh"}
    old.write_text(json.dumps({"hooks": {
        "WorktreeCreate": [{"hooks": [{"type": "http", "url": URL, "timeout": 10}, mine]}],
        "WorktreeRemove": [{"hooks": [{"type": "http", "url": URL, "timeout": 10}]}]}}))
    doc = json.loads(plan(old).after)
    assert doc["hooks"]["WorktreeCreate"] == [{"hooks": [mine]}]
    assert doc["hooks"]["WorktreeRemove"] == []


def test_the_command_hooks_carry_the_daemons_spool_dir(tmp_path, monkeypatch):
    # a daemon run as a service with its own AEP_STATE_DIR ingests
    # <state>/hooks-spool; the agent's environment does not have it, so the
    # installer writes the directory into the command line
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("AEP_STATE_DIR", str(tmp_path / "svc"))
    assert main(["hooks", "install", "claude-code"]) == 0
    doc = json.loads((home / ".claude" / "settings.json").read_text())
    argv = shlex.split(doc["hooks"]["SessionStart"][0]["hooks"][0]["command"])
    assert argv[-3:] == ["claude-code", "--spool", str(tmp_path / "svc" / "hooks-spool")]
    monkeypatch.delenv("AEP_STATE_DIR")
    assert main(["hooks", "install", "claude-code", "--transport", "command"]) == 0
    doc = json.loads((home / ".claude" / "settings.json").read_text())
    argv = shlex.split(doc["hooks"]["PreToolUse"][0]["hooks"][0]["command"])
    assert argv[-2:] == ["--spool", str(home / ".local/state/aep-bridges/hooks-spool")]
    assert main(["hooks", "install", "claude-code", "--spool", str(tmp_path / "x")]) == 0
    doc = json.loads((home / ".claude" / "settings.json").read_text())
    assert shlex.split(doc["hooks"]["Setup"][0]["hooks"][0]["command"])[-1] == str(tmp_path / "x")


def test_status_exits_2_on_a_malformed_settings_file(tmp_path, monkeypatch, capsys):
    """``hooks status`` names the bad file with its line and column and exits 2
    (as install does), so ``hooks status && ...`` does not pass over it."""
    home, project = tmp_path / "home", tmp_path / "proj"
    (project / ".claude").mkdir(parents=True)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (project / ".claude" / "settings.json").write_text("{bad\n")
    assert main(["hooks", "status", "claude-code", "--project", str(project)]) == 2
    assert f"(project) {project}/.claude/settings.json:1:2: not valid JSON" in capsys.readouterr().out
    (project / ".claude" / "settings.json").write_text("{}\n")
    assert main(["hooks", "status", "claude-code", "--project", str(project)]) == 0
