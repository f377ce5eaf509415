"""The capture gate's fast paths (issue 11) held equal to the slow paths
they skip: a registered type's hint-free payload walked by its compiled
per-node, per-ceiling plan (``capture._Compiled`` / ``capture._Run``)
against the member-by-member ``capture._Gate`` pass; :func:`gate` (through
:func:`capture.gate_plan`) against the reference gate (the full pass for
every registered type); ``capture._copy`` (scalars shared without a call)
against the plain recursive copy. Compared by value, by key order (the
JSON bytes) and by the level honored."""
from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridges.core import captable as ct
from bridges.core import capture
from bridges.core.capture import LEVELS, CapturePolicy, gate, gate_plan
from tests.support.schema import type_schema
from tests.unit.core.test_capture_gating import _json_for, _keys_for, _leaf, _sample

POLICIES = (CapturePolicy(), CapturePolicy(home="/home/alice", secret_values=("abc123xyz",)),
            CapturePolicy(pii=False))
TYPES = sorted(ct.TABLE)


def _ref_copy(v):
    """``capture._copy`` as it was: every level rebuilt by recursion."""
    if isinstance(v, dict):
        return {k: _ref_copy(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_ref_copy(x) for x in v]
    return v


def _full_pass(type_, data, ceiling, policy, agent, subject, form_fields=None, levels=None,
               structural=()):
    """The reference gate: ``gate()`` before its plans, the ``_Gate`` pass
    for every registered type (and for every vendor type with ``levels``)."""
    capture.rank(ceiling)
    if ceiling == "none":
        return None, "none"
    if not isinstance(data, dict) or not data:
        return None, "metadata"
    node = ct.node_for(type_)
    if node is None and levels is None:
        return _ref_copy(data), ceiling
    g = capture._Gate(ceiling, policy, agent=agent, subject=subject, form_fields=form_fields,
                      levels=levels, structural=frozenset(structural or ()), derive=True)
    out = g.obj(node, data, "")
    return (out or None), (g.honored if out else "metadata")


def _same(a, b) -> bool:
    return a == b and json.dumps(a) == json.dumps(b)


@st.composite
def _payload(draw, types=TYPES):
    type_ = draw(st.sampled_from(types))
    data = draw(st.dictionaries(st.sampled_from(_keys_for(type_)), _json_for(type_), max_size=8))
    if type_schema(type_) and draw(st.booleans()):
        data = {**_sample(type_schema(type_)), **data}
    return type_, data


_contents = st.sampled_from(["plain words", "token=abc123 please", "/home/alice/.env",
                             "mail bob@example.com", "abc123xyz in the middle"])


@st.composite
def _shaped(draw):
    """A payload shaped like the type's table (every annotated member,
    nested objects and arrays included), with content strings the
    redaction pipeline changes, so content, twins and digests are made."""
    type_ = draw(st.sampled_from(TYPES))

    def fill(node):
        if node.props is not None:
            return {k: fill(c) for k, c in node.props.items()
                    if draw(st.integers(0, 4)) > 0}
        if node.items is not None:
            return [fill(node.items) for _ in range(draw(st.integers(0, 2)))]
        return draw(st.one_of(_contents, _leaf))

    return type_, fill(ct.TABLE[type_])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=st.one_of(_payload(), _shaped()), ceiling=st.sampled_from(LEVELS),
       policy=st.sampled_from(POLICIES), agent=st.one_of(st.none(), st.text(max_size=8)),
       subject=st.one_of(st.none(), st.text(max_size=8)))
@example(inp=("attention.requested", {"kind": "form", "prompt": "p", "options": [
    None, {"id": "a", "label": "A"}, {"label": "B"}]}), ceiling="metadata", policy=POLICIES[0],
    agent="a", subject="s")
@example(inp=("tool.requested", {"args": {"cmd": "token=abc123"}}), ceiling="redacted",
         policy=POLICIES[0], agent=None, subject=None)
def test_the_compiled_plan_equals_the_gate_pass(inp, ceiling, policy, agent, subject):
    type_, data = inp
    before = copy.deepcopy(data)
    ref = _full_pass(type_, copy.deepcopy(data), ceiling, policy, agent, subject)
    got = gate(type_, data, ceiling, policy, agent=agent, subject=subject)
    assert _same(got, ref), (got, ref)
    assert data == before  # never mutates its input...
    if got[0]:  # ...nor hands back one of its containers
        ids = {id(x) for x in _containers(before)} | {id(x) for x in _containers(data)}
        assert not ids & {id(x) for x in _containers(got[0])}


