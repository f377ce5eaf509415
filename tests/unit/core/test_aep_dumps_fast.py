"""``bridges.core.aep.dumps`` (orjson first, else the C encoder it builds
once instead of ``JSONEncoder.encode``, which builds one per call): the same
bytes and the same refusals (``NaN``, lone surrogates, values JSON cannot
carry, cycles, absurd depth) as the encoder it stands for, on any value."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core import aep

_leaf = (st.none() | st.booleans() | st.integers(-2 ** 80, 2 ** 80) | st.floats()
         | st.text(max_size=10) | st.sampled_from(["\ud800", "é€😀", "\x00\n\"\\", object()]))
_key = st.text(max_size=6) | st.integers(-5, 5) | st.floats() | st.none() | st.booleans()
_value = st.recursive(_leaf, lambda c: st.lists(c, max_size=3) | st.tuples(c, c)
                      | st.dictionaries(_key, c, max_size=3), max_leaves=10)


def _outcome(encode, obj):
    try:
        return encode(obj)
    except (TypeError, ValueError) as e:  # UnicodeEncodeError is a ValueError
        return type(e), str(e)


def _reference(obj):
    return aep._ENCODER.encode(obj).encode("utf-8")  # noqa: SLF001 -- the encoder it stands for


@settings(max_examples=500, deadline=None)
@given(obj=st.dictionaries(_key, _value, max_size=5) | _value)
def test_dumps_is_the_encoder_it_stands_for(obj):
    assert _outcome(aep.dumps, obj) == _outcome(_reference, obj)


def test_cycles_and_depth_get_the_encoder_s_own_answer():
    cyclic: dict = {"a": [1]}
    cyclic["a"].append(cyclic)
    with pytest.raises(ValueError, match="Circular reference"):
        aep.dumps(cyclic)
    deep: dict = {}
    d = deep
    for _ in range(100_000):
        d["x"] = d = {}
    with pytest.raises(ValueError, match="nested too deeply"):  # the documented refusal
        aep.dumps(deep)
    # and a failed encode leaves nothing behind for the next one
    shared = {"k": 1}
    with pytest.raises(ValueError):
        aep.dumps({"a": shared, "b": math.nan})
    assert aep.dumps({"again": shared, "b": [shared]}) == b'{"again":{"k":1},"b":[{"k":1}]}'
