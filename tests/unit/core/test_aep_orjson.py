"""``bridges.core.aep.dumps``/``loads`` ask orjson first (issue 11) and keep
the json module's answers: for any value ``dumps`` writes the stdlib's bytes
(floats as ``repr`` writes them) or raises its exception, type and message;
for any text or bytes ``loads`` returns the stdlib's value (types, key order,
int vs float) or raises its exception. The reference is the stdlib path the
module keeps (``_stdlib_dumps``/``_stdlib_loads``: main's code before orjson)
and, for bytes, ``json.dumps`` itself. Each property is shown to fail when a
check of the fast path is planted out (``test_*_catches_*``)."""
from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import math
import re
import uuid
from collections import OrderedDict, namedtuple

import orjson
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from bridges.core import aep


class _Str(str):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


class _Dict(dict):
    pass


class _List(list):
    pass


class _Color(enum.Enum):
    RED = 1
    NAME = "n"


class _Level(enum.IntEnum):
    LOW = 1


class _Kind(str, enum.Enum):
    A = "a"


@dataclasses.dataclass
class _Point:
    x: int = 1


_Pair = namedtuple("_Pair", "a b")

_EXOTIC = [
    _Str("s"), _Int(7), _Float(1.5), _Dict(a=1), _List([1]), _Pair(1, "x"), OrderedDict(k=1),
    _Color.RED, _Color.NAME, _Level.LOW, _Kind.A, _Point(), uuid.UUID(int=1),
    datetime.datetime(2026, 12, 1, 18, 0), datetime.date(2026, 12, 1), datetime.time(1, 2),
    decimal.Decimal("1.5"), b"bytes", {1, 2}, object(), orjson.Fragment(b"[1]"), 1j,
]
_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 2.2250738585072014e-308, 1e-5,
           1.5e-7, 9.99e-5, 1e-4, 1e16, 1e15, 1.7976931348623157e308, 0.1, 1e22, 123456789.125]
_INTS = [2 ** 63 - 1, 2 ** 63, -2 ** 63, -2 ** 63 - 1, 2 ** 64 - 1, 2 ** 64, -2 ** 64, 10 ** 30, 0, -1]
_TEXT = ["", "é€😀", "\ud800", "a\udfffb", "\x00\x1f\x7f\u2028\u2029\"\\/", "\ufeff", "1e-5"]

_leaf = (st.none() | st.booleans() | st.integers() | st.sampled_from(_INTS)
         | st.floats() | st.sampled_from(_FLOATS)
         | st.text(st.characters(codec=None, exclude_categories=()), max_size=8)
         | st.sampled_from(_TEXT) | st.sampled_from(_EXOTIC))
_key = (st.text(max_size=6) | st.sampled_from(["\ud800", "é", _Str("k")]) | st.integers(-3, 3)
        | st.sampled_from([1.5, math.nan, -0.0, None, True, 2 ** 70, (1, 2)]))
_value = st.recursive(_leaf, lambda c: st.lists(c, max_size=4) | st.tuples(c, c)
                      | st.dictionaries(_key, c, max_size=4), max_leaves=12)
_event_like = st.dictionaries(st.text(max_size=8), _value, max_size=6)


_REF_DUMPS = aep._stdlib_dumps  # main's code, captured before any test plants a bug
_REF_LOADS = aep._stdlib_loads


def _answer(fn, arg, shape=lambda v: v):
    try:
        return ("ok", shape(fn(arg)))
    except Exception as e:  # the exact exception: type and message
        return ("error", type(e), str(e))


def _dumps_agrees(obj) -> bool:
    new = _answer(aep.dumps, obj)
    if new != _answer(_REF_DUMPS, obj):
        return False
    if new[0] == "ok":  # and the stdlib's bytes are json.dumps's
        return new[1] == json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                                    allow_nan=False).encode("utf-8")
    return True


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_event_like | _value)
def test_dumps_writes_the_stdlib_bytes_or_raises_its_exception(obj):
    assert _dumps_agrees(obj)


