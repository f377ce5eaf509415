"""Per-session replay buffers (AEP-0003 §5; docs/relay.md): keyed
(source, session) (AEP-0001 §5.2), (source, id) admission dedupe, one event
per position, (epoch, seq) order, AEP_BUFFER trim, AEP_MAX_SESSIONS
least-recently-written eviction, strictly-after replay and the exhausted
verdict."""
from __future__ import annotations

import pytest

from supervisor.relay.buffer import ENTRY_OVERHEAD, Entry, SessionBuffers

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


# -- byte budgets (a few huge events must not pin gigabytes) ---------------------------

def B(seq, size, session="s1", source=SRC):
    """An entry whose accounted size is exactly ``size`` bytes."""
    attrs = {"id": f"{session}-{seq}", "source": source, "type": "tool.completed",
             "session": session, "seq": seq}
    return Entry(attrs, b"x" * (size - ENTRY_OVERHEAD), (0, seq), 1, 1)


def test_per_buffer_byte_budget_trims_oldest_first_then_announces():
    b = SessionBuffers(100, 10, buffer_bytes=6000, total_bytes=10**9)
    for s in range(5):
        b.admit(B(s, 2000))
    assert b.held(K) == 3 and b.bytes == 6000
    entries, exhausted, earliest = b.replay_after(K, (0, 0))
    assert seqs(entries) == [(0, 2), (0, 3), (0, 4)] and exhausted and earliest == (0, 2)
    assert b.counters["trimmed_bytes"] == 2


def test_an_event_bigger_than_the_buffer_budget_is_never_held_but_announced():
    b = SessionBuffers(100, 10, buffer_bytes=6000, total_bytes=10**9)
    b.admit(B(0, 2000))
    b.admit(B(1, 20000))  # alone over budget: everything older goes, then itself
    assert b.held(K) == 0 and b.bytes == 0 and b.counters["trimmed_bytes"] == 2
    # the consumer that saw seq 0 asks for what follows: it was dropped, say so
    assert b.replay_after(K, (0, 0)) == ([], True, (0, 2))
    assert b.replay_after(K, (0, 1)) == ([], False, None)  # nothing dropped after seq 1
    b.admit(B(2, 2000))  # the buffer lives on
    assert seqs(b.replay_after(K, (0, 0))[0]) == [(0, 2)]


def test_total_byte_budget_evicts_least_recently_written_oldest_first():
    b = SessionBuffers(100, 10, buffer_bytes=10000, total_bytes=10000)
    ka, kb = (SRC, "a"), (SRC, "b")
    for s in range(3):
        b.admit(B(s, 2000, session="a"))
    for s in range(3):
        b.admit(B(s, 2000, session="b"))
    assert b.bytes == 10000 and b.held(ka) == 2 and b.held(kb) == 3  # a's oldest went
    for s in range(3, 5):
        b.admit(B(s, 2000, session="b"))
    assert b.held(ka) == 0 and ka not in b.sessions() and b.bytes == 10000
    assert b.counters["sessions_evicted"] == 1
    # a wholly evicted buffer still answers a resume with replay-exhausted
    assert b.replay_after(ka, (0, 0)) == ([], True, (0, 3))
    assert ka in b.keys_for("a", gone=True) and b.keys_for("a") == []


def test_session_cap_eviction_is_announced_too():
    b = SessionBuffers(10, 1)
    b.admit(E(0, session="old"))
    b.admit(E(1, session="old"))
    b.admit(E(0, session="new"))
    assert b.replay_after((SRC, "old"), (0, 0)) == ([], True, (0, 2))
    assert b.replay_after((SRC, "old"), (0, 1)) == ([], False, None)


def test_byte_accounting_stays_exact_under_mixed_trims():
    b = SessionBuffers(4, 3, buffer_bytes=12000, total_bytes=18000)
    for i in range(200):
        b.admit(B(i, 2000 + 97 * (i % 23), session=f"s{i % 5}"))
        assert b.bytes == sum(e.size for k in b.sessions() for e in b.iter_entries(k))
        assert b.bytes <= 18000
        assert all(sum(e.size for e in b.iter_entries(k)) <= 12000 for k in b.sessions())