def _containers(v):
    if isinstance(v, (dict, list)):
        yield v
        for x in (v.values() if isinstance(v, dict) else v):
            yield from _containers(x)


_levels = st.one_of(st.none(), st.dictionaries(
    st.sampled_from(["error", "error.message", "result", "summary", "tool.name", "x"]),
    st.sampled_from([*LEVELS, "bogus"]), max_size=3))
_structural = st.lists(st.sampled_from(["prompt", "options[].label", "fields[].label"]),
                       max_size=2)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inp=_payload(TYPES + ["x.acme.thing", "message.note"]), ceiling=st.sampled_from(LEVELS),
       levels=_levels, structural=_structural,
       form_fields=st.one_of(st.none(), st.just([{"id": "n", "type": "string"}])))
def test_gate_through_its_plan_equals_the_reference_with_hints(inp, ceiling, levels,
                                                               structural, form_fields):
    type_, data = inp
    ref = _full_pass(type_, copy.deepcopy(data), ceiling, POLICIES[0], "a", "S", form_fields,
                     levels, structural)
    got = gate_plan(type_, ceiling).gate(data, POLICIES[0], agent="a", subject="S",
                                         form_fields=form_fields, levels=levels,
                                         structural=structural)
    assert _same(got, ref), (got, ref)


_vendor_data = st.dictionaries(
    st.sampled_from(["error", "error.message", "error.code", "result", "kind", "x", "x.y"])
    | st.text(max_size=4),
    st.recursive(_leaf, lambda c: st.lists(c, max_size=2) | st.dictionaries(
        st.sampled_from(["message", "a"]), c, max_size=2), max_leaves=4), max_size=5)
_level_maps = [{}, {"error": "redacted", "error.message": "redacted"}, {"x.y": "full"},
               {"result": "full"}]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(type_=st.sampled_from(["x.acme.thing", "message.note", *TYPES[:3]]),
       ceiling=st.sampled_from(LEVELS),
       calls=st.lists(st.tuples(_vendor_data, st.integers(0, len(_level_maps) - 1)
                                | st.none()), min_size=1, max_size=6),
       fresh=st.booleans())
def test_gate_levels_equals_the_reference(type_, ceiling, calls, fresh):
    """``GatePlan.gate_levels`` (the stamper's run path; the declared keys
    of the last ``levels`` mapping kept on the plan) against the reference
    pass, one plan asked in turn with the same mapping, another mapping
    (equal-valued copies too: identity is what is kept) and none."""
    plan = capture.GatePlan(type_, ceiling)
    for data, which in calls:
        levels = None if which is None else (
            dict(_level_maps[which]) if fresh else _level_maps[which])
        ref = _full_pass(type_, copy.deepcopy(data), ceiling, POLICIES[0], "a", "S",
                         None, levels)
        got = plan.gate_levels(data, POLICIES[0], "a", "S", levels)
        assert _same(got, ref), (got, ref)


@given(v=st.recursive(_leaf | st.tuples(_leaf), lambda c: st.lists(c, max_size=4)
                      | st.dictionaries(st.text(max_size=4), c, max_size=4)
                      | st.tuples(c, c), max_leaves=30))
def test_copy_equals_the_plain_recursive_copy(v):
    got = capture._copy(v)
    ref = _ref_copy(v)
    assert got == ref and json.dumps(got) == json.dumps(ref)
    assert type(got) is type(ref)
    assert not {id(x) for x in _containers(got)} & {id(x) for x in _containers(v)}


def test_plans_are_shared_and_an_unknown_ceiling_is_refused():
    assert gate_plan("tool.completed", "metadata") is gate_plan("tool.completed", "metadata")
    assert gate_plan("tool.completed", "metadata").compiled is not None
    assert gate_plan("x.acme.thing", "full").compiled is None
    try:
        gate_plan("tool.completed", "secret")
    except ValueError:
        pass
    else:
        raise AssertionError("an unknown ceiling was accepted")
