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
    assert S.claim_key("codex", "t.1", "host-a") == "codex.=dC4x.host-a"
    assert S.parse_claim_key("codex.=dC4x.host-a") == ("codex", "t.1", "host-a")
    assert S.claim_prefix("codex", "t.1") == "codex.=dC4x.*"
    assert S.msg_id({"id": "01J", "source": "aep://host/codex"}) == "01J aep://host/codex"
    assert S.msg_id({"id": "01J"}) is None
    assert S.command_subject("AEP", "host-1") == "AEP.cmd.host-1"
    assert S.claims_bucket("AEP") == "AEP_claims"
