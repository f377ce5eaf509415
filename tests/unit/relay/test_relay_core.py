"""The relay core without sockets: WS protocol state (AEP-0003 §3.5, §4,
§4.1, §6.5), command routing and refusals (AEP-0004 §4), fan-out and replay
semantics (§3.3, §5, §7), capture ceilings (§6.4), backpressure (§8.4) and
orderly close. The ASGI/hypercorn face is covered in tests/integration."""
from __future__ import annotations

import json

import pytest
import trio
import trio.lowlevel
import trio.testing

from supervisor.relay import fanout as fanout_mod
from supervisor.relay import outlet as outlet_mod
from supervisor.relay import params
from supervisor.relay.attrmatch import Filter
from supervisor.relay.core import CommandRefused, Relay, RelayClosed
from supervisor.relay.envelope import MAX_COUNT, InvalidEvent

SRC = "aep://h/agent/a/session/"


def ev(seq, session="s1", type="tool.completed", **kw):
    e = {"aep": "0.1", "id": kw.pop("id", f"{session}-{seq}"), "type": type,
         "time": "2026-07-03T10:00:00Z", "source": SRC + session, "agent": "a",
         "session": session, "seq": seq}
    e.update(kw)
    return e


def cmd(session="s1", type="control.cancel", id="C1", **kw):
    c = {"aep": "0.1", "id": id, "type": type, "time": "2026-07-03T10:00:00Z",
         "source": "aep://h/agent/mc", "agent": "mc", "session": session,
         "data": {"scope": "run"}}
    c.update(kw)
    return c


def hello(role="emitter", agent="a", accepts=("control.cancel",), **caps):
    h = {"type": "hello", "versions": ["0.1"], "role": role,
         "identity": {"agent": agent, "instance": f"{agent}/1"},
         "capabilities": {"emits": ["tool"], **caps}}
    if accepts is not None:
        h["capabilities"]["control"] = {"accepts": list(accepts), "ack_window_ms": 10000}
    return h


async def take(outlet):
    """Everything the outlet would write right now (frames parsed for WS)."""
    out = []
    while outlet.queued:
        payloads, end = await outlet.next_batch()
        for p in payloads:
            out.append(json.loads(p) if outlet.kind == "ws" else p)
        if end is not None:
            out.append(("END", end))
            break
    return out


async def ws(relay, role="consumer", authenticated=None, **hello_kw):
    conn = relay.open_socket(relay.has_token if authenticated is None else authenticated)
    h = hello(role=role, **hello_kw)
    await conn.handle_text(json.dumps(h))
    got = await take(conn.outlet)
    assert got[0]["type"] == "hello", got
    return conn


def sse_events(chunks):
    """Parse SSE bytes into (fields, comments)."""
    text = b"".join(c for c in chunks if isinstance(c, bytes)).decode()
    msgs, comments = [], []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line[1:].strip())
            elif line:
                k, _, v = line.partition(": ")
                fields[k] = v
        if fields:
            msgs.append(fields)
    return msgs, comments


# -- hello and frames ----------------------------------------------------------------

async def test_first_frame_must_be_hello():
    relay = Relay()
    conn = relay.open_socket(False)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "x"}))
    out = await take(conn.outlet)
    assert out[0]["type"] == "error" and out[0]["code"] == "hello-required"
    assert out[-1] == ("END", (1002, "hello required"))


async def test_event_before_hello_and_bad_json_before_hello_are_hello_required():
    for first in (json.dumps(ev(0)), "{not json"):
        relay = Relay()
        conn = relay.open_socket(False)
        await conn.handle_text(first)
        out = await take(conn.outlet)
        assert out[0]["code"] == "hello-required" and out[-1][0] == "END"
        assert relay.buffers.held("s1") == 0


async def test_version_negotiation_selects_exactly_one_or_refuses():
    relay = Relay()
    conn = relay.open_socket(False)
    await conn.handle_text(json.dumps({**hello(role="consumer"), "versions": ["0.2", "0.1"]}))
    (reply,) = await take(conn.outlet)
    assert reply["type"] == "hello" and reply["versions"] == ["0.1"]
    assert reply["capabilities"]["roster"] == {} and reply["capabilities"]["replay"]["all"] is True
    conn2 = relay.open_socket(False)
    await conn2.handle_text(json.dumps({**hello(), "versions": ["0.2"]}))
    out = await take(conn2.outlet)
    assert out[0] == {"type": "error", "code": "version-unsupported", "versions": ["0.1"],
                      "detail": out[0]["detail"]}
    assert out[-1] == ("END", (1002, "version unsupported"))


async def test_emitter_hello_needs_agent_and_role_must_be_known():
    relay = Relay()
    for bad in ({**hello(), "identity": {}}, {**hello(), "role": "admin"}):
        conn = relay.open_socket(False)
        await conn.handle_text(json.dumps(bad))
        out = await take(conn.outlet)
        assert out[0]["code"] == "invalid-hello" and out[-1][0] == "END"


async def test_binary_frames_rejected_then_closed():
    relay = Relay()
    conn = await ws(relay)
    conn.handle_binary()
    out = await take(conn.outlet)
    assert out[0]["code"] == "binary-unsupported" and out[-1] == ("END", (1003, "binary frames unsupported"))


