"""The receiver's shortcuts held equal to the slow paths they skip:

- :func:`bridges.openhands.receiver._frame_json` (the strict reader first,
  ``json.loads`` when it refuses) is ``json.loads``: the same value or the
  same exception type, for JSON of every shape, ``NaN``/``Infinity``, huge
  integers, lone surrogates, whitespace, a BOM, bytes, and broken text;
- a frame's emissions sent without :meth:`Receiver._emit`'s coroutine (the
  channel has room) are the events :meth:`Receiver._emit` sends: the real
  captures fed through a relay channel that fills up at any point (both
  paths taken) give the same stream as with every send refused by
  ``emit_nowait`` (everything through :meth:`Receiver._emit`'s waiting
  path)."""
from __future__ import annotations

import json
import logging
import math
from functools import partial
from pathlib import Path

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core.bridge import BridgeContext, BridgeHealth, Saturated
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.openhands.receiver import Conversation, Receiver, Settings, _frame_json

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "openhands_real"
CAPTURES = ("approve", "reject", "pause_resume", "interrupt", "idle_pause_and_409", "model_500", "chat")

_scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**40), max_value=10**40)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text())
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@st.composite
def _frames(draw) -> str | bytes:
    """Text a socket could carry: JSON written every which way, then maybe
    broken, padded, BOM-prefixed or sent as bytes."""
    text = json.dumps(draw(_values), ensure_ascii=draw(st.booleans()),
                      indent=draw(st.none() | st.integers(0, 2)))
    how = draw(st.sampled_from(["as is", "cut", "pad", "bom", "junk", "dup keys", "bytes"]))
    if how == "cut" and text:
        text = text[:draw(st.integers(0, len(text) - 1))]
    elif how == "pad":
        text = draw(st.sampled_from([" ", "\n", "\t", "\r", "\x0b", "\u2028"])) + text + " "
    elif how == "bom":
        text = "\ufeff" + text
    elif how == "junk":
        text = draw(st.text(max_size=20))
    elif how == "dup keys":
        text = '{"a": 1, "a": ' + text + "}"
    elif how == "bytes":
        return text.encode("utf-8", "surrogatepass")
    return text


def _canon(value: object) -> str:
    """Equality that tells 1 from 1.0 and True from 1, and NaN from nothing
    else (``repr`` of every leaf, in order)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_canon(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_canon(v) for v in value) + "]"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{type(value).__name__}:{value!r}"


def _answer(fn, raw):
    try:
        return "ok", _canon(fn(raw))
    except (ValueError, TypeError, RecursionError) as e:
        return "raises", type(e).__name__


@settings(max_examples=600, deadline=None)
@given(raw=_frames())
def test_frame_json_is_json_loads(raw):
    assert _answer(_frame_json, raw) == _answer(json.loads, raw)


def test_frame_json_is_json_loads_at_the_edges():
    for raw in ('{"a": NaN}', "[Infinity, -Infinity]", " {} ", "\ufeff{}", b"\xef\xbb\xbf{}", b"\xff",
                "1" * 200, "[" * 60_000, '"\\ud800"', "", "nul", '{"a":1}x'):
        assert _answer(_frame_json, raw) == _answer(json.loads, raw), raw[:20]


def test_frame_json_refuses_text_over_check_json_caps():
    """Over :func:`bridges.core.aep.check_json`'s caps (65,538 arrays, a
    number of 300 or 5,000 digits, 100,000 ``[``) ``ValueError`` before any
    parse, where ``json.loads`` would take the text or raise
    ``RecursionError`` (round 12 of issue 25)."""
    for raw in ("[" + ",".join(["[]"] * 65_537) + "]", "1" * 300, "1" * 5000, "[" * 100_000):
        assert _answer(_frame_json, raw) == ("raises", "ValueError"), raw[:20]
        assert _answer(_frame_json, raw.encode()) == ("raises", "ValueError"), raw[:20]


def _captures() -> list[str]:
    out = []
    for c in CAPTURES:
        out.extend(json.dumps(f) for f in json.loads((REAL / f"{c}.json").read_text())["frames"])
    return out


async def _stream(frames: list[str], capacity: int, drain_every: int, *, refuse: bool = False) -> list[dict]:
    """The events the receiver sends for ``frames`` through a relay channel
    of ``capacity``, drained every ``drain_every`` events (the fast path and
    :meth:`Receiver._emit`'s waiting path both taken when it fills).
    ``refuse``: ``emit_nowait`` always says the channel is full."""
    send, recv = trio.open_memory_channel(capacity)
    _, crecv = trio.open_memory_channel(1)
    ctx = BridgeContext("openhands", Stamper("openhands", epoch=1, host="h", policy=CapturePolicy()),
                        send, crecv, BridgeHealth(), logging.getLogger("t"))
    if refuse:
        def full(*a, **kw):
            raise Saturated("openhands")
        ctx.emit_nowait = full  # type: ignore[method-assign]
    rx = Receiver(Settings(url="http://127.0.0.1:1"), Posture(), ctx, None)
    conv = Conversation("c0ffee00-0000-4000-8000-000000000001")
    rx.conversations[conv.id] = conv
    out: list[dict] = []

    async def drain() -> None:
        async for item in recv:
            out.append(item.event)
            if len(out) % drain_every == 0:
                await trio.sleep(0.001)  # let the channel fill meanwhile

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        for raw in frames:
            await rx.handle_raw(conv, raw)
        await rx._apply_pending(conv)
        await send.aclose()
    assert ctx.health.counters.get("frames_timed_out", 0) == 0
    return out


def _shape(events: list[dict]) -> list[tuple]:
    """What must not differ between two runs (ids and times are fresh: a
    cause or subject naming an event of the same run is compared by its
    position; the attention latency is the clock's, not the path's)."""
    pos = {e["id"]: i for i, e in enumerate(events)}
    return [(e["type"], e.get("seq"), e.get("run"), pos.get(e.get("subject"), e.get("subject")), e.get("step"),
             e.get("capture"), json.dumps({k: v for k, v in e.get("data", {}).items() if k != "latency_ms"},
                                          sort_keys=True), pos.get(e.get("cause"), e.get("cause")))
            for e in events]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=60),
       capacity=st.integers(1, 8), drain_every=st.integers(1, 5))
def test_emissions_through_a_filling_channel_are_the_unbounded_stream(picks, capacity, drain_every):
    frames = _captures()
    chosen = [frames[i % len(frames)] for i in picks]
    slow = trio.run(partial(_stream, chosen, 100_000, 10**9, refuse=True))
    fast = trio.run(_stream, chosen, capacity, drain_every)
    assert _shape(slow) == _shape(fast)
    assert slow  # the runs compared something
