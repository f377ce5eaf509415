"""The TOML config file (:mod:`supervisor.configfile`): the environment's
names, values as the environment would hold them, the same did-you-mean
warning, problems for what cannot be a setting, and where each setting
came from (issue 29)."""
from __future__ import annotations

from supervisor.config import known_settings
from supervisor.configfile import Sources, parse, read

KNOWN = known_settings()


def test_values_become_the_environments_strings():
    values, problems, warnings = parse(
        'AEP_LISTEN = "127.0.0.1:9000"\nAEP_BUFFER = 500\nAEP_BRIDGE_OPENCODE_SSE = true\n'
        'AEP_OTLP_PRIMARY = false\nAEP_BODY_TIMEOUT = 2.5\n'
        'AEP_CORS_ORIGINS = ["http://a:1", "http://b:2"]\n', source="f.toml", known=KNOWN)
    assert problems == [] and warnings == []
    assert values == {"AEP_LISTEN": "127.0.0.1:9000", "AEP_BUFFER": "500",
                      "AEP_BRIDGE_OPENCODE_SSE": "1", "AEP_OTLP_PRIMARY": "0",
                      "AEP_BODY_TIMEOUT": "2.5", "AEP_CORS_ORIGINS": "http://a:1,http://b:2"}


def test_misspelt_names_warn_as_in_the_environment_and_unknown_bridges_pass_on():
    values, problems, warnings = parse('AEP_TOKN = "x"\nLISTEN = "y"\nAEP_BRIDGE_NOPE = 1\n',
                                       source="f.toml", known=KNOWN)
    assert problems == []
    assert warnings[0] == ("AEP_TOKN (in f.toml) is not a setting (ignored); "
                           "did you mean AEP_TOKEN?")
    assert warnings[1].startswith("LISTEN (in f.toml) is not a setting (ignored)")
    # config.load refuses it with the environment's own words
    assert values == {"AEP_BRIDGE_NOPE": "1"}


def test_what_cannot_be_a_setting_is_a_problem():
    values, problems, _ = parse('[relay]\nAEP_BUFFER = 5\n', source="f.toml", known=KNOWN)
    assert values == {} and problems and "top-level" in problems[0]
    _, problems, _ = parse('AEP_BUFFER = [[1]]\n', source="f.toml", known=KNOWN)
    assert "array of strings" in problems[0]
    _, problems, _ = parse('AEP_BUFFER = \n', source="f.toml", known=KNOWN)
    assert problems[0].startswith("f.toml: not TOML:") and "line 1" in problems[0]


def test_a_secret_in_a_file_others_can_read_is_warned(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('AEP_TOKEN = "0123456789abcdef0123"\n')
    f.chmod(0o644)
    values, _, warnings = read(f, known=KNOWN, secrets=frozenset({"AEP_TOKEN"}))
    assert values["AEP_TOKEN"] and "other users can read" in warnings[0]
    assert "0123456789abcdef" not in warnings[0]
    f.chmod(0o600)
    assert read(f, known=KNOWN, secrets=frozenset({"AEP_TOKEN"}))[2] == []
    assert "No such file" in read(tmp_path / "none.toml", known=KNOWN)[1][0]


def test_the_environment_wins_and_sources_say_so():
    env = {"AEP_LISTEN": "127.0.0.1:1", "HOME": "/h"}
    s = Sources.of(env)
    s.fill(env, {"AEP_LISTEN": "127.0.0.1:2", "AEP_BUFFER": "5"}, "config file c.toml")
    assert env["AEP_LISTEN"] == "127.0.0.1:1" and env["AEP_BUFFER"] == "5"
    assert s.of_name("AEP_LISTEN") == "environment"
    assert s.of_name("AEP_BUFFER") == "config file c.toml"
