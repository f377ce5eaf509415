"""The daemon's claims and command routing (supervisor.jetstream.presence),
pure: which bridge owns a session, the AEP-0004 §4.2 refusals, the stable
daemon id."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from supervisor.jetstream import presence as P

HELLO = {"identity": {"agent": "opencode"},
         "capabilities": {"control": {"accepts": ["control.cancel"], "ack_window_ms": 5000}}}


def _ev(session: str, seq: int = 1, agent: str = "opencode", type_: str = "run.started") -> dict:
    return {"session": session, "seq": seq, "agent": agent, "type": type_}


def test_a_sequenced_event_claims_its_session_once() -> None:
    c = P.Claims(10)
    assert c.note("b", _ev("s1")) == (("opencode", "s1"), None)
    assert c.note("b", _ev("s1", 2)) == (None, None)
    assert c.note("b", {"agent": "opencode", "type": "agent.status"}) == (None, None)
    assert c.note("b", {"session": "s2", "agent": "x", "type": "control.cancel", "seq": 1}) \
        == (None, None)
    assert c.holders("s1") == ["b"] and c.items() == [("b", "opencode", "s1")]


def test_claims_are_bounded_least_recently_used_first() -> None:
    c = P.Claims(2)
    c.note("b", _ev("s1"))
    c.note("b", _ev("s2"))
    c.note("b", _ev("s1", 2))  # s1 used again
    assert c.note("b", _ev("s3")) == (("opencode", "s3"), ("opencode", "s2"))
    assert c.holders("s2") == []


def _cmd(session="s1", type_="control.cancel", **kw) -> bytes:
    return json.dumps({"id": "c1", "source": "aep://x/y", "type": type_, "session": session,
                       **kw}).encode()


def test_route_answers_like_the_embedded_relay() -> None:
    c = P.Claims(10)
    c.note("b", _ev("s1"))
    hellos = {"b": HELLO, "b2": HELLO}
    cmd, bridge, code, _ = P.route(c, hellos, _cmd())
    assert (bridge, code) == ("b", None) and cmd["id"] == "c1"
    assert P.route(c, hellos, _cmd("nobody"))[2] == "no-route"
    assert P.route(c, hellos, _cmd(type_="control.pause"))[2] == "unsupported"
    c.note("b2", _ev("s1"))
    assert P.route(c, hellos, _cmd())[2] == "ambiguous"
    assert P.route(c, hellos, b"[1]")[2] == "invalid"
    assert P.route(c, hellos, _cmd(type_="run.started"))[2] == "invalid"


@given(st.binary())
def test_route_never_raises_on_garbage(raw: bytes) -> None:
    assert P.route(P.Claims(1), {}, raw)[2] in (None, "no-route", "invalid")


def test_daemon_id_is_made_once_and_kept(tmp_path) -> None:
    a = P.daemon_id(tmp_path, "build-7.example.com")
    assert a.startswith("build-7-example-com-") and len(a.rsplit("-", 1)[1]) == 10
    assert P.daemon_id(tmp_path, "other-host") == a
    assert (tmp_path / P.ID_FILE).read_text().strip() == a


def test_presence_hands_to_the_bridge_or_answers_busy() -> None:
    handed: list[tuple[str, dict]] = []
    room = [True]

    def hand(bridge, cmd):
        if room[0]:
            handed.append((bridge, cmd))
        return room[0]
    from supervisor.jetstream.config import NatsConfig
    from supervisor.jetstream.subjects import parse_command_reply
    p = P.Presence(NatsConfig(servers=("nats://x:1",)), "d", host="h", epoch=1,
                   hellos={"b": HELLO}, max_sessions=10, hand=hand)
    p.note("b", _ev("s1"))
    assert parse_command_reply(p.handle(_cmd())) == ("accepted", None, "")
    assert handed and handed[0][0] == "b"
    room[0] = False
    assert parse_command_reply(p.handle(_cmd()))[:2] == ("refused", "busy")
    assert p.counters["commands_delivered"] == 1 and p.counters["commands_refused"] == 1


class _FlakyBucket:
    """A KV bucket stand-in (trio-side: ``aio`` is patched to pass calls
    through) whose first ``fail`` puts raise, as a bucket electing its
    leader does (nats-py: ``NoRespondersError``)."""

    def __init__(self, fail: int, fail_deletes: int = 0) -> None:
        self.fail = fail
        self.fail_deletes = fail_deletes
        self.store: dict[str, bytes] = {}
        self.puts = 0

    async def put(self, key: str, value: bytes) -> None:
        self.puts += 1
        if self.fail > 0:
            self.fail -= 1
            raise TimeoutError("no responders")
        self.store[key] = value

    async def delete(self, key: str) -> None:
        if self.fail_deletes > 0:
            self.fail_deletes -= 1
            raise TimeoutError("no responders")
        self.store.pop(key, None)


def _keeping(monkeypatch, fail: int, daemons_fail: int = 0, max_sessions: int = 10):
    import supervisor.jetstream.link as link_mod
    from supervisor.jetstream.config import NatsConfig
    monkeypatch.setattr(link_mod, "aio", lambda fn: fn)
    p = P.Presence(NatsConfig(servers=("nats://x:1",), claim_ttl=30.0), "d", host="h",
                   epoch=1, hellos={"b": HELLO}, max_sessions=max_sessions,
                   hand=lambda b, c: True)
    p._kv, p._daemons_kv = _FlakyBucket(fail), _FlakyBucket(daemons_fail)
    return p


async def test_a_claim_put_that_fails_is_tried_again_before_the_next_refresh(monkeypatch, autojump_clock) -> None:
    # a CI flake: the claim of a session met the claims bucket electing its
    # leader, the next try came only with the refresh (TTL/3 = 10 s), and a
    # command routed meanwhile was answered no-route
    import trio
    p = _keeping(monkeypatch, fail=3, daemons_fail=2)
    async with trio.open_nursery() as n:
        n.start_soon(p._keep, None)
        await trio.sleep(0.01)
        p.note("b", _ev("s1"))
        await trio.sleep(3.0)  # well before the refresh at 10 s
        assert [k for k in p._kv.store] == [P.claim_key("opencode", "s1", "d", "b")]
        assert len(p._daemons_kv.store) == 1
        assert p.counters["kv_errors"] == 5 and p._kv.puts == 4
        await trio.sleep(5.0)  # nothing left to retry: no more puts until the refresh
        assert p._kv.puts == 4
        n.cancel_scope.cancel()


async def test_a_claim_released_while_its_retry_waits_is_not_put_again(monkeypatch, autojump_clock) -> None:
    import trio
    p = _keeping(monkeypatch, fail=1, max_sessions=1)
    async with trio.open_nursery() as n:
        n.start_soon(p._keep, None)
        await trio.sleep(0.01)
        p.note("b", _ev("s1"))  # its put fails
        await trio.sleep(0.05)
        p.note("b", _ev("s2"))  # s1 released (one session per bridge)
        await trio.sleep(3.0)
        assert list(p._kv.store) == [P.claim_key("opencode", "s2", "d", "b")]
        n.cancel_scope.cancel()


def _key(session: str) -> str:
    return P.claim_key("opencode", session, "d", "b")


async def test_a_claim_churned_while_puts_fail_is_retried_once_per_pass(monkeypatch,
                                                                       autojump_clock) -> None:
    # a break-it review: every failed put of a re-claimed session was queued
    # again, so one held claim was put ~1,000 times in a row per retry
    import trio
    p = _keeping(monkeypatch, fail=10**9, max_sessions=1)
    async with trio.open_nursery() as n:
        n.start_soon(p._keep, None)
        await trio.sleep(0.01)
        for i in range(400):
            p.note("b", _ev("s1" if i % 2 == 0 else "s2"))
            await trio.sleep(0.0002)
        before = p._kv.puts
        await trio.sleep(6.0)  # a few retry passes, no refresh
        assert p.claims.items() == [("b", "opencode", "s2")]
        assert 1 <= p._kv.puts - before <= 5  # one put a pass
        n.cancel_scope.cancel()


async def test_a_claim_released_and_claimed_again_in_one_pass_stays_put(monkeypatch,
                                                                        autojump_clock) -> None:
    # a break-it review (older than the retry): puts first, deletes after,
    # deleted s1 while it was held again; commands to it met no-route
    import trio
    p = _keeping(monkeypatch, fail=0, max_sessions=1)
    async with trio.open_nursery() as n:
        n.start_soon(p._keep, None)
        await trio.sleep(0.01)
        p.note("b", _ev("s1"))
        await trio.sleep(0.5)
        p.note("b", _ev("s2"))  # s1 released...
        p.note("b", _ev("s1"))  # ...and claimed again (s2 released), one pump tick
        await trio.sleep(0.5)
        assert p.claims.items() == [("b", "opencode", "s1")]
        assert list(p._kv.store) == [_key("s1")]
        n.cancel_scope.cancel()


async def test_a_failed_delete_of_a_released_claim_is_tried_again(monkeypatch,
                                                                  autojump_clock) -> None:
    # else the stale claim stays for the TTL (30 s): a relay sees a second
    # claimant and answers ambiguous
    import trio
    p = _keeping(monkeypatch, fail=0, max_sessions=1)
    p._kv.fail_deletes = 2
    async with trio.open_nursery() as n:
        n.start_soon(p._keep, None)
        await trio.sleep(0.01)
        p.note("b", _ev("s1"))
        await trio.sleep(0.5)
        p.note("b", _ev("s2"))  # s1 released: its deletes fail twice
        await trio.sleep(3.0)
        assert list(p._kv.store) == [_key("s2")]
        n.cancel_scope.cancel()
