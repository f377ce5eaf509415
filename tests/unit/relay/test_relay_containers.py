"""A tenth outside attack on issue 25, finding 2: one event of 15 MiB of
``[[],[],...]`` (5 million arrays, under the 16 MiB body cap) held the event
loop 2-3.4 s in the parse and the walks after it, and a gated hook sent
meanwhile failed open. A line, a ``/socket`` frame or a hook body opening
over :data:`~bridges.core.aep.MAX_CONTAINERS` JSON arrays and objects is
refused before it is parsed; brackets inside strings (code in a tool
result) do not count. So is one holding over
:data:`~bridges.core.aep.MAX_VALUES` values or over
:data:`~bridges.core.aep.MAX_FLOATS` fractions and exponents (one line of
two million floats held the loop 1.7-2.7 s, found while fixing an eleventh
attack); commas and digits inside strings do not count."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.aep import (
    MAX_CONTAINERS,
    MAX_DIGITS,
    MAX_FLOATS,
    MAX_VALUES,
    check_json,
    containers,
)
from supervisor.relay.core import Relay
from tests.unit.relay.test_relay_core import ev
from tests.unit.relay.test_relay_source_work import _post


def test_containers_count_outside_strings_only_past_the_cap():
    assert containers(b'{"a": [1, {"b": []}]}') == 4
    code = json.dumps({"type": "x", "data": {"text": "[{" * MAX_CONTAINERS}})
    assert containers(code) == 2 and containers(code.encode()) == 2  # brackets in a string
    tricky = json.dumps({"s": '\\"[[[' * MAX_CONTAINERS})  # escaped quotes inside
    assert containers(tricky) == 1
    check_json(code)  # no error


@pytest.mark.parametrize("shape", ["[]", "{}"])
def test_over_the_cap_is_refused_before_the_parse(shape):
    many = "[" + ",".join([shape] * (MAX_CONTAINERS + 1)) + "]"
    assert containers(many) == MAX_CONTAINERS + 2
    with pytest.raises(ValueError, match="JSON arrays and objects"):
        check_json(many.encode())


@pytest.mark.parametrize("bad,ok", [
    ([[] for _ in range(MAX_CONTAINERS + 1)], "[{" * (MAX_CONTAINERS + 1)),  # code in a string: taken
    # a twelfth outside attack: 3,800 ints of 4,299 digits (under Python's own
    # limit) held the loop 1.4 s; a number of MAX_DIGITS is taken
    ([int("9" * 4299)] * 3, int("9" * MAX_DIGITS)),
], ids=["millions of arrays", "long numbers"])
async def test_a_post_past_a_json_cap_is_refused_before_the_parse(monkeypatch, bad, ok):
    relay = Relay(token="t")
    parsed = []
    monkeypatch.setattr("supervisor.relay.app.formed_entry",
                        lambda ln: parsed.append(ln) or None)
    e = ev(1, session="s-big")
    e["data"] = {"v": bad}
    assert await _post(relay, [e]) == 400
    assert not parsed  # refused before any parse
    assert relay.counters["invalid_events"] == 1
    good = ev(1, session="s-ok")
    good["data"] = {"v": ok}
    assert await _post(relay, [good]) == 202


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
        check_json(attack)


@settings(max_examples=300)
@given(st.recursive(st.none() | st.booleans() | st.integers()
                    | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(alphabet='[]{}"\\ab,:.e0123'),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(alphabet='[]{}"\\ab,.e1'), kids, max_size=4),
                    max_leaves=20))
def test_the_exact_counts_are_the_values_of_the_json(value):
    """Past a cap's quick count the exact one is what the value holds,
    whatever its strings hold (brackets, commas, digits, quotes, escapes):
    every array and object; every value, counted as those plus their
    commas plus one; every fraction and exponent of its floats."""
    def count(v):  # (containers, commas, fractions and exponents)
        if isinstance(v, (list, dict)):
            kids = list(v.values() if isinstance(v, dict) else v)
            sums = [count(x) for x in kids]
            return (1 + sum(s[0] for s in sums), max(len(kids) - 1, 0) + sum(s[1] for s in sums),
                    sum(s[2] for s in sums))
        if isinstance(v, float):
            text = json.dumps(v)
            return 0, 0, ("." in text) + ("e" in text)
        return 0, 0, 0
    import bridges.core.aep as aep
    text = json.dumps(value)
    n, commas, floats = count(value)
    saved = aep.MAX_CONTAINERS, aep.MAX_VALUES, aep.MAX_FLOATS
    try:
        aep.MAX_CONTAINERS = -1  # always the exact count
        assert containers(text) == n
        assert containers(text.encode()) == n
        for cap, exact in (("MAX_CONTAINERS", n), ("MAX_VALUES", n + commas + 1),
                           ("MAX_FLOATS", floats)):
            aep.MAX_CONTAINERS, aep.MAX_VALUES, aep.MAX_FLOATS = 10**9, 10**9, 10**9
            setattr(aep, cap, exact)  # at the cap: taken
            check_json(text)
            check_json(text.encode())
            setattr(aep, cap, exact - 1)  # one under it: refused
            with pytest.raises(ValueError):
                check_json(text)
            with pytest.raises(ValueError):
                check_json(text.encode())
    finally:
        aep.MAX_CONTAINERS, aep.MAX_VALUES, aep.MAX_FLOATS = saved


def test_over_the_values_or_floats_cap_is_refused_before_the_parse():
    ints = "[" + ",".join(["1"] * MAX_VALUES) + "]"  # MAX_VALUES numbers + the array
    with pytest.raises(ValueError, match="JSON values"):
        check_json(ints)
    assert check_json("[" + ",".join(["1"] * (MAX_VALUES - 1)) + "]") == 1
    floats = "[" + ",".join(["0.5"] * (MAX_FLOATS + 1)) + "]"
    with pytest.raises(ValueError, match="fractions and exponents"):
        check_json(floats.encode())
    check_json("[" + ",".join(["0.5"] * MAX_FLOATS) + "]")
    with pytest.raises(ValueError, match="fractions and exponents"):  # 1.5e3 is two
        check_json("[" + ",".join(["1.5e3"] * (MAX_FLOATS // 2 + 1)) + "]")
    check_json("[" + ",".join(["true", "false", "1e3"] * (MAX_FLOATS // 2)) + "]")


def test_commas_and_numbers_in_strings_do_not_count():
    prose = json.dumps({"type": "x", "data": {"text": "1.5, 2.5e3, " * MAX_VALUES}})
    assert check_json(prose) == 2 and check_json(prose.encode()) == 2


async def test_a_post_of_one_event_of_millions_of_floats_is_refused(monkeypatch):
    relay = Relay(token="t")
    e = ev(1, session="s-floats")
    e["data"] = {"v": [0.5] * (MAX_FLOATS + 1)}
    assert await _post(relay, [e]) == 400
    assert relay.counters["invalid_events"] == 1
    ok = ev(1, session="s-text")
    ok["data"] = {"text": "0.5," * (MAX_VALUES + 1)}  # in a string: taken
    assert await _post(relay, [ok]) == 202


def test_a_number_of_over_max_digits_is_refused_outside_strings_only():
    """A twelfth outside attack: 3,800 ints of 4,299 digits (under Python's own
    limit of 4,300) in one 16 MiB line held the loop 1.4 s (reading and writing
    such an int is quadratic). A number of over MAX_DIGITS digits is refused
    before the parse; the same digits in a string (a hash, a long id) are not."""
    from bridges.core.aep import MAX_DIGITS
    ok = json.dumps({"n": int("9" * MAX_DIGITS), "s": "1" * 5000})
    check_json(ok)
    check_json(ok.encode())
    for bad in (json.dumps({"n": int("9" * (MAX_DIGITS + 1))}),
                '{"f": 1.' + "5" * (MAX_DIGITS + 1) + "}",
                '{"e": 1e' + "1" * (MAX_DIGITS + 1) + "}"):
        with pytest.raises(ValueError, match="digits"):
            check_json(bad)
        with pytest.raises(ValueError, match="digits"):
            check_json(bad.encode())

