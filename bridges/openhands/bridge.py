"""The OpenHands bridge (:class:`bridges.core.bridge.Bridge`): one emitter
identity per agent server.

Design record: ``shared/aep/docs/bridge-openhands-design.md``. Read-only by
default: the receiver's REST client can only GET and the events socket only
ever carries the auth frame. With the gate open (``AEP_TOKEN`` set AND
``AEP_OPENHANDS_CONTROL=1``) :class:`bridges.openhands.control.OpenHandsControl`
adds the five enumerated REST writes; gated off, ``hello`` declares
``control: {accepts: []}``, every command routed here anyway is nacked
``unsupported`` by the ledger (which is given no write callback), and no
write exists to be made.
"""
from __future__ import annotations

import logging
from typing import Any

import trio

from bridges.core import capture as _capture
from bridges.core.capture import CapturePolicy
from bridges.core.ledger import CommandLedger

from . import control as _control
from .mapping import Posture
from .receiver import ReadOnlyRest, Receiver, Settings, rest_client

log = logging.getLogger("aep.bridge.openhands")

EMITS = ["session", "run", "tool", "attention", "error", "state", "control", "x.openhands"]


class OpenHandsBridge:
    """See the module docstring. ``problems``: configuration problems found
    by :func:`bridges.openhands.from_env` (reported by :meth:`preflight`)."""

    name = "openhands"

    def __init__(self, settings: Settings, policy: CapturePolicy, *, token: str | None = None,
                 problems: list[str] | None = None) -> None:
        self.settings = settings
        self.policy = policy
        self.agent = settings.agent
        self.token = token
        self._problems = list(problems or [])
        self.receiver: Receiver | None = None

    @property
    def control_open(self) -> bool:
        """The gate: both the operator's opt-in and a token (control is
        refused on unauthenticated bindings, AEP-0004 §4.1)."""
        return bool(self.settings.control and self.token)

    def capabilities(self) -> dict[str, Any]:
        accepts = list(_control.ACCEPTS) if self.control_open else []
        return {"emits": list(EMITS),
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1]),
                "control": {"accepts": accepts, "ack_window_ms": _control.ACK_WINDOW_MS}}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        return list(self._problems)

    async def run(self, ctx: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        ctx.health.control = self.control_open
        posture = Posture(self.policy, deltas=self.settings.deltas)
        async with rest_client(self.settings) as client:
            decorate = _control.decorate if self.control_open else None
            receiver = Receiver(self.settings, posture, ctx, ReadOnlyRest(client), decorate=decorate)
            self.receiver = receiver
            async with trio.open_nursery() as nursery:
                if self.control_open:
                    nursery.start_soon(_control.OpenHandsControl(self.settings, receiver).serve, ctx)
                else:
                    nursery.start_soon(_refuse_all, ctx)
                await nursery.start(receiver.run)
                task_status.started()


async def _refuse_all(ctx: Any) -> None:
    """Gated off: the ledger answers every command ``unsupported``; it has
    no ``write`` and this bridge has no write path at all."""
    async with CommandLedger(ctx, (), ack_window_ms=_control.ACK_WINDOW_MS) as ledger:
        await ledger.serve(ctx.commands)