async def test_malformed_frames_answered_and_connection_survives():
    relay = Relay()
    conn = await ws(relay)
    await conn.handle_text("{oops")
    await conn.handle_text("[" * 5000 + "]" * 5000)  # valid JSON, nested past the recursion limit
    await conn.handle_text("[1,2]")
    await conn.handle_text(json.dumps({"type": "no-such-frame"}))  # ignored (§2)
    await conn.handle_text(json.dumps({"type": "ping", "t": 7}))
    out = await take(conn.outlet)
    assert [f.get("code", f["type"]) for f in out] == ["bad-json", "bad-json", "bad-frame", "pong"]
    assert out[-1] == {"type": "pong", "t": 7}
    assert relay.counters["bad_frames"] == 3


# -- subscriptions -------------------------------------------------------------------

@pytest.mark.parametrize("frame,code", [
    ({"type": "subscribe", "id": "a", "filter": {"seq": 1}}, "invalid-filter"),
    ({"type": "subscribe", "id": "a", "filter": {"type": "*"}}, "invalid-filter"),
    ({"type": "subscribe", "id": "a", "filter": None}, "invalid-filter"),
    ({"type": "subscribe", "id": "a", "capture": "everything"}, "invalid-filter"),
    ({"type": "subscribe", "id": "a", "from": {"session": "s1"}}, "invalid-filter"),
    ({"type": "subscribe", "id": "a", "from": "some"}, "invalid-filter"),
    ({"type": "subscribe", "id": "a", "from": [{"session": "s1", "seq": -1}]}, "invalid-filter"),
    ({"type": "subscribe", "id": "a", "from": [{"session": "s", "seq": 1}] * 3}, "limit-exceeded"),
])
async def test_subscribe_refusals_are_in_band_and_survivable(frame, code):
    relay = Relay(max_from=2)
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "ok", "filter": {}}))
    await conn.handle_text(json.dumps(frame))
    out = await take(conn.outlet)
    assert out[0] == {"type": "subscribed", "id": "ok"}
    assert out[1]["type"] == "error" and out[1]["code"] == code and out[1]["id"] == "a"
    assert "detail" in out[1]
    # the refused subscription did not disturb the first one, nor the connection
    await conn.handle_text(json.dumps({"type": "ping", "t": 1}))
    relay.ingest_http([relay.entry(ev(0))])
    out = await take(conn.outlet)
    assert [f["type"] for f in out] == ["pong", "tool.completed"]


async def test_limit_exceeded_on_too_many_subscriptions_and_emitter_unauthorized():
    relay = Relay(max_subscriptions=1)
    conn = await ws(relay)
    for sid in ("a", "b"):
        await conn.handle_text(json.dumps({"type": "subscribe", "id": sid}))
    out = await take(conn.outlet)
    assert out[0]["type"] == "subscribed" and out[1]["code"] == "limit-exceeded"
    em = await ws(relay, role="emitter")
    await em.handle_text(json.dumps({"type": "subscribe", "id": "z"}))
    assert (await take(em.outlet))[0] == {
        "type": "error", "code": "unauthorized", "id": "z",
        "detail": "subscribe is answered on consumer/both connections"}


async def test_multiple_subscriptions_filters_and_unsubscribe():
    relay = Relay()
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "att", "filter": {"type": "attention.*"}}))
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "s2", "filter": {"session": "s2"}}))
    await take(conn.outlet)
    relay.ingest_http([relay.entry(e) for e in (
        ev(0, type="attention.requested", severity="notice"), ev(0, session="s2"), ev(1))])
    out = await take(conn.outlet)
    assert [(f["type"], f["session"]) for f in out] == [("attention.requested", "s1"),
                                                        ("tool.completed", "s2")]
    await conn.handle_text(json.dumps({"type": "unsubscribe", "id": "s2"}))
    assert await take(conn.outlet) == [{"type": "unsubscribed", "id": "s2"}]
    relay.ingest_http([relay.entry(ev(1, session="s2"))])
    assert await take(conn.outlet) == []


async def test_ws_replay_with_exhausted_frame_then_live():
    relay = Relay(buffer=3)
    relay.ingest_http([relay.entry(ev(s)) for s in range(6)])
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "r",
                                       "from": [{"session": "s1", "epoch": 0, "seq": 1}]}))
    out = await take(conn.outlet)
    assert out[0] == {"type": "subscribed", "id": "r"}
    assert out[1] == {"type": "replay-exhausted", "sub": "r", "session": "s1",
                      "earliest": {"epoch": 0, "seq": 3}}
    assert [f["seq"] for f in out[2:]] == [3, 4, 5]


async def test_replay_then_live_has_no_gap_and_no_duplicate():
    relay = Relay(buffer=100)
    relay.ingest_http([relay.entry(ev(s)) for s in range(5)])
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "r",
                                       "from": [{"session": "s1", "epoch": 0, "seq": 1}]}))
    relay.ingest_http([relay.entry(ev(s)) for s in (5, 6)])  # live, before the writer reads
    out = await take(conn.outlet)
    assert [f.get("seq") for f in out[1:]] == [2, 3, 4, 5, 6]


