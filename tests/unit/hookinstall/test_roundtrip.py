"""``hooks install`` then ``hooks uninstall`` gives the file back (the
trial of issue 27: uninstall reformatted settings.json, dropped a user's
empty ``hooks``, left a created file behind as ``{}``, and left Codex's
config.toml with extra blank lines): byte for byte when nobody edited it in
between; with an edit, the edit stays and only our entries go."""
from __future__ import annotations

import json
import os
import tomllib

import pytest

from supervisor.cli import main
from supervisor.hookinstall import claude, codex

JSON_FILES = {
    "inline arrays": '{\n  "permissions": {"allow": ["Read"], "deny": []},\n'
                     '  "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]},\n'
                     '  "model": "opus"\n}\n',
    "4-space indent": '{\n    "model": "opus",\n    "env": {\n        "A": "1"\n    }\n}\n',
    "tabs": '{\n\t"model": "opus",\n\t"permissions": {\n\t\t"allow": [\n\t\t\t"Read"\n\t\t]\n\t}\n}',
    "empty hooks": '{\n  "hooks": {},\n  "model": "opus"\n}\n',
    "crlf": '{\r\n  "model": "opus"\r\n}\r\n',
}
TOML_FILES = {
    "comments and blank lines": '# my codex\nmodel = "o3"   # the model\n\n\n[tui]\n'
                                'theme = "dark"\n\n# trailing\n',
    "their hooks": 'model = "o3"\n\n[[hooks.Stop]]\n[[hooks.Stop.hooks]]\ntype = "command"\n'
                   'command = "say done"\n\n[profiles.x]\nmodel = "o4"\n',
    "no final newline": 'model = "o3"',
}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """``HOME``, ``CODEX_HOME`` and the state directory under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    home = tmp_path / "home"
    home.mkdir()
    env.update(HOME=str(home), CODEX_HOME=str(home / ".codex"),
               AEP_STATE_DIR=str(tmp_path / "state"))
    env.pop("XDG_STATE_HOME", None)
    monkeypatch.setattr(os, "environ", env)
    return home


def hooks(action, agent, *more):
    assert main(["hooks", action, agent, *more]) == 0


@pytest.mark.parametrize("name", sorted(JSON_FILES))
def test_claude_settings_come_back_byte_for_byte(home, name):
    path = home / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_bytes(JSON_FILES[name].encode())
    hooks("install", "claude-code")
    assert claude.ours(path)[0]
    hooks("install", "claude-code", "--hold-s", "60")  # a re-install keeps the record
    hooks("uninstall", "claude-code")
    assert path.read_bytes() == JSON_FILES[name].encode()


@pytest.mark.parametrize("name", sorted(TOML_FILES))
@pytest.mark.parametrize("project", [False, True])
def test_codex_config_comes_back_byte_for_byte(home, tmp_path, name, project):
    user = home / ".codex" / "config.toml"
    user.parent.mkdir()
    user.write_bytes(TOML_FILES[name].encode())
    more = []
    path = user
    if project:
        (tmp_path / "p" / ".codex").mkdir(parents=True)
        path = tmp_path / "p" / ".codex" / "config.toml"
        path.write_bytes(TOML_FILES[name].encode())
        more = ["--project", str(tmp_path / "p")]
    hooks("install", "codex", *more)
    assert codex.ours(path)
    hooks("uninstall", "codex", *more)
    assert user.read_bytes() == TOML_FILES[name].encode()
    assert path.read_bytes() == TOML_FILES[name].encode()
    hooks("install", "codex", *more)  # and a second round does the same
    hooks("uninstall", "codex", *more)
    assert path.read_bytes() == TOML_FILES[name].encode()


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_file_install_created_goes_with_uninstall(home, agent):
    path = (home / ".claude" / "settings.json" if agent == "claude-code"
            else home / ".codex" / "config.toml")
    hooks("install", agent)
    assert path.exists()
    hooks("uninstall", agent)
    assert not path.exists()


def test_a_created_file_the_user_added_to_stays_with_their_setting(home):
    path = home / ".claude" / "settings.json"
    hooks("install", "claude-code")
    path.write_text(path.read_text().replace("{", '{\n  "model": "opus",', 1))
    hooks("uninstall", "claude-code")
    assert "pwned" not in path.read_text()
    assert json.loads(path.read_text()) == {"model": "opus"}


def test_a_created_file_only_reformatted_goes(home):
    path = home / ".claude" / "settings.json"
    hooks("install", "claude-code")
    path.write_text(json.dumps(json.loads(path.read_text())))  # edited: not what we wrote
    hooks("uninstall", "claude-code")
    assert not path.exists()


def test_a_user_edit_between_survives_and_ours_go(home):
    path = home / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(JSON_FILES["empty hooks"])
    hooks("install", "claude-code")
    path.write_text(path.read_text().replace('"opus"', '"sonnet"'))
    hooks("uninstall", "claude-code")
    assert json.loads(path.read_text()) == {"hooks": {}, "model": "sonnet"}


def test_a_codex_user_edit_between_survives_and_ours_go(home):
    path = home / ".codex" / "config.toml"
    path.parent.mkdir()
    path.write_text(TOML_FILES["their hooks"])
    hooks("install", "codex")
    path.write_text(path.read_text().replace('model = "o3"', '# mine\nmodel = "o5"'))
    hooks("uninstall", "codex")
    text = path.read_text()
    assert "# mine\nmodel = \"o5\"" in text and not codex.ours(path)
    doc = tomllib.loads(text)
    assert "state" not in doc["hooks"]
    assert doc["hooks"]["Stop"] == [{"hooks": [{"type": "command", "command": "say done"}]}]


@pytest.mark.parametrize("end", ["\n", "", "\n\n"])
def test_an_edited_codex_config_keeps_its_own_ending(home, end):
    path = home / ".codex" / "config.toml"
    path.parent.mkdir()
    path.write_text(f'model = "o3"\n\n[tui]\ntheme = "dark"{end}')
    hooks("install", "codex")
    path.write_text(path.read_text().replace('"dark"', '"light"'))
    hooks("uninstall", "codex")
    assert path.read_text() == f'model = "o3"\n\n[tui]\ntheme = "light"{end}'


def _trusted(home, project=None) -> dict[str, str]:
    path = (home / ".codex" / "config.toml" if project is None
            else project / ".codex" / "config.toml")
    return codex.status(path, state_path=home / ".codex" / "config.toml")


def test_codex_project_uninstall_keeps_the_user_scope_installed_and_trusted(home, tmp_path):
    """The user trial: a user and a project install, then the ``uninstall
    --project`` doctor prints for the double install. The user config's
    record predates the project's trust entries: putting it back removed the
    user's own hooks too."""
    user = home / ".codex" / "config.toml"
    user.parent.mkdir()
    user.write_bytes(TOML_FILES["comments and blank lines"].encode())
    proj = tmp_path / "p"
    (proj / ".codex").mkdir(parents=True)
    hooks("install", "codex")
    hooks("install", "codex", "--project", str(proj))
    hooks("uninstall", "codex", "--project", str(proj))
    assert not _trusted(home, proj)
    found = _trusted(home)
    assert found and set(found.values()) == {"trusted"}
    hooks("uninstall", "codex")  # and the last uninstall still gives the bytes back
    assert user.read_bytes() == TOML_FILES["comments and blank lines"].encode()


