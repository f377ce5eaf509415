"""``POST /events`` reads each line from its bytes when it can
(:func:`supervisor.relay.envelope.formed_entry`, issue 11): held equal to
the long way it skips, ``to_entry(loads(text), text, owned=True)`` on the
line's text (the same entry, or the same refusal), and the whole POST
answer held equal to that long way applied line by line to the text of the
body (the same status, body and ingested events)."""
from __future__ import annotations

import json

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.aep import loads
from supervisor.relay.app import make_app
from supervisor.relay.core import Relay
from supervisor.relay.envelope import MAX_DATA_DEPTH, InvalidEvent, formed_entry, to_entry

SRC = "aep://h/agent/a/session/s"


def _event(i: int = 0, **kw) -> dict:
    ev = {"aep": "0.1", "id": f"01BENCH{i:010d}", "type": "tool.completed",
          "time": "2026-11-30T12:00:00.000Z", "source": SRC, "agent": "bench", "session": "s",
          "seq": i, "epoch": 0,
          "data": {"tool": {"name": "bash", "call_id": f"c{i}"}, "status": "success",
                   "duration_ms": 12}}
    ev.update(kw)
    return ev


def _long_way(text: str):
    """What the POST path made of one line before: the entry, or the refusal."""
    try:
        return to_entry(loads(text), text, owned=True)
    except InvalidEvent as e:
        return ("invalid", str(e))
    except ValueError as e:
        return ("json", str(e))


def _fast_way(line: bytes):
    """formed_entry, then the long way when it does not answer (the POST path)."""
    try:
        e = formed_entry(line)
    except InvalidEvent as exc:
        return ("invalid", str(exc))
    return _long_way(line.decode("utf-8")) if e is None else e


def _fields(e) -> tuple:
    if isinstance(e, tuple):
        return e
    # attributes in order with their exact types: the wire form is made from them
    attrs = [(k, type(v), v) for k, v in e.attrs.items()]
    return (attrs, e.raw, e.pos, e.sev, e.cap, e.key, e.n, e.size, e.bkey)


def _nest(value, depth: int, kind: str):
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, 10**18, 10**19,
                     1234567890123456789]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-05, 1e16, 0.1, -0.0, 5e-324, 1.0]),
    st.text(alphabet="0123456789[]{}\"\\ae\u00e9\u2028\ud800\x00\n", max_size=40),
    st.sampled_from(["9" * 19, "[" * 300, "{" * 70, "\ufeff"]))
_value = st.recursive(_scalar, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.sampled_from(["a", "b", "result", "tool", "x"]), c,
                                        max_size=3), max_leaves=12)
_deep = st.builds(_nest, _scalar, st.integers(MAX_DATA_DEPTH - 3, MAX_DATA_DEPTH + 2),
                  st.sampled_from(["list", "dict"]))
_data = st.one_of(st.none(), st.dictionaries(st.sampled_from(["status", "tool", "result", "n", "deep"]),
                                             st.one_of(_value, _deep), max_size=4))
_overrides = st.fixed_dictionaries({}, optional={
    "seq": st.one_of(st.integers(0, 5), st.sampled_from([2**64, 2**63, -1, 1.0, True])),
    "epoch": st.sampled_from([0, 2, 2**64, 1.5]),
    "type": st.sampled_from(["tool.completed", "agent.started", "control.cancel", "bad type",
                             "x.v.thing.done", "attention.routed"]),
    "capture": st.sampled_from(["none", "metadata", "redacted", "full", "bogus"]),
    "severity": st.sampled_from(["debug", "info", "notice", "error", "bogus"]),
    "time": st.sampled_from(["2026-02-29T00:00:00Z", "2024-02-29T23:59:60Z", "nope",
                             "2026-11-30T12:00:00.5+01:00"]),
    "region": st.one_of(st.text(max_size=3), st.integers(-2**65, 2**65), st.floats(), st.none()),
    "Bad": st.just("x"),
    "session": st.sampled_from(["s", "", 7]),
})


def _text(ev: dict, ascii_: bool, spaced: bool, dup: str | None) -> str:
    text = json.dumps(ev, ensure_ascii=ascii_, separators=(", ", ": ") if spaced else (",", ":"))
    if dup is not None and text.startswith("{"):
        text = "{" + dup + "," + text[1:] if len(text) > 2 else text  # a repeated key: the last wins
    return text


@settings(max_examples=3000, deadline=None)
@given(i=st.integers(0, 10**6), data=_data, over=_overrides, ascii_=st.booleans(),
       spaced=st.booleans(), drop=st.sets(st.sampled_from(["aep", "id", "agent", "source"])),
       dup=st.one_of(st.none(), st.sampled_from(['"seq":3', '"data":{}', '"aep":"0.2"', '"id":"z"',
                                                 '"seq":18446744073709551616'])),
       pad=st.sampled_from(["", " ", "\r", "\t \r"]))