async def test_eviction_between_subscribe_and_replay_is_announced_not_silent():
    # replay is served lazily; if the buffer trims meanwhile, the marker is
    # computed against what is actually served
    relay = Relay(buffer=3)
    relay.ingest_http([relay.entry(ev(s)) for s in range(6)])
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "r",
                                       "from": [{"session": "s1", "epoch": 0, "seq": 2}]}))
    relay.ingest_http([relay.entry(ev(6))])  # trims seq 3 before the writer reads
    out = await take(conn.outlet)
    assert out[1] == {"type": "replay-exhausted", "sub": "r", "session": "s1",
                      "earliest": {"epoch": 0, "seq": 4}}
    assert [f["seq"] for f in out[2:]] == [4, 5, 6]


async def test_replay_all_serves_every_held_session_without_marker():
    relay = Relay(buffer=2)
    relay.ingest_http([relay.entry(e) for e in (ev(0), ev(1), ev(2), ev(0, session="s2"))])
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "all", "from": "all"}))
    out = await take(conn.outlet)
    assert out[0]["type"] == "subscribed"
    assert not any(f["type"] == "replay-exhausted" for f in out)
    assert sorted((f["session"], f["seq"]) for f in out[1:]) == [("s1", 1), ("s1", 2), ("s2", 0)]


# -- SSE streams (outlets) --------------------------------------------------------

async def test_sse_frames_carry_event_data_and_id():
    relay = Relay()
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    e = ev(4, epoch=2)
    relay.ingest_http([relay.entry(e)])
    relay.ingest_http([relay.entry({"aep": "0.1", "id": "H1", "type": "agent.heartbeat",
                                    "time": "2026-07-03T10:00:00Z", "source": "aep://h/agent/a",
                                    "agent": "a"})])
    msgs, _ = sse_events(await take(outlet))
    assert msgs[0] == {"event": "tool.completed", "data": json.dumps(e, separators=(",", ":")),
                       "id": "s1:2:4"}
    assert msgs[1]["event"] == "agent.heartbeat" and "id" not in msgs[1]  # agent-scoped: no id


async def test_session_names_that_would_break_sse_framing_get_no_id():
    relay = Relay()
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    relay.ingest_http([relay.entry(ev(0, session="evil\ndata: {}", source=SRC + "evil"))])
    msgs, _ = sse_events(await take(outlet))
    assert len(msgs) == 1 and "id" not in msgs[0]


async def test_sse_resume_marker_and_live_only_once():
    relay = Relay(buffer=2)
    relay.ingest_http([relay.entry(ev(s)) for s in range(5)])
    outlet = relay.open_stream(Filter({}), None, plan_all=False,
                               positions=[("s1", (0, 1))], live=True)
    relay.ingest_http([relay.entry(ev(0, session="s2"))])
    msgs, comments = sse_events(await take(outlet))
    assert comments == ["replay-exhausted s1 0:3"]
    assert [m["id"] for m in msgs] == ["s1:0:3", "s1:0:4", "s2:0:0"]


async def test_sse_replay_only_ends_with_replay_complete():
    relay = Relay()
    relay.ingest_http([relay.entry(ev(s)) for s in range(3)])
    outlet = relay.open_stream(Filter({"session": "s1"}), None, plan_all=False,
                               positions=None, live=False)
    out = await take(outlet)
    msgs, comments = sse_events(out)
    assert [m["id"] for m in msgs] == ["s1:0:0", "s1:0:1", "s1:0:2"]
    assert comments == ["replay-complete"] and out[-1] == ("END", True)
    relay.ingest_http([relay.entry(ev(3))])
    assert relay.stats()["subscribers"] == 0  # replay-only never registered live


def test_last_event_id_parsing():
    p = params.parse_last_event_id
    assert p("s1:0:7") == ("s1", (0, 7))
    assert p("a:b:3:12") == ("a:b", (3, 12))
    assert p("garbage") is None and p("s::1") is None and p(":1:2") is None


async def test_live_fanout_forwards_duplicates_buffer_keeps_one():
    relay = Relay()
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    e = ev(0)
    conn = relay.attach_emitter(hello(), _noop)
    await conn.ingest(e)
    await conn.ingest(e)  # at-least-once redelivery (AEP-0004 §3 re-ack path)
    msgs, _ = sse_events(await take(outlet))
    assert len(msgs) == 2
    assert relay.buffers.held("s1") == 1 and relay.buffers.counters["duplicates"] == 1


async def _noop(_cmd):
    return None


# -- capture ceiling -----------------------------------------------------------------

async def test_downlevel_runs_once_per_event_and_ceiling(monkeypatch):
    calls = []

    def fake_downlevel(event, ceiling):
        calls.append(ceiling)
        return {**{k: v for k, v in event.items() if k != "data"}, "capture": ceiling}

    monkeypatch.setattr("bridges.core.capture.downlevel", fake_downlevel)
    relay = Relay()
    outlets = [relay.open_stream(Filter({}), c, plan_all=False, positions=None, live=True)
               for c in ["none"] * 10 + ["metadata"] * 10 + [None] * 10 + ["full"] * 10]
    relay.ingest_http([relay.entry(ev(0, capture="redacted", data={"x": 1}))])
    assert sorted(calls) == ["metadata", "none"]
    payloads = [outlet.peek().payload for outlet in outlets]
    # one rendering per ceiling, shared by reference across subscribers
    assert len({id(p) for p in payloads}) == 3
    # ... and one queue item per rendering (never changed once queued)
    assert len({id(outlet.peek()) for outlet in outlets}) == 3
    assert json.loads(sse_events([payloads[0]])[0][0]["data"])["capture"] == "none"
    assert json.loads(sse_events([payloads[25]])[0][0]["data"])["data"] == {"x": 1}
    assert payloads[35] is payloads[25]  # `full` ceiling above the event: unchanged


