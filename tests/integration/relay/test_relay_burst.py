"""A 10,000-event burst reaches one SSE consumer that reads at full speed
whole (issue 11): AEP-0003 §8.4 sheds *slow* consumers, and a consumer
whose writer drains as fast as the relay fills it is not one. Counts, not
times: the consumer here is the relay's own SSE writer
(:func:`supervisor.relay.streams.pump_sse`) onto an ASGI ``send`` that
takes every body at once, so the only thing that could lose events is the
relay starving its writers while it ingests (an ingest of the whole burst
without a yield fills the outlet far past its 1 MiB soft budget: ~3 MiB of
info events, thousands dropped).

Both ingest paths: ``POST /events`` NDJSON batches (the relay's ASGI app)
and the fleet's pump (a bridge emitting the burst through the relay
channel, JSONL log first)."""
from __future__ import annotations

import json

import trio

from supervisor.config import Config
from supervisor.fleet import Fleet
from supervisor.relay.app import make_app
from supervisor.relay.attrmatch import Filter
from supervisor.relay.core import Relay
from supervisor.relay.streams import pump_sse

BURST = 10_000


class SseSink:
    """An SSE consumer reading at full speed: every body sent is taken at
    once; counts the ``event:`` messages."""

    def __init__(self) -> None:
        self.events = 0
        self.ids: list[str] = []

    async def send(self, msg):
        body = msg.get("body", b"")
        for block in body.split(b"\n\n"):
            if block.startswith(b"event: "):
                self.events += 1
                for line in block.split(b"\n"):
                    if line.startswith(b"id: "):
                        self.ids.append(line[4:].decode())

    async def receive(self):
        await trio.sleep_forever()


async def _stream(relay: Relay, sink: SseSink, flt: dict) -> trio.CancelScope:
    outlet = relay.open_stream(Filter(flt), None, plan_all=False, positions=None, live=True)
    await pump_sse(relay, outlet, sink.receive, sink.send)


def _event(i: int) -> dict:
    return {"aep": "0.1", "id": f"01BURST{i:019d}", "type": "tool.completed",
            "time": "2026-12-01T10:00:00.000Z", "source": "aep://h/agent/burst/session/b1",
            "agent": "burst", "session": "b1", "seq": i, "epoch": 0,
            "data": {"tool": {"name": "bash", "call_id": f"call-{i}"}, "status": "success",
                     "duration_ms": 12}}


async def _post(app, body: bytes) -> dict:
    out: dict = {}
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if chunks:
            return chunks.pop()
        await trio.sleep_forever()

    async def send(msg):
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        elif msg["type"] == "http.response.body":
            out["body"] = out.get("body", b"") + msg.get("body", b"")

    scope = {"type": "http", "method": "POST", "path": "/events", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/x-ndjson"),
                         (b"aep-version", b"0.1")], "client": ("127.0.0.1", 1)}
    await app(scope, receive, send)
    return out


async def _settle(sink: SseSink, want: int) -> None:
    """Until every task is blocked (the writers drained what they hold)."""
    with trio.fail_after(120):
        while sink.events < want:
            before = sink.events
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            if sink.events == before:
                return


async def test_a_10k_post_burst_reaches_a_full_speed_consumer_whole():
    relay = Relay()
    app = make_app(relay)
    sink = SseSink()
    lines = [json.dumps(_event(i)) for i in range(BURST)]
    async with trio.open_nursery() as n:
        n.start_soon(_stream, relay, sink, {})
        await trio.testing.wait_all_tasks_blocked()
        resp = await _post(app, "\n".join(lines).encode())  # one batch: the whole burst
        assert resp["status"] == 202 and json.loads(resp["body"]) == {"accepted": BURST}
        await _settle(sink, BURST)
        n.cancel_scope.cancel()
    assert sink.events == BURST
    assert relay.counters["dropped_low_severity"] == 0
    assert sink.ids == [f"b1:0:{i}" for i in range(BURST)]  # in order, none twice


class Burst:
    """A bridge that emits ``BURST`` info events at once, then idles."""
    agent = name = "burst"

    def capabilities(self):
        return {"emits": ["tool.completed"], "control": {"accepts": [], "ack_window_ms": 10000}}

    def preflight(self):
        return []

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        ctx.health.source = True
        task_status.started()
        for i in range(BURST):
            await ctx.emit("b1", {"type": "tool.completed", "data": {
                "tool": {"name": "bash", "call_id": f"call-{i}"}, "status": "success",
                "duration_ms": 12}})
        await trio.sleep_forever()


async def test_a_10k_bridge_burst_through_the_fleet_reaches_a_full_speed_consumer_whole(tmp_path):
    relay = Relay()
    sink = SseSink()
    fleet = Fleet(Config(state_dir=tmp_path), [Burst()], relay=relay, host="h")
    async with trio.open_nursery() as n:
        n.start_soon(_stream, relay, sink, {"agent": "burst"})
        await trio.testing.wait_all_tasks_blocked()
        await n.start(fleet.run)
        await _settle(sink, BURST)
        n.cancel_scope.cancel()
    assert sink.events == BURST
    assert relay.counters["dropped_low_severity"] == 0
    assert [i.rsplit(":", 1)[1] for i in sink.ids] == [str(i) for i in range(BURST)]
    log = (tmp_path / "logs" / "burst" / "b1.jsonl").read_text().splitlines()
    assert len(log) == BURST  # and the session log has every one


class TurnsSink(SseSink):
    """A consumer that reads at full speed behind a socket: each body takes
    ``turns`` scheduler turns to leave, whatever its size (the kernel takes
    what the reader drained meanwhile), so ingest runs between a writer's
    turns. Counts, not times."""

    def __init__(self, turns: int) -> None:
        super().__init__()
        self.turns = turns
        self.bodies = 0

    async def send(self, msg):
        for _ in range(self.turns):
            await trio.lowlevel.checkpoint()
        self.bodies += 1
        await super().send(msg)


async def test_back_to_back_posts_reach_a_consumer_behind_a_socket_whole():
    """20,000 info events POSTed back to back (500-line batches, nothing
    awaited between them but the answers) to a consumer whose every write
    takes two scheduler turns: the writer takes up to half its soft budget
    each turn (here its whole queue), so what ingest queued while it wrote
    leaves in the next write instead of piling up past the 1 MiB soft budget
    (a 256 KiB take per turn shed thousands: issue 11)."""
    relay = Relay()
    app = make_app(relay)
    sink = TurnsSink(turns=2)
    n_events = 2 * BURST
    lines = [json.dumps(_event(i)) for i in range(n_events)]
    async with trio.open_nursery() as n:
        n.start_soon(_stream, relay, sink, {})
        await trio.testing.wait_all_tasks_blocked()
        for i in range(0, n_events, 500):
            resp = await _post(app, "\n".join(lines[i:i + 500]).encode())
            assert resp["status"] == 202
        await _settle(sink, n_events)
        n.cancel_scope.cancel()
    assert relay.counters["dropped_low_severity"] == 0
    assert sink.events == n_events
    assert sink.ids == [f"b1:0:{i}" for i in range(n_events)]
    assert sink.bodies < n_events // 256  # writes carry many events each
