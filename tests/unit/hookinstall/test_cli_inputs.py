"""``aep-bridges hooks install`` from a fresh user's side (issue 27's trial):
the daemon's ``--config`` / ``AEP_CONFIG`` / ``--env-file`` give the
default ``--daemon`` (the configured ``AEP_LISTEN``), the output says the
URL written, and bad options (a missing ``--project``, a hold out of
range, a ``--daemon`` that is no http(s) URL) exit 2 writing nothing."""
from __future__ import annotations

import json
import os

import pytest

from supervisor.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A process environment of the test's own (``--config`` is written into
    it), no AEP_* setting, ``HOME`` a temporary directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    home = tmp_path / "home"
    home.mkdir()
    env["HOME"] = str(home)
    env["CODEX_HOME"] = str(home / ".codex")
    env.pop("XDG_STATE_HOME", None)
    monkeypatch.setattr(os, "environ", env)
    return home


def urls(home) -> set[str]:
    doc = json.loads((home / ".claude" / "settings.json").read_text())
    return {h["url"] for groups in doc["hooks"].values() for g in groups for h in g["hooks"]
            if h["type"] == "http"}


@pytest.mark.parametrize("how", ["--config", "AEP_CONFIG", "--env-file"])
def test_install_takes_the_daemons_listen_from_its_config(home, tmp_path, capsys, how):
    conf = tmp_path / ("daemon.env" if how == "--env-file" else "daemon.toml")
    conf.write_text("AEP_LISTEN=127.0.0.1:9123\n" if how == "--env-file"
                    else 'AEP_LISTEN = "127.0.0.1:9123"\n')
    argv = ["hooks", "install", "claude-code"]
    if how == "AEP_CONFIG":
        os.environ["AEP_CONFIG"] = str(conf)
    else:
        argv += [how, str(conf)]
    assert main(argv) == 0
    assert urls(home) == {"http://127.0.0.1:9123/hooks/claude-code"}
    assert "the hooks send to the daemon at http://127.0.0.1:9123" in capsys.readouterr().out


def test_codex_install_writes_the_configured_daemon_into_the_shim(home, tmp_path, capsys):
    conf = tmp_path / "daemon.toml"
    conf.write_text('AEP_LISTEN = "127.0.0.1:9124"\n')
    assert main(["hooks", "install", "codex", "--config", str(conf)]) == 0
    assert "--daemon http://127.0.0.1:9124" in (home / ".codex" / "config.toml").read_text()
    assert "the hooks send to the daemon at http://127.0.0.1:9124" in capsys.readouterr().out


def test_a_flag_wins_over_the_config_and_a_bad_config_refuses(home, tmp_path, capsys):
    conf = tmp_path / "daemon.toml"
    conf.write_text('AEP_LISTEN = "127.0.0.1:9123"\n')
    assert main(["hooks", "install", "claude-code", "--config", str(conf),
                 "--daemon", "http://127.0.0.1:9200"]) == 0
    assert urls(home) == {"http://127.0.0.1:9200/hooks/claude-code"}
    conf.write_text("AEP_LISTEN = \n")
    assert main(["hooks", "install", "claude-code", "--config", str(conf)]) == 2
    assert urls(home) == {"http://127.0.0.1:9200/hooks/claude-code"}


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_a_missing_project_is_refused_not_created(home, tmp_path, capsys, agent):
    gone = tmp_path / "no-such-project"
    assert main(["hooks", "install", agent, "--project", str(gone)]) == 2
    assert not gone.exists()
    err = capsys.readouterr().err
    assert f"--project {gone}: no such directory" in err


@pytest.mark.parametrize("hold", ["0", "-5", "3601"])
def test_a_hold_out_of_range_is_refused(home, capsys, hold):
    assert main(["hooks", "install", "claude-code", "--hold-s", hold]) == 2
    assert f"--hold-s {hold}" in capsys.readouterr().err
    assert not (home / ".claude").exists()


@pytest.mark.parametrize("daemon", ["127.0.0.1:8787", "ftp://127.0.0.1:8787", "http://",
                                    "http://127.0.0.1:99999", "localhost"])
def test_a_daemon_that_is_no_http_url_is_refused(home, capsys, daemon):
    assert main(["hooks", "install", "claude-code", "--daemon", daemon]) == 2
    assert f"--daemon {daemon}: not an http:// or https:// URL" in capsys.readouterr().err
    assert not (home / ".claude").exists()


def test_a_good_hold_and_https_daemon_pass(home):
    assert main(["hooks", "install", "claude-code", "--hold-s", "3600",
                 "--daemon", "https://box.lan:9443/"]) == 0
    assert urls(home) == {"https://box.lan:9443/hooks/claude-code"}


@pytest.mark.parametrize("daemon", ["http://127.0.0.1:1/x?q=1", "http://127.0.0.1:1/#f",
                                    "http://u:p@127.0.0.1:1"])
def test_a_daemon_with_a_query_fragment_or_user_is_refused(home, capsys, daemon):
    assert main(["hooks", "install", "claude-code", "--daemon", daemon]) == 2
    assert f"--daemon {daemon}: a query" in capsys.readouterr().err
    assert not (home / ".claude").exists()


def test_a_daemon_path_prefix_is_joined_by_the_url_and_the_shim(home):
    """``--daemon http://h:p/aep``: the HTTP hook's URL and the shim (its own
    URL split) both post to ``/aep/hooks/<agent>``."""
    from bridges.hooks_common.shim import _split_url
    assert main(["hooks", "install", "claude-code", "--daemon", "http://127.0.0.1:9/aep/"]) == 0
    assert urls(home) == {"http://127.0.0.1:9/aep/hooks/claude-code"}
    doc = json.loads((home / ".claude" / "settings.json").read_text())
    command = doc["hooks"]["SessionStart"][0]["hooks"][0]["command"]
    assert "--daemon http://127.0.0.1:9/aep" in command
    assert _split_url("http://127.0.0.1:9/aep")[4] == "/aep"