async def test_downlevel_failure_fails_closed(monkeypatch):
    def broken(event, ceiling):
        raise RuntimeError("bug")

    monkeypatch.setattr("bridges.core.capture.downlevel", broken)
    relay = Relay()
    outlet = relay.open_stream(Filter({}), "redacted", plan_all=False, positions=None, live=True)
    relay.ingest_http([relay.entry(ev(0, capture="full", data={"secret": "x"}))])
    msgs, _ = sse_events(await take(outlet))
    delivered = json.loads(msgs[0]["data"])
    assert "data" not in delivered and delivered["capture"] == "metadata"
    assert relay.counters["downlevel_errors"] == 1


# -- backpressure (§8.4) ----------------------------------------------------------------

async def test_slow_consumer_drops_low_severity_first_and_counts():
    relay = Relay(queue_soft_bytes=2000, queue_hard_bytes=4000)
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    for s in range(40):
        relay.ingest_http([relay.entry(ev(s, severity="debug" if s % 2 else "info"))])
    assert relay.counters["dropped_low_severity"] > 0
    assert outlet.state == "open"
    dropped = relay.counters["dropped_low_severity"]
    # notice+ still gets in (it evicts queued debug/info rather than being dropped)
    for s in range(40, 50):
        relay.ingest_http([relay.entry(ev(s, severity="warning"))])
    msgs, _ = sse_events(await take(outlet))
    ids = [int(m["id"].rsplit(":", 1)[1]) for m in msgs]
    assert set(range(40, 50)) <= set(ids)
    assert relay.counters["dropped_low_severity"] > dropped  # evictions are counted too
    assert outlet.state == "open"
    # and by severity (/metrics: events_dropped_total{reason="relay-slow-consumer",severity})
    assert relay.counters["dropped_debug"] > 0 and relay.counters["dropped_info"] > 0
    assert relay.counters["dropped_debug"] + relay.counters["dropped_info"] \
        == relay.counters["dropped_low_severity"]


async def test_notice_that_cannot_be_queued_terminates_the_stream():
    relay = Relay(queue_soft_bytes=1000, queue_hard_bytes=2000)
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    killed = []
    outlet.abort = lambda: killed.append(True)
    outlet.in_send = True  # the writer is stuck in a send to a peer that stopped reading
    for s in range(30):
        relay.ingest_http([relay.entry(ev(s, severity="error"))])
    assert outlet.state == "terminated" and killed == [True]
    assert relay.counters["streams_terminated"] == 1
    assert relay.stats()["subscribers"] == 0  # no more fan-out work for it
    out = await take(outlet)
    assert out == [b": terminated slow-consumer\n\n", ("END", True)]


async def test_ws_overflow_sends_closing_with_positions_then_1013():
    relay = Relay(queue_soft_bytes=500, queue_hard_bytes=1000)
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "x"}))
    await take(conn.outlet)
    relay.ingest_http([relay.entry(ev(0, severity="notice"))])
    await take(conn.outlet)  # delivered: s1 0:0
    for s in range(1, 30):
        relay.ingest_http([relay.entry(ev(s, severity="notice"))])
    out = await take(conn.outlet)
    assert out[0] == {"type": "closing", "reason": "slow-consumer",
                      "delivered": [{"sub": "x", "session": "s1", "epoch": 0, "seq": 0}]}
    assert out[1] == ("END", (1013, "slow-consumer"))


# -- command routing (AEP-0004 §4) -------------------------------------------------

async def test_watch_only_relay_refuses_every_command_unauthorized():
    relay = Relay(token=None)
    got = []
    target = relay.attach_emitter(hello(), _append(got))
    await target.ingest(ev(0))
    sender = await ws(relay)
    await sender.handle_text(json.dumps(cmd()))
    (err,) = await take(sender.outlet)
    assert err["type"] == "error" and err["code"] == "unauthorized" and err["cause"] == "C1"
    assert got == []
    with pytest.raises(CommandRefused) as r:
        await target.ingest(cmd(id="C2"))
    assert r.value.code == "unauthorized"


def _append(lst):
    async def deliver(c):
        lst.append(c)
    return deliver


