"""The fleet supervisor: crash isolation, restart with backoff, JSONL first,
drain. The relay here is a recording stand-in for the embedded relay's
emitter-connection interface (the real relay is exercised in the
integration tests)."""
import itertools
import json

import trio
import trio.testing

from supervisor.config import Config
from supervisor.fleet import Fleet


class RecordingRelay:
    def __init__(self):
        self.hellos = []
        self.events = []

    def attach_emitter(self, hello, deliver, open_sessions=False, source_base=None):
        self.hellos.append(hello)
        relay = self

        class Conn:
            async def ingest(self, ev):
                relay.events.append(ev)
        return Conn()


class Steady:
    """Emits one event per tick, forever."""
    agent = "steady"
    name = "steady"

    def capabilities(self):
        return {"emits": ["x"], "control": {"accepts": [], "ack_window_ms": 10000}}

    def preflight(self):
        return []

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        ctx.health.source = True
        task_status.started()
        while True:
            await ctx.emit("s1", {"type": "x.steady.tick.seen"})
            await trio.sleep(0.1)


class Crashy:
    """Emits one event, then crashes; counts its starts."""
    agent = "crashy"
    name = "crashy"

    def __init__(self):
        self.starts = 0

    def capabilities(self):
        return {"emits": ["x"], "control": {"accepts": ["control.cancel"], "ack_window_ms": 10000}}

    def preflight(self):
        return []

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        self.starts += 1
        task_status.started()
        await ctx.emit("c1", {"type": "x.crashy.run.began"})
        raise RuntimeError("vendor said no")


