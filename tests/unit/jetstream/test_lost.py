"""Issue 25, hardening round two: on JetStream a session the fleet was
refused in KV ``S_bindings`` was lost until the daemon restarted; the
embedded relay asks again at every event. Now the bucket is asked again as
the fleet's events come, at most once a claim refresh per session
(:mod:`supervisor.jetstream.lost`, pure), and a shared-token session whose
claim went free is taken back by compare-and-set (counted
``fleet_reclaimed``); a per-emitter credential's never. A fake clock (trio's
autojump clock, the bucket's ``at`` on the same clock) and a bindings
bucket stand-in with the real compare-and-set rule."""
from __future__ import annotations

import json
from types import SimpleNamespace

import nats.js.errors as jerr
import trio

from supervisor.jetstream import presence as P
from supervisor.jetstream.config import NatsConfig
from supervisor.jetstream.lost import LostSessions
from supervisor.jetstream.subjects import binding_value, token

HELLO = {"identity": {"agent": "opencode"},
         "capabilities": {"control": {"accepts": ["control.cancel"], "ack_window_ms": 5000}}}


def test_a_lost_session_is_due_at_most_once_per_interval() -> None:
    lost = LostSessions(cap=8, every=1.0)
    assert lost.lose("s", now=10.0) is True and "s" in lost
    assert not lost.due("s", 10.0) and not lost.due("s", 10.99)
    assert lost.due("s", 11.0)
    assert [lost.due("s", 11.0 + k / 100) for k in range(100)] == [False] * 100
    assert lost.due("s", 12.5) and not lost.due("s", 13.4)
    assert lost.lose("s", now=13.4) is False  # found held again: a full interval on
    assert not lost.due("s", 14.3) and lost.due("s", 14.4)
    assert not lost.due("other", 99.0)  # not lost: nothing to ask
    assert lost.regain("s") is True and "s" not in lost and not lost.due("s", 99.0)
    assert lost.regain("s") is False and len(lost) == 0


def test_the_lost_sessions_are_bounded_the_oldest_forgotten_and_counted() -> None:
    lost = LostSessions(cap=3, every=1.0)
    for k in range(3):
        lost.lose(f"s{k}", now=float(k))
    lost.lose("s0", now=3.0)  # found held again: the most recent now
    lost.lose("s3", now=4.0)
    assert len(lost) == 3 and "s1" not in lost and {"s0", "s2", "s3"} <= set(lost._due)
    for k in range(4, 104):
        lost.lose(f"s{k}", now=float(k))
    assert len(lost) == 3 and lost.evicted == 101


class _Bindings:
    """A KV ``S_bindings`` stand-in (``aio`` patched to pass calls through):
    create-only, compare-and-set ``update``, revisions, and how often it
    was read."""

    def __init__(self) -> None:
        self.store: dict[str, tuple[bytes, int]] = {}
        self.rev = 0
        self.reads = 0

    def set(self, session: str, principal: str, at_ms: int) -> None:
        self.rev += 1
        self.store[token(session)] = (binding_value(principal=principal, source="src",
                                                    owner="relay-a", at_ms=at_ms), self.rev)

    def principal(self, session: str) -> str:
        return json.loads(self.store[token(session)][0])["principal"]

    async def create(self, key: str, value: bytes) -> None:
        if key in self.store:
            raise jerr.KeyWrongLastSequenceError()
        self.rev += 1
        self.store[key] = (value, self.rev)

    async def get(self, key: str) -> SimpleNamespace:
        self.reads += 1
        if key not in self.store:
            raise jerr.KeyNotFoundError()
        value, rev = self.store[key]
        return SimpleNamespace(value=value, revision=rev)

    async def update(self, key: str, value: bytes, last: int) -> None:
        if key not in self.store or self.store[key][1] != last:
            raise jerr.KeyWrongLastSequenceError()
        self.rev += 1
        self.store[key] = (value, self.rev)

    async def put(self, key: str, value: bytes) -> None:  # the claims bucket
        self.store[key] = (value, 0)

    async def delete(self, key: str) -> None:
        self.store.pop(key, None)


def _ev(session: str, seq: int = 1) -> dict:
    return {"session": session, "seq": seq, "agent": "opencode", "type": "x.toy.tick"}


def _now_ms() -> int:
    return int(trio.current_time() * 1000) + 10**12


#: AEP_NATS_CLAIM_TTL (a refresh each TTL / 3 = 1 s) and AEP_CLAIM_GRACE
CLAIM_TTL, GRACE = 3.0, 2.0


async def test_a_lost_shared_token_session_is_taken_back_once_free_without_a_restart(
        monkeypatch, autojump_clock) -> None:
    import supervisor.jetstream.link as link_mod
    monkeypatch.setattr(link_mod, "aio", lambda fn: fn)
    monkeypatch.setattr(P, "_now_ms", _now_ms)
    p = P.Presence(NatsConfig(servers=("nats://x:1",), claim_ttl=CLAIM_TTL), "d", host="h",
                   epoch=1, hellos={"b": HELLO}, max_sessions=10, hand=lambda b, c: True,
                   claim_grace_s=GRACE)
    bindings = _Bindings()
    p._kv, p._daemons_kv, p._bindings_kv = _Bindings(), _Bindings(), bindings
    bindings.set("shared", "token", _now_ms())  # a shared-token emitter, connected
    bindings.set("cred", "emitter:alice", 0)  # a per-emitter credential's, long idle
    async with trio.open_nursery() as n:
        n.start_soon(p._keep, None)
        await trio.sleep(0.01)
        for s in ("shared", "cred"):
            assert not p.refuses(_ev(s))
            p.note("b", _ev(s))
        await trio.sleep(0.1)
        assert "shared" in p.lost and "cred" in p.lost and p.claims.items() == []
        # while held: every event refused, the bucket asked at most once a refresh
        reads, refused = bindings.reads, 0
        for i in range(200):  # 10 virtual seconds of events, 20 a second
            last_at = trio.current_time()
            bindings.set("shared", "token", _now_ms())  # its relay keeps "at" fresh
            assert p.refuses(_ev("shared", i + 2)) and p.refuses(_ev("cred", i + 2))
            refused += 2
            await trio.sleep(0.05)
        asked = bindings.reads - reads
        assert 2 * 8 <= asked <= 2 * 11, asked  # ~ one a second per session, not one an event
        assert p.counters["refused_fleet_into_owned"] == refused
        assert bindings.principal("shared") == "token" and p.counters["fleet_reclaimed"] == 0
        # the emitter left: its "at" stops; once older than the grace plus a
        # refresh, the next due check takes the session back by compare-and-set
        seq, flowing = 300, None
        while trio.current_time() - last_at < GRACE + 10 * CLAIM_TTL:  # bounded
            seq += 1
            if not p.refuses(_ev("shared", seq)):
                flowing = trio.current_time()
                break
            p.refuses(_ev("cred", seq))
            await trio.sleep(0.05)
        assert flowing is not None, "the fleet never took the free session back"
        assert flowing - last_at >= GRACE + CLAIM_TTL / 3  # not before it was free
        assert "shared" not in p.lost and bindings.principal("shared") == "fleet"
        assert p.counters["fleet_reclaimed"] == 1
        p.note("b", _ev("shared", seq))  # its events claim the session again
        await trio.sleep(0.1)
        assert p.claims.items() == [("b", "opencode", "shared")]
        assert P.claim_key("opencode", "shared", "d", "b") in p._kv.store
        # the credential's session is never taken, however long
        assert "cred" in p.lost and bindings.principal("cred") == "emitter:alice"
        n.cancel_scope.cancel()