async def test_routing_refusals_and_exactly_one_delivery():
    relay = Relay(token="t")
    got, got2 = [], []
    target = relay.attach_emitter(hello(accepts=["control.cancel"]), _append(got))
    await target.ingest(ev(0))
    audit = relay.open_stream(Filter({"session": "s1"}), None, plan_all=False,
                              positions=None, live=True)
    await take(audit)
    sender = await ws(relay)
    for c in (cmd(id="N1", session="nobody"), cmd(id="U1", type="control.pause", data={}),
              cmd(id="OK1")):
        await sender.handle_text(json.dumps(c))
    out = await take(sender.outlet)
    assert [(f["code"], f["cause"]) for f in out] == [("no-route", "N1"), ("unsupported", "U1")]
    assert [c["id"] for c in got] == ["OK1"]
    # only the routed command reaches subscribers (audit), never buffered
    msgs, _ = sse_events(await take(audit))
    assert [json.loads(m["data"])["id"] for m in msgs] == ["OK1"] and "id" not in msgs[0]
    assert relay.buffers.held("s1") == 1
    # a second claimant makes the session ambiguous: refuse, never guess
    # (two fleet bridges of one agent: one of another agent is refused there)
    other = relay.attach_emitter(hello(agent="a"), _append(got2))
    await other.ingest(ev(0, id="b-0", agent="a", source="aep://h/agent/a2/session/s1"))
    await sender.handle_text(json.dumps(cmd(id="A1")))
    (err,) = await take(sender.outlet)
    assert err["code"] == "ambiguous" and err["cause"] == "A1"
    assert [c["id"] for c in got] == ["OK1"] and got2 == []
    # the claim resolves when one claimant leaves
    other.close()
    await sender.handle_text(json.dumps(cmd(id="A1")))
    assert await take(sender.outlet) == []
    assert [c["id"] for c in got] == ["OK1", "A1"]
    assert relay.counters["commands_routed"] == 2 and relay.counters["commands_refused"] == 3


async def test_target_without_control_declaration_is_unsupported():
    relay = Relay(token="t")
    target = relay.attach_emitter(hello(accepts=None), _noop)
    await target.ingest(ev(0))
    sender = await ws(relay)
    await sender.handle_text(json.dumps(cmd()))
    assert (await take(sender.outlet))[0]["code"] == "unsupported"


async def test_remote_emitter_receives_command_byte_identical():
    relay = Relay(token="t")
    target = await ws(relay, role="emitter")
    await target.handle_text(json.dumps(ev(0)))
    sender = await ws(relay)
    raw = json.dumps(cmd(), indent=1)  # not the relay's compact form
    await sender.handle_text(raw)
    assert await take(sender.outlet) == []
    payloads, _ = await target.outlet.next_batch()
    assert payloads == [raw]


async def test_duplicate_keys_in_a_command_are_refused():
    relay = Relay(token="t")
    sender = await ws(relay)
    raw = json.dumps(cmd())[:-1] + ',"session":"other"}'
    await sender.handle_text(raw)
    (err,) = await take(sender.outlet)
    assert err["code"] == "invalid-event" and err["cause"] == "C1"


async def test_invalid_events_on_the_socket_answer_with_cause():
    relay = Relay()
    em = await ws(relay, role="emitter")
    await em.handle_text(json.dumps({**ev(0), "seq": -1}))
    (err,) = await take(em.outlet)
    assert err["type"] == "error" and err["code"] == "invalid-event" and err["cause"] == "s1-0"
    assert relay.buffers.held("s1") == 0


# -- roster (AEP-0003 §4.1) --------------------------------------------------------

async def test_roster_one_entry_per_claim_verbatim_and_emitter_refused():
    relay = Relay(token="t")
    a = relay.attach_emitter(hello(agent="a", accepts=["control.cancel"]), _noop)
    c_hello = hello(agent="a")
    c_hello["identity"]["instance"] = "c/1"
    c = relay.attach_emitter(c_hello, _noop)
    b = await ws(relay, role="emitter", agent="b", accepts=None)
    await a.ingest(ev(0))
    # two of the fleet's own bridges of one agent may collide: both are
    # listed (a live remote emitter's session, or one a bridge of another
    # agent claims, is never entered by a fleet bridge: test_bindings.py)
    await b.handle_text(json.dumps(ev(0, session="s3", id="b1", agent="b",
                                      source="aep://h/agent/b/session/s3")))
    await a.ingest(ev(0, session="s2"))
    await c.ingest(ev(0, session="s2", id="c0", agent="a", source="aep://h/agent/c/session/s2"))
    await b.handle_text(json.dumps({"type": "roster", "id": "r-0"}))
    (refusal,) = await take(b.outlet)
    assert refusal["code"] == "unauthorized" and refusal["id"] == "r-0"
    consumer = await ws(relay)
    await consumer.handle_text(json.dumps({"type": "roster", "id": "r-1"}))
    (reply,) = await take(consumer.outlet)
    assert reply["id"] == "r-1"
    ctl = {"accepts": ["control.cancel"], "ack_window_ms": 10000}
    assert sorted(reply["entries"], key=lambda e: (e["session"], e["agent"], e["instance"])) == [
        {"session": "s1", "agent": "a", "instance": "a/1", "control": ctl, "emits": ["tool"]},
        {"session": "s2", "agent": "a", "instance": "a/1", "control": ctl, "emits": ["tool"]},
        {"session": "s2", "agent": "a", "instance": "c/1", "control": ctl, "emits": ["tool"]},
        {"session": "s3", "agent": "b", "instance": "b/1", "emits": ["tool"]},
    ]
    a.close()
    await consumer.handle_text(json.dumps({"type": "roster", "id": "r-2"}))
    (reply,) = await take(consumer.outlet)
    assert sorted(e["instance"] for e in reply["entries"]) == ["b/1", "c/1"]


# -- in-process emitters -----------------------------------------------------------

