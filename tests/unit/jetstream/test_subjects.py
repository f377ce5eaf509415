"""The subject scheme (supervisor.jetstream.subjects): tokens are valid NATS
subject tokens and KV key segments, one to one, and invertible."""
from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.jetstream import subjects as S

SUBJECT_TOKEN = re.compile(r"[^.*>\s]+")
KV_KEY = re.compile(r"[-/_=.A-Za-z0-9]+")


@given(st.text())
def test_token_is_a_subject_token_and_kv_segment_and_inverts(value: str) -> None:
    tok = S.token(value)
    assert SUBJECT_TOKEN.fullmatch(tok)
    assert KV_KEY.fullmatch(tok) and "." not in tok
    assert S.untoken(tok) == value


@given(st.text(), st.text())
def test_distinct_values_distinct_tokens(a: str, b: str) -> None:
    if a != b:
        assert S.token(a) != S.token(b)


@pytest.mark.parametrize("value,tok", [
    ("codex", "codex"), ("01JABCDEF", "01JABCDEF"), ("a-b_c", "a-b_c"),
    ("", "="), ("a.b", "=YS5i"), ("=x", "=PXg"), ("s p", "=cyBw"), ("é", "=w6k"),
])
def test_known_tokens(value: str, tok: str) -> None:
    assert S.token(value) == tok
    assert S.untoken(tok) == value


def test_none_is_the_empty_token() -> None:
    assert S.token(None) == "="


@pytest.mark.parametrize("bad", ["a.b", "*", ">", "=a.b", "=a b", "", "=$$"])
def test_untoken_refuses_what_token_cannot_make(bad: str) -> None:
    with pytest.raises(ValueError):
        S.untoken(bad)


def test_event_subject_round_trip() -> None:
    ev = {"agent": "codex", "session": "thread.1"}
    subj = S.event_subject_of("AEP", ev)
    assert subj == "AEP.ev.codex.=dGhyZWFkLjE"
    assert S.parse_event_subject("AEP", subj) == ("codex", "thread.1")
    assert S.event_subject_of("AEP", {"agent": "codex"}) == "AEP.ev.codex.="
    assert S.parse_event_subject("AEP", "AEP.ev.codex.=") == ("codex", None)
    with pytest.raises(ValueError):
        S.parse_event_subject("AEP", "OTHER.ev.codex.=")


def test_filter_subjects() -> None:
    assert S.filter_subjects("AEP", None, None) == ["AEP.ev.>"]
    assert S.filter_subjects("AEP", ["codex"], None) == ["AEP.ev.codex.*"]
    assert S.filter_subjects("AEP", None, ["s1", "s.2"]) == ["AEP.ev.*.s1", "AEP.ev.*.=cy4y"]
    assert S.filter_subjects("AEP", ["a", "b"], ["s"]) == ["AEP.ev.a.s", "AEP.ev.b.s"]


def test_claim_key_and_msg_id() -> None:
    assert S.claim_key("codex", "t.1", "host-a", "otlp_in") == "codex.=dC4x.host-a.otlp_in"
    assert S.parse_claim_key("codex.=dC4x.host-a.otlp_in") == ("codex", "t.1", "host-a", "otlp_in")
    # the older shape (no bridge) still parses
    assert S.claim_key("codex", "t.1", "host-a", None) == "codex.=dC4x.host-a"
    assert S.parse_claim_key("codex.=dC4x.host-a") == ("codex", "t.1", "host-a", None)
    assert S.claim_prefix("codex", "t.1") == "codex.=dC4x.>"
    assert S.session_claims_filter("t.1") == "*.=dC4x.>"
    assert S.msg_id({"id": "01J", "source": "aep://host/codex"}) == "01J aep://host/codex"
    assert S.msg_id({"id": "01J"}) is None
    assert S.command_subject("AEP", "host-1") == "AEP.cmd.host-1"
    assert S.claims_bucket("AEP") == "AEP_claims"


# -- the event headers, claim / daemon values and command replies ------------------

HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def test_event_headers_carry_id_position_severity_type_source_daemon() -> None:
    ev = {"id": "01JABC", "source": "aep://h/otlp", "epoch": 7, "seq": 42,
          "type": "tool.failed", "severity": "warning", "agent": "codex", "session": "s"}
    assert S.event_headers(ev, "h-01JXYZ1234") == {
        "Nats-Msg-Id": "01JABC aep://h/otlp", "Aep-Pos": "7:42", "Aep-Severity": "warning",
        "Aep-Type": "tool.failed", "Aep-Source": "aep://h/otlp", "Aep-Daemon": "h-01JXYZ1234"}


