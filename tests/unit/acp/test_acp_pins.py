"""Every pin of ``mappings/acp.json`` (``moments``, ``fallback``, the
``deltas_expected`` forks) reproduces exactly through the pure mapping
(``bridges/acp/mapping.py``), read from ``shared/`` at test time. The pins are
at the bridge default posture (capture ``metadata``, ``attention.*`` at
``redacted``, deltas off); the deltas forks pair ``AEP_ACP_DELTAS`` with
capture ``redacted``."""
from __future__ import annotations

import copy

import pytest

from bridges.acp.mapping import Posture, map_moment
from bridges.core import capture
from bridges.core.envelope import Stamper
from tests.support.schema import validate_event
from tests.support.shared import fixture

PINS = fixture("mappings/acp.json")
MOMENTS = PINS["moments"]


def shape(e: dict) -> dict:
    """The pin's view of an emission: ``{type, data, subject?}``."""
    out = {"type": e["type"], "data": e.get("data", {})}
    if "subject" in e:
        out["subject"] = e["subject"]
    return out


@pytest.mark.parametrize("name", sorted(MOMENTS))
def test_moment_pin(name):
    pin = MOMENTS[name]
    got = [shape(e) for e in map_moment(copy.deepcopy(pin["input"]), Posture())]
    assert got == pin["expected"]


@pytest.mark.parametrize("name", sorted(n for n in MOMENTS if "deltas_expected" in MOMENTS[n]))
def test_deltas_fork_pin(name):
    pin = MOMENTS[name]
    posture = Posture(policy=capture.CapturePolicy(ceiling="redacted"), deltas=True)
    got = [shape(e) for e in map_moment(copy.deepcopy(pin["input"]), posture)]
    assert got == pin["deltas_expected"]


def test_fallback_pin():
    pin = PINS["fallback"]
    out = map_moment(copy.deepcopy(pin["input"]), Posture())
    assert [shape(e) for e in out] == pin["expected"]
    assert out[0]["severity"] == "debug"


def test_every_pin_is_covered():
    """No block of the fixture escapes the tests above."""
    assert set(PINS) - {"$comment", "identity", "moments", "fallback"} == set()
    assert len(MOMENTS) >= 20


@pytest.mark.parametrize("name", sorted(MOMENTS))
def test_pin_survives_the_stampers_gate_and_validates(name):
    """The mapping shapes content to the ceiling already: the stamper's gate
    keeps the pinned data as is, and the stamped event is valid AEP."""
    pin = MOMENTS[name]
    policy = capture.CapturePolicy()
    st = Stamper("acp", epoch=1, host="test-host", policy=policy)
    for e, want in zip(map_moment(copy.deepcopy(pin["input"]), Posture(policy=policy)),
                       pin["expected"], strict=True):
        ev = st.stamp("sess_1", e)
        assert ev.get("data", {}) == want["data"], ev
        validate_event(ev)


def test_permission_prompt_at_metadata_is_synthesized():
    """With ``attention.*`` lowered to ``metadata`` the tool title never
    rides: the prompt is built from structure only (AEP-0003 §9.2)."""
    pin = MOMENTS["request_permission"]
    posture = Posture(policy=capture.CapturePolicy(attention="metadata"))
    (e,) = map_moment(copy.deepcopy(pin["input"]), posture)
    assert "sudo" not in e["data"]["prompt"]
    assert e["data"]["prompt"] == capture.synthesize_prompt("acp", "permission", "tc9")
    assert "options" not in e["data"] and "respond_via" not in e["data"]


def test_prompt_content_only_at_redacted_and_up():
    pin = MOMENTS["request_session_prompt"]
    (meta,) = map_moment(copy.deepcopy(pin["input"]), Posture())
    assert "prompt" not in meta["data"]
    red = Posture(policy=capture.CapturePolicy(ceiling="redacted"))
    (e,) = map_moment(copy.deepcopy(pin["input"]), red)
    assert e["data"]["prompt"] == "fix the failing build"
    assert e["data"]["message_digest"] == pin["expected"][0]["data"]["message_digest"]


def test_deltas_at_metadata_carry_no_text():
    pin = MOMENTS["update_agent_chunk"]
    (e,) = map_moment(copy.deepcopy(pin["input"]), Posture(deltas=True))
    assert e["type"] == "x.acp.agent.message.chunk" and e["data"] == {}
