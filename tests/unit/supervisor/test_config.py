"""Configuration: DESIGN.md names and defaults; bad settings refused with one
line each before anything binds."""
import io
import logging
import socket

import pytest

from bridges.core.cappolicy import redact_text
from bridges.core.settings import EnvReader, parse_hostport
from supervisor import config
from supervisor.tools import logs


def load(env, **kw):
    kw.setdefault("check_ports", False)
    return config.load({"HOME": "/home/u", **env}, **kw)


def test_defaults_match_design():
    cfg, problems = load({})
    assert problems == []
    assert cfg.listen == ("127.0.0.1", 8787)
    assert cfg.relay_url is None and cfg.embedded_relay
    assert cfg.token is None
    assert (cfg.buffer, cfg.max_sessions) == (10_000, 500)
    assert [s.key for s in cfg.enabled] == ["otlp_in"]  # only OTLP on by default
    assert str(cfg.state_dir) == "/home/u/.local/state/aep-bridges"
    assert cfg.policy.ceiling == "metadata"
    assert cfg.policy.ceiling_for("attention.requested") == "redacted"


def test_xdg_state_home_and_explicit_state_dir():
    cfg, _ = load({"XDG_STATE_HOME": "/x/state"})
    assert str(cfg.state_dir) == "/x/state/aep-bridges"
    cfg, _ = load({"XDG_STATE_HOME": "/x/state", "AEP_STATE_DIR": "/y"})
    assert str(cfg.state_dir) == "/y"


def test_every_problem_gets_its_own_line():
    _, problems = load({
        "AEP_BRIDGE_NOPE": "1",
        "AEP_LISTEN": "localhost",
        "AEP_BUFFER": "lots",
        "AEP_MAX_SESSIONS": "0",
        "AEP_RELAY_URL": "ftp://x",
        "AEP_BRIDGE_OTLP_IN": "maybe",
        "AEP_CAPTURE": "everything",
    })
    joined = "\n".join(problems)
    assert len(problems) == 7, joined
    for needle in ("AEP_BRIDGE_NOPE: unknown bridge", "AEP_LISTEN='localhost'", "AEP_BUFFER='lots'",
                   "AEP_MAX_SESSIONS=0", "AEP_RELAY_URL='ftp://x'", "AEP_BRIDGE_OTLP_IN='maybe'",
                   "AEP_CAPTURE"):
        assert needle in joined


def test_unbuilt_bridge_is_refused_not_ignored(monkeypatch):
    # every FLEET bridge is built now: a stand-in entry without a factory
    from supervisor import config as config_mod
    spec = config_mod.BridgeSpec("later", "AEP_BRIDGE_LATER", False, None, None, "a later bridge")
    monkeypatch.setattr(config_mod, "FLEET", config_mod.FLEET + (spec,))
    monkeypatch.setattr(config_mod, "_FLAGS", config_mod._FLAGS | {spec.flag})
    _, problems = load({"AEP_BRIDGE_LATER": "1"})
    assert problems == ["AEP_BRIDGE_LATER=1: the later bridge is not part of this build"]


def test_bridges_enable_and_disable():
    cfg, problems = load({"AEP_BRIDGE_OTLP_IN": "0", "AEP_BRIDGE_OPENHANDS": "1"})
    assert problems == []
    assert [s.key for s in cfg.enabled] == ["openhands"]


@pytest.mark.parametrize("value,expected", [
    ("127.0.0.1:1", ("127.0.0.1", 1)),
    ("[::1]:8787", ("::1", 8787)),
    ("0.0.0.0:0", ("0.0.0.0", 0)),
])
def test_parse_hostport(value, expected):
    assert parse_hostport(value) == expected


@pytest.mark.parametrize("value", ["", ":80", "host:", "host:99999", "host:http", "[::1]8787"])
def test_parse_hostport_refuses(value):
    with pytest.raises(ValueError, match="is not host:port"):
        parse_hostport(value)


def test_env_reader_collects_one_line_per_problem_and_keeps_defaults():
    r = EnvReader({"F": "maybe", "I": "x", "J": "0", "S": "-1", "U": "ftp://h", "H": "nope",
                   "OK": "On"})
    assert r.flag("F") is False and r.flag("OK") is True and r.flag("MISSING", True) is True
    assert r.integer("I", 7) == 7 and r.integer("J", 5, minimum=1) == 5
    assert r.seconds("S", 15.0) == 15.0
    assert r.url("U", "http://d:1") == "ftp://h"
    assert r.hostport("H", "127.0.0.1:1") is None
    assert len(r.problems) == 6
    assert r.problems[0] == "F='maybe': expected 1/true/yes/on or 0/false/no/off"


def test_a_bad_flag_names_every_word_a_flag_accepts():
    """The problem line lists exactly what is accepted (not "1 or 0" while
    true/yes/on are taken too)."""
    from bridges.core.settings import FALSE, TRUE
    r = EnvReader({"F": "maybe", **{f"T{i}": w.upper() for i, w in enumerate(TRUE)},
                   **{f"N{i}": w.title() for i, w in enumerate(FALSE) if w}})
    assert r.flag("F", True) is True
    line = r.problems[0]
    for i, w in enumerate(TRUE):
        assert r.flag(f"T{i}") is True and w in line
    for i, w in enumerate(w for w in FALSE if w):
        assert r.flag(f"N{i + 1}", True) is False and w in line
    assert len(r.problems) == 1