async def test_attach_emitter_validates_hello():
    relay = Relay()
    for bad in (hello(role="consumer"), {**hello(), "identity": {"instance": "x"}},
                {**hello(), "versions": ["9.9"]}, "hello"):
        with pytest.raises(ValueError):
            relay.attach_emitter(bad, _noop)


async def test_local_ingest_rejects_invalid_and_counts_connections():
    relay = Relay()
    conn = relay.attach_emitter(hello(), _noop)
    with pytest.raises(InvalidEvent):
        await conn.ingest({**ev(0), "type": "tool"})
    with pytest.raises(InvalidEvent):
        await conn.ingest({**ev(0), "data": {"when": object()}})
    assert relay.stats()["connections"] == 1
    conn.close()
    assert relay.stats()["connections"] == 0
    with pytest.raises(RelayClosed):
        await conn.ingest(ev(1))


async def test_session_cap_evicts_buffers_but_not_claims():
    relay = Relay(token="t", max_sessions=2)
    got = []
    conn = relay.attach_emitter(hello(), _append(got))
    for s in ("a", "b", "c"):
        await conn.ingest(ev(0, session=s))
    assert [k[1] for k in relay.buffers.sessions()] == ["b", "c"]
    assert relay.buffers.counters["sessions_evicted"] == 1
    # claims are bounded to max_sessions too (least recently used dropped)
    assert sorted(e["session"] for e in relay.roster()) == ["b", "c"]


# -- orderly close ---------------------------------------------------------------

async def test_close_ends_streams_and_sockets_in_order():
    relay = Relay()
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "x"}))
    await take(conn.outlet)
    local = relay.attach_emitter(hello(), _noop)
    await local.ingest(ev(0))
    sse_out, ws_out = [], []

    async def writer(o, sink):
        while True:
            payloads, end = await o.next_batch()
            sink.extend(payloads)
            if end is not None:
                sink.append(("END", end))
                o.closed()
                return

    async with trio.open_nursery() as n:
        n.start_soon(writer, outlet, sse_out)
        n.start_soon(writer, conn.outlet, ws_out)
        with trio.fail_after(5):
            await relay.close("shutdown")
    assert sse_out[-2:] == [b": shutting-down\n\n", ("END", True)]
    assert sse_events(sse_out)[0][0]["id"] == "s1:0:0"  # queued events flushed first
    closing = json.loads(ws_out[-2])
    assert closing == {"type": "closing", "reason": "shutdown",
                       "delivered": [{"sub": "x", "session": "s1", "epoch": 0, "seq": 0}]}
    assert ws_out[-1] == ("END", (1001, "shutdown"))
    with pytest.raises(RelayClosed):
        await local.ingest(ev(1))
    with pytest.raises(RelayClosed):
        relay.attach_emitter(hello(), _noop)


async def test_close_aborts_a_stream_that_cannot_drain():
    relay = Relay()
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    aborted = trio.Event()
    outlet.abort = aborted.set
    with trio.fail_after(5):
        await relay.close("shutdown", grace=0.05)
    assert aborted.is_set()


def test_repr_never_shows_the_token():
    assert "s3cret" not in repr(Relay(token="s3cret"))
    assert Relay(token="s3cret").check_token("s3cret") and not Relay(token="s3cret").check_token("x")


# -- write coalescing -----------------------------------------------------------

async def test_sse_writer_lingers_so_a_burst_leaves_in_one_write(mock_clock):
    relay = Relay(sse_linger_s=0.05)
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    got = []

    async def writer():
        got.append(await outlet.next_batch(linger=relay.sse_linger()))

    async with trio.open_nursery() as n:
        n.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        for s in range(10):
            relay.ingest_http([relay.entry(ev(s))])
            await trio.lowlevel.checkpoint()  # the writer is woken, and lingers
        assert got == []
        mock_clock.jump(0.05)
    payloads, end = got[0]
    assert len(payloads) == 10 and end is None


def test_linger_scales_with_open_streams():
    relay = Relay(sse_linger_s=0.005)
    assert relay.sse_linger() == 0.005
    for _ in range(100):
        relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    assert relay.sse_linger() == 0.05
    for _ in range(300):
        relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    assert relay.sse_linger() == 0.1


async def test_delivered_positions_stay_bounded():
    relay = Relay(max_sessions=3)
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": "x"}))
    for i in range(10):
        relay.ingest_http([relay.entry(ev(0, session=f"s{i}", source=SRC + f"s{i}"))])
    await take(conn.outlet)
    assert [p["session"] for p in conn.outlet.delivered_positions()] == ["s7", "s8", "s9"]


# -- hostile input (review findings) --------------------------------------------------

LONE = "p\ud800"  # legal as a JSON escape, no UTF-8 form (AEP-0001 §5: the envelope is UTF-8)


@pytest.mark.parametrize("poison", [
    {"session": LONE, "source": SRC + "p"},
    {"subject": LONE},
    {"data": {"text": LONE}},
    {"data": {LONE: 1}},
    {"id": LONE},
])
async def test_lone_surrogates_are_invalid_events(poison):
    relay = Relay()
    with pytest.raises(InvalidEvent, match="UTF-8"):
        relay.entry({**ev(0), **poison})


