"""Test support for the OTLP inbound bridge: building an
:class:`~bridges.otlp_in.OtlpInBridge` the way a test reads best (listeners
as the strings an operator writes, ``"127.0.0.1:0"``, ``"off"``, through the
bridge's own parser), a real ``BridgeContext`` over a memory channel (what
the fleet hands a bridge), and draining that channel."""
from __future__ import annotations

import logging
from typing import Any

import trio

from bridges.core.bridge import BridgeContext, BridgeHealth, Outbound
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.otlp_in import OtlpConfig, OtlpInBridge
from bridges.otlp_in.config import DEFAULT_MAX_BODY, parse_listen


def otlp_bridge(*, grpc: str = "127.0.0.1:0", http: str = "127.0.0.1:0", vendor: str = "codex",
                primary: bool = False, max_body: int = DEFAULT_MAX_BODY,
                **kw: Any) -> OtlpInBridge:
    """One profile on ``grpc`` / ``http`` (``host:port`` or ``off``);
    ``kw``: :class:`OtlpInBridge` keywords (``emit_grace``, ``policy``...)."""
    cfg = OtlpConfig(vendor, parse_listen(grpc), parse_listen(http), primary, max_body)
    return OtlpInBridge(cfg, **kw)


def bridge_context(name: str, agent: str, *, channel: int = 1000,
                   policy: CapturePolicy | None = None, epoch: int = 3
                   ) -> tuple[BridgeContext, trio.MemoryReceiveChannel[Outbound]]:
    """A ``BridgeContext`` stamping as ``agent`` on host ``test-host`` onto a
    relay channel of ``channel`` slots, and that channel's receiving end."""
    send, recv = trio.open_memory_channel[Outbound](channel)
    _, commands = trio.open_memory_channel[dict[str, Any]](0)
    stamper = Stamper(agent, epoch=epoch, host="test-host", policy=policy or CapturePolicy())
    return (BridgeContext(name, stamper, send, commands, BridgeHealth(),
                          logging.getLogger("test.otlp")), recv)


def drain(recv: trio.MemoryReceiveChannel[Outbound]) -> list[dict[str, Any]]:
    """Every envelope on the channel now (without waiting)."""
    out = []
    while True:
        try:
            out.append(recv.receive_nowait().event)
        except trio.WouldBlock:
            return out


def checked_claim(emission: Any, policy: CapturePolicy) -> Any:
    """``emission`` as it would be without a ``plain`` claim in its
    ``gating`` (:class:`bridges.core.bridge.Gating`), after asserting the
    claim holds: the data a dict of exact JSON scalars that the gate of its
    type at ``policy``'s ceiling for it keeps as it is, at ``metadata``. An
    emission without the claim is returned as it is."""
    from bridges.core.capture import declares, gate_plan
    hints = emission.get("gating") or {}
    if "plain" not in hints:
        return emission
    assert hints["plain"] is True and set(hints) == {"levels", "plain"}, hints
    data = emission.get("data")
    assert isinstance(data, dict) and all(type(k) is str for k in data), emission
    assert all(type(v) in (str, int, float, bool) for v in data.values()), data
    assert not declares(hints["levels"], data), (data, hints["levels"])
    g = gate_plan(emission["type"], policy.ceiling_for(emission["type"]))
    if data and g.takes_plain:
        assert g.gate(data, policy, levels=hints["levels"]) == (data, "metadata")
    return {**emission, "gating": {"levels": hints["levels"]}}
