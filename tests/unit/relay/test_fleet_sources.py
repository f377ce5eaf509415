"""The fleet's reserved sources (:mod:`supervisor.relay.fleetsources`),
compared normalized (issue 25, sixth outside attack: the base was matched
as a literal prefix, so every other spelling of ``aep://vm/agent/claude-code``
was accepted from a non-fleet party)."""
from __future__ import annotations

import sys
from urllib.parse import quote

import pytest

from supervisor.relay import fleetsources
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
    # an eighth attack (atk8 01/01b): past the old read limits (64 segments, 2,048
    # characters), no authority, IPv4 in IPv6, ideographic stops, a ligature
    "70 empty segments": "aep://vm" + "/" * 70 + "agent/claude-code/session/s1",
    "70 ./ segments": "aep://localhost/" + "./" * 70 + "agent/claude-code/session/s2",
    "x/.. x70": "aep://127.0.0.1/" + "x/../" * 70 + "agent/claude-code/session/s3",
    "2100-char userinfo": "aep://" + "u" * 2100 + "@vm/agent/claude-code/session/s4",
    "no authority": "aep:/agent/claude-code", "rootless": "aep:agent/claude-code/session/x",
    "v4-compatible": "aep://[::127.0.0.1]/agent/claude-code",
    "v4-translated": "aep://[::ffff:0:127.0.0.1]/agent/claude-code",
    "NAT64": "aep://[64:ff9b::127.0.0.1]/agent/claude-code",
    "6to4": "aep://[2002:7f00:1::1]/agent/claude-code",
    "ideographic stops": "aep://127%E3%80%820%E3%80%820%E3%80%821/agent/claude-code",
    "halfwidth stop": "aep://localhost%EF%BD%A1/agent/claude-code",
    "fullwidth stop": "aep://vm%EF%BC%8E/agent/claude-code",
    "ligature au": "aep://localhost/agent/cl%EA%9C%B7de-code",
    # two readings of one path: a dot or empty segment in one only
    "..;x climbs leniently only": BASE + "/..;x",
    "empty then .. (strict)": BASE + "//..",
    "fullwidth .. (lenient)": "aep://vm/x/%EF%BC%8E%EF%BC%8E/agent/claude-code",
    "zero width then ..": BASE + "/%E2%80%8B/..",
    # past the bounds under a reserved host: unreadable, so the fleet's
    "2 KB ASCII host": "aep://" + "h" * 2043 + "/agent/claude-code/1",
    "2 KB FDFA host": "aep://" + "%EF%B7%BA" * 227 + "/agent/claude-code/1",
    "padded agent": "aep://vm/" + "%E2%80%8B" * 100 + "agent/claude-code",
    "many segments, then ..": "aep://vm/agent/x/" + "y/" * 40 + "../" * 42 + "claude-code",
    # a ninth attack (atk9 01): a character that spells no letter inserted
    "blank symbol inserted": "aep://vm/agent/claude-co%F0%9D%85%99de/session/s",
    "private use inserted": "aep://vm/agent/claude-co%EE%80%80de",
    "unassigned inserted": "aep://vm/agent/claude-co%CD%B8de",
    "object replacement after": "aep://vm/agent/claude-code%EF%BF%BC",
    "cyrillic o and private use": "aep://vm/agent/claude-c%D0%BE%EE%80%80de",
    "zero-padded hex loopback": "aep://0x" + "0" * 80 + "7f000001/agent/claude-code",
    # an eleventh attack (atk11 f2): loopback names were compared literally, and
    # casefold split a letter into a letter and a mark the fold kept (ẗ: t U+0308)
    "cyrillic o in localhost": "aep://l%D0%BEcalhost/agent/claude-code/session/s3",
    "t with diaeresis in agent": "aep://localhost/agen%E1%BA%97/claude-code/session/s4",
    "t with diaeresis, this host": "aep://vm/agen%E1%BA%97/claude-code/session/s6",
    "greek capital eta in localhost (folds to eta, an n)": "aep://local%CE%97ost/agent/claude-code",
    "cyrillic capital en in localhost": "aep://local%D0%9Dost/agent/codex",
    "greek capital epsilon in the name": "aep://vm/agent/claude-cod%CE%95",
    "lookalike subdomain of localhost": "aep://x.l%D0%BEcalhost/agent/codex",
    "lookalike trailing stop": "aep://localhost%EA%93%B8/agent/codex",
    "lookalike digit in an address": "aep://%D3%8F27.0.0.1/agent/claude-code",
    "escaped port": "aep://localhost%3A80/agent/claude-code",
    "escaped userinfo": "aep://u%40localhost/agent/claude-code",
    "fullwidth brackets": "aep://%EF%BC%BB::1%EF%BC%BD/agent/claude-code",
    "fullwidth colon and port": "aep://127.0.0.1%EF%BC%9A80/agent/claude-code",
    "lookalike colon and port": "aep://localhost%EA%9E%8980/agent/claude-code",
    "ypogegrammeni (casefold: a letter) after the name": "aep://vm/agent/claude-code%CD%85",
}