async def test_lone_surrogate_on_the_socket_is_an_error_frame_and_replay_all_survives():
    relay = Relay()
    em = await ws(relay, role="emitter")
    await em.handle_text(json.dumps(ev(0)))
    # json.dumps escapes the surrogate as \ud800: valid JSON text
    await em.handle_text(json.dumps({**ev(1, id="bad"), "session": LONE}))
    (err,) = await take(em.outlet)
    assert err["type"] == "error" and err["code"] == "invalid-event" and err["cause"] == "bad"
    await em.handle_text(json.dumps(ev(2)))
    outlet = relay.open_stream(Filter({}), None, plan_all=True, positions=None, live=False)
    msgs, comments = sse_events(await take(outlet))
    assert [m["id"] for m in msgs] == ["s1:0:0", "s1:0:2"] and comments == ["replay-complete"]


async def test_a_frame_echoing_text_without_utf8_form_carries_u_fffd_and_the_socket_lives():
    """One lone-surrogate rule (bridges.core.aep.dumps): no UTF-8 form, no wire
    form. A frame the relay must answer anyway (it echoes the client's id)
    goes out with U+FFFD in place of the surrogate, as valid UTF-8 JSON."""
    relay = Relay()
    conn = await ws(relay)
    await conn.handle_text(json.dumps({"type": "subscribe", "id": LONE, "filter": {}}))
    await conn.handle_text(json.dumps({"type": "ping", "t": 7}))
    (subscribed, pong) = await take(conn.outlet)
    assert subscribed == {"type": "subscribed", "id": "p\ufffd"}
    assert pong == {"type": "pong", "t": 7}


async def test_a_failing_subscriber_is_shed_and_the_ingest_completes(monkeypatch):
    relay = Relay()
    bad = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    good = relay.open_stream(Filter({}), "none", plan_all=False, positions=None, live=True)

    def broken(self):
        raise UnicodeEncodeError("utf-8", "x", 0, 1, "boom")

    monkeypatch.setattr(fanout_mod.View, "sse", lambda self: broken(self) if self.raw is self.entry.raw
                        else b"ok\n\n")
    relay.ingest_http([relay.entry(ev(s)) for s in range(3)])
    assert relay.buffers.held("s1") == 3 and relay.counters["fanout_errors"] == 1
    assert bad.state == outlet_mod.TERMINATED and len(await take(good)) == 3


def test_from_positions_naming_a_session_without_utf8_form_are_refused():
    with pytest.raises(params.InvalidFilter):
        params.parse_from([{"session": "p\ud800", "seq": 1}])


@pytest.mark.parametrize("value", ["s:0:\u00b2", "s:\u0663:1", "s:0:" + "9" * 5000, "s:" + "1" * 5000 + ":0",
                                   "s:0:1\u00b2", "s:+1:2", "s:0: 1"])
def test_malformed_last_event_id_is_ignored_not_raised(value):
    assert params.parse_last_event_id(value) is None


async def test_socket_events_must_carry_the_hello_identity_agent_when_strict():
    relay = Relay(strict_identity=True)
    em = await ws(relay, role="emitter", agent="evil")
    await em.handle_text(json.dumps(ev(0, agent="codex", id="x1")))
    (err,) = await take(em.outlet)
    assert err["type"] == "error" and err["code"] == "invalid-event" and err["cause"] == "x1"
    assert "identity.agent" in err["detail"]
    assert relay.buffers.held("s1") == 0 and relay.counters["events"] == 0
    await em.handle_text(json.dumps(ev(1, agent="evil")))  # the connection survives
    assert await take(em.outlet) == [] and relay.buffers.held("s1") == 1


async def test_by_default_a_mismatched_agent_is_accepted_claimed_and_counted(caplog):
    relay = Relay()
    em = await ws(relay, role="emitter", agent="aep-live-check-roster")
    await em.handle_text(json.dumps(ev(0, agent="aep-live-check", id="x1")))
    await em.handle_text(json.dumps(ev(1, agent="aep-live-check", id="x2")))
    assert await take(em.outlet) == []
    assert relay.buffers.held("s1") == 2 and relay.counters["identity_mismatch"] == 2
    assert [e["agent"] for e in relay.roster() if e["session"] == "s1"] == ["aep-live-check-roster"]
    assert len([r for r in caplog.records if "identity.agent" in r.getMessage()]) == 1


async def test_in_process_emitter_events_must_carry_its_hello_agent_when_strict():
    relay = Relay(strict_identity=True)
    conn = relay.attach_emitter(hello(agent="a"), _noop)
    with pytest.raises(InvalidEvent, match="identity.agent"):
        await conn.ingest(ev(0, agent="b"))
    await conn.ingest(ev(0, agent="a"))
    assert relay.buffers.held("s1") == 1


async def test_a_squatter_on_a_session_name_cannot_evict_a_bridge_history():
    relay = Relay(buffer=5)
    bridge = relay.attach_emitter(hello(agent="a"), _noop)
    for s in range(5):
        await bridge.ingest(ev(s, session="victim"))
    squat = [ev(s, session="victim", id=f"m{s}", agent="mallory", epoch=MAX_COUNT,
                source="aep://h/agent/mallory/session/victim") for s in range(5)]
    relay.ingest_http([relay.entry(e) for e in squat])
    assert relay.buffers.held((SRC + "victim", "victim")) == 5
    # a bare-name resume position replays every buffer of that name
    outlet = relay.open_stream(Filter({}), None, plan_all=False,
                               positions=[("victim", (0, 2))], live=False)
    msgs, comments = sse_events(await take(outlet))
    got = sorted((json.loads(m["data"])["agent"], json.loads(m["data"])["seq"]) for m in msgs)
    assert got == [("a", 3), ("a", 4)] + [("mallory", s) for s in range(5)]
    # each buffer gets its own verdict: a's is covered (no marker); mallory's
    # starts past the position, so it is announced (the safe direction: a
    # consumer is told to consult history, never silently under-delivered)
    assert comments == [f"replay-exhausted victim {MAX_COUNT}:0", "replay-complete"]


