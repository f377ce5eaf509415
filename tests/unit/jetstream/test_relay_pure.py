"""The pure parts of the JetStream relay (supervisor.jetstream.relay): the
roster from the claims bucket, a claim's declared verbs, a daemon's reply
to a routed command."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from supervisor.jetstream import relay as R
from supervisor.jetstream import subjects as S


def test_roster_entries_from_claims_with_the_daemon_filling_in() -> None:
    claims = [
        (S.claim_key("opencode", "ses_1", "d1"),
         json.dumps({"control": {"accepts": ["control.attention.respond"]}}).encode()),
        (S.claim_key("codex", "s.2", "d2"), json.dumps({"instance": "box2/codex"}).encode()),
    ]
    daemons = {"d1": {"instance": "box1/opencode", "emits": ["run", "tool"]}}
    assert R.roster_entries(claims, daemons) == [
        {"session": "ses_1", "agent": "opencode", "instance": "box1/opencode",
         "control": {"accepts": ["control.attention.respond"]}, "emits": ["run", "tool"]},
        {"session": "s.2", "agent": "codex", "instance": "box2/codex"},
    ]


def test_roster_skips_malformed_keys_values_and_sessionless_claims() -> None:
    claims = [("not-a-key", b"{}"), (S.claim_key("a", "s", "d"), b"[not json"),
              (S.claim_key("a", None, "d"), b"{}"), (S.claim_key("a", "s", "d"), b"[1]")]
    assert R.roster_entries(claims, {}) == []


@given(st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=40)), max_size=5))
def test_roster_never_raises_on_garbage(claims: list[tuple[str, bytes]]) -> None:
    assert isinstance(R.roster_entries(claims, {}), list)


def test_accepts_of() -> None:
    assert R.accepts_of({"control": {"accepts": ["control.x", 3]}}) == frozenset({"control.x"})
    assert R.accepts_of({}) == frozenset()
    assert R.accepts_of({"control": {"accepts": "control.x"}}) == frozenset()


def test_reply_refusal_shapes() -> None:
    assert R.reply_refusal(b'{"ok": true}') is None
    assert R.reply_refusal(b'{"ok": false, "code": "ambiguous", "detail": "2 claim"}') == (
        "ambiguous", "2 claim")
    assert R.reply_refusal(b"nope")[0] == "no-route"
    assert R.reply_refusal(b'{"ok": false}')[0] == "no-route"


@given(st.binary(max_size=64))
def test_reply_refusal_never_raises(data: bytes) -> None:
    got = R.reply_refusal(data)
    assert got is None or (isinstance(got[0], str) and isinstance(got[1], str))