def test_formed_entry_equals_the_long_way(i, data, over, ascii_, spaced, drop, dup, pad):
    ev = _event(i, **over)
    if data is None:
        ev.pop("data")
    else:
        ev["data"] = data
    for k in drop:
        ev.pop(k, None)
    try:
        text = _text(ev, ascii_, spaced, dup) + pad
    except ValueError:
        return  # (json.dumps of NaN is allowed; nothing else refuses here)
    try:
        line = text.encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate written raw: the body would not be UTF-8 (its own 400)
    assert _fields(_fast_way(line)) == _fields(_long_way(text))


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet='{}[]":,0123456789.eE-+ \t\r\\ua"', max_size=60))
def test_formed_entry_equals_the_long_way_on_any_text(text):
    assert _fields(_fast_way(text.encode())) == _fields(_long_way(text))


def test_the_events_emitters_send_take_the_bytes_path():
    """Not vacuous: the common events are answered by formed_entry itself."""
    for ev in (_event(3), _event(4, data={"n": [1, {"a": None, "b": True}]}),
               _event(5, type="agent.started", session=None)):
        ev = {k: v for k, v in ev.items() if v is not None}
        if ev["type"].startswith("agent."):
            for k in ("session", "seq", "epoch"):
                ev.pop(k, None)
        e = formed_entry(json.dumps(ev).encode())
        assert e is not None and _fields(e) == _fields(_long_way(json.dumps(ev)))
    deep = _event(6, data={"d": _nest(1, MAX_DATA_DEPTH - 1, "list")})
    assert formed_entry(json.dumps(deep).encode()) is not None
    assert formed_entry(json.dumps(_event(6, data={"d": _nest(1, MAX_DATA_DEPTH, "list")})).encode()) is None
    assert formed_entry(json.dumps(_event(7, data={"f": 1.5})).encode()) is None  # a float: the long way


# -- the whole POST answer -----------------------------------------------------------------

def _reference_answer(relay: Relay, body: bytes, batch: bool):
    """The POST path's answer written the long way on the body's text (what
    it did before it read the lines' bytes); ``None`` for a batch it takes."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return 400, {"error": "invalid-event", "detail": "body is not UTF-8"}
    parts = text.split("\n") if batch else [text]
    indexed = [(i, ln) for i, ln in enumerate(parts) if ln.strip(" \t\r")] if batch \
        else [(0, text)]
    entries = []
    for i, ln in indexed:
        where = {"line": i} if batch else {}
        got = _long_way(ln)
        if isinstance(got, tuple):
            detail = got[1] if got[0] == "invalid" else f"not valid JSON: {got[1]}"
            return 400, {"error": "invalid-event", "detail": detail, **where}
        if got.pos is None and got.attrs["type"].startswith("control."):
            return 403, {"error": "unauthorized", **where, "detail":
                         "commands flow only on an authenticated WebSocket (AEP-0004 §4.1)"}
        entries.append(got)
    problem = relay.check_batch(entries)
    if problem is not None:
        where = {"line": indexed[problem[0]][0]} if batch else {}
        return 400, {"error": "invalid-event", "detail": problem[1], **where}
    return 202, {"accepted": len(entries)}


async def _post(relay: Relay, body: bytes, batch: bool):
    app = make_app(relay)
    sent: list = []
    ctype = b"application/x-ndjson" if batch else b"application/json"
    scope = {"type": "http", "path": "/events", "method": "POST", "query_string": b"",
             "server": ("127.0.0.1", 1), "headers": [
                 (b"host", b"127.0.0.1"), (b"content-type", ctype), (b"aep-version", b"0.1")]}
    msgs = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive():
        return next(msgs)

    async def send(m):
        sent.append(m)
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


_line = st.one_of(
    st.builds(lambda i, over: json.dumps(_event(i, **over)), st.integers(0, 6), _overrides),
    st.builds(lambda i, v: json.dumps(_event(i, data={"v": v})), st.integers(0, 6), _value),
    st.sampled_from(["", " ", "\t\r", "\x0b", "\u2028", "{}", "x", "[1,2]", "\ufeff{}"]))


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(_line, min_size=1, max_size=6), batch=st.booleans(),
       crlf=st.booleans(), broken=st.booleans())
def test_the_post_answer_equals_the_long_way(lines, batch, crlf, broken):
    text = ("\r\n" if crlf else "\n").join(lines)
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:
        body = text.encode("utf-8", "surrogatepass")
    if broken:
        body += b"\n\xff"
    relay = Relay()
    expected = _reference_answer(relay, body, batch)
    held_before = relay.buffers.held("s")
    got = trio.run(_post, relay, body, batch)
    assert got == expected
    if expected[0] == 202:
        assert relay.counters["events"] == expected[1]["accepted"]
    else:
        assert relay.counters["events"] == 0 and relay.buffers.held("s") == held_before
