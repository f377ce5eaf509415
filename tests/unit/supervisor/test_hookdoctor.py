"""``aep-bridges doctor`` for the hook bridges (issue 27's trial, finding 3):
each check on real config files written by the installer, in a temporary
home and project: installed or not (and Codex's trust), pointing at this
daemon, the token, the spool, the shim command, the control gate."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from bridges import claude_code, codex_hooks
from bridges.core.capture import CapturePolicy
from supervisor.hookinstall import claude, codex
from supervisor.hookinstall.common import write_in_place
from supervisor.tools import doctor, hookdoctor

TOKEN = "doctor-test-token"


def world(tmp_path: Path, *, port: int = 8787, token: str | None = TOKEN, control: bool = False,
          agent: str = "claude-code"):
    home, project, state = tmp_path / "home", tmp_path / "proj", tmp_path / "state"
    for d in (home, project, state):
        d.mkdir(parents=True, exist_ok=True)
    env = {"AEP_STATE_DIR": str(state), "CODEX_HOME": str(home / ".codex")}
    if token:
        env["AEP_TOKEN"] = token
    if control:
        env["AEP_CLAUDE_CODE_CONTROL" if agent == "claude-code" else "AEP_CODEX_HOOKS_CONTROL"] = "1"
    pkg = claude_code if agent == "claude-code" else codex_hooks
    bridge = pkg.from_env(env, policy=CapturePolicy())
    cfg = SimpleNamespace(listen=("127.0.0.1", port), token=token, state_dir=state)
    return SimpleNamespace(home=home, project=project, state=state, env=env, bridge=bridge,
                           cfg=cfg)


def install_claude(w, *, daemon: str = "http://127.0.0.1:8787", transport: str = "http",
                   python: str | None = None) -> Path:
    path = claude.settings_path(project=None, home=w.home)
    plan = claude.install(path, transport=transport, daemon=daemon, hold_s=120,
                          daemon_given=daemon != "http://127.0.0.1:8787", python=python,
                          spool=str(w.state / "hooks-spool"))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_in_place(path, plan.after)
    return path


def check(w, *, ours: bool = False):
    found = hookdoctor.findings(w.bridge, w.cfg, ours=ours, env=w.env, project=w.project,
                                home=w.home)
    return found, [f for f in found if not f.ok]


def test_not_installed_is_a_failure_with_the_install_command(tmp_path):
    w = world(tmp_path, port=9999)
    _, fails = check(w)
    assert len(fails) == 1
    assert "not installed" in fails[0].what
    assert fails[0].fix.startswith("aep-bridges hooks install claude-code --daemon http://127.0.0.1:9999")


def test_installed_for_this_daemon_with_its_token_is_all_ok(tmp_path):
    w = world(tmp_path)
    install_claude(w)
    found, fails = check(w)
    assert fails == [], fails
    text = "\n".join(f.what for f in found)
    assert "events installed in" in text and "point at this daemon" in text
    assert "send the daemon's token" in text and "the shim command resolves" in text
    assert "control gate: off" in text and "AEP_CLAUDE_CODE_CONTROL=1" in text
    assert TOKEN not in text


def test_hooks_pointing_at_another_port_fail_with_a_reinstall(tmp_path):
    w = world(tmp_path, port=8790)
    install_claude(w, daemon="http://127.0.0.1:8787")
    _, fails = check(w)
    (f,) = [f for f in fails if "not this daemon" in f.what]
    assert "http://127.0.0.1:8787/hooks/claude-code" in f.what
    assert f.fix == ("aep-bridges hooks install claude-code --daemon http://127.0.0.1:8790 "
                     f"--user --spool {w.state / 'hooks-spool'}")


def test_a_token_the_hooks_do_not_send_fails(tmp_path):
    w = world(tmp_path)
    path = install_claude(w)
    doc = json.loads(path.read_text())
    doc["hooks"]["PreToolUse"][0]["hooks"][0]["headers"] = {"Authorization": "Bearer old-token"}
    doc["hooks"]["Stop"][0]["hooks"][0]["allowedEnvVars"] = []
    doc["httpHookAllowedEnvVars"] = ["HOME"]
    path.write_text(json.dumps(doc))
    found, fails = check(w)
    (f,) = [f for f in fails if "requires AEP_TOKEN" in f.what]
    assert "PreToolUse sends a literal token" in f.what and "old-token" not in f.what
    assert "Stop sends $AEP_TOKEN without AEP_TOKEN" in f.what
    assert "httpHookAllowedEnvVars lacks AEP_TOKEN" in f.what
    assert all(TOKEN not in x.what for x in found)


def test_a_token_file_with_another_token_fails_and_the_right_one_passes(tmp_path):
    w = world(tmp_path)
    path = install_claude(w, transport="command")
    tf = tmp_path / "tok"
    tf.write_text("not-it\n")
    doc = json.loads(path.read_text())
    for groups in doc["hooks"].values():
        groups[0]["hooks"][0]["command"] += f" --token-file {tf}"
    path.write_text(json.dumps(doc))
    _, fails = check(w)
    assert any("holds another token than the daemon's" in f.what for f in fails)
    tf.write_text(TOKEN + "\n")
    assert check(w)[1] == []


def test_moments_waiting_in_the_spool_are_counted(tmp_path):
    w = world(tmp_path)
    install_claude(w)
    spool = w.state / "hooks-spool"
    spool.mkdir()
    (spool / "claude-code.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    (spool / "claude-code.jsonl.ingesting-01X").write_text('{"a": 3}\n')
    _, fails = check(w)
    (f,) = fails
    assert "3 moments waiting" in f.what and "not running" in f.what
    assert "aep-bridges run" in f.fix
    found, fails = check(w, ours=True)
    assert fails == [] and any("3 moments waiting (the running daemon" in x.what for x in found)


def test_a_shim_whose_interpreter_is_gone_fails(tmp_path):
    w = world(tmp_path)
    install_claude(w, python=str(tmp_path / "gone" / "python3"))  # SessionStart is a command hook
    _, fails = check(w)
    (f,) = [f for f in fails if "shim command does not resolve" in f.what]
    assert "gone/python3" in f.what and f.fix.startswith("aep-bridges hooks install claude-code")
    w2 = world(tmp_path / "ok")
    install_claude(w2, python=sys.executable)
    assert check(w2)[1] == []


def test_the_control_gate_is_said(tmp_path):
    w = world(tmp_path, control=True)
    install_claude(w)
    found, fails = check(w)
    assert fails == []
    assert any("control gate: on" in f.what for f in found)


def test_codex_hooks_not_trusted_fail(tmp_path):
    w = world(tmp_path, agent="codex")
    home = w.home / ".codex"
    path = codex.config_path(project=None, codex_home=home)
    plans = codex.install(path, state_path=path, hold_s=120, spool=str(w.state / "hooks-spool"))
    path.parent.mkdir(parents=True, exist_ok=True)
    for plan in plans:
        write_in_place(plan.path, plan.after)
    assert check(w)[1] == []
    text = path.read_text()
    path.write_text(text.replace("trusted_hash", "x_trusted_hash"))  # the trust gone
    _, fails = check(w)
    (f,) = fails
    assert "not trusted" in f.what and "aep-bridges hooks install codex" in f.fix


def test_a_malformed_settings_file_fails_with_its_line(tmp_path):
    w = world(tmp_path)
    path = claude.settings_path(project=None, home=w.home)
    path.parent.mkdir(parents=True)
    path.write_text('{\n  "hooks": {,\n}\n')
    _, fails = check(w)
    assert any(f"{path}:2:" in f.what for f in fails)


def test_doctor_runs_the_hook_checks_for_a_hook_bridge_only(tmp_path):
    w = world(tmp_path)
    out = io.StringIO()
    cfg = SimpleNamespace(**vars(w.cfg), relay_url=None, listen_=None)
    seen = []

    def hooks(b, c, *, ours):
        seen.append(b.name)
        return [doctor.Finding(False, "hooked", "fix it")]
    rc = doctor.run(cfg, [w.bridge], [], ours=lambda _b=None: False, out=out, hooks=hooks)
    assert rc == 1 and seen == ["claude_code"] and "FAIL  hooked" in out.getvalue()


def runnable(fix: str) -> list[str]:
    """The fix's command line (before any parenthesized remark), parsed by
    the real ``hooks install`` argument parser."""
    import argparse
    import shlex

    from supervisor.hookinstall.cli import add_parser
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    argv = shlex.split(fix.split(" (")[0].split(", or ")[0])
    assert argv[:2] == ["aep-bridges", "hooks"], fix
    parser.parse_args(argv[1:])  # exits on an unknown option
    return argv


def test_every_install_fix_names_the_scope_and_this_daemon(tmp_path):
    w = world(tmp_path, port=8790)
    _, fails = check(w)
    (f,) = fails
    argv = runnable(f.fix)
    assert argv[argv.index("--daemon") + 1] == "http://127.0.0.1:8790" and "--user" in argv
    # a project file pointing at another daemon, with a gone interpreter
    path = claude.settings_path(project=w.project, home=w.home)
    plan = claude.install(path, transport="command", daemon="http://127.0.0.1:8787", hold_s=120,
                          python=str(tmp_path / "gone" / "python3"),
                          spool=str(w.state / "hooks-spool"))
    path.parent.mkdir(parents=True)
    write_in_place(path, plan.after)
    _, fails = check(w)
    fixes = [f.fix for f in fails if "hooks install" in f.fix]
    assert len(fixes) == 2, fails
    for fix in fixes:
        argv = runnable(fix)
        assert argv[argv.index("--daemon") + 1] == "http://127.0.0.1:8790"
        assert argv[argv.index("--project") + 1] == str(w.project.resolve())


def test_a_wrong_token_file_fix_says_no_http_header(tmp_path):
    w = world(tmp_path)
    path = install_claude(w, transport="command")
    tf = tmp_path / "tok"
    tf.write_text("not-it\n")
    doc = json.loads(path.read_text())
    for groups in doc["hooks"].values():
        groups[0]["hooks"][0]["command"] += f" --token-file {tf}"
    path.write_text(json.dumps(doc))
    _, fails = check(w)
    (f,) = [f for f in fails if "requires AEP_TOKEN" in f.what]
    assert "header" not in f.fix and str(tf) in f.fix
    runnable(f.fix.split(", or ", 1)[1])


def test_hooks_in_both_the_user_and_the_project_file_fail(tmp_path):
    w = world(tmp_path)
    install_claude(w)
    assert check(w)[1] == []
    path = claude.settings_path(project=w.project, home=w.home)
    plan = claude.install(path, transport="http", daemon="http://127.0.0.1:8787", hold_s=120,
                          spool=str(w.state / "hooks-spool"))
    path.parent.mkdir(parents=True)
    write_in_place(path, plan.after)
    _, fails = check(w)
    (f,) = fails
    assert "installed twice" in f.what and "two asks per gated tool" in f.what
    assert runnable(f.fix)[:4] == ["aep-bridges", "hooks", "uninstall", "claude-code"]
    assert f"--project {w.project.resolve()}" in f.fix


def test_a_project_that_is_the_home_is_one_file_not_twice(tmp_path):
    w = world(tmp_path)
    install_claude(w)
    found = hookdoctor.findings(w.bridge, w.cfg, ours=False, env=w.env, project=w.home,
                                home=w.home)
    assert [f for f in found if not f.ok] == []
    assert sum("events installed in" in f.what for f in found) == 1


def test_one_moment_is_singular(tmp_path):
    w = world(tmp_path)
    install_claude(w)
    spool = w.state / "hooks-spool"
    spool.mkdir()
    (spool / "claude-code.jsonl").write_text('{"a": 1}\n')
    found, _ = check(w, ours=True)
    assert any("1 moment waiting (the running" in f.what for f in found)


def test_codex_twice_only_when_the_project_is_trusted(tmp_path):
    w = world(tmp_path, agent="codex")
    home = w.home / ".codex"
    user = codex.config_path(project=None, codex_home=home)
    proj = codex.config_path(project=w.project.resolve(), codex_home=home)
    proj.parent.mkdir(parents=True)
    for path in (proj,):  # the project's alone, its project untrusted: Codex never reads it
        for plan in codex.install(path, state_path=user, hold_s=120,
                                  spool=str(w.state / "hooks-spool")):
            plan.path.parent.mkdir(parents=True, exist_ok=True)
            write_in_place(plan.path, plan.after)
    _, fails = check(w)
    (f,) = fails
    assert "the project is not trusted" in f.what and "trust_level" in f.fix
    for plan in codex.install(user, state_path=user, hold_s=120,
                              spool=str(w.state / "hooks-spool")):
        write_in_place(plan.path, plan.after)
    assert check(w)[1] == []  # the user's file runs; the untrusted project's is not read
    user.write_text(user.read_text() + f'\n[projects."{w.project.resolve()}"]\n'
                                       'trust_level = "trusted"\n')
    _, fails = check(w)
    (f,) = fails
    assert "installed twice" in f.what
    assert runnable(f.fix)[:4] == ["aep-bridges", "hooks", "uninstall", "codex"]
