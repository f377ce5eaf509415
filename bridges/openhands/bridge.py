"""The OpenHands bridge (:class:`bridges.core.bridge.Bridge`): one emitter
identity per agent server.

Design record: ``shared/aep/docs/bridge-openhands-design.md``. Read-only by
default: the receiver's REST client can only GET and the events socket only
ever carries the auth frame. With the gate open (``AEP_TOKEN`` set AND
``AEP_OPENHANDS_CONTROL=1``) each run builds an
:class:`bridges.openhands.control.OpenHandsControl` (the five enumerated
REST writes) and hands it to the fleet in its :class:`OpenHandsRun`; gated
off, ``hello`` declares ``control: {accepts: []}``, the run carries no
controller, every command routed here anyway is nacked ``unsupported`` by
the fleet's ledger, and no write exists to be made.
"""
from __future__ import annotations

import contextlib
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
from .config import OpenHandsConfig
from .receiver import ReadOnlyRest, Receiver, rest_client

log = logging.getLogger("aep.bridge.openhands")

EMITS = ["session", "run", "tool", "attention", "error", "state", "control", "x.openhands"]


@dataclass(kw_only=True)
class OpenHandsRun(BridgeRun):
    """Everything one run owns (the per-run handle ``run()`` hands the
    fleet): the ``receiver`` (discovery, sockets, per-conversation state,
    persisted under ``AEP_STATE_DIR``) and the ``controller`` (an
    :class:`~bridges.openhands.control.OpenHandsControl`, or ``None``)."""

    receiver: Receiver


class OpenHandsBridge:
    """See the module docstring. ``config``: :mod:`bridges.openhands.config`;
    ``problems``: its configuration problems (reported by :meth:`preflight`)."""

    name = "openhands"

    def __init__(self, config: OpenHandsConfig, policy: CapturePolicy, *,
                 problems: list[str] | None = None) -> None:
        self.config = config
        self.settings = config  # the receiver's name for it
        self.policy = policy
        self.agent = config.agent
        self._problems = list(problems or [])

    @property
    def control_open(self) -> bool:
        """The gate: both the operator's opt-in and a token (control is
        refused on unauthenticated bindings, AEP-0004 §4.1)."""
        return self.config.control_open

    def capabilities(self) -> Capabilities:
        accepts = list(_control.ACCEPTS) if self.control_open else []
        return {"emits": list(EMITS),
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1]),
                "control": {"accepts": accepts, "ack_window_ms": _control.ACK_WINDOW_MS}}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        return list(self._problems)

    def listeners(self) -> dict[str, Address | None]:
        """None: the bridge only dials out (the agent server's REST and sockets)."""
        return {}

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[OpenHandsRun] = trio.TASK_STATUS_IGNORED) -> None:
        """Build this run's receiver (and controller), run discovery until
        cancelled, and hand the run to the fleet once started."""
        posture = Posture(agent=self.agent, mode="primary", policy=self.policy,
                          deltas=self.config.deltas)
        async with rest_client(self.config) as client, contextlib.AsyncExitStack() as stack:
            decorate = _control.decorate if self.control_open else None
            receiver = Receiver(self.config, posture, ctx, ReadOnlyRest(client), decorate=decorate)
            run = OpenHandsRun(receiver=receiver)
            if self.control_open:
                writes = await stack.enter_async_context(
                    rest_client(self.config, timeout=_control.WRITE_TIMEOUT))
                run.controller = _control.OpenHandsControl(self.config, receiver, client=writes)
            async with trio.open_nursery() as nursery:
                await nursery.start(receiver.run)
                task_status.started(run)


if TYPE_CHECKING:  # mypy holds the class to the fleet's contract
    _conforms: type[Bridge] = OpenHandsBridge
