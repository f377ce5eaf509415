"""Vendor fallback type naming (AEP-0001 §6; the design records' rules)
against the mapping pins read from shared/ at test time, and the grammar
property for any input."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.naming import (
    MAX_NAME,
    MAX_SEGMENT,
    MAX_SEGMENTS,
    TYPE_GRAMMAR,
    dotted_type,
    fallback_type,
    kind_type,
    path_type,
    snake,
    token,
    vendor_token,
)
from tests.support.schema import event_problems
from tests.support.shared import aep_dir, fixture, pin_entries

# The envelope's own pattern, read from the schema (not copied).
_ENVELOPE = json.loads((aep_dir() / "schemas/aep-event.schema.json").read_text())
ENVELOPE_TYPE = re.compile(_ENVELOPE["properties"]["type"]["pattern"])


def _expected_types(entry: dict) -> list[str]:
    out = []
    for k, v in entry.items():
        if k == "input" or not ("expected" in k or k in ("companion", "primary")):
            continue
        for e in v if isinstance(v, list) else [v]:
            if isinstance(e, dict) and str(e.get("type", "")).startswith("x."):
                out.append(e["type"])
    return out


# ---------------------------------------------------------------- the pins


def _openhands_cases():
    d = fixture("mappings/openhands.json")
    for path, e in pin_entries(d):
        for t in _expected_types(e):
            yield pytest.param(e["input"]["kind"], t, id=path)


@pytest.mark.parametrize("kind, expected", list(_openhands_cases()))
def test_openhands_kind_naming(kind, expected):
    # docs/bridge-openhands-design.md: snake, drop _event, split at the last
    # underscore, .event for single segments.
    assert kind_type("openhands", kind) == expected


def _agui_cases():
    d = fixture("mappings/agui.json")
    for path, e in pin_entries(d):
        kind = e["input"].get("type")
        for t in _expected_types(e):
            if kind == "THINKING_START":
                continue  # a deprecated alias mapped by name, not mechanically
            yield pytest.param(kind, t, id=path)


@pytest.mark.parametrize("kind, expected", list(_agui_cases()))
def test_agui_type_naming(kind, expected):
    assert kind_type("agui", kind, drop_event_suffix=False) == expected


def _acp_cases():
    d = fixture("mappings/acp.json")
    for path, e in pin_entries(d):
        inp = e["input"]
        update = (inp.get("params") or {}).get("update") if isinstance(inp.get("params"), dict) \
            else None
        name = update["sessionUpdate"] if isinstance(update, dict) else inp.get("method")
        for t in _expected_types(e):
            if t in ("x.acp.tool_call.update", "x.acp.plan.updated", "x.acp.usage.updated"):
                continue  # hand-named in the record, not the mechanical fallback
            yield pytest.param(name, t, id=path)


@pytest.mark.parametrize("name, expected", list(_acp_cases()))
def test_acp_method_naming(name, expected):
    assert path_type("acp", name) == expected


def _bus_cases():
    for vendor in ("opencode", "kilocode"):
        d = fixture(f"mappings/{vendor}.json")
        e = d["fallback"]
        for t in _expected_types(e):
            yield pytest.param(vendor, e["input"]["event"]["type"], t, id=f"{vendor}/fallback")


@pytest.mark.parametrize("vendor, bus_type, expected", list(_bus_cases()))
def test_sse_bus_fallback_naming(vendor, bus_type, expected):
    assert dotted_type(vendor, bus_type) == expected


def _kimi_cases():
    d = fixture("mappings/kimi-code.json")
    e = d["fallback"]
    yield pytest.param("hook", e["input"]["hook_event_name"], _expected_types(e)[0],
                       id="hooks/fallback")
    for path, e in pin_entries(d["ws_modes"], "ws_modes"):
        for t in _expected_types(e):
            yield pytest.param("web", e["input"]["type"], t, id=path)


@pytest.mark.parametrize("channel, name, expected", list(_kimi_cases()))
def test_kimi_naming(channel, name, expected):
    if channel == "hook":  # x.kimi-code.session.{snake_case}
        assert fallback_type("kimi-code", "session", snake(name)) == expected
    else:
        assert dotted_type("kimi-code", name, prefix="web") == expected


def test_otlp_channel_naming():
    # docs/bridge-otlp-inbound-design.md: x.codex.otel.{snake_of_event_name}
    pins = fixture("mappings/codex-otel.json")["records"]
    for entry in pins.values():
        t = entry["companion"]["type"] if isinstance(entry["companion"], dict) \
            else entry["companion"][0]["type"]
        leaf = entry["input"]["attributes"]["event.name"].split(".", 1)[1]
        assert fallback_type("codex", "otel", leaf) == t


def test_pin_corpus_is_not_empty():
    assert len(list(_openhands_cases())) >= 10
    assert len(list(_acp_cases())) >= 5
    assert len(list(_agui_cases())) >= 7


# ---------------------------------------------------------------- the helpers


@pytest.mark.parametrize("name, expected", [
    ("ACPToolCallEvent", "acp_tool_call_event"),
    ("SandboxCheckpointEvent", "sandbox_checkpoint_event"),
    ("TEXT_MESSAGE_CONTENT", "text_message_content"),
    ("something-new", "something_new"),
    ("codex.sse_event", "codex_sse_event"),
    ("HTTPServer2Start", "http_server2_start"),
    ("  Réponse  Reçue ", "reponse_recue"),
    ("__", ""),
])
def test_snake(name, expected):
    assert snake(name) == expected


def test_token_and_vendor_token_defaults():
    assert token("!!!") == "unknown"
    assert token("x" * 200) == "x" * 64
    assert vendor_token("Kimi Code") == "kimi-code"
    assert vendor_token("kilo.ai") == "kilo-ai"
    assert vendor_token("***") == "vendor"


@pytest.mark.parametrize("args, expected", [
    (("acp", "initialize", ""), "x.acp.initialize.event"),
    (("acp", "", ""), "x.acp.unknown.event"),
    (("Open Hands", "Message", "Event"), "x.open-hands.message.event"),
    (("codex", "otel", "some.new.Thing"), "x.codex.otel.some.new.thing"),
    (("v", "a..b", ".c."), "x.v.a.b.c"),
])
def test_fallback_type(args, expected):
    assert fallback_type(*args) == expected


def test_fallbacks_never_enter_the_vendor_command_namespace():
    assert kind_type("openhands", "ControlStateEvent") == "x.openhands.vendor_control.state"
    assert dotted_type("opencode", "control.changed") == "x.opencode.vendor_control.changed"
    assert path_type("acp", "control") == "x.acp.vendor_control.event"


def test_event_suffix_alone_is_not_dropped_to_nothing():
    assert kind_type("openhands", "Event") == "x.openhands.event.event"
    assert kind_type("openhands", "") == "x.openhands.unknown.event"


# ---------------------------------------------------------------- the grammar, for any input


_names = st.one_of(st.text(max_size=40), st.from_regex(r"[A-Za-z_./ -]{0,30}", fullmatch=True),
                   st.sampled_from(["control", "Control.x", "CONTROL_EVENT", "ControlEvent",
                                    "session/control", "", "Event", "_event"]))


@settings(max_examples=500, deadline=None)
@given(vendor=_names, family=_names, leaf=_names, name=_names)
def test_every_helper_produces_a_grammatical_type(vendor, family, leaf, name):
    for t in (fallback_type(vendor, family, leaf), kind_type(vendor, name),
              kind_type(vendor, name, drop_event_suffix=False), path_type(vendor, name),
              dotted_type(vendor, name), dotted_type(vendor, name, prefix=family)):
        assert TYPE_GRAMMAR.match(t), t
        assert ENVELOPE_TYPE.match(t), t
        # An emitted (sequenced) vendor fact: never the x.{vendor}.control.*
        # command namespace, where the envelope forbids seq.
        ev = {"aep": "0.1", "id": "1", "type": t, "time": "2026-07-03T10:00:00Z",
              "source": "aep://h/agent/a/session/s", "agent": "a", "session": "s", "seq": 0}
        assert event_problems(ev) == []


@settings(max_examples=200, deadline=None)
@given(vendor=_names, family=_names, leaf=_names)
def test_fallback_is_stable_on_already_legal_input(vendor, family, leaf):
    t = fallback_type(vendor, family, leaf)
    _, v, *rest = t.split(".")
    assert fallback_type(v, rest[0], ".".join(rest[1:])) == t


# the former acronym rule, the reference the linear one must equal
_BACKTRACKING_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")


def _snake_reference(name: str) -> str:
    import unicodedata
    s = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    s = _BACKTRACKING_ACRONYM.sub(r"\1_\2", s)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


@settings(max_examples=2000)
@given(st.text(alphabet="ABCXabcx019_.- É", max_size=60))
def test_snake_equals_the_backtracking_rule_it_replaced(name):
    assert snake(name) == _snake_reference(name)


def test_a_long_run_of_capitals_is_linear():
    """Outside review of issue 25: ``"A" * 1_000_000`` as a hook's
    ``hook_event_name`` held the event loop for minutes (the acronym rule
    backtracked quadratically: 16,000 capitals took 4.9 s, 32,000 took
    23.8 s). Linear now: a million capitals map at once (a run of the old
    rule on this input would take hours, so this call would not return)."""
    assert token("A" * 1_000_000) == "a" * 64
    assert token("A" * 500_000 + "Bc") == "a" * 64


@pytest.mark.parametrize("name", ["." * 4_190_000, "aA" * 1_000_000, "a." * 1_000_000, "!." * 1_000_000])
def test_a_huge_vendor_name_is_read_only_as_far_as_a_type_can_reach(name):
    """Outside review of issue 25: a hook whose ``hook_event_name`` was 4 MB
    of dots held the event loop 17 s while it became
    ``x.claude-code.session.event`` (every segment split and sanitized); a
    name is cut to MAX_NAME characters first: more than a whole type's 780
    (MAX_SEGMENTS segments of MAX_SEGMENT), so only a hostile name's tail
    is lost."""
    t = fallback_type("claude-code", "session", name)
    assert TYPE_GRAMMAR.match(t) and t == fallback_type("claude-code", "session", name[:MAX_NAME])
    assert MAX_NAME >= MAX_SEGMENTS * (MAX_SEGMENT + 1)
