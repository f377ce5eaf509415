"""formed_entry (the POST fast path) held equal to the long way on adversarial JSON
*text* (hand-spelled, not json.dumps output): duplicate keys at the top and
in data, number spellings (big/negative ints, -0, exponents, 1e400), JSON
whitespace (\\r, \\t) between tokens, escapes (lone surrogates, \\u2028,
\\/), nesting around 64 levels, extension attributes (written by review 6b)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.relay.test_relay_ingest_fast import _fast_way, _fields, _long_way

WS = st.sampled_from(["", " ", "\t", "\r", "\n", " \r\n\t"])
NUMS = st.sampled_from(["0", "-0", "1", "-1", "01", "1.0", "-0.0", "1e2", "1E-5", "1e400", "-1e400",
                        str(2**63 - 1), str(2**63), str(2**64 - 1), str(2**64), str(-2**63),
                        str(-2**63 - 1), str(-2**64), "1" + "0" * 40, "12345678901234567890",
                        "0.1", "123456789012345678901234567890.5", "NaN", "Infinity", "-Infinity"])
STRS = st.sampled_from(['"x"', '""', '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"', '"\u2028"',
                        '"\\u2028"', '"\\/"', '"\\u0000"', '"\u00e9"', '"a\\nb"', '"prompt"', '"[[[["'])
KEYS = st.sampled_from(["trigger", "n", "prompt", "text", "args", "tool", "name", "a", "\\ud800", "trigger"])


def nested(depth):
    return st.one_of(
        st.builds(lambda n: "[" * n + "1" + "]" * n, st.integers(depth - 3, depth + 2)),
        st.builds(lambda n: '{"a":' * n + "1" + "}" * n, st.integers(depth - 3, depth + 2)))


VALUES = st.recursive(st.one_of(NUMS, STRS, st.sampled_from(["true", "false", "null"])),
                      lambda inner: st.one_of(
                          st.builds(lambda xs, w: "[" + w + ("," + w).join(xs) + w + "]", st.lists(inner, max_size=3), WS),
                          st.builds(lambda kvs, w: "{" + ",".join(f'{w}"{k}"{w}:{w}{v}' for k, v in kvs) + "}",
                                    st.lists(st.tuples(KEYS, inner), max_size=4), WS)), max_leaves=8)
DATA = st.one_of(
    st.builds(lambda kvs, w: "{" + ",".join(f'{w}"{k}"{w}:{w}{v}' for k, v in kvs) + "}",
              st.lists(st.tuples(KEYS, st.one_of(VALUES, nested(63))), max_size=4), WS),
    st.sampled_from(["null", "[]", '"x"', "1"]))

BASE = [("aep", '"0.1"'), ("id", '"01JX9YB1BBBB0000000001GOLD"'), ("type", '"run.started"'),
        ("time", '"2026-07-03T10:14:01.000Z"'), ("source", '"aep://host-a/agent/c/session/s"'),
        ("agent", '"c"'), ("session", '"s"'), ("run", '"r"'), ("seq", "1"), ("epoch", "0")]
EXTRA = st.lists(st.one_of(
    st.tuples(st.sampled_from(["type", "seq", "epoch", "session", "capture", "severity", "aep", "data", "xext", "id"]),
              st.one_of(NUMS, STRS, st.sampled_from(['"control.cancel"', '"tool.requested"', '"full"',
                                                     '"redacted"', '"metadata"', '"debug"', '"notice"',
                                                     '"0.1"', '{"prompt":"x"}', '{}'])))), max_size=4)


@settings(max_examples=1000, deadline=None)
@given(extra=EXTRA, data=DATA, cap=st.sampled_from(["metadata", "redacted", "full", None]),
       w=WS, drop=st.sets(st.sampled_from(["seq", "epoch", "run", "session"]), max_size=2),
       tail=st.sampled_from(["", " ", "\r", "\t\r", " x"]))
def test_formed_entry_equals_the_long_way_on_hand_spelled_text(extra, data, cap, w, drop, tail):
    pairs = [(k, v) for k, v in BASE if k not in drop]
    if cap is not None:
        pairs.append(("capture", f'"{cap}"'))
    pairs.append(("data", data))
    pairs.extend(extra)
    text = w + "{" + ",".join(f'{w}"{k}"{w}:{w}{v}{w}' for k, v in pairs) + "}" + tail
    line = text.encode("utf-8")
    assert _fields(_fast_way(line)) == _fields(_long_way(text))