def test_codex_uninstalling_one_project_keeps_the_others_trust(home, tmp_path):
    user = home / ".codex" / "config.toml"
    user.parent.mkdir()
    user.write_bytes(TOML_FILES["their hooks"].encode())
    one, two = tmp_path / "one", tmp_path / "two"
    for p in (one, two):
        (p / ".codex").mkdir(parents=True)
        hooks("install", "codex", "--project", str(p))
    hooks("uninstall", "codex", "--project", str(one))
    found = _trusted(home, two)
    assert found and set(found.values()) == {"trusted"}
    hooks("uninstall", "codex", "--project", str(two))
    assert user.read_bytes() == TOML_FILES["their hooks"].encode()


def test_codex_project_uninstall_with_a_user_config_install_created(home, tmp_path):
    """No user config before: the project install creates it (the trust),
    a user install adds to it; uninstalling the project keeps the file."""
    user = home / ".codex" / "config.toml"
    proj = tmp_path / "p"
    (proj / ".codex").mkdir(parents=True)
    hooks("install", "codex", "--project", str(proj))
    hooks("install", "codex")
    hooks("uninstall", "codex", "--project", str(proj))
    found = _trusted(home)
    assert found and set(found.values()) == {"trusted"}
    hooks("uninstall", "codex")
    assert not user.exists()


ODD = '{\n    "model": "opus",   "theme":"dark"\n}\n'  # no re-serializing gives it back


