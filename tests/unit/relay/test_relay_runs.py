"""The POST path's run shortcuts (issue 11) held equal to the one-event
paths they skip: :meth:`Relay._admit_run` (buffers, then
:meth:`Fanout.offer_run`) against one :meth:`Relay._admit` per entry, and
:meth:`Outlet.offer_many` against one :meth:`Outlet.offer` per item. Equal
means: every outlet queues the same items in the same order (payloads,
sizes, severities, WS marks), sheds and counts the same (§8.4 order:
``debug``/``info`` dropped past the soft budget, evicted for ``notice``+,
the stream terminated past the hard one), ends in the same state, and the
buffers hold the same entries. Small budgets make the shedding happen."""
from __future__ import annotations

import copy

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.relay.attrmatch import Filter
from supervisor.relay.buffer import Entry
from supervisor.relay.core import Relay
from supervisor.relay.envelope import to_entry
from supervisor.relay.outlet import EndItem, EventItem, FrameItem, Outlet, ReplayItem, Subscriber

FILTERS = [{}, {"session": "s1"}, {"session": ["s1", "s2"]}, {"agent": "a1"}, {"type": "tool.*"},
           {"severity": {"gte": "notice"}}, {"epoch": 0}, {"session": "s2", "agent": "a2"},
           {"capture": "full"}, {"region": "eu"}, {"region": 1}]
CEILINGS = [None, "none", "metadata", "redacted", "full"]
DATA = {"none": None, "metadata": {"status": "success", "duration_ms": 3},
        "redacted": {"status": "success", "result_redacted": "r***"},
        "full": {"status": "success", "result": "out", "result_redacted": "o**"}}

_event = st.fixed_dictionaries({
    "session": st.sampled_from(["s1", "s2", None]),
    "agent": st.sampled_from(["a1", "a2"]),
    "type": st.sampled_from(["tool.completed", "message.delta", "x.v.thing.done"]),
    "severity": st.sampled_from([None, "debug", "info", "notice", "error"]),
    "capture": st.sampled_from([None, "none", "metadata", "redacted", "full"]),
    "epoch": st.sampled_from([None, 0, 1]),
    "seq": st.integers(0, 6),
    "id": st.integers(0, 8),
    "region": st.sampled_from([None, "eu", 1, True]),
})


def _envelope(spec: dict, source_of: dict) -> dict:
    session = spec["session"]
    ev = {"aep": "0.1", "id": f"id{spec['id']}", "type": spec["type"],
          "time": "2026-11-30T12:00:00.000Z", "agent": spec["agent"]}
    if session is None:  # agent-scoped: live only
        ev["type"] = "agent.presence"
        ev["source"] = f"aep://h/agent/{spec['agent']}"
    else:
        ev["source"] = source_of.get(session, f"aep://h/agent/a/session/{session}")
        ev.update(session=session, seq=spec["seq"])
        if spec["epoch"] is not None:
            ev["epoch"] = spec["epoch"]
    for k in ("severity", "capture", "region"):
        if spec[k] is not None:
            ev[k] = spec[k]
    declared = spec["capture"] or "metadata"
    data = DATA[declared] if ev["type"] == "tool.completed" else {"n": spec["seq"]}
    if declared == "none":
        data = None
    if data is not None:
        ev["data"] = copy.deepcopy(data)
    return ev


def _item(item: object) -> tuple:
    if isinstance(item, EventItem):
        return ("event", item.payload, item.size, item.sev, item.mark)
    if isinstance(item, FrameItem):
        payload = item.payload
        return ("frame", payload() if callable(payload) else payload, item.size)
    if isinstance(item, EndItem):
        return ("end", item.end)
    assert isinstance(item, ReplayItem)
    return ("replay",)


def _outlet_state(o: Outlet) -> tuple:
    return (o.state, o.dropped, o.queued_bytes, [_item(i) for i in o.flat()], o.delivered)


