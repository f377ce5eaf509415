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