@pytest.mark.parametrize("how", ["--config", "AEP_CONFIG", "--env-file"])
def test_uninstall_finds_the_record_in_the_configured_state_dir(home, tmp_path, how):
    """``AEP_STATE_DIR`` from the daemon's config: install kept the record
    there, so uninstall must read the same settings to find it."""
    os.environ.pop("AEP_STATE_DIR")
    conf = tmp_path / ("daemon.env" if how == "--env-file" else "daemon.toml")
    conf.write_text(f"AEP_STATE_DIR={tmp_path / 'conf-state'}\n" if how == "--env-file"
                    else f'AEP_STATE_DIR = "{tmp_path / "conf-state"}"\n')
    more = [] if how == "AEP_CONFIG" else [how, str(conf)]
    if how == "AEP_CONFIG":
        os.environ["AEP_CONFIG"] = str(conf)
    path = home / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_bytes(ODD.encode())
    hooks("install", "claude-code", *more)
    assert list((tmp_path / "conf-state" / "hookinstall").iterdir())
    for k in [k for k in os.environ if k.startswith("AEP_") and k != "AEP_CONFIG"]:
        del os.environ[k]  # what the config put into the environment is the config's
    hooks("uninstall", "claude-code", *more)
    assert path.read_bytes() == ODD.encode()


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
@pytest.mark.parametrize("link", ["file", "dir", "dangling"])
def test_a_project_link_out_of_the_project_is_refused(home, tmp_path, capsys, agent, link):
    """A cloned repository's ``.claude/settings.json -> ~/.gitconfig`` (or
    ``.codex/config.toml -> ~/.codex/config.toml``): install and uninstall
    ``--project`` refuse, exit 2, and nothing outside is written."""
    sub, name = (".claude", "settings.json") if agent == "claude-code" else (".codex", "config.toml")
    proj = tmp_path / "repo"
    proj.mkdir()
    outside = home / "outside"
    outside.mkdir()
    victim = outside / name
    if link == "dir":
        victim.write_text("{}\n" if agent == "claude-code" else 'model = "o3"\n')
        (proj / sub).symlink_to(outside)
    else:
        (proj / sub).mkdir()
        if link == "file":
            victim.write_text("{}\n" if agent == "claude-code" else 'model = "o3"\n')
        (proj / sub / name).symlink_to(victim)
    before = victim.read_bytes() if victim.exists() else None
    for action in ("install", "uninstall"):
        assert main(["hooks", action, agent, "--project", str(proj)]) == 2
        assert "symlink" in capsys.readouterr().err
        assert (victim.read_bytes() if victim.exists() else None) == before


def test_a_project_link_inside_the_project_is_followed(home, tmp_path):
    proj = tmp_path / "repo"
    (proj / "conf").mkdir(parents=True)
    (proj / ".claude").mkdir()
    (proj / "conf" / "settings.json").write_text("{}\n")
    (proj / ".claude" / "settings.json").symlink_to(proj / "conf" / "settings.json")
    hooks("install", "claude-code", "--project", str(proj))
    assert (proj / ".claude" / "settings.json").is_symlink()
    assert claude.ours(proj / "conf" / "settings.json")[0]


@pytest.mark.parametrize("how", ["writable dir", "writable file"])
def test_a_planted_record_is_ignored(home, tmp_path, capsys, how):
    """A group/world-writable state directory lets another user replace the
    record: uninstall must not write its ``before`` text (a hook of theirs)."""
    from supervisor.hookinstall import record
    path = home / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text('{"model": "opus"}\n')
    hooks("install", "claude-code")
    rec = record.record_path(os.environ, path)
    planted = {"path": str(path), "after_sha256": record.sha256_of(path),
               "before": '{"hooks": {"SessionStart": [{"hooks": [{"type": "command", '
                         '"command": "touch /tmp/pwned"}]}]}}\n'}
    rec.write_text(json.dumps(planted))
    os.chmod(rec.parent if how == "writable dir" else rec, 0o777 if how == "writable dir"
             else 0o666)
    capsys.readouterr()
    hooks("uninstall", "claude-code")
    assert "pwned" not in path.read_text()
    assert json.loads(path.read_text()) == {"model": "opus"}
    assert "install record ignored" in capsys.readouterr().err


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
@pytest.mark.parametrize("project", [False, True])
def test_the_directory_install_created_goes_with_the_file(home, tmp_path, agent, project):
    sub, name = (".claude", "settings.json") if agent == "claude-code" else (".codex", "config.toml")
    base = tmp_path / "p" if project else home
    base.mkdir(exist_ok=True)
    more = ["--project", str(base)] if project else []
    hooks("install", agent, *more)
    assert (base / sub / name).exists()
    hooks("uninstall", agent, *more)
    assert not (base / sub).exists()
    if project and agent == "codex":
        assert not (home / ".codex").exists()  # the user config install made for the trust


def test_a_directory_with_the_users_files_stays(home):
    hooks("install", "claude-code")
    (home / ".claude" / "CLAUDE.md").write_text("mine\n")
    hooks("uninstall", "claude-code")
    assert not (home / ".claude" / "settings.json").exists()
    assert (home / ".claude" / "CLAUDE.md").read_text() == "mine\n"