#: not the fleet's: other agents, other hosts (an uplinked daemon elsewhere
#: sends under aep://{its host}/agent/claude-code), other schemes and paths
NOT_OWNED = {
    "other agent": "aep://vm/agent/my-agent", "longer name": "aep://vm/agent/claude-code2",
    "other host": "aep://vm2/agent/claude-code", "remote ip": "aep://10.0.0.7/agent/claude-code",
    "host prefix": "aep://vmx/agent/claude-code", "other scheme": "urn:vm:agent:claude-code",
    "http": "http://vm/agent/claude-code", "not agent/": "aep://vm/agents/claude-code",
    "agent only": "aep://vm/agent", "agent deeper": "aep://vm/x/agent/claude-code",
    "dotdot out": "aep://vm/agent/claude-code/../../x",
    "non-ASCII other": "aep://vm/agent/%C3%A9t%C3%A9",
    "no authority, other agent": "aep:/agent/my-agent",
    # legitimate long sources: another host is not read past its host; under
    # a loopback host a long path whose first two segments are another agent's
    "other host, long tail": "aep://vm2/agent/claude-code/session/" + "%EF%B7%BA" * 7000,
    "other host, 70 segments": "aep://vm2/" + "x/" * 70 + "agent/claude-code",
    "long host of FDFA, other agent": "aep://" + "%EF%B7%BA" * 227 + "/agent/x/1",
    "long session": "aep://localhost/agent/my-agent/session/" + "%E4%BD%A0" * 5000,
    "many segments": "aep://localhost/agent/my-agent/session/" + "a/" * 100,
    "trailing slash": "aep://localhost/agent/my-agent/",
    "double slash deeper": "aep://vm/agent/my-agent/session//x",
    "ipv6 elsewhere": "aep://[2001:db8::127.0.0.1]/agent/claude-code",
    "a ligature too short": "aep://vm/agent/%EA%9C%B7",
    # a tenth attack (atk10 06): any non-ASCII character stood for one or two
    # letters and symbols were dropped, so these read as codex / claude-code
    "CJK 4 (智能助手)": "aep://localhost/agent/" + quote("智能助手") + "/session/s1",
    "CJK 3 (小助手)": "aep://localhost/agent/" + quote("小助手") + "/session/s1",
    "kana 9 (コードアシスタント)": "aep://localhost/agent/" + quote("コードアシスタント") + "/session/s1",
    "codex + emoji": "aep://localhost/agent/" + quote("codex🚀") + "/session/s1",
    "codex + currency": "aep://localhost/agent/" + quote("codex€"),
    # the eleventh attack's readings make no other host this one
    "escaped port elsewhere": "aep://vm2%3A80/agent/claude-code",
    "lookalike colon elsewhere": "aep://vm2%EA%9E%8980/agent/claude-code",
    "escaped userinfo elsewhere": "aep://localhost%40vm2/agent/claude-code",
    "an IPv6 host elsewhere": "aep://[2001:db8::1]/agent/claude-code",
    "greek word host": "aep://%CE%B7%CE%BF%CF%83%CF%84/agent/claude-code",
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


def test_the_verdict_cache_keeps_no_long_source(fleet):
    """An eighth outside attack (finding 4): 4,096 distinct 60 KB sources
    were kept as keys (+256 MiB outside the buffer budget)."""
    for n in range(300):
        fleet.owns(f"aep://h/{n}/" + "a" * 60_000)
        fleet.owns(f"aep://vm/agent/a{n}/" + "a" * 60_000)
    assert sum(sys.getsizeof(k) for k in fleet._seen) < 1 << 20


#: every trick of the attack and the FDFA host, long
HOSTILE = [*OWNED.values(), *NOT_OWNED.values(),
           "aep://" + "%EF%B7%BA" * 7000 + "/agent/claude-code/1",
           "aep://vm/" + "%EF%B7%BA" * 7000 + "/agent/claude-code",
           "aep://vm/agent/" + "%EF%B7%BA" * 7000, "aep://vm" + "/." * 30000,
           "aep://vm/agent/claude-code/" + "%EF%B7%BA/" * 6000,
           "aep://vm/" + "%EF%BC%8E%EF%BC%8E/" * 6000]


@pytest.mark.parametrize("source", HOSTILE)
def test_the_per_character_work_is_bounded(fleet, source, monkeypatch):
    """An eighth outside attack (finding 5): folding distinct 2 KB sources
    of U+FDFA cost 1-1.6 ms each and one batch held the event loop 12 s.
    Percent-decoding and the Unicode fold read at most MAX_FOLD characters
    of a source, whatever its length."""
    read = []
    real = fleetsources.unquote
    monkeypatch.setattr(fleetsources, "unquote", lambda t, **kw: read.append(len(t)) or real(t, **kw))
    fleet.owns(source)
    assert sum(read) <= getattr(fleetsources, "MAX_FOLD", 512)  # (the old module had none)


@pytest.mark.parametrize("host", ["开发服务器", "开发机", "サーバー"])
def test_a_non_ascii_remote_host_is_not_this_one(host):
    """A tenth outside attack (atk10 06): a host of non-ASCII letters half
    to all of this host's length was read as this host, so a remote
    daemon's own claude-code sources were refused."""
    f = FleetSources()
    f.reserve("aep://dev-box/agent/claude-code")
    assert not f.owns(f"aep://{quote(host)}/agent/claude-code/session/s1")
    assert f.owns("aep://d%D0%B5v-b%D0%BEx/agent/claude-code")  # (Cyrillic е, о: still this host)


@pytest.mark.parametrize("name", ["k%C4%B0mi-code", "open%E1%BA%96ands", "%C7%B0%E1%BA%98%E1%BA%99"])
def test_a_letter_casefold_splits_is_its_letter(name):
    """An eleventh outside attack (atk11 f2): casefold splits ``İ ẖ ǰ ẘ ẙ``
    (as ``ẗ``) into a letter and a combining mark, and the old fold
    casefolded after it had dropped the marks."""
    f = FleetSources()
    for agent in ("kimi-code", "openhands", "jwy"):
        f.reserve(f"aep://vm/agent/{agent}")
    assert f.owns(f"aep://vm/agent/{name}/session/s1")
    assert f.owns(f"aep://l%D0%BEcalhost/agent/{name}")