async def test_a_crashing_bridge_restarts_and_never_disturbs_its_sibling(tmp_path, autojump_clock):
    relay = RecordingRelay()
    crashy = Crashy()
    fleet = Fleet(Config(state_dir=tmp_path), [Steady(), crashy], relay=relay, host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        await trio.sleep(20)
        health = fleet.healthz(authorized=True)
        n.cancel_scope.cancel()
    assert crashy.starts >= 4  # restarted again and again, with backoff (not thousands)
    assert crashy.starts < 30
    ticks = [e for e in relay.events if e["agent"] == "steady"]
    assert len(ticks) >= 150  # the sibling kept its 10/s pace throughout
    assert [e["seq"] for e in ticks] == list(range(len(ticks)))
    # one stamper per identity survives restarts: seq keeps climbing, same epoch
    crashes = [e for e in relay.events if e["agent"] == "crashy"]
    assert [e["seq"] for e in crashes] == list(range(len(crashes)))
    assert health["bridges"]["crashy"]["counters"]["restarts"] >= 3
    assert health["bridges"]["crashy"]["source"] is False
    assert health["bridges"]["steady"] == {"ok": True, "relay": True, "source": True,
                                           "control": False, "counters": {}}
    assert health["bridges"]["crashy"]["control"] is True
    assert health["ok"] is False
    # each bridge is its own emitter identity on the relay
    assert [h["identity"]["agent"] for h in relay.hellos] == ["steady", "crashy"]
    assert relay.hellos[1]["capabilities"]["control"]["accepts"] == ["control.cancel"]


async def test_jsonl_is_written_before_the_relay_sees_the_event(tmp_path):
    seen_on_disk = []

    class CheckingRelay(RecordingRelay):
        def attach_emitter(self, hello, deliver, open_sessions=False, source_base=None):
            class Conn:
                async def ingest(self, ev):
                    path = tmp_path / "logs" / ev["agent"] / f"{ev['session']}.jsonl"
                    lines = path.read_text().splitlines()
                    seen_on_disk.append(json.loads(lines[-1])["id"] == ev["id"])
            return Conn()

    fleet = Fleet(Config(state_dir=tmp_path), [Steady()], relay=CheckingRelay(), host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        await trio.sleep(0.35)
        n.cancel_scope.cancel()
    assert seen_on_disk and all(seen_on_disk)


async def test_epoch_is_new_on_every_fleet_start(tmp_path):
    e1 = Fleet(Config(state_dir=tmp_path), [], relay=RecordingRelay()).epoch
    e2 = Fleet(Config(state_dir=tmp_path), [], relay=RecordingRelay()).epoch
    assert e2 > e1


async def test_drain_delivers_what_the_channel_holds(tmp_path):
    """Events already on the relay channel when shutdown starts are logged
    (and delivered) by drain(), not lost with the pump."""
    fleet = Fleet(Config(state_dir=tmp_path, channel_size=64), [Steady()], relay=RecordingRelay(),
                  host="h")
    ctx = fleet.members["steady"].ctx
    for _ in range(50):
        ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
    assert ctx.saturated() is False
    await fleet.drain()  # the pump never ran
    lines = (tmp_path / "logs" / "steady" / "s.jsonl").read_text().splitlines()
    assert len(lines) == 50 and fleet.session_log.lines == 50


async def test_emit_nowait_reports_saturation_without_burning_a_seq(tmp_path):
    fleet = Fleet(Config(state_dir=tmp_path, channel_size=2), [Steady()], relay=RecordingRelay())
    ctx = fleet.members["steady"].ctx
    ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
    ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
    assert ctx.saturated()
    import pytest

    from bridges.core.bridge import Saturated
    with pytest.raises(Saturated):
        ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
    await fleet.drain()
    nxt = ctx.stamper.stamp("s", {"type": "x.steady.tick.seen"})
    assert nxt["seq"] == 2


class OneShot(Steady):
    """Emits the events it is given, then idles."""

    def __init__(self, emissions, name="oneshot", caps=None):
        self.emissions = emissions
        self.name = self.agent = name
        self.caps = caps

    def capabilities(self):
        return self.caps if self.caps is not None else super().capabilities()

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        ctx.health.source = True
        task_status.started()
        for em in self.emissions:
            await ctx.emit("s\ud800x", em)
        await trio.sleep_forever()


async def test_lone_surrogates_never_kill_the_pump(tmp_path):
    """A vendor string with a lone UTF-16 surrogate has no UTF-8 form: the
    fleet replaces it (U+FFFD) once, for the log and the relay alike, and
    keeps delivering (the break-it review crashed the daemon with one)."""
    relay = RecordingRelay()
    bridge = OneShot([{"type": "x.oneshot.tool.seen", "data": {"model": "gpt\ud800"}},
                      {"type": "x.oneshot.tool.seen", "data": {"ok": True}}])
    fleet = Fleet(Config(state_dir=tmp_path), [bridge], relay=relay, host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        with trio.fail_after(5):
            while len(relay.events) < 2:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    first = relay.events[0]
    assert first["data"]["model"] == "gpt\ufffd" and first["session"] == "s\ufffdx"
    assert first["source"].endswith("/session/s%EF%BF%BDx")  # one URI path segment
    assert relay.events[1]["data"] == {"ok": True}
    files = list((tmp_path / "logs" / "oneshot").iterdir())
    lines = files[0].read_bytes().decode("utf-8").splitlines()  # valid UTF-8
    assert [json.loads(x)["id"] for x in lines] == [e["id"] for e in relay.events]
    # the session is stamped clean (U+FFFD): only the first event's data needed the fleet
    assert fleet.counters["unencodable_text"] == 1


async def test_an_unserializable_event_is_dropped_and_counted_not_fatal(tmp_path):
    relay = RecordingRelay()
    bridge = OneShot([{"type": "x.oneshot.tool.seen", "data": {"n": float("nan")}},
                      {"type": "x.oneshot.tool.seen", "data": {"n": 1}}])
    fleet = Fleet(Config(state_dir=tmp_path), [bridge], relay=relay, host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        with trio.fail_after(5):
            while not relay.events:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    assert [e["data"] for e in relay.events] == [{"n": 1}]
    assert fleet.counters["unserializable"] == 1


async def test_the_fleet_nacks_commands_for_a_bridge_without_control(tmp_path):
    """AEP-0004 §4.2/§7: the target nacks what it does not accept, even when
    a (remote) relay routed it anyway; a bridge that declares no control
    block never reads its inbox, so the fleet answers for it."""
    delivers = {}

    class CapturingRelay(RecordingRelay):
        def attach_emitter(self, hello, deliver, open_sessions=False, source_base=None):
            delivers[hello["identity"]["agent"]] = deliver
            return super().attach_emitter(hello, deliver, open_sessions)

    relay = CapturingRelay()
    bridge = OneShot([], name="nocontrol", caps={"emits": ["x"]})
    fleet = Fleet(Config(state_dir=tmp_path), [bridge], relay=relay, host="h")
    cmd = {"aep": "0.1", "id": "01CMD", "type": "control.cancel", "time": "2026-11-30T12:00:00Z",
           "source": "aep://ops/agent/operator", "agent": "operator", "session": "s1",
           "data": {"scope": "run"}}
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        for want in (1, 2, 3):  # a retransmit after the decision gets the recorded ack again
            await delivers["nocontrol"](dict(cmd))
            with trio.fail_after(5):
                while len(relay.events) < want:
                    await trio.sleep(0.01)
        n.cancel_scope.cancel()
    acks = relay.events
    assert {a["type"] for a in acks} == {"control.rejected"}
    assert acks[0]["data"]["reason"] == "unsupported" and acks[0]["cause"] == "01CMD"
    assert acks[1] == acks[0] and acks[2] == acks[0]  # byte-identical re-ack


async def test_health_reports_a_failing_session_log(tmp_path):
    (tmp_path / "logs").write_text("not a directory")
    relay = RecordingRelay()
    fleet = Fleet(Config(state_dir=tmp_path), [OneShot([{"type": "x.oneshot.tool.seen"}])],
                  relay=relay, host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        with trio.fail_after(5):
            while not relay.events:
                await trio.sleep(0.01)
        health = fleet.healthz(authorized=True)
        n.cancel_scope.cancel()
    assert health["log"] is False and health["ok"] is False
    assert health["counts"]["jsonl_errors"] == 1
    assert len(relay.events) == 1  # the relay still got it: the log is history, not a gate


def test_root_cause_unwraps_nursery_groups():
    from supervisor.fleet import root_cause
    leaf = OSError(98, "Address already in use")
    assert root_cause(ExceptionGroup("x", [ExceptionGroup("y", [leaf])])) is leaf
    assert root_cause(leaf) is leaf


async def test_a_fleet_without_bridges_keeps_no_spare_files(tmp_path):
    """``aep-bridges relay`` (no bridges) writes no session log, so it makes
    no spare files (review: it made the whole pool beside a daemon's)."""
    fleet = Fleet(Config(state_dir=tmp_path), [], relay=RecordingRelay(), host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        await trio.sleep(1.0)  # real time: the keeper's work is in a worker thread
        n.cancel_scope.cancel()
    assert fleet.spares.counters["made"] == 0
    assert not (tmp_path / "logs" / ".spare").exists()


async def test_other_tasks_run_between_two_drains_of_the_pump(tmp_path):
    """The pump yields once per drain (its channel's receive does, whether
    or not something is queued), so a relay writer runs between two drains
    of a full channel: it sees the deliveries arrive a batch or two at a
    time (trio runs the two tasks in either order in a turn), never all at
    once after the last."""
    from supervisor.pump import PUMP_BATCH

    relay = RecordingRelay()
    fleet = Fleet(Config(state_dir=tmp_path, channel_size=6 * PUMP_BATCH), [Steady()],
                  relay=relay, host="h")
    ctx = fleet.members["steady"].ctx
    seen: list[int] = []

    async def writer():
        while len(relay.events) < 6 * PUMP_BATCH:
            seen.append(len(relay.events))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as n:
        await fleet._attach(n, fleet.members["steady"])  # noqa: SLF001 (the sink, no bridge run)
        for _ in range(6 * PUMP_BATCH):
            ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
        n.start_soon(fleet._pump)  # noqa: SLF001
        n.start_soon(writer)
        with trio.fail_after(10):
            while len(relay.events) < 6 * PUMP_BATCH:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    assert seen[0] == 0 and len(seen) >= 3
    assert max(b - a for a, b in itertools.pairwise(seen)) <= 2 * PUMP_BATCH


async def test_a_waiting_sender_hears_its_verdicts_before_the_relay_fans_out(tmp_path):
    """An export awaiting ``logged_since`` (its answer to the exporter) is
    woken by the drain's session-log verdicts and runs before the pump hands
    that drain to the relay: the exporter's next request can arrive while
    the relay fans out (issue 11). The log has the events when it answers;
    the relay gets every one of them right after, in order."""
    relay = RecordingRelay()
    fleet = Fleet(Config(state_dir=tmp_path), [Steady()], relay=relay, host="h")
    ctx = fleet.members["steady"].ctx
    at_answer: list[tuple[int, int]] = []

    async with trio.open_nursery() as n:
        await fleet._attach(n, fleet.members["steady"])  # noqa: SLF001 (the sink, no bridge run)
        n.start_soon(fleet._pump)  # noqa: SLF001
        mark = ctx.log_mark()
        sent = [ctx.emit_nowait("s", {"type": "x.steady.tick.seen"}) for _ in range(5)]
        assert await ctx.logged_since(mark)
        log = tmp_path / "logs" / "steady" / "s.jsonl"
        at_answer.append((len(log.read_text().splitlines()), len(relay.events)))
        with trio.fail_after(10):
            while len(relay.events) < 5:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    assert at_answer == [(5, 0)]
    assert [ev["id"] for ev in relay.events] == [ev["id"] for ev in sent]


async def test_the_pump_drops_the_gil_for_a_waiting_sender_before_the_relay_fans_out(
        tmp_path, monkeypatch):
    """When a sender waits on a drain's verdicts, the pump, after letting it
    run, drops the GIL once (``_drop_gil``) before the relay's hand-over: a
    sender answering from grpcio's thread takes it then, not a switch
    interval later (issue 11). A drain nobody waits on does not (nor one
    whose sender answers on the event loop: issue 27,
    ``test_fleet_verdicts.py``)."""
    import supervisor.pump as fleet_mod

    relay = RecordingRelay()
    fleet = Fleet(Config(state_dir=tmp_path), [Steady()], relay=relay, host="h")
    ctx = fleet.members["steady"].ctx
    ctx.answers_in_thread = True  # as the OTLP bridge's gRPC receiver sets it
    log = tmp_path / "logs" / "steady" / "s.jsonl"
    drops: list[tuple[int, int, int]] = []
    answered: list[bool] = []  # the sender has run past its verdicts
    monkeypatch.setattr(fleet_mod, "_drop_gil", lambda: drops.append(
        (len(log.read_text().splitlines()), len(relay.events), len(answered))))

    async with trio.open_nursery() as n:
        await fleet._attach(n, fleet.members["steady"])  # noqa: SLF001 (the sink, no bridge run)
        n.start_soon(fleet._pump)  # noqa: SLF001
        mark = ctx.log_mark()
        for _ in range(5):
            ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
        assert await ctx.logged_since(mark)
        answered.append(True)
        with trio.fail_after(10):
            while len(relay.events) < 5:
                await trio.sleep(0.01)
        # after the log has the drain and the sender has answered, before the relay has it
        assert drops == [(5, 0, 1)]
        for _ in range(3):  # nobody waits on these verdicts
            ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
        with trio.fail_after(10):
            while len(relay.events) < 8:
                await trio.sleep(0.01)
        n.cancel_scope.cancel()
    assert drops == [(5, 0, 1)]


async def test_shutdown_delivers_every_logged_drain_to_the_relay_in_order(tmp_path):
    """drain() at shutdown leaves the channel to the pump (every send side
    closed, then it waits for the pump to end), so a drain the pump holds
    (logged, its export answered, not yet handed over) reaches the relay
    before what was queued after it, and before ``relay.close()``: an
    acknowledged event the consumers never saw was the bug (a review found
    the pump's hand-over overtaken, then refused as RelayClosed). After the
    drain a sender is refused: the channel is closed."""
    from supervisor.relay.core import Relay

    relay = Relay()
    fleet = Fleet(Config(state_dir=tmp_path), [Steady()], relay=relay, host="h")
    ctx = fleet.members["steady"].ctx
    sent: list[dict] = []

    async with trio.open_nursery() as n:
        await fleet._attach(n, fleet.members["steady"])  # noqa: SLF001 (the sink, no bridge run)
        n.start_soon(fleet._pump)  # noqa: SLF001
        mark = ctx.log_mark()
        sent.extend(ctx.emit_nowait("s", {"type": "x.steady.tick.seen"}) for _ in range(5))
        assert await ctx.logged_since(mark)  # the pump now holds that drain, logged
        sent.extend(ctx.emit_nowait("s", {"type": "x.steady.tick.seen"}) for _ in range(5))
        with trio.fail_after(10):
            await fleet.drain()
        await relay.close("shutdown", grace=0.1)
        try:
            ctx.emit_nowait("s", {"type": "x.steady.tick.seen"})
        except trio.ClosedResourceError:
            refused = True
        else:
            refused = False
        n.cancel_scope.cancel()
    held = sorted((e.n, e.pos[1]) for e in relay.buffers.iter_entries("s"))
    assert [seq for _, seq in held] == [ev["seq"] for ev in sent] == list(range(10))
    assert fleet.counters["sink_errors"] == 0
    assert refused


async def test_a_bridge_event_the_relay_refuses_is_counted_and_turns_health_red(tmp_path):
    """The relay refusing a bridge's own event (an outside party took its place;
    since the fifth attack on issue 25 no outside post can, so this path is
    reached here): counted ``relay_refused``, the bridge's health red, the pump
    goes on with the next events."""
    from supervisor.relay import InvalidEvent

    class RefusingRelay(RecordingRelay):
        def attach_emitter(self, hello, deliver, open_sessions=False, source_base=None):
            relay = self

            class Conn:
                async def ingest(self, ev):
                    if ev["seq"] == 1:
                        raise InvalidEvent("seq 1 of session s1 was taken")
                    relay.events.append(ev)
            return Conn()

    relay = RefusingRelay()
    fleet = Fleet(Config(state_dir=tmp_path), [Steady()], relay=relay, host="h")
    async with trio.open_nursery() as n:
        await n.start(fleet.run)
        with trio.fail_after(10):
            while len(relay.events) < 3:
                await trio.sleep(0.05)
        health = fleet.healthz(authorized=True)
        n.cancel_scope.cancel()
    steady = health["bridges"]["steady"]
    assert steady["counters"]["relay_refused"] == 1
    assert steady["ok"] is False and "relay refused" in steady["detail"]
    assert [e["seq"] for e in relay.events][:3] == [0, 2, 3]
