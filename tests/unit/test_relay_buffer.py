"""Per-session replay buffers (AEP-0003 §5; docs/relay.md): keyed
(source, session) (AEP-0001 §5.2), (source, id) admission dedupe, one event
per position, (epoch, seq) order, AEP_BUFFER trim, AEP_MAX_SESSIONS
least-recently-written eviction, strictly-after replay and the exhausted
verdict."""
from __future__ import annotations

import pytest

from supervisor.relay.buffer import Entry, SessionBuffers


SRC = "aep://h/agent/a"
K = (SRC, "s1")  # buffers are keyed (source, session), AEP-0001 §5.2


def E(seq, session="s1", epoch=0, id=None, source=SRC):
    attrs = {"id": id or f"{session}-{epoch}-{seq}", "source": source, "type": "tool.completed",
             "session": session, "seq": seq, "epoch": epoch}
    return Entry(attrs, b"{}", (epoch, seq), 1, 1)


def seqs(entries):
    return [e.pos for e in entries]


def test_admission_dedupes_on_source_and_id():
    b = SessionBuffers(10, 10)
    assert b.admit(E(1, id="X"))
    assert not b.admit(E(1, id="X"))  # redelivery: same (source, id)
    assert b.admit(E(2, id="X", source="aep://h/agent/other"))  # same id, other emitter
    assert b.held("s1") == 2
    assert b.counters["duplicates"] == 1


def test_out_of_order_inserts_by_epoch_then_seq():
    b = SessionBuffers(10, 10)
    for seq, epoch in [(5, 0), (1, 1), (7, 0), (2, 0), (0, 1)]:
        b.admit(E(seq, epoch=epoch))
    entries, _, earliest = b.replay_after(K, None)
    assert seqs(entries) == [(0, 2), (0, 5), (0, 7), (1, 0), (1, 1)]
    assert earliest == (0, 2)


def test_replay_is_strictly_after_the_position():
    b = SessionBuffers(10, 10)
    for s in range(5):
        b.admit(E(s))
    entries, exhausted, _ = b.replay_after(K, (0, 2))
    assert seqs(entries) == [(0, 3), (0, 4)] and not exhausted
    assert b.replay_after(K, (0, 4))[0] == []
    assert b.replay_after((SRC, "nope"), (0, 0)) == ([], False, None)


def test_trim_to_depth_and_exhausted_marker():
    b = SessionBuffers(3, 10)
    for s in range(6):
        b.admit(E(s))
    entries, exhausted, earliest = b.replay_after(K, (0, 1))
    assert seqs(entries) == [(0, 3), (0, 4), (0, 5)]
    assert exhausted and earliest == (0, 3)  # seq 2 was evicted
    # the position right before the earliest held is covered: no marker
    assert not b.replay_after(K, (0, 2))[1]
    # replay-all never reports exhaustion
    assert not b.replay_after(K, None)[1]
    assert b.counters["trimmed"] == 3


def test_new_epoch_after_old_position_is_reported_exhausted():
    b = SessionBuffers(10, 10)
    b.admit(E(0, epoch=2))
    assert b.replay_after(K, (1, 40))[1]
    assert not b.replay_after(K, (2, 0))[1]


def test_trimmed_ids_are_forgotten():
    b = SessionBuffers(2, 10)
    b.admit(E(0, id="A"))
    b.admit(E(1))
    b.admit(E(2))
    # A was trimmed: a late redelivery is backfill older than everything held
    # and is trimmed again immediately; nothing retains the stale id
    assert b.admit(E(0, id="A"))
    assert seqs(b.replay_after(K, None)[0]) == [(0, 1), (0, 2)]


def test_session_cap_evicts_least_recently_written():
    b = SessionBuffers(10, 2)
    b.admit(E(0, session="old"))
    b.admit(E(0, session="new"))
    b.admit(E(1, session="old"))  # refresh: old is now the most recently written
    b.admit(E(0, session="third"))
    assert b.sessions() == [(SRC, "old"), (SRC, "third")]
    assert b.counters["sessions_evicted"] == 1


def test_long_running_session_compacts_and_stays_correct():
    b = SessionBuffers(100, 1)
    for s in range(5000):
        b.admit(E(s))
    entries, exhausted, earliest = b.replay_after(K, (0, 4949))
    assert seqs(entries) == [(0, s) for s in range(4950, 5000)]
    assert earliest == (0, 4900) and not exhausted
    assert b.held("s1") == 100


def test_invalid_sizes_refused():
    with pytest.raises(ValueError):
        SessionBuffers(0, 1)


def test_another_emitter_with_the_same_session_name_gets_its_own_buffer():
    """AEP-0001 §5.2: distinct emitters with one session string are distinct
    sessions; a squatter can neither evict nor interleave a bridge's history."""
    b = SessionBuffers(5, 10)
    for s in range(5):
        b.admit(E(s, session="v"))
    mallory = "aep://h/agent/mallory/session/v"
    for s in range(5):
        b.admit(E(s, session="v", epoch=2 ** 62, source=mallory, id=f"m{s}"))
    entries, exhausted, _ = b.replay_after((SRC, "v"), None)
    assert [e.attrs["source"] for e in entries] == [SRC] * 5 and seqs(entries) == [(0, s) for s in range(5)]
    assert b.held((SRC, "v")) == 5 and b.held((mallory, "v")) == 5 and b.held("v") == 10
    assert b.keys_for("v") == [(SRC, "v"), (mallory, "v")] and "v" in b and (SRC, "v") in b
    assert b.counters["trimmed"] == 0


def test_one_position_holds_one_event_per_emitter_session():
    b = SessionBuffers(10, 10)
    b.admit(E(3, id="X"))
    b.admit(E(5, id="Z"))
    assert b.conflict(E(3, id="Y"))  # another event at a held position: emitter fault
    assert not b.conflict(E(3, id="X"))  # the same event again: redelivery
    assert not b.conflict(E(3, id="Y", source="aep://h/agent/b"))  # another emitter's session
    assert not b.conflict(E(4, id="Y")) and not b.conflict(E(6, id="Y"))  # free positions
    assert not b.conflict(E(3, id="Y", epoch=1))
