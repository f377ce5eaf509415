"""The fleet's reserved sources (:mod:`supervisor.relay.fleetsources`),
compared normalized (issue 25, sixth outside attack: the base was matched
as a literal prefix, so every other spelling of ``aep://vm/agent/claude-code``
was accepted from a non-fleet party)."""
from __future__ import annotations

import pytest

from supervisor.relay.fleetsources import FleetSources

BASE = "aep://vm/agent/claude-code"


@pytest.fixture()
def fleet() -> FleetSources:
    f = FleetSources()
    f.reserve(BASE)
    f.reserve("aep://vm/agent/codex")
    return f


#: every spelling the attack posted (a4_fleet_sources.py), and then some;
#: the raw non-ASCII ones are refused before (no URI: test_relay_envelope.py),
#: here their percent-encoded forms
OWNED = {
    "exact": BASE, "upper": "AEP://VM/AGENT/CLAUDE-CODE", "trailing /": BASE + "/",
    "session under": BASE + "/session/x", "query": BASE + "?x=1", "fragment": BASE + "#f",
    "semicolon": BASE + ";x", "pct %2D": "aep://vm/agent/claude%2Dcode",
    "pct %61gent": "aep://vm/%61gent/claude-code", "pct host %76m": "aep://%76m/agent/claude-code",
    "dot seg": "aep://vm/agent/./claude-code", "dotdot": "aep://vm/x/../agent/claude-code",
    "pct dotdot": "aep://vm/x/%2E%2E/agent/claude-code", "double slash": "aep://vm//agent/claude-code",
    "port": "aep://vm:80/agent/claude-code", "empty port": "aep://vm:/agent/claude-code",
    "userinfo": "aep://u@vm/agent/claude-code", "userinfo+port": "aep://u:p@vm:1/agent/claude-code",
    "host dot": "aep://vm./agent/claude-code", "pct %20": "aep://vm/agent/claude-code%20",
    "pct tab": "aep://vm/agent/claude-code%09",
    "U+2010 hyphen": "aep://vm/agent/claude%E2%80%90code",
    "cyrillic e": "aep://vm/agent/claude-cod%D0%B5", "cyrillic a in agent": "aep://vm/%D0%B0gent/codex",
    "fullwidth c": "aep://vm/agent/%EF%BD%83laude-code", "bidi RLO": "aep://vm/agent/claude-code%E2%80%AE",
    "zero width": "aep://vm/agent/claude-%E2%80%8Bcode", "query session": BASE + "?/session/x",
    "ipv4 host": "aep://127.0.0.1/agent/claude-code", "other loopback": "aep://127.8.9.1/agent/codex",
    "localhost": "aep://localhost/agent/claude-code", "LOCALHOST.": "aep://LOCALHOST./agent/codex",
    "x.localhost": "aep://x.localhost/agent/codex", "ipv6": "aep://[::1]:9/agent/claude-code",
    "unspecified": "aep://0.0.0.0/agent/codex", "second agent": "aep://vm/agent/codex/session/s",
    # a seventh attack: loopback in inet_aton's forms and IPv4-mapped; marks NFKC leaves
    # alone, blank letters, lookalike separators, an empty host
    "127.1": "aep://127.1/agent/claude-code", "decimal": "aep://2130706433/agent/claude-code",
    "hex": "aep://0x7f000001/agent/claude-code", "octal": "aep://0177.0.0.1/agent/claude-code",
    "zero": "aep://0/agent/claude-code", "v4-mapped": "aep://[::ffff:127.0.0.1]/agent/claude-code",
    "v4-mapped hex": "aep://[::ffff:7f00:1]/agent/claude-code",
    "CGJ U+034F": "aep://localhost/agent/claude-c%CD%8Fode",
    "VS16": "aep://localhost/agent/claude-code%EF%B8%8F",
    "Mongolian VS": "aep://localhost/agent/claude%E1%A0%8B-code",
    "Hangul filler": "aep://localhost/agent/claude-co%E3%85%A4de",
    "CGJ in agent": "aep://localhost/a%CD%8Fgent/claude-code",
    "empty host": "aep:///agent/claude-code", "backslashes": "aep://localhost\\agent\\claude-code",
    "underscore": "aep://localhost/agent/claude_code",
    "long tail": BASE + "/" + "%EF%B7%BA" * 7000,
}

#: not the fleet's: other agents, other hosts (an uplinked daemon elsewhere
#: sends under aep://{its host}/agent/claude-code), other schemes and paths
NOT_OWNED = {
    "other agent": "aep://vm/agent/my-agent", "longer name": "aep://vm/agent/claude-code2",
    "other host": "aep://vm2/agent/claude-code", "remote ip": "aep://10.0.0.7/agent/claude-code",
    "host prefix": "aep://vmx/agent/claude-code", "other scheme": "urn:vm:agent:claude-code",
    "http": "http://vm/agent/claude-code", "not agent/": "aep://vm/agents/claude-code",
    "agent only": "aep://vm/agent", "agent deeper": "aep://vm/x/agent/claude-code",
    "dotdot out": "aep://vm/agent/claude-code/../../x", "no authority": "aep:/agent/claude-code",
    "non-ASCII other": "aep://vm/agent/%C3%A9t%C3%A9",
}


@pytest.mark.parametrize("source", list(OWNED.values()), ids=list(OWNED))
def test_every_spelling_of_a_reserved_source_is_owned(fleet, source):
    assert fleet.owns(source)
    assert fleet.owns(source)  # and so from the verdict cache


@pytest.mark.parametrize("source", list(NOT_OWNED.values()), ids=list(NOT_OWNED))
def test_other_sources_are_not(fleet, source):
    assert not fleet.owns(source)


def test_nothing_is_owned_before_a_reservation():
    assert not FleetSources().owns(BASE)


@pytest.mark.parametrize("base", ["aep://vm/agent", "aep://vm/x/claude-code", "urn:x", "http://vm/agent/a"])
def test_a_base_of_another_shape_is_a_programming_error(base):
    with pytest.raises(ValueError):
        FleetSources().reserve(base)


def test_a_reservation_after_a_verdict_is_seen():
    f = FleetSources()
    f.reserve(BASE)
    assert not f.owns("aep://vm/agent/codex")
    f.reserve("aep://vm/agent/codex")
    assert f.owns("aep://vm/agent/codex")


def test_the_verdict_cache_is_bounded(fleet):
    for n in range(5000):
        fleet.owns(f"aep://vm/agent/a{n}")
    assert len(fleet._seen) <= 4096
    assert fleet.owns(BASE)