def test_byte_budgets_validated():
    with pytest.raises(ValueError):
        SessionBuffers(10, 10, buffer_bytes=0)
    with pytest.raises(ValueError):
        SessionBuffers(10, 10, buffer_bytes=100, total_bytes=50)


# -- held entries: atomic, untracked by the collector (issue 11) -----------------

import gc  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_scalar = st.one_of(st.text(max_size=8), st.integers(min_value=-2**70, max_value=2**70), st.booleans())


@settings(max_examples=200, deadline=None)
@given(extra=st.dictionaries(st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True), _scalar, max_size=5),
       seq=st.integers(min_value=0, max_value=2**64), epoch=st.integers(min_value=0, max_value=9),
       sev=st.integers(min_value=0, max_value=5), cap=st.integers(min_value=0, max_value=3),
       n=st.integers(min_value=0, max_value=10**9), raw=st.binary(max_size=40))
def test_a_held_entry_rebuilds_the_entry_it_was_made_from(extra, seq, epoch, sev, cap, n, raw):
    attrs = {"id": "x", "source": SRC, "type": "tool.completed", "session": "s1", "seq": seq,
             "epoch": epoch, **{k: v for k, v in extra.items() if k not in ("id", "source")}}
    e = Entry(attrs, raw, (epoch, seq), sev, cap, n)
    back = Entry.from_held(e.held())
    assert back.attrs == e.attrs and list(back.attrs) == list(e.attrs)  # order too
    assert (back.raw, back.pos, back.sev, back.cap, back.n, back.size, back.key, back.bkey) == \
        (e.raw, e.pos, e.sev, e.cap, e.n, e.size, e.key, e.bkey)


def test_held_entries_cost_the_collector_nothing():
    """What a buffer keeps per event is untracked after one young collection
    (an Entry object per held event was one tracked object each, walked by
    every full collection: issue 11), and replay rebuilds equal entries."""
    b = SessionBuffers(10_000, 10)
    for i in range(1000):
        ev = {"aep": "0.1", "id": f"id-{i}", "source": SRC, "type": "tool.completed",
              "session": "s1", "seq": i, "epoch": 0, "data": {"tool": {"name": "bash"}}}
        attrs = dict(ev)
        attrs.pop("data")  # a dict that held a dict stays tracked: what ingest hands over
        b.admit(Entry(attrs, b'{"x":1}', (0, i), 1, 1, n=i + 1))
    gc.collect(0)
    s = b._sessions[K]  # noqa: SLF001 -- what the buffer holds, as the collector sees it
    assert not any(gc.is_tracked(h) for h in s.entries[s.start:])
    assert not any(gc.is_tracked(k) for k in s.keys) and not any(gc.is_tracked(k) for k in s.ids)
    entries, _, _ = b.replay_after(K, (0, 997))
    assert [(e.attrs["id"], e.pos, e.n) for e in entries] == [("id-998", (0, 998), 999),
                                                              ("id-999", (0, 999), 1000)]
    assert b.held_duplicate(E(5, id="id-5")).raw == b'{"x":1}'


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=12)


def _canonical(v):
    """An independent JSON-value form: type-tagged, members sorted, numbers as floats."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, (int, float)):
        return ("number", float(v))
    if isinstance(v, list):
        return ("array", tuple(_canonical(x) for x in v))
    return ("object", tuple(sorted((k, _canonical(x)) for k, x in v.items())))


@given(_json, _json)
def test_same_json_is_json_value_equality(a, b):
    from supervisor.relay.buffer import same_json
    assert same_json(a, b) == (_canonical(a) == _canonical(b))
    assert same_json(a, a)
    if isinstance(a, dict):
        assert same_json(a, dict(reversed(list(a.items()))))  # member order does not matter
