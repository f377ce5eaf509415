"""Every pin of ``mappings/opencode.json`` and ``mappings/kilocode.json``
(``moments``, ``todos``, ``fallback``, ``sse_modes``) reproduces exactly
through the one pure mapping (``bridges/sse_common/mapping.py``), read from
``shared/`` at test time. The pins are at the adapter default posture
(capture ``metadata``, ``attention.*`` at ``redacted``)."""
from __future__ import annotations

import pytest

from bridges.core import capture
from bridges.core.posture import Posture
from bridges.kilocode_sse import PROFILE as KILO
from bridges.opencode_sse import PROFILE as OPENCODE
from bridges.sse_common.mapping import diff_todos, map_moment
from tests.support.shared import fixture

PROFILES = {"opencode": OPENCODE, "kilocode": KILO}


def pins(vendor: str) -> dict:
    return fixture(PROFILES[vendor].pins)


def shape(e: dict) -> dict:
    """The pin's shape of an emission: ``{type, data, subject?}`` (severity
    and gating hints are envelope matters the pins do not carry)."""
    out = {"type": e["type"], "data": e.get("data", {})}
    if "subject" in e:
        out["subject"] = e["subject"]
    return out


def one(out: list[dict]) -> dict | None:
    assert len(out) <= 1, out
    return shape(out[0]) if out else None


def cases(block: str):
    for vendor in PROFILES:
        for name in pins(vendor)[block]:
            if not name.startswith("$"):
                yield pytest.param(vendor, name, id=f"{vendor}-{name}")


def test_profiles_point_at_their_pins():
    assert pins("opencode")["fallback"]["expected"]["type"].startswith("x.opencode.")
    assert pins("kilocode")["fallback"]["expected"]["type"].startswith("x.kilocode.")
    assert OPENCODE.agent == "opencode" and KILO.agent == "kilocode"


@pytest.mark.parametrize("vendor,name", list(cases("moments")))
def test_moment_pin(vendor, name):
    pin = pins(vendor)["moments"][name]
    out = map_moment(pin["input"], Posture(agent=PROFILES[vendor].agent, mode="adapter"))
    assert one(out) == pin["expected"]


@pytest.mark.parametrize("vendor,name", list(cases("moments")))
def test_moment_pin_survives_the_stampers_gate(vendor, name):
    """The mapping already shapes content to the ceiling: the emitter-side
    gate (``capture.gate``, run by the stamper) leaves the pinned data as is."""
    pin = pins(vendor)["moments"][name]
    policy = capture.CapturePolicy()
    for e in map_moment(pin["input"], Posture(agent=PROFILES[vendor].agent, mode="adapter", policy=policy)):
        hints = e.get("gating") or {}
        data, _ = capture.gate(e["type"], e.get("data"), policy.ceiling_for(e["type"]), policy,
                               agent=PROFILES[vendor].agent, subject=e.get("subject"),
                               structural=hints.get("structural") or ())
        assert (data or {}) == pin["expected"]["data"]


@pytest.mark.parametrize("vendor", list(PROFILES))
def test_todos_pin(vendor):
    pin = pins(vendor)["todos"]
    for mode in ("adapter", "primary"):
        out = diff_todos(pin["input"]["prev"], pin["input"]["next"],
                         Posture(agent=PROFILES[vendor].agent, mode=mode))
        assert [shape(e) for e in out] == pin["expected"]


@pytest.mark.parametrize("vendor", list(PROFILES))
@pytest.mark.parametrize("mode", ["adapter", "companion", "primary"])
def test_fallback_pin(vendor, mode):
    pin = pins(vendor)["fallback"]
    out = map_moment(pin["input"], Posture(agent=PROFILES[vendor].agent, mode=mode))
    assert one(out) == pin["expected"]
    assert out[0]["severity"] == "debug"


def sse_cases():
    for vendor in PROFILES:
        for name in pins(vendor)["sse_modes"]["modes"]:
            for mode in ("companion", "primary"):
                yield pytest.param(vendor, name, mode, id=f"{vendor}-{name}-{mode}")


@pytest.mark.parametrize("vendor,name,mode", list(sse_cases()))
def test_sse_mode_pin(vendor, name, mode):
    p = pins(vendor)
    expected = p["sse_modes"]["modes"][name][mode]
    out = map_moment(p["moments"][name]["input"], Posture(agent=PROFILES[vendor].agent, mode=mode))
    assert one(out) == expected


@pytest.mark.parametrize("vendor", list(PROFILES))
def test_companion_emits_no_core_type(vendor):
    """sse_modes $comment: companion emits ONLY the x.{agent}.* family."""
    p = pins(vendor)
    posture = Posture(agent=PROFILES[vendor].agent, mode="companion")
    for name, m in p["moments"].items():
        if m["input"]["kind"] != "bus":
            continue
        for e in map_moment(m["input"], posture):
            assert e["type"].startswith(f"x.{PROFILES[vendor].agent}."), (name, e)


@pytest.mark.parametrize("vendor", list(PROFILES))
def test_primary_asks_carry_no_answer_affordance(vendor):
    """The read-only-channel rule: primary without the gate sheds options and
    respond_via from every mapped ask; a form keeps its fields."""
    p = pins(vendor)
    posture = Posture(agent=PROFILES[vendor].agent, mode="primary")
    seen = 0
    for name, m in p["moments"].items():
        if m["input"]["kind"] != "bus":
            continue
        for e in map_moment(m["input"], posture):
            if e["type"] == "attention.requested":
                seen += 1
                assert "options" not in e["data"] and "respond_via" not in e["data"], name
    assert seen >= 1