def _id(value) -> str:
    """A test id that is the same in every process (pytest-xdist's workers
    must collect the same ids): ``repr`` without an object's address."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


@pytest.mark.parametrize("obj", _EXOTIC + _FLOATS + _INTS + _TEXT, ids=_id)
def test_each_value_orjson_treats_otherwise_gets_the_stdlib_answer(obj):
    for wrapped in (obj, [obj], {"data": {"k": obj}}, {"a": [1, (obj, "x")]}):
        assert _dumps_agrees(wrapped), wrapped


def test_non_str_keys_deep_nesting_and_cycles_get_the_stdlib_answer():
    for obj in ({2: "a", None: 1, 1.5: 2, True: 3}, {"a": {2 ** 70: 1}}, {(1,): 1}):
        assert _dumps_agrees(obj)
    for depth in (250, 254, 255, 256, 257, 600, 5000, 100_000):  # orjson's limit is ~255
        deep: list = []
        for _ in range(depth):
            deep = [deep]
        assert _dumps_agrees(deep) and _dumps_agrees({"d": deep})
    loop: dict = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        aep.dumps(loop)


@settings(max_examples=1000, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(_FLOATS[3:]))
def test_a_float_has_one_wire_form_that_reads_back_as_itself(x):
    """The decision on floats: ``repr``'s form always (``1e-05``, ``1e+16``),
    whichever encoder wrote it, and both readers give the same double back."""
    out = aep.dumps({"x": x})
    assert out == b'{"x":' + repr(x).encode() + b"}"
    for back in (json.loads(out)["x"], aep.loads(out)["x"], aep.loads(out.decode())["x"]):
        assert type(back) is float and back.hex() == x.hex()


def test_a_plain_event_is_written_by_orjson(monkeypatch):
    """The fast path answers for what the daemon writes (else every
    property above would hold trivially, the stdlib answering for all)."""
    event = {"aep": "0.1", "id": "01M8SEESP4EHHJB5P9GM4FJKS9", "type": "x.codex.otel.sse_event",
             "seq": 5, "epoch": 1764612000, "severity": "info", "data": {
                 "event.kind": "response.created", "ok": True, "n": None, "r": 0.25,
                 "list": [1, "é", (2, 3)], "deep": {"x": [{"y": -1}]}}}
    want = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()

    def no_stdlib(_obj):
        raise AssertionError("the stdlib path was taken")

    monkeypatch.setattr(aep, "_stdlib_dumps", no_stdlib)
    monkeypatch.setattr(aep, "_stdlib_loads", no_stdlib)
    assert aep.dumps(event) == want
    assert aep.loads(want) == aep.loads(want.decode()) == json.loads(want)


# -- loads -------------------------------------------------------------------

class _Key(str):
    pass


def _typed(v):
    """``v`` as a flat list of tokens with its types and dict key order
    spelled out (1, 1.0 and True differ, -0.0 and 0.0 differ, NaN equals
    NaN), built without recursion: any depth either reader returns compares."""
    out, stack = [], [v]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is dict:
            out.append(("dict", len(x)))
            for k, y in reversed(list(x.items())):
                stack += [y, _Key(k)]
        elif t is list:
            out.append(("list", len(x)))
            stack += reversed(x)
        elif t is _Key:
            out.append(("key", str(x)))
        elif t is float:
            out.append(("float", x.hex() if x == x else "nan"))
        else:
            out.append((t.__name__, x))
    return out


def _loads_agrees(text) -> bool:
    return _answer(aep.loads, text, _typed) == _answer(_REF_LOADS, text, _typed)


_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(_INTS) | st.floats()
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=6),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
    max_leaves=12)
_space = st.text(st.sampled_from([" ", "\t", "\n", "\r", "\x0b", "\x0c", "\xa0", "\u2028", "\ufeff"]),
                 max_size=2)
_number = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][-+]?[0-9]{1,3})?", fullmatch=True)
_bigint = st.integers(min_value=10 ** 17, max_value=10 ** 21).map(str) | st.integers().map(str) \
    | st.sampled_from([str(i) for i in _INTS] + ["-0", "1e400", "-1e400", "1" + "0" * 400])
_soup = st.lists(st.sampled_from(list('{}[]:," \\0123456789.-+eEtrufalsnNIiy\t\n\r\x0bu')
                                 + ["\ud800", "\\ud800", "\\udc00", "\\u00e9", "é", "\ufeff", "\x00"]),
                 max_size=24).map("".join)
_dup = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9)), max_size=5).map(
    lambda kv: "{" + ",".join(f'"{k}":{v}' for k, v in kv) + "}")


def _spaced(text, space):
    return space + text + space


_texts = st.one_of(
    st.builds(_spaced, _json_value.map(lambda v: json.dumps(v, ensure_ascii=False)), _space),
    st.builds(_spaced, _json_value.map(json.dumps), _space),
    _number, _bigint, _bigint.map(lambda n: '{"seq":' + n + ',"x":[' + n + "]}"),
    _soup, _dup,
    st.integers(1015, 1030).map(lambda n: "[" * n + "]" * n),
    st.sampled_from(["NaN", "[Infinity]", '{"x":-Infinity}', '"\\ud800"', '"\\ud800\\udc00"',
                     "\ufeff{}", "", " ", "01", "1.", "[1,]", '"\x01"']),
)
_encodings = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32",
                              "latin-1"])


def _encoded(text, codec):
    return text.encode(codec, "surrogatepass") if codec.startswith("utf") else \
        text.encode(codec, "replace")


_inputs = _texts | st.builds(_encoded, _texts, _encodings) | st.binary(max_size=24)


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_inputs)
def test_loads_reads_the_stdlib_value_or_raises_its_exception(text):
    assert _loads_agrees(text)


@pytest.mark.parametrize("text", [
    "18446744073709551615", "18446744073709551616", "-9223372036854775808", "-9223372036854775809",
    "9999999999999999999", "-9999999999999999999", '{"a":[123456789012345678901234567890]}',
    '{"t":"1234567890123456789012"}', "1e400", "1" + "0" * 5000, '"\\ud800"', "\ufeff[1]",
    b"\xef\xbb\xbf[1]", "[1]".encode("utf-16"), b'"\xed\xa0\x80"', '{"a":1,"b":2,"a":3}',
    "[" * 1024 + "]" * 1024, "[" * 1025 + "]" * 1025, "[" * 100_000, bytearray(b"[1]"),
    memoryview(b"[1]"), 5, None,
], ids=lambda t: _id(t)[:40])
def test_each_text_orjson_reads_otherwise_gets_the_stdlib_answer(text):
    assert _loads_agrees(text)
    if isinstance(text, str):
        assert _loads_agrees(text.encode("utf-8", "surrogatepass"))


# -- the properties catch a planted bug in the fast path -------------------------

_FIND = settings(database=None, max_examples=5000, deadline=None,
                 suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("planted", ["no type walk", "no walk into lists", "no float check",
                                     "orjson's refusal kept"])
def test_the_dumps_property_catches_a_planted_bug(monkeypatch, planted):
    if planted == "no type walk":  # Enum members, UUIDs, NaN would be written as orjson does
        monkeypatch.setattr(aep, "_plain_values", lambda v: True)
        monkeypatch.setattr(aep, "_plain", lambda o: True)
    elif planted == "no float check":  # NaN as null, 1e-05 as 0.00001
        monkeypatch.setattr(aep, "_same_float", lambda x: True)
    elif planted == "no walk into lists":  # an Enum member inside a list or tuple slips by
        walk = aep._plain_values
        monkeypatch.setattr(aep, "_plain_values",
                            lambda v: isinstance(v, (list, tuple)) or walk(v))
        monkeypatch.setattr(aep, "_plain", lambda o: isinstance(o, (list, tuple)) or
                            o.__class__ in (str, int, bool, dict, type(None)) or
                            (o.__class__ is float and aep._same_float(o)))
    else:  # no stdlib answer after orjson refuses (an int past 64 bits, a non-str key)
        monkeypatch.setattr(aep, "_stdlib_dumps", orjson.dumps)
    bad = find(_event_like | _value, lambda o: not _dumps_agrees(o), settings=_FIND)
    assert not _dumps_agrees(bad)


def test_the_depth_check_keeps_the_stdlib_refusal(monkeypatch):
    """orjson reads 1,024 levels; the stdlib refuses past its recursion limit
    (3.11: ~1,000 levels at pytest's depth; 3.12's C limit is 1,500, 3.13's
    higher). A plain test: hypothesis raises the recursion limit while it
    runs, so there the stdlib reads these."""
    texts = {n: "[" * n + "]" * n for n in (255, 256, 600, 990, 1000, 1024, 1025, 1600)}
    assert all(_loads_agrees(t) for t in texts.values())
    only_orjson_reads = [n for n, t in texts.items()
                         if _answer(_REF_LOADS, t)[0] == "error" and _answer(orjson.loads, t)[0] == "ok"]
    assert only_orjson_reads == [] or only_orjson_reads[0] >= 990
    monkeypatch.setattr(aep, "_DEEP", 10 ** 9)  # planted: no depth check
    for n in only_orjson_reads:  # none where the stdlib reads 1,024 levels (3.12+)
        assert not _loads_agrees(texts[n])


@pytest.mark.parametrize("planted", ["no big-int check", "orjson's refusal kept"])
def test_the_loads_property_catches_a_planted_bug(monkeypatch, planted):
    if planted == "no big-int check":  # ints past 64 bits would come back as floats
        monkeypatch.setattr(aep, "_RUN_19", b"\xff")
    else:  # no stdlib answer after orjson refuses (a lone surrogate escape, UTF-16, a BOM)
        monkeypatch.setattr(aep, "_stdlib_loads", orjson.loads)
    bad = find(_inputs, lambda t: not _loads_agrees(t), settings=_FIND)
    assert not _loads_agrees(bad)


def _at_stack_depth(frames, fn):
    return fn() if frames <= 0 else _at_stack_depth(frames - 1, fn)


def test_dumps_from_a_deep_stack_answers_as_the_stdlib_there():
    """The walk after orjson recurses in Python: where the caller's stack
    leaves it too little room, the stdlib answers (as it does there too)."""
    import sys

    value: list = [1]
    for _ in range(200):
        value = [value]
    for used in (0, sys.getrecursionlimit() - 350, sys.getrecursionlimit() - 150):
        new = _at_stack_depth(used, lambda: _answer(aep.dumps, value))
        old = _at_stack_depth(used, lambda: _answer(_REF_DUMPS, value))
        assert new == old
    assert new[0] == "error" or new[1] == _REF_DUMPS(value)


def test_dumps_bytes_hold_their_own_size_not_orjsons_write_block():
    """orjson writes into a block of 4 KiB or more and its bytes keep that
    block; the relay keeps every event's wire bytes (buffers, SSE queues),
    so a small event held ~8x its size (the stuck-readers RSS test caught
    it: +40 MiB). ``dumps`` returns exact-size bytes."""
    import tracemalloc
    ev = {"aep": "0.1", "type": "tool.completed", "seq": 1, "data": {"x": "y" * 300}}
    assert aep._OJ_DUMPS(ev) == aep.dumps(ev)  # the orjson path, not the stdlib's
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [aep.dumps(ev) for _ in range(1000)]
        per = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert per < 2 * len(kept[0]), f"{per:.0f} bytes held per {len(kept[0])}-byte event"
