"""A tenth outside attack on issue 25, finding 2: one event of 15 MiB of
``[[],[],...]`` (5 million arrays, under the 16 MiB body cap) held the event
loop 2-3.4 s in the parse and the walks after it, and a gated hook sent
meanwhile failed open. A line, a ``/socket`` frame or a hook body opening
over :data:`~bridges.core.aep.MAX_CONTAINERS` JSON arrays and objects is
refused before it is parsed; brackets inside strings (code in a tool
result) do not count."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.aep import MAX_CONTAINERS, check_containers, containers
from supervisor.relay.core import Relay
from tests.unit.relay.test_relay_core import ev
from tests.unit.relay.test_relay_source_work import _post


def test_containers_count_outside_strings_only_past_the_cap():
    assert containers(b'{"a": [1, {"b": []}]}') == 4
    code = json.dumps({"type": "x", "data": {"text": "[{" * MAX_CONTAINERS}})
    assert containers(code) == 2 and containers(code.encode()) == 2  # brackets in a string
    tricky = json.dumps({"s": '\\"[[[' * MAX_CONTAINERS})  # escaped quotes inside
    assert containers(tricky) == 1
    check_containers(code)  # no error


@pytest.mark.parametrize("shape", ["[]", "{}"])
def test_over_the_cap_is_refused_before_the_parse(shape):
    many = "[" + ",".join([shape] * (MAX_CONTAINERS + 1)) + "]"
    assert containers(many) == MAX_CONTAINERS + 2
    with pytest.raises(ValueError, match="JSON arrays and objects"):
        check_containers(many.encode())


async def test_a_post_of_one_event_of_millions_of_arrays_is_refused(monkeypatch):
    relay = Relay(token="t")
    parsed = []
    monkeypatch.setattr("supervisor.relay.app.formed_entry",
                        lambda ln: parsed.append(ln) or None)
    e = ev(1, session="s-big")
    e["data"] = {"v": [[] for _ in range(MAX_CONTAINERS + 1)]}
    assert await _post(relay, [e]) == 400
    assert not parsed  # refused before any parse
    assert relay.counters["invalid_events"] == 1
    ok = ev(1, session="s-code")
    ok["data"] = {"text": "[{" * (MAX_CONTAINERS + 1)}  # code in a string: taken
    assert await _post(relay, [ok]) == 202


def test_an_unterminated_string_is_one_match_to_the_end():
    """An eleventh outside attack, finding 1: 70,000 ``[``, one ``"``, then
    ``\\"`` many times and no closing quote. The old string pattern failed
    at that quote and was tried again at every later one (quadratic: 130 KB
    held the loop 9 s); now a string runs to the end when it never closes,
    so every quote starts one match and the scan is linear."""
    from bridges.core.aep import _STRING_B, _STRING_S
    attack = "[" * 70_000 + '"' + '\\"' * 5_000
    m = _STRING_S.search(attack)
    assert m is not None and m.start() == 70_000 and m.end() == len(attack)
    mb = _STRING_B.search(attack.encode())
    assert mb is not None and mb.end() == len(attack)
    assert containers(attack) == 70_000  # the brackets before it still count
    with pytest.raises(ValueError):
        check_containers(attack)


@settings(max_examples=300)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(alphabet='[]{}"\\ab'), kids, max_size=4),
                    max_leaves=20))
def test_the_exact_count_is_the_number_of_containers(value):
    """Past the cap's quick count the exact one is every array and object
    the value holds, whatever its strings hold (brackets, quotes, escapes)."""
    def count(v):
        if isinstance(v, list):
            return 1 + sum(count(x) for x in v)
        if isinstance(v, dict):
            return 1 + sum(count(x) for x in v.values())
        return 0
    import bridges.core.aep as aep
    text = json.dumps(value)
    saved = aep.MAX_CONTAINERS
    aep.MAX_CONTAINERS = -1  # always the exact count
    try:
        assert containers(text) == count(value)
        assert containers(text.encode()) == count(value)
    finally:
        aep.MAX_CONTAINERS = saved
