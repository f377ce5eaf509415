"""The eviction order of the replay buffers (supervisor/relay/pins.py;
issue 25, fifth outside attack: 600 new OTLP sessions from an
unauthenticated sender evicted the buffer of a Claude Code session holding
a permission ask): a buffer with an open ask is pinned (at most a quarter of
the cap; past it the least recently written open pin goes, counted), and
the open kind (OTLP, AG-UI, remote posts, restored) goes before the fleet's
authenticated bridges' buffers. Each kind of eviction is counted."""
from __future__ import annotations

import trio

from bridges.core.aep import dumps
from bridges.core.envelope import Stamper
from supervisor.relay.attrmatch import Filter
from supervisor.relay.buffer import Entry, SessionBuffers
from supervisor.relay.core import Relay


def E(session, seq, type_="tool.completed", *, source=None, ident=None, subject=None, size=2):
    attrs = {"id": ident or f"{session}-{seq}", "source": source or f"aep://h/s/{session}",
             "type": type_, "session": session, "seq": seq, "epoch": 0}
    if subject is not None:
        attrs["subject"] = subject
    return Entry(attrs, b"x" * size, (0, seq), 1, 1)


def ask(b, session, seq=1, fleet=True, ident=None):
    e = E(session, seq, "attention.requested", ident=ident or f"ask-{session}")
    b.admit(e, fleet)
    return e.attrs["id"]


def flood(b, n, prefix="flood"):
    for i in range(n):
        b.admit(E(f"{prefix}-{i}", 1))  # the open kind (fleet=False)


def held(b):
    return {k[1] for k in b.sessions()}


def test_an_open_ask_survives_a_flood_of_new_open_sessions():
    b = SessionBuffers(100, 8)
    b.admit(E("victim", 0), True)
    ask(b, "victim")
    flood(b, 60)
    assert "victim" in held(b) and len(b) == 8
    assert b.counters["sessions_evicted"] == 60 - 7
    assert b.counters["sessions_evicted_open"] == 60 - 7
    assert b.counters["sessions_evicted_fleet"] == b.counters["sessions_evicted_pinned"] == 0
    assert b.pinned == 1


def test_fleet_buffers_go_after_every_open_one_whatever_their_recency():
    b = SessionBuffers(100, 4)
    b.admit(E("hook", 0), True)  # the least recently written, but the fleet's
    flood(b, 10)
    assert "hook" in held(b)
    assert b.counters["sessions_evicted_fleet"] == 0
    # only fleet buffers left to go: the least recently written of them
    for i in range(4):
        b.admit(E(f"fleet-{i}", 0), True)
    assert held(b) == {"fleet-0", "fleet-1", "fleet-2", "fleet-3"}
    assert b.counters["sessions_evicted_fleet"] == 1


def test_a_resolved_or_timed_out_ask_unpins():
    b = SessionBuffers(100, 8)
    a1 = ask(b, "v1", ident="a1")
    b.admit(E("v1", 2, "attention.resolved", subject=a1), True)
    a2 = ask(b, "v2", ident="a2")
    assert b.pinned == 1
    b.admit(E("v2", 2, "attention.timeout", subject=a2), True)
    assert b.pinned == 0
    ask(b, "v3")
    b.admit(E("v3", 2, "session.ended"), True)
    assert b.pinned == 0
    # an unrelated subject closes nothing
    ask(b, "v4")
    b.admit(E("v4", 2, "attention.resolved", subject="another"), True)
    assert b.pinned == 1


def test_pins_are_bounded_least_recently_written_open_pin_first():
    b = SessionBuffers(100, 8)  # at most 2 pinned
    ask(b, "fleet-ask", fleet=True)
    ask(b, "open-ask-1", fleet=False)
    ask(b, "open-ask-2", fleet=False)  # a third pin: the oldest open pin goes
    assert b.pinned == 2 and b.counters["pins_released"] == 1
    assert b.is_pinned(("aep://h/s/fleet-ask", "fleet-ask"))
    assert not b.is_pinned(("aep://h/s/open-ask-1", "open-ask-1"))
    # the released one is the next of its kind to go
    for i in range(5):
        b.admit(E(f"o{i}", 1))
    b.admit(E("one-more", 1))
    assert "open-ask-1" not in held(b) and {"fleet-ask", "open-ask-2"} <= held(b)


