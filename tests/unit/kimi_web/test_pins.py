"""Every ``ws_modes`` pin of ``mappings/kimi-code.json`` reproduces exactly
through :mod:`bridges.kimi_web.mapping`, in both modes, read from
``shared/`` at test time (the adapter default posture: capture
``metadata``, ``attention.*`` at ``redacted``)."""
from __future__ import annotations

import pytest

from bridges.core import capture
from bridges.core.posture import Posture
from bridges.kimi_web.mapping import AGENT, map_frame
from tests.support.shared import fixture


def modes() -> dict:
    return fixture("mappings/kimi-code.json")["ws_modes"]["modes"]


def shape(e: dict) -> dict:
    out = {"type": e["type"], "data": e.get("data", {})}
    if "subject" in e:
        out["subject"] = e["subject"]
    return out


def one(out: list[dict]) -> dict | None:
    assert len(out) <= 1, out
    return shape(out[0]) if out else None


NAMES = [n for n in modes() if not n.startswith("$")]


def test_every_pin_is_here():
    assert len(NAMES) == 15 and "tool_result" in NAMES and "bus_echo_permission" in NAMES


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["companion", "primary"])
def test_ws_mode_pin(name, mode):
    pin = modes()[name]
    out = map_frame(pin["input"], Posture(agent=AGENT, mode=mode))
    assert one(out) == pin[mode]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["companion", "primary"])
def test_pin_survives_the_stampers_gate(name, mode):
    """The emitter-side gate the stamper runs leaves the pinned data as is."""
    pin = modes()[name]
    policy = capture.CapturePolicy()
    for e in map_frame(pin["input"], Posture(agent=AGENT, mode=mode, policy=policy)):
        hints = e.get("gating") or {}
        data, _ = capture.gate(e["type"], e.get("data"), policy.ceiling_for(e["type"]), policy,
                               agent="kimi-code", subject=e.get("subject"),
                               form_fields=hints.get("form_fields"))
        assert (data or {}) == pin[mode]["data"]
