"""The command ledger, one test per rule (AEP-0004 §2.3, §3, §4.2, §7;
DESIGN.md "The command ledger is shared"; the REST-settled ack discipline of
docs/bridge-openhands-design.md and docs/adapter-opencode-design.md).

Every test runs a real BridgeContext over a real trio memory channel and a
real Stamper; timing rules run on trio's MockClock (``autojump_clock``), so
"the guard expired" and "inside the window" are virtual-time facts, not
wall-clock races."""
from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio
import trio.lowlevel

from bridges.core.bridge import BridgeContext, BridgeHealth, Outbound, Saturated
from bridges.core.capture import CapturePolicy
from bridges.core.control import Controller
from bridges.core.envelope import Stamper
from bridges.core.ledger import CommandLedger, Refuse, Unreachable, WriteResult
from tests.support.schema import validate_event, validate_stream
from tests.support.shared import aep_dir

ACCEPTS = ["control.cancel", "control.pause"]
SENDER = "aep://phone/agent/telegram-sink"
EPOCH = 7


def assert_valid(ev: dict[str, Any]) -> None:
    """Envelope schema + payload schema + capture honesty (tests/support/schema.py)."""
    validate_event(ev)


def command(type_: str = "control.cancel", *, id_: str = "01CMD0000000000000000000001",
            source: str = SENDER, session: str = "ses-1", run: str | None = "run-1",
            data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A command as AEP-0004 §2 shapes it (what ControlSender.build emits)."""
    cmd: dict[str, Any] = {"aep": "0.1", "id": id_, "type": type_,
                           "time": "2026-11-30T12:00:00.000Z", "source": source,
                           "agent": "telegram-sink", "session": session,
                           "capture": "metadata",
                           "data": data if data is not None else {"scope": "run"}}
    if run is not None:
        cmd["run"] = run
    return cmd


class Rig:
    """A BridgeContext wired to a memory channel the test reads."""

    def __init__(self, ceiling: str = "metadata", size: int = 100) -> None:
        self.send, self.recv = trio.open_memory_channel[Outbound](size)
        self.cmd_send, cmd_recv = trio.open_memory_channel[dict](size)
        self.health = BridgeHealth()
        stamper = Stamper("opencode", epoch=EPOCH, host="box",
                          policy=CapturePolicy(ceiling=ceiling))
        self.ctx = BridgeContext("opencode_sse", stamper, self.send, cmd_recv,
                                 self.health, logging.getLogger("test.ledger"))

    def drain(self) -> list[Outbound]:
        out = []
        while True:
            try:
                out.append(self.recv.receive_nowait())
            except trio.WouldBlock:
                return out


class Writes:
    """A scripted REST write: records calls, returns/raises what it is told,
    optionally after a (virtual) delay."""

    def __init__(self, result: Any = 200, delay: float = 0.0) -> None:
        self.result = result
        self.delay = delay
        self.calls: list[str] = []
        self.finished: list[str] = []

    async def __call__(self, cmd: dict[str, Any]) -> WriteResult:
        self.calls.append(cmd["id"])
        await trio.sleep(self.delay)
        self.finished.append(cmd["id"])
        if isinstance(self.result, BaseException):
            raise self.result
        if isinstance(self.result, WriteResult):
            return self.result
        return WriteResult(self.result)


class Toy:
    """A scripted :class:`~bridges.core.control.Controller`: the plan is the
    command itself unless ``check`` returns something else; ``check`` (sync
    or async), ``note`` and ``perform`` are the test's callables (each
    optional: no ``perform`` = a 200 write that does nothing)."""

    def __init__(self, accepts=ACCEPTS, *, check=None, note=None, perform=None,
                 ack_window_ms: int = 10_000, guard_ms: int = 8_000) -> None:
        self.accepts = tuple(accepts)
        self.ack_window_ms = ack_window_ms
        self.guard_ms = guard_ms
        self._check, self._note, self._perform = check, note, perform

    def check(self, cmd):
        if self._check is None:
            return cmd
        res = self._check(cmd)
        if hasattr(res, "__await__"):
            async def plan():
                got = await res
                return cmd if got is None else got
            return plan()
        return cmd if res is None else res

    def note(self, plan):
        return self._note(plan) if self._note is not None else None

    async def perform(self, plan):
        if self._perform is None:
            return WriteResult(200)
        return await self._perform(plan)


def toy_is_a_controller(c: Controller) -> None:  # a static (mypy) check of the protocol
    pass


toy_is_a_controller(Toy())


# -- the ack itself ------------------------------------------------------

async def test_accepted_ack_lands_in_the_target_session_cause_linked_with_run():
    rig = Rig()
    cmd = command()
    async with CommandLedger(rig.ctx, Toy()) as ledger:
        ack = await ledger.handle(cmd)
    [out] = rig.drain()
    assert out.bridge == "opencode_sse" and out.redelivery is False
    assert out.event is ack
    assert ack["type"] == "control.accepted"
    assert ack["session"] == cmd["session"]
    assert ack["cause"] == cmd["id"]
    assert ack["run"] == cmd["run"]
    assert ack["source"] == "aep://box/agent/opencode/session/ses-1"
    assert (ack["epoch"], ack["seq"]) == (EPOCH, 0)
    assert "data" not in ack or ack["data"] == {}
    assert_valid(ack)


async def test_ack_without_run_when_the_command_has_none():
    rig = Rig()
    async with CommandLedger(rig.ctx, Toy()) as ledger:
        ack = await ledger.handle(command(run=None))
    assert "run" not in ack
    assert_valid(ack)


# -- dedupe and re-ack ---------------------------------------------------

async def test_redelivery_reemits_the_recorded_ack_byte_identically_without_re_executing():
    rig = Rig()
    write = Writes(200)
    cmd = command()
    async with CommandLedger(rig.ctx, Toy(perform=write)) as ledger:
        first = await ledger.handle(cmd)
        wire_first = json.dumps(first)
        # a sink mutating the envelope it was handed must not corrupt the record
        first["seq"] = 999
        again = await ledger.handle(dict(cmd))
        third = await ledger.handle(dict(cmd))
    outs = rig.drain()
    # one decision; re-sends are pure duplicates (outs[0] is the dict mutated above)
    validate_stream([json.loads(wire_first), outs[1].event, outs[2].event])
    assert [o.redelivery for o in outs] == [False, True, True]
    assert json.dumps(outs[1].event) == wire_first
    assert json.dumps(outs[2].event) == wire_first
    assert json.dumps(again) == wire_first and json.dumps(third) == wire_first
    assert write.calls == [cmd["id"]]  # MUST NOT re-execute (§2.3)
    assert rig.health.counters["control_redelivered"] == 2
    assert rig.health.counters["control_accepted"] == 1


async def test_recorded_rejection_is_reemitted_too():
    rig = Rig()
    cmd = command("control.attention.respond")
    async with CommandLedger(rig.ctx, Toy()) as ledger:
        first = await ledger.handle(cmd)
        again = await ledger.handle(cmd)
    assert first["type"] == "control.rejected"
    assert json.dumps(again) == json.dumps(first)
    assert [o.redelivery for o in rig.drain()] == [False, True]


async def test_dedupe_key_is_source_and_id():
    rig = Rig()
    write = Writes(200)
    a = command(source="aep://phone/agent/telegram-sink")
    b = command(source="aep://laptop/agent/mission-control")  # same id, other sender
    async with CommandLedger(rig.ctx, Toy(perform=write)) as ledger:
        ack_a = await ledger.handle(a)
        ack_b = await ledger.handle(b)
    assert ack_a["id"] != ack_b["id"]
    assert write.calls == [a["id"], b["id"]]
    assert [o.redelivery for o in rig.drain()] == [False, False]


async def test_duplicate_mid_decision_gets_no_second_ack(autojump_clock):
    rig = Rig()
    write = Writes(200, delay=2.0)
    cmd = command()
    results: list[Any] = []
    async with CommandLedger(rig.ctx, Toy(perform=write)) as ledger:
        async with trio.open_nursery() as n:
            async def first():
                results.append(await ledger.handle(cmd))
            n.start_soon(first)
            await trio.sleep(0.5)  # the write is in flight
            assert write.calls == [cmd["id"]]
            dup = await ledger.handle(dict(cmd))
            assert dup is None
            assert rig.drain() == []  # nothing emitted for the duplicate
    [out] = rig.drain()
    assert out.event is results[0] and out.redelivery is False
    assert write.calls == [cmd["id"]]
    assert rig.health.counters["control_inflight_duplicates"] == 1


# -- the type gate and check ---------------------------------------------

async def test_undeclared_type_is_rejected_unsupported_without_check_or_write():
    rig = Rig()
    calls: list[str] = []
    write = Writes(200)
    toy = Toy(check=lambda c: calls.append("check"), perform=write,
              note=lambda p: calls.append("note"))
    async with CommandLedger(rig.ctx, toy) as ledger:
        ack = await ledger.handle(command("x.opencode.control.instruct"))
    assert ack["type"] == "control.rejected"
    assert ack["data"]["reason"] == "unsupported"
    assert ack["cause"] == "01CMD0000000000000000000001"
    assert calls == [] and write.calls == []
    assert_valid(ack)


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_refuse_from_check_never_calls_write(asynchronous):
    rig = Rig()
    write = Writes(200)
    armed: list[str] = []

    def check_sync(cmd):
        raise Refuse("refused", "session is idle")

    async def check_async(cmd):
        await trio.lowlevel.checkpoint()
        raise Refuse("refused", "session is idle")

    toy = Toy(check=check_async if asynchronous else check_sync, perform=write,
              note=lambda p: armed.append(p["id"]))
    async with CommandLedger(rig.ctx, toy) as ledger:
        ack = await ledger.handle(command())
    assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "refused"
    assert write.calls == [] and armed == []
    assert_valid(ack)


async def test_check_that_passes_lets_the_write_run():
    rig = Rig()
    write = Writes(204)
    seen: list[str] = []
    async with CommandLedger(rig.ctx, Toy(check=lambda c: seen.append(c["id"]),
                                          perform=write)) as ledger:
        ack = await ledger.handle(command())
    assert ack["type"] == "control.accepted"
    assert seen == write.calls == ["01CMD0000000000000000000001"]


async def test_check_crash_is_a_defined_invalid_nack_not_a_crash():
    rig = Rig()
    write = Writes(200)
    async with CommandLedger(rig.ctx, Toy(check=lambda c: c["data"]["scope"],
                                          perform=write)) as ledger:
        ack = await ledger.handle(command(data={}))
    assert ack["data"]["reason"] == "invalid"
    assert write.calls == []


def test_refuse_rejects_reasons_outside_the_registry():
    reasons = json.loads((aep_dir() / "schemas/registry/nack-reasons.json").read_text())
    text = json.dumps(reasons)
    for r in ("unsupported", "unauthorized", "busy", "refused", "invalid"):
        assert f'"{r}"' in text
        Refuse(r)
    with pytest.raises(ValueError):
        Refuse("timeout")  # sender-side only, never on the wire (§3)


# -- the REST-settled ack guard ------------------------------------------

async def test_2xx_accepts():
    rig = Rig()
    for i, status in enumerate((200, 201, 202, 204, 299)):
        async with CommandLedger(rig.ctx, Toy(perform=Writes(status))) as ledger:
            ack = await ledger.handle(command(id_=f"C{i}"))
            assert ack["type"] == "control.accepted", status


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422])
async def test_4xx_refuses_with_the_vendor_detail_capture_gated(status):
    # at `redacted` the detail leaves (through the redaction pipeline) ...
    rig = Rig(ceiling="redacted")
    busy = Toy(perform=Writes(WriteResult(status, "session busy")))
    async with CommandLedger(rig.ctx, busy) as ledger:
        ack = await ledger.handle(command())
    assert ack["type"] == "control.rejected"
    assert ack["data"]["reason"] == "refused"
    assert f"HTTP {status}" in ack["data"]["detail"]
    assert "session busy" in ack["data"]["detail"]
    assert_valid(ack)
    # ... at the default `metadata` ceiling it does not (detail is [redacted],
    # schemas/types/control.rejected.schema.json); the reason always does.
    rig = Rig(ceiling="metadata")
    async with CommandLedger(rig.ctx, busy) as ledger:
        ack = await ledger.handle(command())
    assert ack["data"]["reason"] == "refused"
    assert "detail" not in ack["data"]
    assert ack["capture"] == "metadata"
    assert_valid(ack)


async def test_a_huge_vendor_error_page_is_clipped():
    rig = Rig(ceiling="redacted")
    async with CommandLedger(rig.ctx, Toy(perform=Writes(WriteResult(400, "x" * 100_000)))) as ledger:
        ack = await ledger.handle(command())
    assert len(ack["data"]["detail"]) <= 600


@pytest.mark.parametrize("failure", [WriteResult(500), WriteResult(502, "bad gateway"),
                                     WriteResult(503), Unreachable("connection refused"),
                                     RuntimeError("boom")])
async def test_5xx_unreachable_or_a_crashing_write_is_busy(failure):
    rig = Rig()
    async with CommandLedger(rig.ctx, Toy(perform=Writes(failure))) as ledger:
        ack = await ledger.handle(command())
    assert ack["type"] == "control.rejected"
    assert ack["data"]["reason"] == "busy"
    assert_valid(ack)


async def test_refuse_from_write_carries_its_reason():
    rig = Rig()
    async with CommandLedger(rig.ctx, Toy(perform=Writes(Refuse("invalid", "no such permission")))
                             ) as ledger:
        ack = await ledger.handle(command())
    assert ack["data"]["reason"] == "invalid"


async def test_guard_expiry_accepts_inside_the_window_and_the_write_keeps_going(autojump_clock):
    rig = Rig()
    write = Writes(200, delay=60.0)  # the vendor takes a minute
    toy = Toy(perform=write, ack_window_ms=10_000, guard_ms=8_000)
    async with CommandLedger(rig.ctx, toy) as ledger:
        t0 = trio.current_time()
        ack = await ledger.handle(command())
        t_ack = trio.current_time() - t0
        assert ack["type"] == "control.accepted"
        assert 8.0 <= t_ack < 10.0  # the guard, inside the declared window
        assert write.finished == []  # still writing, not cancelled
        await trio.sleep(60)
        assert write.finished == ["01CMD0000000000000000000001"]
    assert rig.health.counters["control_guard_expired"] == 1
    assert len(rig.drain()) == 1  # the late 2xx emits nothing more


async def test_guard_is_clamped_inside_the_declared_window(autojump_clock):
    rig = Rig()
    hang = Writes(200, delay=3600)
    ledger = CommandLedger(rig.ctx, Toy(perform=hang, ack_window_ms=10_000, guard_ms=30_000))
    assert ledger.guard_ms < ledger.ack_window_ms
    short = CommandLedger(rig.ctx, Toy(perform=hang, ack_window_ms=2_000, guard_ms=8_000))
    assert short.guard_ms < 2_000
    for led, window in ((ledger, 10.0), (short, 2.0)):
        async with led:
            t0 = trio.current_time()
            ack = await led.handle(command(id_=f"C{window}"))
            assert ack["type"] == "control.accepted"
            assert trio.current_time() - t0 < window


async def test_slow_check_is_busy_inside_the_window_and_never_writes(autojump_clock):
    rig = Rig()
    write = Writes(200)

    async def check(cmd):
        await trio.sleep(3600)

    async with CommandLedger(rig.ctx, Toy(check=check, perform=write,
                                          ack_window_ms=10_000)) as ledger:
        t0 = trio.current_time()
        ack = await ledger.handle(command())
        assert trio.current_time() - t0 < 10.0
    assert ack["data"]["reason"] == "busy"
    assert write.calls == []


async def test_every_decision_lands_inside_the_window(autojump_clock):
    """Whatever the vendor does (answers fast, slow, errors, hangs), the ack
    goes out before ack_window_ms elapses, in virtual time."""
    rig = Rig()
    behaviours = [Writes(200, 0.1), Writes(409, 7.9), Writes(500, 8.1),
                  Writes(Unreachable("reset"), 5.0), Writes(200, 9.99), Writes(200, 1e6)]
    toy = Toy(perform=lambda plan: behaviours[int(plan["id"][1:])](plan), ack_window_ms=10_000)
    async with CommandLedger(rig.ctx, toy) as ledger:
        for i in range(len(behaviours)):
            t0 = trio.current_time()
            ack = await ledger.handle(command(id_=f"W{i}"))
            assert ack is not None
            assert trio.current_time() - t0 < 10.0, i


async def test_leaving_the_ledger_cancels_writes_still_running(autojump_clock):
    rig = Rig()
    write = Writes(200, delay=1e6)
    async with CommandLedger(rig.ctx, Toy(perform=write)) as ledger:
        await ledger.handle(command())
    assert write.calls and write.finished == []


# -- the plan, pending notes and after_ack -------------------------------

async def test_the_plan_check_returns_is_what_note_and_perform_get():
    """The ledger carries the plan from check to note to perform: no side
    dictionary keyed by command id in the bridge."""
    rig = Rig()
    seen: list[Any] = []

    class Plan:
        pass

    plans: list[Plan] = []

    def check(cmd):
        plans.append(Plan())
        return plans[-1]

    async def perform(plan):
        seen.append(("perform", plan))
        return WriteResult(200)

    toy = Toy(check=check, note=lambda plan: seen.append(("note", plan)), perform=perform)
    async with CommandLedger(rig.ctx, toy) as ledger:
        await ledger.handle(command(id_="P1"))
        await ledger.handle(command(id_="P2"))
    assert seen == [("note", plans[0]), ("perform", plans[0]),
                    ("note", plans[1]), ("perform", plans[1])]


async def test_no_controller_nacks_everything_unsupported():
    rig = Rig()
    async with CommandLedger(rig.ctx) as ledger:
        acks = [await ledger.handle(command(t, id_=f"U{i}"))
                for i, t in enumerate(("control.cancel", "control.pause", "x.toy.control.poke"))]
    assert [a["data"]["reason"] for a in acks] == ["unsupported"] * 3
    for a in acks:
        assert_valid(a)


async def test_note_runs_before_the_write_and_after_ack_follows_the_ack():
    rig = Rig()
    order: list[Any] = []

    async def outcome():
        [ack] = [o.event for o in rig.drain()]
        order.append(("after_ack", ack["type"], ack["cause"]))

    async def perform(plan):
        order.append("write")
        return WriteResult(200, after_ack=outcome)

    def note(plan):
        order.append(("note", plan["id"]))
        return lambda: order.append("undo")

    async with CommandLedger(rig.ctx, Toy(perform=perform, note=note)) as ledger:
        ack = await ledger.handle(command())
    assert order == [("note", ack["cause"]), "write",
                     ("after_ack", "control.accepted", ack["cause"])]


async def test_a_late_write_runs_after_ack_only_once_the_ack_is_out(autojump_clock):
    rig = Rig()
    order: list[str] = []

    async def outcome():
        order.append("after_ack")
        await rig.ctx.emit("ses-1", {"type": "x.toy.outcome", "data": {}})

    async def perform(plan):
        await trio.sleep(20)  # outlives the 8 s guard
        order.append("write")
        return WriteResult(200, after_ack=outcome)

    async with CommandLedger(rig.ctx, Toy(perform=perform)) as ledger:
        ack = await ledger.handle(command())
        assert ack["type"] == "control.accepted" and order == []
        await trio.sleep(30)
    assert order == ["write", "after_ack"]
    assert [o.event["type"] for o in rig.drain()] == ["control.accepted", "x.toy.outcome"]


@pytest.mark.parametrize("failure", [WriteResult(409), WriteResult(503), Unreachable("down")])
async def test_a_rejected_write_undoes_the_note_and_never_runs_after_ack(failure):
    rig = Rig()
    events: list[str] = []

    async def perform(plan):
        got = await Writes(failure)(plan)
        return WriteResult(got.status, got.detail, after_ack=lambda: events.append("after"))

    async with CommandLedger(rig.ctx, Toy(perform=perform,
                                          note=lambda p: (lambda: events.append("undo")))
                             ) as ledger:
        ack = await ledger.handle(command())
    assert ack["type"] == "control.rejected"
    assert events == ["undo"]


async def test_a_refused_check_or_note_never_writes_and_undoes_nothing():
    rig = Rig()
    write = Writes(200)

    def bad_note(plan):
        raise Refuse("refused", "raced")

    async with CommandLedger(rig.ctx, Toy(perform=write, note=bad_note)) as ledger:
        ack = await ledger.handle(command())
    assert ack["data"] == {"reason": "refused"} and write.calls == []


async def test_a_write_failing_after_the_guard_undoes_but_never_re_acks(autojump_clock):
    rig = Rig()
    events: list[str] = []
    toy = Toy(perform=Writes(WriteResult(409), delay=20),
              note=lambda p: (lambda: events.append("undo")))
    async with CommandLedger(rig.ctx, toy) as ledger:
        ack = await ledger.handle(command())
        assert ack["type"] == "control.accepted" and events == []
        await trio.sleep(30)
        assert events == ["undo"]
    assert len(rig.drain()) == 1
    assert rig.health.counters["control_late_write_failed"] == 1


async def test_a_crashing_hook_never_changes_the_decision():
    rig = Rig()

    async def after():
        raise RuntimeError("bridge bug")

    async def perform(plan):
        return WriteResult(200, after_ack=after)

    async with CommandLedger(rig.ctx, Toy(perform=perform)) as ledger:
        ack = await ledger.handle(command())
        again = await ledger.handle(command())
    assert ack["type"] == "control.accepted"
    assert json.dumps(again) == json.dumps(ack)
    assert rig.health.counters["control_callback_errors"] == 1


# -- bounded memory ------------------------------------------------------

async def test_retention_is_bounded_lru_and_a_forgotten_command_is_new():
    rig = Rig()
    write = Writes(200)
    async with CommandLedger(rig.ctx, Toy(perform=write), retain=3) as ledger:
        acks = {}
        for name in ("A", "B", "C"):
            acks[name] = await ledger.handle(command(id_=name))
        await ledger.handle(command(id_="A"))  # refresh A: B is now oldest
        acks["D"] = await ledger.handle(command(id_="D"))
        assert len(ledger) == 3
        assert ledger.recorded(SENDER, "B") is None
        again_a = await ledger.handle(command(id_="A"))
        new_b = await ledger.handle(command(id_="B"))
    assert json.dumps(again_a) == json.dumps(acks["A"])  # remembered
    assert new_b["id"] != acks["B"]["id"]  # forgotten: decided anew (§3)
    assert write.calls == ["A", "B", "C", "D", "B"]


async def test_a_command_flood_is_bounded_by_max_pending(autojump_clock):
    rig = Rig()
    write = Writes(200, delay=5)
    acks: dict[str, Any] = {}
    async with CommandLedger(rig.ctx, Toy(perform=write), max_pending=2) as ledger:
        async with trio.open_nursery() as n:
            async def one(i):
                acks[i] = await ledger.handle(command(id_=f"F{i}"))
            for i in range(3):
                n.start_soon(one, i)
                await trio.sleep(0.1)
    assert acks[2]["data"]["reason"] == "busy"
    assert [acks[i]["type"] for i in (0, 1)] == ["control.accepted"] * 2
    assert write.calls == ["F0", "F1"]


# -- malformed input and the serve loop ----------------------------------

@pytest.mark.parametrize("bad", [{}, {"id": 5, "session": "s"}, {"id": "x"},
                                 {"id": "x", "session": ""}, "not a dict"])
async def test_a_command_that_cannot_be_acked_is_counted_not_crashed(bad):
    rig = Rig()
    async with CommandLedger(rig.ctx, Toy()) as ledger:
        assert await ledger.handle(bad) is None
    assert rig.drain() == []
    assert rig.health.counters["control_malformed"] == 1


async def test_handle_outside_the_context_is_an_error():
    rig = Rig()
    with pytest.raises(RuntimeError):
        await CommandLedger(rig.ctx, Toy()).handle(command())


async def test_serve_decides_commands_concurrently_from_the_inbox(autojump_clock):
    rig = Rig()
    slow = Writes(200, delay=5)
    accepted: list[str] = []

    async def perform(plan):
        got = await slow(plan)

        async def after():
            accepted.append(plan["id"])
        return WriteResult(got.status, after_ack=after)

    async with CommandLedger(rig.ctx, Toy(perform=perform)) as ledger:
        async with trio.open_nursery() as n:
            n.start_soon(ledger.serve, rig.ctx.commands)
            t0 = trio.current_time()
            await rig.cmd_send.send(command(id_="S1"))
            await rig.cmd_send.send(command(id_="S1"))  # duplicate mid-decision
            await rig.cmd_send.send(command(id_="S2"))
            await rig.cmd_send.send(command("control.attention.respond", id_="S3"))
            await rig.cmd_send.aclose()
        await trio.sleep(6)
        # both writes ran side by side: everything decided well inside one guard
        assert trio.current_time() - t0 < 8
    outs = rig.drain()
    validate_stream(o.event for o in outs)
    by_cause = {o.event["cause"]: o.event["type"] for o in outs}
    assert len(outs) == 3
    assert by_cause == {"S1": "control.accepted", "S2": "control.accepted",
                        "S3": "control.rejected"}
    assert sorted(accepted) == ["S1", "S2"]
    assert slow.calls.count("S1") == 1


def test_declaration_is_the_hello_control_block():
    rig = Rig()
    led = CommandLedger(rig.ctx, Toy(ack_window_ms=5000))
    assert led.declaration == {"accepts": ACCEPTS, "ack_window_ms": 5000}
    assert CommandLedger(rig.ctx).declaration == {"accepts": [], "ack_window_ms": 10000}
    with pytest.raises(ValueError):
        CommandLedger(rig.ctx, Toy(ack_window_ms=0))



# -- the ack before its outcome (AEP-0004 §1) ------------------------------

@pytest.mark.parametrize("path", ["emit", "emit_nowait"])
async def test_an_outcome_the_vendor_reports_before_the_write_returns_follows_the_ack(path):
    """Seen in a parallel run with the real OpenCode: the abort's error frame
    was read (``run.cancelled``, cause = the command) before the abort POST
    returned, so the outcome was stamped before ``control.accepted`` and
    ``aep-bridges cancel``, reading from the ack's position on, never saw
    it. The outcome now waits for the ack (``emit_nowait`` refuses it as
    :class:`Saturated`, the receivers' cue to wait in ``emit``); an event
    with no cause, or another cause, does not wait."""
    rig = Rig()
    cmd = command()
    order: list[str] = []
    outcome = {"type": "run.cancelled", "data": {"by": "control"}}

    async def reader() -> None:  # the receiver's task: frames arrive mid-write
        await rig.ctx.emit(cmd["session"], {"type": "progress.status", "data": {}}, run="run-1")
        rig.ctx.emit_nowait(cmd["session"], {"type": "progress.status", "data": {}},
                            run="run-1", cause="01SOMETHINGELSE000000000001")
        order.append("others sent")
        if path == "emit_nowait":
            with pytest.raises(Saturated):
                rig.ctx.emit_nowait(cmd["session"], outcome, run="run-1", cause=cmd["id"])
        await rig.ctx.emit(cmd["session"], outcome, run="run-1", cause=cmd["id"])
        order.append("outcome sent")

    async def perform(plan):
        nursery.start_soon(reader)
        await trio.sleep(0.05)  # the reader runs (and must wait) before the write returns
        order.append("write returned")
        return WriteResult(200)

    async with trio.open_nursery() as nursery:
        async with CommandLedger(rig.ctx, Toy(perform=perform)) as ledger:
            ack = await ledger.handle(cmd)
    assert order == ["others sent", "write returned", "outcome sent"]
    events = [o.event for o in rig.drain()]
    types = [e["type"] for e in events]
    assert types.index("control.accepted") < types.index("run.cancelled"), types
    assert events[types.index("run.cancelled")]["seq"] > ack["seq"]
    # released: an outcome after the ack (or of a decided command) goes at once
    rig.ctx.emit_nowait(cmd["session"], outcome, run="run-1", cause=cmd["id"])