def _buffers_state(relay: Relay) -> list:
    out = []
    for key, s in relay.buffers._sessions.items():
        out.append((key, s.entries[s.start:], s.keys[s.start:], sorted(s.ids), s.bytes, s.dropped))
    return out


def _subscribe(relay: Relay, subs: list, pending: bool, filters: list = FILTERS,
               ceilings: list = CEILINGS) -> list[Outlet]:
    """Subscribers ``subs`` (``(kind, filter index, ceiling index)``) on
    ``relay``, a WebSocket's later subscriptions on its first outlet; the
    first with a pending resume position when ``pending``. Their outlets."""
    outlets: list[Outlet] = []
    ws: Outlet | None = None
    for n, (kind, fi, ci) in enumerate(subs):
        if kind == "sse" or ws is None:
            o = Outlet(relay, kind)
            outlets.append(o)
            if kind == "ws":
                ws = o
        else:
            o = ws  # a second subscription on the same WebSocket
        sub = Subscriber(Filter(filters[fi]), ceilings[ci], o, sid=f"sub{n}" if kind == "ws" else None)
        relay.fanout.add(sub, {"s1": (0, 2)} if pending and n == 0 else None)
    return outlets


def _relay(soft: int, subs: list, pending: bool) -> tuple[Relay, list[Outlet]]:
    relay = Relay(buffer=4, max_sessions=3, queue_soft_bytes=soft, queue_hard_bytes=soft * 3)
    return relay, _subscribe(relay, subs, pending)


_subs = st.lists(st.tuples(st.sampled_from(["sse", "ws"]), st.integers(0, len(FILTERS) - 1),
                           st.integers(0, len(CEILINGS) - 1)), min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(specs=st.lists(_event, min_size=0, max_size=24), subs=_subs,
       soft=st.sampled_from([400, 1200, 5000, 1 << 20]), pending=st.booleans(),
       queued=st.integers(0, 3), split=st.integers(1, 24),
       shared_source=st.booleans())
def test_admit_run_equals_one_admit_per_entry(specs, subs, soft, pending, queued, split, shared_source):
    source_of = {"s1": "aep://h/agent/a", "s2": "aep://h/agent/a"} if shared_source else {}
    envelopes = [_envelope(s, source_of) for s in specs]
    one, one_outlets = _relay(soft, subs, pending)
    run, run_outlets = _relay(soft, subs, pending)
    for outlets in (one_outlets, run_outlets):
        for o in outlets:  # output already waiting: the budgets start part used
            for _ in range(queued):
                o.offer(EventItem(b"x" * 150, 150, 1))

    def admissible(relay: Relay) -> list:
        entries = []
        for ev in envelopes:
            e = to_entry(copy.deepcopy(ev))
            entries.append(e)
        return entries

    one_entries, run_entries = admissible(one), admissible(run)
    for e in one_entries:
        one._admit(e, None)
    for i in range(0, len(run_entries), split):
        run._admit_run(run_entries[i:i + split])
    assert [_outlet_state(o) for o in run_outlets] == [_outlet_state(o) for o in one_outlets]
    assert run.counters == one.counters
    assert run.buffers.counters == one.buffers.counters
    assert _buffers_state(run) == _buffers_state(one)
    assert [e.n for e in run_entries] == [e.n for e in one_entries]
    assert run.fanout.pending == one.fanout.pending


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 900), st.integers(0, 5)), max_size=20),
       queued=st.lists(st.tuples(st.integers(1, 900), st.integers(0, 5)), max_size=6),
       soft=st.integers(200, 4000), hard_x=st.integers(1, 4), in_send=st.booleans(),
       stuck=st.booleans(), state=st.sampled_from(["open", "finishing"]))