async def test_a_different_event_at_a_held_position_is_refused_redelivery_is_not():
    relay = Relay()
    em = await ws(relay, role="emitter")
    await em.handle_text(json.dumps(ev(3, id="x")))
    await em.handle_text(json.dumps(ev(3, id="y")))
    (err,) = await take(em.outlet)
    assert err["code"] == "invalid-event" and err["cause"] == "y" and "(epoch, seq)" in err["detail"]
    await em.handle_text(json.dumps(ev(3, id="x")))  # redelivery: legal, deduped
    assert await take(em.outlet) == []
    assert relay.buffers.held("s1") == 1 and relay.counters["events"] == 2
    local = relay.attach_emitter(hello(), _noop)
    # another live connection under the same source: refused before the position
    # check (issue 10 #8: a live emitter's source is its own)
    with pytest.raises(InvalidEvent, match="epoch, seq|connected emitter"):
        await local.ingest(ev(3, id="z"))


async def test_a_replay_below_the_events_capture_is_chunked_by_bytes(monkeypatch):
    """A twelfth outside attack: 8 subscribers replaying 8 events of 4 MB at
    ``capture=metadata`` each down-leveled (parsed and re-encoded) a chunk of
    up to 256 events in one step: the loop was held 3.6 s. A chunk now ends
    once the events it rendered pass CHUNK_BYTES."""
    from supervisor.relay.replay import ReplayJob
    chunks: list[int] = []
    real = ReplayJob.next_chunk

    def spy(self):
        out = real(self)
        if out:
            chunks.append(sum(1 for p in out if isinstance(p, (bytes, str)) and b"s1:0:" in
                              (p if isinstance(p, bytes) else p.encode())))
        return out
    monkeypatch.setattr(ReplayJob, "next_chunk", spy)
    relay = Relay()
    big = "y" * 100_000
    relay.ingest_http([relay.entry(ev(s, capture="full", data={"text": big})) for s in range(12)])
    outlet = relay.open_stream(Filter({"session": "s1"}), "metadata", plan_all=True,
                               positions=None, live=False)
    msgs, _ = sse_events(await take(outlet))
    assert [m["id"] for m in msgs] == [f"s1:0:{s}" for s in range(12)]
    assert all(json.loads(m["data"])["capture"] == "metadata" for m in msgs)
    per_chunk = -(-ReplayJob.CHUNK_BYTES // 100_000)  # the chunk ends after the event past it
    assert sum(chunks) == 12 and max(chunks) <= per_chunk, chunks


async def test_many_replays_below_capture_render_each_event_once_and_one_at_a_time(monkeypatch):
    """A thirteenth outside attack: 32 subscribers replaying at
    ``capture=metadata`` each re-rendered the same events, all in one
    scheduling round (each writer took its chunk without waiting for the
    others): the loop was held 3-9 s and gated hooks failed open. Now a
    replay's render is shared by the replays that render it meanwhile, and one
    chunk renders at a time relay-wide (a second task ticks between them)."""
    from bridges.core import capture
    from supervisor.relay.replay import ReplayJob
    from tests.support.ticker import Ticker
    downlevels: list[int] = []
    real_downlevel = capture.downlevel
    monkeypatch.setattr("bridges.core.capture.downlevel",
                        lambda ev, c: downlevels.append(1) or real_downlevel(ev, c))
    ticker = Ticker()
    rendered_at: list[int] = []
    real_chunk = ReplayJob.next_chunk
    monkeypatch.setattr(ReplayJob, "next_chunk",
                        lambda self: rendered_at.append(ticker.ticks) or real_chunk(self))
    relay = Relay()
    big = "y" * 100_000
    relay.ingest_http([relay.entry(ev(s, capture="full", data={"text": big})) for s in range(6)])
    outlets = [relay.open_stream(Filter({"session": "s1"}), "metadata", plan_all=True,
                                 positions=None, live=False) for _ in range(8)]
    got: list[list] = []

    async def all_of_them():
        async with trio.open_nursery() as n:
            for o in outlets:
                n.start_soon(lambda o=o: _gather_into(got, take(o)))
    await ticker.beside(all_of_them)
    assert len(got) == 8
    for out in got:
        msgs, _ = sse_events(out)
        assert [m["id"] for m in msgs] == [f"s1:0:{s}" for s in range(6)]
    assert len(downlevels) == 6  # once per event, not once per subscriber
    # one chunk renders per round (the ticker may run before or after it: two a tick)
    per_tick: dict[int, int] = {}
    for t in rendered_at:
        per_tick[t] = per_tick.get(t, 0) + 1
    assert max(per_tick.values()) <= 2, per_tick


async def _gather_into(into: list, coro) -> None:
    into.append(await coro)
