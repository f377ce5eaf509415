"""``aep-bridges hooks install|uninstall|status codex`` on ``config.toml``:
the hooks left trusted the way Codex 0.171.0 records trust, the rest of the
file (comments, other hooks, their trust) kept, malformed TOML refused."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.hookinstall import codex
from supervisor.hookinstall.common import Refused

ORIGINAL = '''# my codex config
model = "o3"  # keep me

[[hooks.Stop]]
[[hooks.Stop.hooks]]
type = "command"
command = "notify-send done"

[profiles.x]
model = "y"
'''


def test_trusted_hash_matches_what_codex_reported():
    """Pins read from the real Codex 0.171.0's app-server ``hooks/list``
    (``currentHash``) for hooks declared in a config.toml (issue 27 probe)."""
    hook = {"type": "command", "command": "/usr/bin/true PreToolUse", "timeout": 130}
    assert codex.trusted_hash("PreToolUse", hook) == (
        "sha256:b0175b489745243ebd586a2b2b828bc89764e2c512fe9e52a9508e91c5f07ff1")
    hook = {"type": "command", "command": "/usr/bin/true PreModelRequest", "timeout": 130}
    assert codex.trusted_hash("PreModelRequest", hook) == (
        "sha256:78483a98b1ce5bb77a9cd72cfbc62f0119b794a85424e5242e0ee4424d728747")


def test_event_labels():
    assert [codex.event_label(e) for e in ("PreToolUse", "SessionStart", "PostModelRequest")] \
        == ["pre_tool_use", "session_start", "post_model_request"]
    assert len(codex.EVENTS) == 14


def run_install(path: Path, **kw) -> None:
    for p in codex.install(path, state_path=kw.pop("state_path", path), hold_s=120, **kw):
        p.path.parent.mkdir(parents=True, exist_ok=True)
        p.path.write_text(p.after)


def run_uninstall(path: Path, state_path: Path | None = None) -> None:
    for p in codex.uninstall(path, state_path=state_path or path):
        p.path.write_text(p.after)


def test_install_keeps_everything_and_trusts_each_hook(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(ORIGINAL)
    run_install(path)
    text = path.read_text()
    assert text.startswith("# my codex config\nmodel = \"o3\"  # keep me\n")
    doc = tomllib.loads(text)
    assert doc["profiles"] == {"x": {"model": "y"}}
    assert doc["hooks"]["Stop"][0] == {"hooks": [{"type": "command",
                                                  "command": "notify-send done"}]}
    state = doc["hooks"]["state"]
    for event in codex.EVENTS:
        groups = doc["hooks"][event]
        gi = len(groups) - 1
        (ours,) = groups[gi]["hooks"]
        assert ours["command"].split()[-1] == "codex"
        assert ours["timeout"] == {"PreToolUse": 130, "PermissionRequest": 130,
                                   "SessionEnd": 3, "Interrupt": 3}.get(event, 10)
        key = f"{path.resolve()}:{codex.event_label(event)}:{gi}:0"
        assert state[key] == {"trusted_hash": codex.trusted_hash(event, ours)}
    assert codex.status(path, state_path=path) == {e: "trusted" for e in codex.EVENTS}
    before = path.read_text()
    assert all(not p.changed and not p.changes
               for p in codex.install(path, state_path=path, hold_s=120))
    run_install(path)
    assert path.read_text() == before


def test_uninstall_moves_the_trust_of_hooks_after_ours(tmp_path):
    path = tmp_path / "config.toml"
    run_install(path)
    src = str(path.resolve())
    with path.open("a") as f:  # the user adds a Stop hook after ours, and trusts it
        f.write(f'\n[[hooks.Stop]]\n[[hooks.Stop.hooks]]\ntype = "command"\ncommand = "mine"\n'
                f'\n[hooks.state."{src}:stop:1:0"]\ntrusted_hash = "sha256:mine"\n')
    run_uninstall(path)
    doc = tomllib.loads(path.read_text())
    assert doc["hooks"]["Stop"] == [{"hooks": [{"type": "command", "command": "mine"}]}]
    assert doc["hooks"]["state"] == {f"{src}:stop:0:0": {"trusted_hash": "sha256:mine"}}
    assert set(doc["hooks"]) == {"Stop", "state"}


def test_install_then_uninstall_gives_back_the_settings(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(ORIGINAL)
    run_install(path)
    run_uninstall(path)
    assert tomllib.loads(path.read_text()) == tomllib.loads(ORIGINAL)
    assert "# my codex config" in path.read_text() and "# keep me" in path.read_text()
    assert codex.status(path, state_path=path) == {}


def test_a_modified_hook_shows_as_modified(tmp_path):
    path = tmp_path / "config.toml"
    run_install(path)
    path.write_text(path.read_text().replace("timeout = 130", "timeout = 131", 1))
    assert "modified" in codex.status(path, state_path=path).values()


@pytest.mark.parametrize("text, where", [('model = "o3"\n[hooks\n', ":2:"),
                                         ('a = 1\na = 2\n', ":2:")])
def test_malformed_toml_is_refused_with_line_and_column(tmp_path, text, where):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(Refused) as e:
        codex.install(path, state_path=path, hold_s=120)
    assert f"{path}{where}" in str(e.value)
    assert path.read_text() == text


def test_a_project_install_trusts_from_the_user_config(tmp_path, monkeypatch, capsys):
    home, project = tmp_path / "home", tmp_path / "proj"
    project.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CODEX_HOME", str(home / ".codex"))
    monkeypatch.delenv("AEP_LISTEN", raising=False)
    assert main(["hooks", "install", "codex", "--project", str(project)]) == 0
    assert "trust_level" in capsys.readouterr().out  # Codex reads it only when trusted
    hooks = tomllib.loads((project / ".codex" / "config.toml").read_text())["hooks"]
    assert "state" not in hooks and set(hooks) == set(codex.EVENTS)
    user = tomllib.loads((home / ".codex" / "config.toml").read_text())
    src = project.resolve() / ".codex" / "config.toml"
    assert set(user["hooks"]["state"]) == {f"{src}:{codex.event_label(e)}:0:0"
                                           for e in codex.EVENTS}
    capsys.readouterr()
    assert main(["hooks", "status", "codex", "--project", str(project)]) == 0
    out = capsys.readouterr().out
    assert f"codex (project) {src}: 14 events: 14 trusted (the project is not trusted" in out
    assert f"codex (user) {home}/.codex/config.toml: not installed" in out
    assert main(["hooks", "uninstall", "codex", "--project", str(project)]) == 0
    # both files were made by the install: the uninstall takes them away again
    assert not (home / ".codex" / "config.toml").exists()
    assert not (project / ".codex" / "config.toml").exists()


def test_codex_refuses_the_http_transport(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / ".codex"))
    assert main(["hooks", "install", "codex", "--transport", "http"]) == 2
    assert not (tmp_path / ".codex").exists()


def test_the_installed_shim_spools_where_the_service_daemon_ingests(tmp_path, monkeypatch):
    """The daemon runs with its own AEP_STATE_DIR (a service); Codex runs the
    installed command in an environment without it. With the daemon down,
    the moment lands in the daemon's spool directory, not the agent's."""
    import json
    import subprocess

    from tests.support.net import free_port

    home, svc = tmp_path / "home", tmp_path / "svc"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CODEX_HOME", str(home / ".codex"))
    monkeypatch.setenv("AEP_STATE_DIR", str(svc))
    monkeypatch.setenv("AEP_LISTEN", f"127.0.0.1:{free_port()}")  # nobody listens
    assert main(["hooks", "install", "codex"]) == 0
    cmd = tomllib.loads((home / ".codex" / "config.toml").read_text())[
        "hooks"]["Stop"][0]["hooks"][0]["command"]
    agent_env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}  # no AEP_STATE_DIR
    done = subprocess.run(["sh", "-c", cmd], input='{"hook_event_name": "Stop"}', env=agent_env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == ""
    (line,) = (svc / "hooks-spool" / "codex.jsonl").read_text().splitlines()
    assert json.loads(line)["payload"] == {"hook_event_name": "Stop"}
    assert not (home / ".local").exists()