def test_offer_many_equals_one_offer_per_item(sizes, queued, soft, hard_x, in_send, stuck, state):
    async def main() -> None:
        def outlet() -> Outlet:
            relay = Relay(queue_soft_bytes=soft, queue_hard_bytes=soft * hard_x)
            o = Outlet(relay, "sse")
            for n, (size, sev) in enumerate(queued):
                o.offer(EventItem(b"q%d" % n, size, sev))
            o.in_send = in_send
            # a writer in its send since now, or for longer than stuck_s
            o.send_started = trio.current_time() - (relay.stuck_s + 1 if stuck else 0)
            o.state = state
            return o
        items = [EventItem(b"i%d" % n, size, sev) for n, (size, sev) in enumerate(sizes)]
        one, many = outlet(), outlet()
        for item in items:
            one.offer(item)
        many.offer_many(items, sum(i.size for i in items))
        assert _outlet_state(many) == _outlet_state(one)
        assert many.hub.counters == one.hub.counters
    trio.run(main, clock=trio.testing.MockClock())  # the clock stands still


def test_a_run_from_one_emitter_asks_a_constant_filter_once():
    """The shortcut is taken: a stream filtering on another session is
    asked once for a run of one session, not once per entry."""
    relay = Relay()
    calls = []

    class Counting(Filter):
        __slots__ = ()

        def matches(self, attrs):  # type: ignore[override]
            calls.append(attrs["id"])
            return super().matches(attrs)

    relay.fanout.add(Subscriber(Counting({"session": "other"}), None, Outlet(relay, "sse")))
    entries = [to_entry({"aep": "0.1", "id": f"i{n}", "type": "tool.completed",
                         "time": "2026-11-30T12:00:00Z", "source": "aep://h/agent/a/session/s",
                         "agent": "a", "session": "s", "seq": n}) for n in range(10)]
    relay._admit_run(entries)
    assert calls == ["i0"]


def test_one_verdict_needs_one_type_not_just_equal_values():
    """``True == 1`` in Python, not in attr-match (§6.2): a run whose
    ``region`` is ``true`` then ``1`` is two verdicts for ``{"region": 1}``."""
    specs = [{"session": "s1", "agent": "a1", "type": "tool.completed", "severity": None,
              "capture": None, "epoch": None, "seq": n, "id": n, "region": r}
             for n, r in enumerate([True, 1, True, 1])]
    envelopes = [_envelope(s, {}) for s in specs]
    subs = [("sse", FILTERS.index({"region": 1}), 0)]
    one, one_outlets = _relay(1 << 20, subs, False)
    run, run_outlets = _relay(1 << 20, subs, False)
    for e in [to_entry(copy.deepcopy(ev)) for ev in envelopes]:
        one._admit(e, None)
    run._admit_run([to_entry(copy.deepcopy(ev)) for ev in envelopes])
    assert len(one_outlets[0]._q) == 2
    assert [_outlet_state(o) for o in run_outlets] == [_outlet_state(o) for o in one_outlets]


# -- check_batch's fresh-run shortcut -------------------------------------------------

_held = st.lists(st.tuples(st.sampled_from(["s1", "s2"]), st.integers(0, 6), st.integers(0, 8)),
                 max_size=10)
_batch = st.lists(st.tuples(st.sampled_from(["s1", "s2", None]), st.integers(0, 8),
                            st.integers(0, 10), st.booleans()), max_size=12)


def _entry(session, seq, ident, variant, source_of):
    spec = {"session": session, "agent": "a1", "type": "tool.completed", "severity": None,
            "capture": None, "epoch": None, "seq": seq, "id": ident,
            "region": "eu" if variant else None}
    return to_entry(_envelope(spec, source_of))


@settings(max_examples=600, deadline=None)
@given(held=_held, batch=_batch, shared_source=st.booleans(), owned=st.booleans(),
       ascending=st.booleans())
