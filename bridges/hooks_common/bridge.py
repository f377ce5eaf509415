"""The one hook bridge (:class:`bridges.core.bridge.Bridge`), configured by a
:class:`~bridges.hooks_common.profile.HookProfile`: mounts ``POST
/hooks/<agent>`` on the daemon's listener for the length of its run, sweeps
the shims' spool, and hands the fleet its controller when a gate is open.

The bridge object holds only its frozen configuration; the run's
:class:`HookHub` (sessions, asks, queues, dedupe memory) is built by
:meth:`HookBridge.run` and dies with it. The one thing a run passes to the
next is the state file of its open runs and tool calls
(``{AEP_STATE_DIR}/<bridge>/runs.json``, :mod:`.runs`): read back before the
spool is swept, so a turn open across a restart is closed by its own
``Stop``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from bridges.core import capture as _capture
from bridges.core.bridge import Bridge, BridgeContext, BridgeRun, Capabilities
from bridges.core.capture import CapturePolicy
from bridges.core.settings import Address

from . import control as _control
from . import runs as _runs
from . import spool as _spool
from .config import HookConfig
from .endpoint import HookEndpoint
from .hub import HookHub
from .hub import now_ms as _now_ms
from .profile import HookProfile

__all__ = ["EMITS", "HookBridge", "HookRun"]

EMITS = ("session", "run", "tool", "attention", "delegation", "progress", "agent", "control")


@dataclass(kw_only=True)
class HookRun(BridgeRun):
    """The per-run handle: the run's :class:`HookHub` (and the controller)."""

    hub: HookHub


class HookBridge:
    """See the module docstring. ``problems``: configuration problems (one
    line each, reported by :meth:`preflight`)."""

    def __init__(self, profile: HookProfile, config: HookConfig,
                 policy: CapturePolicy | None = None, *, problems: list[str] | None = None,
                 spool_interval_s: float = _spool.INTERVAL_S,
                 restored_idle_s: float = _runs.RESTORED_IDLE_S) -> None:
        self.profile = profile
        self.config = config
        self.policy = policy or CapturePolicy()
        self.name = profile.key
        self.agent = profile.agent
        self.path = f"/hooks/{profile.agent}"
        self.spool_interval_s = spool_interval_s
        self.restored_idle_s = restored_idle_s
        self._problems = list(problems or [])

    @property
    def accepts(self) -> tuple[str, ...]:
        """The command types the open gates accept (``()``: none)."""
        return _control.accepts(self.agent, respond=self.config.control_open,
                                instruct=self.config.instruct_open)

    def capabilities(self) -> Capabilities:
        """The ``hello`` block: the core families and ``x.<agent>``, and
        ``control.accepts`` as :attr:`accepts`."""
        return {"emits": [*EMITS, f"x.{self.agent}"],
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1]),
                "control": {"accepts": list(self.accepts),
                            "ack_window_ms": _control.ACK_WINDOW_MS}}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        """The configuration's problem lines (no port of its own to check)."""
        return list(self._problems)

    def listeners(self) -> dict[str, Address | None]:
        """No listener of its own: hooks come in on ``AEP_LISTEN``."""
        return {}

    def new_run(self, ctx: BridgeContext) -> HookRun:
        """The per-run objects (tests drive them directly)."""
        hub = HookHub(self.profile, self.config, ctx,
                      state=_runs.state_file(self.config.state_dir, self.name),
                      idle_s=self.restored_idle_s)
        ctl = _control.HookControl(hub, respond=self.config.control_open,
                                   instruct=self.config.instruct_open) if self.accepts else None
        return HookRun(controller=ctl, hub=hub)

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[HookRun] = trio.TASK_STATUS_IGNORED) -> None:
        """Mount the endpoint, sweep the spool, serve until cancelled.
        Raises ``RuntimeError`` without a daemon listener (``ctx.mounts``)."""
        if ctx.mounts is None:
            raise RuntimeError(f"the {self.name} bridge needs the daemon's listener (ctx.mounts)")
        run = self.new_run(ctx)
        run.hub.runs.restore(_now_ms())  # before any moment, live or spooled
        with ctx.mounts.mount(self.path, HookEndpoint(run.hub)):
            ctx.health.source = True
            ctx.health.control = bool(self.accepts)
            gated = ", ".join(self.config.gate_tools) or "none"
            ctx.log.info("%s: hooks come in at POST %s on the daemon listener (control %s, "
                         "PreToolUse gate: %s, steering %s)", self.name, self.path,
                         "on" if self.config.control_open else "off", gated,
                         "on" if self.config.instruct_open else "off")
            try:
                async with trio.open_nursery() as nursery:
                    if run.hub.runs.state.path is not None:
                        nursery.start_soon(run.hub.runs.state.compactor)
                    nursery.start_soon(_sweep_runs, run.hub, self.spool_interval_s)
                    spool = self.config.spool_dir
                    if isinstance(spool, Path):
                        nursery.start_soon(_spool.serve, run.hub, spool, self.spool_interval_s)
                    task_status.started(run)
                    await trio.sleep_forever()
            finally:
                ctx.health.source = False
                run.hub.release()


async def _sweep_runs(hub: HookHub, interval_s: float) -> None:
    """Close restored runs left idle (:meth:`.runs.RunBook.sweep`) and time
    out the asks whose hook hung up (:meth:`.hub.HookHub.expire`), every
    ``interval_s`` seconds until cancelled."""
    while True:
        await trio.sleep(interval_s)
        await hub.runs.sweep(_now_ms())
        await hub.expire()


if TYPE_CHECKING:  # mypy holds the class to the fleet's contract
    _conforms: type[Bridge] = HookBridge