def test_agent_scoped_event_has_no_position_and_default_severity() -> None:
    h = S.event_headers({"id": "1", "source": "s", "type": "agent.status"}, "d")
    assert S.POS not in h and h[S.SEVERITY] == "info"
    assert S.parse_pos(h.get(S.POS)) is None


@given(st.dictionaries(st.sampled_from(["id", "source", "epoch", "seq", "type", "severity"]),
                       st.one_of(st.text(), st.integers(), st.booleans(), st.none())),
       st.text())
def test_event_headers_never_raise_and_values_are_one_ascii_line(ev: dict, daemon: str) -> None:
    for k, v in S.event_headers(ev, daemon).items():
        assert k in S.HEADERS and HEADER_VALUE.fullmatch(v), (k, v)


@given(st.integers(min_value=0, max_value=2**63), st.integers(min_value=0, max_value=2**63))
def test_position_header_round_trips(epoch: int, seq: int) -> None:
    h = S.event_headers({"epoch": epoch, "seq": seq}, "d")
    assert S.parse_pos(h[S.POS]) == (epoch, seq)


@pytest.mark.parametrize("bad", ["", "1", "a:1", "1:", ":1", "1:-2", "1:2:3", "True:1"])
def test_parse_pos_refuses_garbage(bad: str) -> None:
    assert S.parse_pos(bad) is None


def test_claim_value_copies_identity_and_declarations_verbatim() -> None:
    hello = {"type": "hello", "role": "emitter",
             "identity": {"agent": "opencode", "instance": "h/1/opencode_sse"},
             "capabilities": {"emits": ["run.*"], "capture": "metadata",
                              "control": {"accepts": ["control.run.cancel"], "ack_window_ms": 5000}}}
    v = S.parse_value(S.claim_value(daemon="h-1", bridge="opencode_sse", hello=hello,
                                    agent="opencode", session="ses_1", at_ms=123))
    assert v == {"v": 1, "daemon": "h-1", "bridge": "opencode_sse", "agent": "opencode",
                 "session": "ses_1", "identity": hello["identity"], "emits": ["run.*"],
                 "control": {"accepts": ["control.run.cancel"], "ack_window_ms": 5000}, "at": 123}


def test_claim_value_without_control_declares_none() -> None:
    v = S.parse_value(S.claim_value(daemon="d", bridge="b", hello={"identity": {"agent": "a"}},
                                    agent="a", session=None, at_ms=0))
    assert v is not None and "control" not in v and v["session"] is None


def test_daemon_value_lists_each_bridge_hello() -> None:
    v = S.parse_value(S.daemon_value(daemon="d", host="h", pid=9, epoch=3, started="t",
                                     hellos={"b": {"role": "emitter"}}, at_ms=5))
    assert v is not None and v["bridges"] == [{"name": "b", "hello": {"role": "emitter"}}]


def test_command_replies_round_trip() -> None:
    assert S.parse_command_reply(S.command_reply("d", bridge="b")) == ("accepted", None, "")
    for code in S.REFUSAL_CODES:
        assert S.parse_command_reply(S.command_reply("d", code=code, detail="why")) == \
            ("refused", code, "why")
    with pytest.raises(ValueError):
        S.command_reply("d", code="nope")


@given(st.binary())
def test_parse_never_raises_on_garbage(raw: bytes) -> None:
    assert S.parse_command_reply(raw)[0] in ("accepted", "refused", "invalid")
    S.parse_value(raw)


_ANY = st.one_of(st.none(), st.text(max_size=12))


@given(_ANY, _ANY, st.text(min_size=1, max_size=12), st.one_of(st.none(), st.text(max_size=12)))
def test_claim_keys_of_both_shapes_round_trip_and_are_valid_kv_keys(agent, session, daemon,
                                                                     bridge) -> None:
    key = S.claim_key(agent, session, daemon, bridge)
    assert re.fullmatch(r"[-/_=.A-Za-z0-9]+", key)
    a, s_, d, b = S.parse_claim_key(key)
    assert (a, s_, d, b) == (agent or "", session or None, daemon, bridge)


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["d1", "d2"]),
                          st.sampled_from(["x", "y"]), st.booleans()), max_size=12))
def test_claimants_are_the_distinct_bridge_claims_whatever_the_key_shape(claims) -> None:
    """Each (session, daemon, bridge) claim once, whether its key is of the
    new shape, the old one (bridge in the value only), or both."""
    entries = [(S.claim_key("codex", sess, d, None if legacy else b),
                S.claim_value(daemon=d, bridge=b, hello={}, agent="codex", session=sess, at_ms=1))
               for sess, d, b, legacy in claims]
    got = [(s_, d, b) for _, s_, d, b, _ in S.claimants(entries)]
    assert sorted(got) == sorted({(sess, d, b) for sess, d, b, _ in claims})
    assert all(v["bridge"] == b for *_, b, v in S.claimants(entries))