def test_check_batch_fresh_run_equals_the_full_checks(held, batch, shared_source, owned, ascending):
    source_of = {"s1": "aep://h/agent/a", "s2": "aep://h/agent/a"} if shared_source else {}
    if ascending:  # what emitters send: one session, seqs going up (the shortcut's case)
        batch = [("s1", 7 + n, ident, v) for n, (_, _, ident, v) in enumerate(batch)]
    relay = Relay(buffer=5)
    if owned:  # another emitter's connection owns s2's source
        conn = relay.attach_emitter({"role": "emitter", "identity": {"agent": "a1", "instance": "h"},
                                     "capabilities": {"emits": ["x"]}}, _noop)
        relay.claims.own_source(conn, source_of.get("s2", "aep://h/agent/a/session/s2"))
    for session, seq, ident in held:
        e = _entry(session, seq, ident, False, source_of)
        if relay.check_batch([e]) is None:
            relay._admit(e, None)
    entries = [_entry(*b, source_of) for b in batch]
    fast = relay.check_batch(entries)
    relay._fresh_run = lambda entries: False  # type: ignore[method-assign]
    assert fast == relay.check_batch(entries)


async def _noop(cmd):
    return None


@pytest.mark.parametrize("batch, expected", [
    # a later entry's id is already held (other content): refused, not fresh
    ([(7, 5), (8, 3)], (1, "id")),
    # positions going back within the batch: a held position under another id
    ([(7, 5), (1, 6)], (1, "position")),
    # one id twice in the batch with other content
    ([(7, 5), (8, 5)], (1, "id")),
    # an emitter appending: nothing to refuse
    ([(7, 5), (8, 6), (9, 7)], None),
])
def test_check_batch_fresh_run_guards(batch, expected):
    relay = Relay(buffer=5)
    for seq, ident in [(0, 3), (1, 4)]:
        relay._admit(_entry("s1", seq, ident, False, {}), None)
    entries = [_entry("s1", seq, ident, False, {}) for seq, ident in batch]
    got = relay.check_batch(entries)
    relay._fresh_run = lambda entries: False  # type: ignore[method-assign]
    assert got == relay.check_batch(entries)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got[0] == expected[0] and expected[1] in got[1]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(["", " ", "\t\r", "\x0b", "\u2028", "{}", "x", " {} "]),
                      min_size=1, max_size=12))
def test_line_numbers_asked_on_demand_equal_the_indexed_lines(parts):
    """The POST path names a refused event's line from the split body when
    it answers (``_line_number``) instead of keeping ``(line, text)`` per
    event: the same line as enumerating the non-blank lines."""
    from supervisor.relay.app import _line_number
    indexed = [(i, ln) for i, ln in enumerate(parts) if ln.strip(" \t\r")]
    assert [_line_number(parts, j) for j in range(len(indexed))] == [i for i, _ in indexed]


# -- the capture check's hot keys -------------------------------------------------------

def _reference_rank(spec, value, best):
    """The capture walk over every key (what ``capcheck._max_rank`` did
    before it skipped the keys that cannot show more than metadata)."""
    for key, v in value.items():
        s = spec.get(key)
        if s is None:
            continue
        r, obj, item = s
        if r > best:
            if r == 3:
                return 3
            best = r
        elif r == 1:
            if obj is not None:
                if isinstance(v, dict):
                    best = _reference_rank(obj, v, best)
            elif item is not None and isinstance(v, list) and v:
                irank, iobj = item
                if iobj is not None:
                    for x in v:
                        if isinstance(x, dict):
                            best = _reference_rank(iobj, x, best)
                            if best == 3:
                                return 3
                elif irank > best:
                    best = irank
            if best == 3:
                return 3
    return best


def _spec_keys():
    from supervisor.relay.capcheck import _SPECS
    names: set[str] = set()

    def walk(spec):
        for k, (_, obj, item) in spec.items():
            names.add(k)
            if obj is not None:
                walk(obj)
            if item is not None and item[1] is not None:
                walk(item[1])
    for spec in _SPECS.values():
        walk(spec)
    return sorted(names) + ["junk"]


_KEYS = st.sampled_from(_spec_keys())
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=3)),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(_KEYS, c, max_size=5),
                     max_leaves=16)