def test_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _, problems = config.load({"AEP_LISTEN": f"127.0.0.1:{port}", "HOME": "/h"})
    assert problems == [f"AEP_LISTEN=127.0.0.1:{port}: address in use or not bindable"]


def test_relay_only_ignores_bridge_flags():
    cfg, problems = load({"AEP_BRIDGE_NOPE": "1", "AEP_RELAY_URL": "http://r:1"}, relay_only=True)
    assert problems == [] and cfg.enabled == () and cfg.relay_url is None


def test_log_settings_are_validated():
    _, problems = load({"AEP_LOG_LEVEL": "loud", "AEP_LOG_FORMAT": "xml"})
    assert problems == ["AEP_LOG_LEVEL='loud': expected one of debug, info, warning, error, critical",
                        "AEP_LOG_FORMAT='xml': expected json or text"]
    _, ok = load({"AEP_LOG_LEVEL": "DEBUG", "AEP_LOG_FORMAT": "Text"})
    assert ok == []


def test_misspelt_settings_are_pointed_out_not_fatal():
    cfg, problems = load({"AEP_LISTN": "127.0.0.1:1", "AEP_FOO": "1"})
    assert problems == []
    assert cfg.warnings[0].startswith("AEP_FOO is not a setting (ignored)")
    assert cfg.warnings[1] == "AEP_LISTN is not a setting (ignored); did you mean AEP_LISTEN?"
    assert len(cfg.warnings) == 2


def test_unknown_bridge_lists_only_bridges_that_can_be_enabled():
    _, problems = load({"AEP_BRIDGE_X": "1"})
    assert "AEP_BRIDGE_OTLP_IN" in problems[0] and "AEP_BRIDGE_ACP" in problems[0]


def test_relay_byte_budgets_and_cors_origins():
    cfg, problems = load({"AEP_BUFFER_BYTES": "4096", "AEP_BUFFER_TOTAL_BYTES": "1048576",
                          "AEP_CORS_ORIGINS": "https://Dash.example:443, http://localhost:5173"})
    assert problems == []
    assert (cfg.buffer_bytes, cfg.total_bytes) == (4096, 1048576)
    assert cfg.cors_origins == ("https://dash.example", "http://localhost:5173")
    _, bad = load({"AEP_CORS_ORIGINS": "*", "AEP_BUFFER_BYTES": "12"})
    assert len(bad) == 2 and "AEP_CORS_ORIGINS" in bad[1] and "AEP_BUFFER_BYTES=12" in bad[0]


def test_a_relative_state_dir_is_a_config_problem_with_or_without_probes(tmp_path, monkeypatch):
    """A service's working directory is not the user's: ``AEP_STATE_DIR``
    must be absolute, for ``run`` (probes) and ``check --no-ports`` alike;
    nothing is created relative to the cwd."""
    monkeypatch.chdir(tmp_path)
    for probes in (True, False):
        _, problems = config.load({"HOME": str(tmp_path), "AEP_STATE_DIR": "rel/state"},
                                  check_ports=probes)
        assert "AEP_STATE_DIR='rel/state': must be an absolute path" in problems, problems
    assert not (tmp_path / "rel").exists()


def test_the_check_probe_creates_no_state_dir(tmp_path):
    missing = tmp_path / "a" / "b" / "state"
    assert config.state_dir_problem(missing, create=False) is None
    assert not (tmp_path / "a").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    problem = config.state_dir_problem(blocker / "state", create=False)
    assert problem is not None and "not writable" in problem and "not a directory" in problem
    assert config.state_dir_problem(missing) is None and missing.is_dir()  # run creates it


def test_a_state_dir_the_daemon_creates_is_private(tmp_path):
    """Session logs hold the agents' activity: a state directory made by the
    daemon is 0700 (under any umask); one the operator made keeps its mode."""
    import os
    import stat
    old = os.umask(0o022)
    try:
        made = tmp_path / "made" / "state"
        assert config.state_dir_problem(made) is None
        assert stat.S_IMODE(made.stat().st_mode) == 0o700
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o750)
        assert config.state_dir_problem(theirs) is None
        assert stat.S_IMODE(theirs.stat().st_mode) == 0o750
    finally:
        os.umask(old)


def test_a_relative_xdg_state_home_is_ignored(tmp_path):
    from bridges.core.paths import state_dir
    assert state_dir({"HOME": str(tmp_path), "XDG_STATE_HOME": "rel"}) == \
        tmp_path / ".local" / "state" / "aep-bridges"


