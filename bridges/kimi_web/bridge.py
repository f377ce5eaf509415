"""The Kimi web bridge (:class:`bridges.core.bridge.Bridge`): one emitter
identity (agent ``kimi-code``) for the ``kimi web`` found under
``KIMI_CODE_HOME`` (or ``AEP_KIMI_WEB_URL``).

The bridge object holds only its frozen configuration; everything a run
needs (tracker, receiver, control handler) is built by :meth:`run` in a
per-run :class:`KimiWebRun` and dies with it, so a supervisor restart starts
clean (the cursors survive in the state file, not on this object).

Read-only by default: the receiver's socket only ever sends
``client_hello``, ``subscribe`` and ``pong``, and its REST calls are GETs.
Gated off, ``hello`` declares ``control: {accepts: []}``, the run has no
:class:`bridges.core.control.Controller`, and every command routed here is
nacked ``unsupported`` by a ledger that has no write. Gated on, the run's
controller is :class:`bridges.kimi_web.control.KimiWebControl`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from bridges.core import capture as _capture
from bridges.core.bridge import Bridge, BridgeContext, BridgeRun, Capabilities
from bridges.core.capture import CapturePolicy
from bridges.core.posture import Posture
from bridges.core.settings import Address

from . import control as _control
from .config import KimiWebConfig
from .receiver import Receiver
from .tracker import Tracker

log = logging.getLogger("aep.bridge.kimi_web")

PRIMARY_EMITS = ("run", "tool", "attention", "control")


@dataclass(kw_only=True)
class KimiWebRun(BridgeRun):
    """Everything one run owns (the per-run handle ``run()`` hands the
    fleet): the ``tracker`` (mapping state, persisted by the receiver), the
    ``receiver`` (discovery, the socket, REST reads) and the ``controller``
    (a :class:`~bridges.kimi_web.control.KimiWebControl`, or ``None``)."""

    tracker: Tracker
    receiver: Receiver


class KimiWebBridge:
    """See the module docstring. ``problems``: configuration problems found
    by :func:`bridges.kimi_web.config.from_env` (reported by :meth:`preflight`)."""

    name = "kimi_web"

    def __init__(self, config: KimiWebConfig, policy: CapturePolicy | None = None, *,
                 problems: list[str] | None = None) -> None:
        self.config = config
        self.policy = policy or CapturePolicy()
        self.agent = config.agent
        self._problems = list(problems or [])

    @property
    def control_open(self) -> bool:
        return self.config.control_open

    def capabilities(self) -> Capabilities:
        ns = "x.kimi-code"
        emits = [*PRIMARY_EMITS, ns] if self.config.primary else ["control", ns]
        return {"emits": emits,
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1]),
                "control": {"accepts": list(_control.ACCEPTS) if self.control_open else [],
                            "ack_window_ms": _control.ACK_WINDOW_MS}}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        return list(self._problems)

    def listeners(self) -> dict[str, Address | None]:
        """None: the bridge only dials out (the kimi web socket and REST)."""
        return {}

    def new_run(self, ctx: BridgeContext) -> KimiWebRun:
        """The per-run objects (tests drive them directly)."""
        posture = Posture(agent=self.agent, mode="primary" if self.config.primary else "companion",
                          policy=self.policy)
        tracker = Tracker(posture, answerable=self.control_open)
        receiver = Receiver(self.config, tracker, ctx)
        ctl = _control.KimiWebControl(receiver, guard_ms=self.config.guard_ms) \
            if self.control_open else None
        return KimiWebRun(controller=ctl, tracker=tracker, receiver=receiver)

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[KimiWebRun] = trio.TASK_STATUS_IGNORED) -> None:
        """Build this run's state, attach and follow until cancelled, and
        hand the run to the fleet once started."""
        run = self.new_run(ctx)
        async with trio.open_nursery() as nursery:
            await nursery.start(run.receiver.run)
            task_status.started(run)


if TYPE_CHECKING:  # mypy holds the class to the fleet's contract
    _conforms: type[Bridge] = KimiWebBridge