def _shaped(spec, depth=0):
    """A payload laid out like ``spec`` (its keys, nested where it nests),
    with junk keys and values of other shapes mixed in."""
    keys = sorted(spec) + ["junk"]

    def value(key):
        member = spec.get(key)
        options = [_JSON]
        if member is not None and depth < 3:
            _, obj, item = member
            if obj is not None:
                options.append(_shaped(obj, depth + 1))
            if item is not None:
                options.append(st.lists(_shaped(item[1], depth + 1) if item[1] is not None
                                        else _JSON, min_size=1, max_size=3))
        return st.one_of(options)
    return st.lists(st.sampled_from(keys), max_size=6, unique=True).flatmap(
        lambda ks: st.fixed_dictionaries({k: value(k) for k in ks}))


def _typed_payloads():
    from supervisor.relay.capcheck import _SPECS
    return st.sampled_from(sorted(_SPECS)).flatmap(
        lambda t: st.tuples(st.just(t), _shaped(_SPECS[t])))


@settings(max_examples=1500, deadline=None)
@given(typed=_typed_payloads())
def test_capture_check_hot_keys_equal_the_whole_walk(typed):
    from bridges.core.aep import CAPTURE_LEVELS
    from supervisor.relay.capcheck import _SPECS, content_level
    type_, data = typed
    want = "none" if not data else CAPTURE_LEVELS[_reference_rank(_SPECS[type_], data, 1)]
    assert content_level(type_, data) == want


# -- the buffers' run admission ---------------------------------------------------------

def _buf_entry(session: str, seq: int, ident: int, size: int, source: str,
               type_: str = "tool.completed") -> Entry:
    attrs = {"id": f"i{ident}", "source": source, "type": type_,
             "session": session, "seq": seq, "epoch": 0}
    if type_ != "attention.requested":  # a close names an ask (maybe this one's)
        attrs["subject"] = f"i{ident % 4}"
    return Entry(attrs, b"x" * size, (0, seq), 1, 1)


def _whole_state(b) -> tuple:
    sessions = [(key, s.entries[s.start:], s.keys[s.start:], sorted(s.ids), s.bytes, s.dropped)
                for key, s in b._sessions.items()]
    return (sessions, b.bytes, dict(b.counters), list(b._gone.items()),
            {k: list(v) for k, v in b._names.items()}, {k: list(v) for k, v in b._sources.items()},
            {k: list(v) for k, v in b._gone_names.items()}, _orders(b))


def _orders(b) -> tuple:
    """The eviction orders and open asks (supervisor/relay/pins.py)."""
    return ([list(o) for o in (b._open, b._fleet, b._pinned_open, b._pinned_fleet)],
            {k: (s.fleet, dict(s.asks or {})) for k, s in b._sessions.items()})


# mostly an emitter appending (the shortcut's case), with duplicates, backfills,
# other sessions, a shared source, sizes that cross the byte budgets, asks
# opened and closed (the pins)
_run_step = st.tuples(st.sampled_from(["s1", "s1", "s1", "s2", "s3"]), st.integers(-2, 3),
                      st.integers(0, 30), st.sampled_from([0, 10, 300, 3000]), st.booleans(),
                      st.sampled_from(["tool.completed"] * 4 + [
                          "attention.requested", "attention.resolved", "attention.timeout",
                          "session.ended"]))


@settings(max_examples=800, deadline=None)
@given(prior=st.lists(_run_step, max_size=12), runs=st.lists(st.lists(_run_step, max_size=14), max_size=4),
       depth=st.integers(1, 6), max_sessions=st.sampled_from([1, 2, 3, 8]),
       budget=st.sampled_from([(5000, 6000), (8000, 20000), (1 << 20, 1 << 22)]))