def test_the_smallest_accepted_byte_budgets_still_hold_events():
    """Each held event is accounted ``len(raw) + ENTRY_OVERHEAD`` bytes: at
    the old minimum (1024 = the overhead) a session buffer held nothing.
    The minimum is now four overheads, and a buffer at it holds events."""
    from supervisor.relay.buffer import ENTRY_OVERHEAD, Entry, SessionBuffers
    for name in ("AEP_BUFFER_BYTES", "AEP_BUFFER_TOTAL_BYTES"):
        _, bad = load({name: str(4 * ENTRY_OVERHEAD - 1)})
        assert len(bad) == 1 and f"{name}={4 * ENTRY_OVERHEAD - 1}" in bad[0]
    cfg, problems = load({"AEP_BUFFER_BYTES": str(4 * ENTRY_OVERHEAD),
                          "AEP_BUFFER_TOTAL_BYTES": str(4 * ENTRY_OVERHEAD)})
    assert problems == []
    b = SessionBuffers(100, 10, buffer_bytes=cfg.buffer_bytes, total_bytes=cfg.total_bytes)
    raw = b'{"aep":"0.1","type":"tool.completed","data":{"status":"success"}}' * 4
    for seq in range(3):
        attrs = {"id": f"e{seq}", "source": "aep://h/agent/a", "type": "tool.completed",
                 "session": "s1", "seq": seq}
        b.admit(Entry(attrs, raw, (0, seq), 1, 1))
    assert b.held(("aep://h/agent/a", "s1")) == 3


def test_the_start_probe_gives_back_spares_when_the_inodes_are_gone(tmp_path, monkeypatch):
    """Our own spare session log files may hold the last inodes (review: the
    daemon could not start again once another program took the rest): the
    probe gives some back and tries again; with none to give it refuses."""
    import errno
    spare = tmp_path / "logs" / ".spare"
    spare.mkdir(parents=True)
    for i in range(3):
        (spare / f"{i}.spare").touch()
    real = type(tmp_path).write_bytes
    always = [False]

    def write_bytes(self, data):  # the file system is full while our spares are there
        if self.name == ".aep-bridges-probe" and (always[0] or len(list(spare.iterdir())) == 3):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)
    monkeypatch.setattr(type(tmp_path), "write_bytes", write_bytes)
    assert config.state_dir_problem(tmp_path) is None
    assert not any(spare.iterdir())  # given back (up to 64 a time)
    always[0] = True
    problem = config.state_dir_problem(tmp_path)  # nothing left to give back
    assert problem is not None and "No space left on device" in problem


def test_emitter_credentials_file(tmp_path):
    """``AEP_EMITTER_TOKENS`` (issue 25): ``name=token`` lines in a file no
    one else may read; every problem one line, never quoting a token."""
    creds = tmp_path / "emitters"
    creds.write_text("# the emitters\nalice = alice-tok\n\nbob=bob-tok\n")
    creds.chmod(0o600)
    env = {"AEP_TOKEN": "shared", "AEP_EMITTER_TOKENS": str(creds), "AEP_CLAIM_GRACE": "30"}
    cfg, problems = load(env, check_ports=False)
    assert problems == []
    assert cfg.emitter_tokens == (("alice", "alice-tok"), ("bob", "bob-tok"))
    assert cfg.claim_grace == 30.0 and "alice-tok" not in repr(cfg)
    # the daemon's own credentials: redacted from captured content like
    # AEP_TOKEN (outside review of issue 25: a Bash command carrying alice's
    # token reached every reader of the stream and the session log), and
    # scrubbed from the daemon's log lines
    red = redact_text("curl -u x:alice-tok http://h; echo bob-tok shared", cfg.policy)
    assert "alice-tok" not in red and "bob-tok" not in red and "shared" not in red, red
    out = io.StringIO()
    logs.setup(cfg.environ, stream=out, secrets=[t for _, t in cfg.emitter_tokens])
    logging.getLogger("aep.test").warning("a line with alice-tok in it")
    assert "alice-tok" not in out.getvalue() and "a line with" in out.getvalue()
    logs.setup(cfg.environ, stream=io.StringIO())
    creds.chmod(0o640)
    _, problems = load(env, check_ports=False)
    assert len(problems) == 1 and "group or others (mode 640)" in problems[0], problems
    creds.write_text("alice=alice-tok\nalice=other\nbob=shared\nno-equals\nbad name=x\n"
                     "carol=has space\n")
    creds.chmod(0o600)
    _, problems = load(env, check_ports=False)
    assert [p.split(": ", 1)[0].rsplit(" ", 2)[-2:] for p in problems] == [
        ["line", "2"], ["line", "3"], ["line", "4"], ["line", "5"], ["line", "6"]], problems
    assert not any(t in p for p in problems for t in ("alice-tok", "other", "has space"))
    _, problems = load({"AEP_EMITTER_TOKENS": str(creds)}, check_ports=False)
    assert any("needs AEP_TOKEN" in p for p in problems), problems
    _, problems = load({"AEP_TOKEN": "t", "AEP_EMITTER_TOKENS": str(tmp_path / "none")},
                       check_ports=False)
    assert problems == [f"AEP_EMITTER_TOKENS={str(tmp_path / 'none')!r}: No such file or directory"]
