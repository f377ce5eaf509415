"""The pure parts of the JetStream relay (supervisor.jetstream.routing): the
roster from the claims bucket (the shapes of supervisor.jetstream.subjects),
a claim's declared verbs, a daemon's reply to a routed command."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from supervisor.jetstream import routing as R
from supervisor.jetstream import subjects as S

HELLO = {"identity": {"agent": "opencode", "instance": "box1/opencode"},
         "capabilities": {"emits": ["run", "tool"],
                          "control": {"accepts": ["control.attention.respond"]}}}


def test_roster_entries_carry_each_claims_declarations_verbatim() -> None:
    claims = [
        (S.claim_key("opencode", "ses_1", "d1", "opencode"),
         S.claim_value(daemon="d1", bridge="opencode", hello=HELLO, agent="opencode",
                       session="ses_1", at_ms=1)),
        (S.claim_key("codex", "s.2", "d2", "otlp"),
         S.claim_value(daemon="d2", bridge="otlp", hello={"identity": {"instance": "box2/codex"}},
                       agent="codex", session="s.2", at_ms=1)),
    ]
    assert R.roster_entries(claims, {}) == [
        {"session": "ses_1", "agent": "opencode", "instance": "box1/opencode",
         "control": {"accepts": ["control.attention.respond"]}, "emits": ["run", "tool"]},
        {"session": "s.2", "agent": "codex", "instance": "box2/codex"},
    ]


def test_the_daemon_entry_fills_what_a_claim_leaves_out() -> None:
    bare = json.dumps({"v": 1, "daemon": "d1", "bridge": "opencode", "agent": "opencode",
                       "session": "ses_1", "identity": {}}).encode()
    daemons = {"d1": json.loads(S.daemon_value(daemon="d1", host="box1", pid=1, epoch=1,
                                               started="x", hellos={"opencode": HELLO}, at_ms=1))}
    assert R.roster_entries([(S.claim_key("opencode", "ses_1", "d1", "opencode"), bare)], daemons) == [
        {"session": "ses_1", "agent": "opencode", "instance": "box1/opencode",
         "control": {"accepts": ["control.attention.respond"]}, "emits": ["run", "tool"]}]


def test_roster_skips_malformed_keys_values_other_versions_and_sessionless_claims() -> None:
    ok = S.claim_value(daemon="d", bridge="b", hello={}, agent="a", session="s", at_ms=1)
    claims = [("not-a-key", ok), (S.claim_key("a", "s", "d", "b"), b"[not json"),
              (S.claim_key("a", None, "d", "b"), ok), (S.claim_key("a", "s", "d", "b"), b'{"v": 2}'),
              (S.claim_key("a", "s", "d", "other"), ok)]  # the value names another bridge
    assert R.roster_entries(claims, {}) == []


@given(st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=40)), max_size=5),
       st.dictionaries(st.text(max_size=5), st.dictionaries(st.text(max_size=5), st.none())))
def test_roster_never_raises_on_garbage(claims, daemons) -> None:
    assert isinstance(R.roster_entries(claims, daemons), list)


def test_two_bridges_of_one_daemon_are_two_roster_entries_and_both_key_shapes_one() -> None:
    """Two bridges of one agent on one daemon claiming one session: two
    claimants, two entries (AEP-0003 §4.1, one per live claim; the old
    <agent>.<session>.<daemon> key made them one). A claim in both key
    shapes (a daemon upgraded in place, its old key not expired yet) is one."""
    def value(bridge: str) -> bytes:
        return S.claim_value(daemon="d1", bridge=bridge, hello=HELLO, agent="opencode",
                             session="ses_1", at_ms=1)
    claims = [(S.claim_key("opencode", "ses_1", "d1", "a"), value("a")),
              (S.claim_key("opencode", "ses_1", "d1", None), value("a")),  # legacy, same claim
              (S.claim_key("opencode", "ses_1", "d1", "b"), value("b"))]
    entries = R.roster_entries(claims, {})
    assert len(entries) == 2 and entries[0] == entries[1]
    assert [b for *_, b, _ in S.claimants(claims)] == ["a", "b"]
    # a legacy key alone still reads (its bridge from the value)
    assert R.roster_entries(claims[1:2], {}) == entries[:1]


def test_accepts_of() -> None:
    assert R.accepts_of({"control": {"accepts": ["control.x", 3]}}) == frozenset({"control.x"})
    assert R.accepts_of({}) == frozenset()
    assert R.accepts_of({"control": {"accepts": "control.x"}}) == frozenset()


def test_reply_refusal_reads_the_daemons_reply_shape() -> None:
    assert R.reply_refusal(S.command_reply("d1", bridge="opencode")) is None
    assert R.reply_refusal(S.command_reply("d1", code="ambiguous", detail="2 bridges")) == (
        "ambiguous", "2 bridges")
    assert R.reply_refusal(S.command_reply("d1", code="unsupported", detail="x")) == (
        "unsupported", "x")
    assert R.reply_refusal(S.command_reply("d1", code="busy"))[0] == "no-route"
    assert R.reply_refusal(S.command_reply("d1", code="invalid"))[0] == "invalid-event"
    assert R.reply_refusal(b"nope")[0] == "no-route"
    assert R.reply_refusal(b'{"v": 1, "status": "maybe"}')[0] == "no-route"


@given(st.binary(max_size=64))
def test_reply_refusal_never_raises(data: bytes) -> None:
    got = R.reply_refusal(data)
    assert got is None or (isinstance(got[0], str) and isinstance(got[1], str))


def test_the_next_pull_asks_for_what_the_outlet_takes_by_the_last_sizes():
    """Round 16 of issue 25: 256 events of 1-4 MB pulled at once overran the
    outlet's budget and a replay lost some; small events still go 256 a pull."""
    from types import SimpleNamespace

    from supervisor.jetstream.subscribe import FETCH_BATCH, next_batch

    def msgs(*sizes: int) -> list:
        return [SimpleNamespace(data=b"x" * n) for n in sizes]

    room = 512 * 1024
    assert next_batch(msgs(900_000), room) == 1
    assert next_batch(msgs(100_000, 100_000), room) == 5
    assert next_batch(msgs(300, 500), room) == FETCH_BATCH
    assert next_batch([SimpleNamespace(data=None)], room) == FETCH_BATCH