def test_only_pins_left_the_cap_still_holds():
    b = SessionBuffers(100, 4)  # one pin
    ask(b, "p")
    for i in range(3):
        b.admit(E(f"f{i}", 0), True)
    b.admit(E("f3", 0), True)  # unpinned fleet buffers go first
    assert "p" in held(b) and len(b) == 4


def test_a_trimmed_ask_no_longer_pins():
    b = SessionBuffers(3, 8)
    ask(b, "v", seq=1)
    for seq in range(2, 5):
        b.admit(E("v", seq), True)  # depth 3: the ask is trimmed
    assert b.pinned == 0


def test_the_total_byte_budget_trims_open_buffers_before_a_pinned_one():
    b = SessionBuffers(100, 50, buffer_bytes=20_000, total_bytes=40_000)
    ask(b, "victim")
    for i in range(30):
        b.admit(E(f"big-{i}", 1, size=4000))
    assert "victim" in held(b) and b.bytes <= 40_000


def _hello(agent):
    return {"role": "emitter", "identity": {"agent": agent, "instance": "h"},
            "capabilities": {"emits": ["x"], "control": {"accepts": [], "ack_window_ms": 1000}}}


async def _noop(cmd):
    return None


def test_relay_keeps_a_hook_bridges_open_ask_through_an_otlp_flood():
    """Through the relay's own paths (the fleet's stamped runs): the hook
    bridge's ask is pinned and the OTLP bridge (``open_sessions``) evicts
    only its own kind (``from=all`` replays what the buffers hold: the
    integration test reads it off ``/stream``)."""
    async def main():
        relay = Relay(buffer=100, max_sessions=20)
        relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)  # fan-out
        hooks = relay.attach_emitter(_hello("claude-code"), _noop)
        otlp = relay.attach_emitter(_hello("codex"), _noop, open_sessions=True)
        st_hooks = Stamper("claude-code", host="h")
        st_otlp = Stamper("codex", host="h")
        evs = [st_hooks.stamp("victim", {"type": "session.started"}),
               st_hooks.stamp("victim", {"type": "attention.requested",
                                         "data": {"kind": "permission", "prompt": "Permission requested"}})]
        pairs = [(e, dumps(e)) for e in evs]
        assert hooks.ingest_stamped_run(pairs, 0) == 2
        for i in range(200):
            e = st_otlp.stamp(f"flood-{i}", {"type": "session.started"})
            otlp.ingest_stamped_run([(e, dumps(e))], 0)
        assert "attention.requested" in [e.type for e in relay.buffers.iter_entries("victim")]
        stats = relay.stats()
        assert stats["sessions_pinned"] == 1
        assert stats["counters"]["sessions_evicted_open"] == 200 - 19  # 201 sessions, 20 held
        assert stats["counters"]["sessions_evicted_fleet"] == 0
    trio.run(main)


def test_asks_an_open_party_posts_in_its_own_sessions_never_outlive_the_fleets_buffers():
    """A sixth outside attack: a credential holder posted attention.requested in its own
    sessions, which were pinned and so outlived the fleet's unpinned buffers: every
    Claude Code hook session's buffer was evicted under the total bytes."""
    b = SessionBuffers(100, 12)  # at most 3 pinned
    for i in range(9):
        b.admit(E(f"hook-{i}", 0), True)  # the fleet's, no ask, least recently written
    for i in range(3):
        b.admit(E(f"alice-{i}", 0))
        ask(b, f"alice-{i}", fleet=False)
    assert b.pinned == 3 and len(b) == 12
    b.admit(E("alice-new", 0))
    assert {f"hook-{i}" for i in range(9)} <= held(b)
    assert b.counters["sessions_evicted_fleet"] == 0
    assert b.counters["sessions_evicted_pinned"] == 1
