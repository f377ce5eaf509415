"""``supervisor.fleet.run_bridge``: the one control path (issue 7, "one
control shape"). Each run's handle goes up, the fleet's ledger serves the
run's controller (none: ``unsupported``), a returning run takes its command
service with it, and nothing else in the tree builds a ledger."""
from __future__ import annotations

import ast
import logging
from pathlib import Path

import trio

from bridges.core.bridge import BridgeContext, BridgeHealth, BridgeRun, Outbound
from bridges.core.control import WriteResult
from bridges.core.envelope import Stamper
from supervisor.fleet import run_bridge

ROOT = Path(__file__).resolve().parents[3]


def rig(name="toy"):
    out_s, out_r = trio.open_memory_channel[Outbound](100)
    cmd_s, cmd_r = trio.open_memory_channel[dict](10)
    ctx = BridgeContext(name, Stamper("toy", epoch=1, host="h"), out_s, cmd_r, BridgeHealth(),
                        logging.getLogger("t"))
    return ctx, cmd_s, out_r


def command(id_, type_="control.cancel"):
    return {"aep": "0.1", "id": id_, "type": type_, "time": "2026-01-01T00:00:00Z",
            "source": "aep://ops/agent/op", "agent": "op", "session": "s1",
            "data": {"scope": "run"}}


class Cancel:
    accepts = ("control.cancel",)
    ack_window_ms = 10_000
    guard_ms = 8_000

    def __init__(self):
        self.performed = []

    def check(self, cmd):
        return cmd["id"]

    def note(self, plan):
        return None

    async def perform(self, plan):
        self.performed.append(plan)
        return WriteResult(204)


class Toy:
    name, agent = "toy", "toy"

    def __init__(self, controller=None, *, bare=False, returns=False):
        self.controller, self.bare, self.returns = controller, bare, returns

    def capabilities(self):
        accepts = list(self.controller.accepts) if self.controller else []
        return {"emits": ["x"], "control": {"accepts": accepts, "ack_window_ms": 10000}}

    def preflight(self, *, check_ports=True):
        return []

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        if self.bare:
            task_status.started()
        else:
            task_status.started(BridgeRun(controller=self.controller))
        if not self.returns:
            await trio.sleep_forever()


async def acks(out_r, n):
    got = []
    with trio.fail_after(5):
        while len(got) < n:
            got.append((await out_r.receive()).event)
    return got


async def test_the_handle_goes_up_and_the_controller_is_served():
    ctx, cmd_s, out_r = rig()
    controller = Cancel()
    async with trio.open_nursery() as n:
        handle = await n.start(run_bridge, Toy(controller), ctx)
        assert handle.controller is controller and ctx.health.control is True
        await cmd_s.send(command("C1"))
        await cmd_s.send(command("C2", "control.pause"))
        got = {a["cause"]: a for a in await acks(out_r, 2)}  # decided concurrently
        n.cancel_scope.cancel()
    a, b = got["C1"], got["C2"]
    assert a["type"] == "control.accepted"
    assert (b["type"], b["data"]["reason"]) == ("control.rejected", "unsupported")
    assert controller.performed == ["C1"]


async def test_a_bare_started_means_no_controller():
    ctx, cmd_s, out_r = rig()
    async with trio.open_nursery() as n:
        handle = await n.start(run_bridge, Toy(bare=True), ctx)
        assert isinstance(handle, BridgeRun) and handle.controller is None
        assert ctx.health.control is False
        await cmd_s.send(command("C1"))
        [a] = await acks(out_r, 1)
        n.cancel_scope.cancel()
    assert a["data"]["reason"] == "unsupported"


async def test_a_run_that_returns_takes_its_command_service_with_it():
    ctx, _cmd_s, _ = rig()
    with trio.fail_after(5):
        await run_bridge(Toy(Cancel(), returns=True), ctx)  # returns instead of serving forever


async def test_a_controller_that_contradicts_the_declaration_is_logged(caplog):
    class Liar(Toy):
        def capabilities(self):
            return {"emits": ["x"], "control": {"accepts": ["control.pause"], "ack_window_ms": 10000}}

    ctx, _, _ = rig()
    async with trio.open_nursery() as n:
        await n.start(run_bridge, Liar(Cancel()), ctx)
        n.cancel_scope.cancel()
    assert "declares control.accepts ['control.pause'] but its run accepts ['control.cancel']" \
        in caplog.text


def test_only_the_fleet_builds_a_ledger():
    """Structural: outside its own module, ``CommandLedger`` is used in
    shipped code only by ``supervisor/fleet.py``; bridges hand controllers up."""
    users = []
    for path in sorted((ROOT / "bridges").rglob("*.py")) + sorted((ROOT / "supervisor").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if "CommandLedger" in names:
            users.append(path.relative_to(ROOT).as_posix())
    assert users == ["supervisor/fleet.py"]