def test_buffers_admit_run_equals_one_admit_per_entry(prior, runs, depth, max_sessions, budget):
    from supervisor.relay.buffer import SessionBuffers

    def entries(steps, seq0):
        out, seq = [], seq0
        for session, step, ident, size, shared, type_ in steps:
            seq = max(seq + step, 0)  # mostly rising, sometimes back or equal
            source = "aep://h/agent/a" if shared else f"aep://h/agent/a/session/{session}"
            out.append(_buf_entry(session, seq, ident, size, source, type_))
        return out
    one = SessionBuffers(depth, max_sessions, buffer_bytes=budget[0], total_bytes=budget[1])
    run = SessionBuffers(depth, max_sessions, buffer_bytes=budget[0], total_bytes=budget[1])
    for b in (one, run):
        for e in entries(prior, 0):
            b.admit(e)
    assert _whole_state(run) == _whole_state(one)
    for n, steps in enumerate(runs):
        for e in entries(steps, 10 * n):
            one.admit(e)
        run.admit_run(entries(steps, 10 * n))
        assert _whole_state(run) == _whole_state(one)


def test_buffers_admit_run_takes_an_appending_stretch_in_one_step():
    """The shortcut is taken: an emitter appending to a held buffer past its
    depth is not admitted entry by entry (and still trims exactly)."""
    from supervisor.relay.buffer import SessionBuffers
    b = SessionBuffers(3, 10)
    b.admit(_buf_entry("s1", 0, 0, 10, "aep://h/s1"))
    calls = []
    b.admit = lambda e: calls.append(e)  # type: ignore[method-assign]
    b.admit_run([_buf_entry("s1", seq, seq, 10, "aep://h/s1") for seq in range(1, 9)])
    assert calls == []
    s = b._sessions[("aep://h/s1", "s1")]
    assert s.keys[s.start:] == [(0, 6), (0, 7), (0, 8)] and s.dropped == (0, 5)
    assert sorted(s.ids) == [f"i{n}" for n in (6, 7, 8)]
    assert b.counters["trimmed"] == 6 and b.bytes == 3 * (10 + 1024)


# -- the encode of a well-formed event ---------------------------------------------------

class _Colour(__import__("enum").Enum):
    RED = "red"


_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2 ** 63, max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-05, 1e16, 1e+22, -0.0, 0.1, 123456789.125, 5e-324]),
    st.text(max_size=4), st.sampled_from(["\ud800", "é", "\u2028", "\x00"]),
    st.sampled_from([_Colour.RED, __import__("uuid").UUID(int=7), b"b"]))
_value = st.recursive(_scalar, lambda c: st.lists(c, max_size=3) | st.tuples(c, c)
                      | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=10)


@settings(max_examples=1500, deadline=None)
@given(data=st.one_of(st.none(), st.dictionaries(st.text(max_size=4), _value, max_size=4)),
       ext=st.dictionaries(st.sampled_from(["region", "n", "flag"]),
                           st.one_of(st.text(max_size=3), st.integers(), st.booleans(),
                                     st.integers(min_value=2 ** 64, max_value=2 ** 66)), max_size=2),
       seq=st.one_of(st.integers(0, 10), st.integers(2 ** 64, 2 ** 66)))
def test_encode_of_a_well_formed_event_equals_encode(data, ext, seq):
    """``_encode_formed`` (orjson, ``data`` alone walked) gives what
    :func:`encode` gives for every event :func:`well_formed` passes: the
    same bytes, or the same refusal."""
    from supervisor.relay.envelope import InvalidEvent, _encode_formed, encode, well_formed
    ev = {"aep": "0.1", "id": "i1", "type": "tool.completed", "time": "2026-11-30T12:00:00Z",
          "source": "aep://h/agent/a/session/s", "agent": "a", "session": "s", "seq": seq, **ext}
    if data is not None:
        ev["data"] = data
    if not well_formed(ev):
        return

    def answer(f):
        try:
            return f(ev)
        except InvalidEvent as e:
            return ("refused", str(e))
    assert answer(_encode_formed) == answer(encode)
