"""The trusted run's stretch of appends (issue 11):
:meth:`SessionBuffers.append_stamped` (a drain's pairs that merely append
to the buffer of the event admitted just before, admitted in one loop with
no :class:`Entry`) and :meth:`Fanout.offer_held` (their fan-out from the
held tuples) held equal to the paths they skip. Each drain goes three
ways: one ``ingest_stamped`` per envelope (the one-event path), the run
with the stretch turned off (every pair through ``_admit`` and
``Fanout.offer_run``), and the run as it is. Compared: each answer (a
``RunFault``'s resume index included), the relay's counters, everything
the buffers hold and remember (entries, positions, ids, bytes, drops,
recency, evicted buffers), what every outlet queued, shed and counted
(SSE and WebSocket, filters and capture ceilings, small budgets, resume
positions waiting), the claims and the admission counter.

The drains are what the fleet hands over with what can go wrong in one:
two emitter sessions and another emitter's source interleaved, duplicates,
forged positions, reused ids, backfills, epochs up and down, a ``seq``
that is no ``int``, unknown severities, other capture levels, extension
attributes, reordered keys, no ``data``, another agent, commands, a type
that is no string, events too big for a buffer, the depth and both byte
budgets trimming and evicting, and a fault injected in a trim (an
admission that raises part way)."""
from __future__ import annotations

import copy

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.aep import dumps
from bridges.core.envelope import Stamper
from supervisor.relay.attrmatch import Filter
from supervisor.relay.buffer import Entry, SessionBuffers
from supervisor.relay.core import Relay, RunFault
from supervisor.relay.envelope import InvalidEvent, to_entry
from supervisor.relay.outlet import Outlet

from . import test_relay_runs as _runs

FILTERS = [{}, {"agent": "codex"}, {"session": "s1"}, {"type": "x.codex.*"},
           {"severity": {"gte": "notice"}}, {"capture": "full"}, {"agent": "codex", "session": "s2"},
           {"epoch": 2}, {"ext": 1}, {"session": ["s1", "s2"]}]
CEILINGS = [None, "none", "metadata", "full"]
TYPES = ["x.codex.otel.sse_event", "x.codex.otel.api_request", "tool.completed",
         "attention.requested", "attention.resolved"]  # (an ask opened, closed: the pins)
MUTATIONS = [None] * 8 + [
    "dup", "forge", "reid", "backfill", "epoch_up", "epoch_down", "no_epoch", "seq_bool",
    "seq_float", "sev_notice", "sev_debug", "sev_bad", "capture_full", "capture_none", "no_data",
    "reorder", "ext", "ext_true", "agent_other", "big", "command", "type_int", "session_int",
    "source_copy", "session_copy"]

_op = st.tuples(st.integers(0, 1), st.sampled_from(["s1", "s2"]), st.sampled_from(TYPES),
                st.sampled_from(MUTATIONS), st.integers(0, 60))


def _pairs(script: list, stampers: list[Stamper]) -> list[tuple[dict, bytes]]:
    pairs: list[tuple[dict, bytes]] = []
    epochs = {}
    for who, session, type_, mut, pick in script:
        st_ = stampers[who]
        prev = pairs[pick % len(pairs)][0] if pairs else None
        emission = {"type": type_, "data": {"n": len(pairs)}}
        if type_ == "attention.resolved" and prev is not None:  # closes an ask (maybe)
            emission["subject"] = prev["id"]
        ev = st_.stamp(session, emission)
        if (who, session) in epochs:
            ev["epoch"] = epochs[who, session]
        if mut == "dup" and prev is not None:
            ev = copy.deepcopy(prev)
        elif mut == "forge" and prev is not None and "seq" in prev:
            ev = copy.deepcopy(prev)
            ev["id"] = st_.stamp(None, {"type": "agent.heartbeat"})["id"]
        elif mut == "reid" and prev is not None and "seq" in prev:
            ev = copy.deepcopy(prev)
            ev["seq"] = ev["seq"] + 1000 if type(ev["seq"]) is int else 1000
        elif mut == "backfill" and ev["seq"] > 1:
            ev["seq"] -= 2
        elif mut in ("epoch_up", "epoch_down"):
            ev["epoch"] = epochs[who, session] = ev.get("epoch", 0) + (1 if mut == "epoch_up" else -1)
        elif mut == "no_epoch":
            del ev["epoch"]
        elif mut == "seq_bool":
            ev["seq"] = True
        elif mut == "seq_float":
            ev["seq"] = float(ev["seq"])
        elif mut in ("sev_notice", "sev_debug", "sev_bad"):
            ev["severity"] = {"sev_notice": "notice", "sev_debug": "debug", "sev_bad": "warn"}[mut]
        elif mut == "capture_full":
            ev["capture"] = "full"
            ev["data"] = {"status": "success", "result": "out", "result_redacted": "o**"}
        elif mut == "capture_none":
            ev["capture"] = "none"
            ev.pop("data", None)
        elif mut == "no_data":
            ev.pop("data", None)
        elif mut == "reorder":
            ev = dict(reversed(list(ev.items())))
        elif mut in ("ext", "ext_true"):
            data = ev.pop("data")
            ev["ext"] = 1 if mut == "ext" else True
            ev["data"] = data
        elif mut == "agent_other":
            ev["agent"] = "someone-else"
        elif mut == "big":
            ev["data"] = {"blob": "x" * 3000}
        elif mut == "command":
            ev = {"aep": "0.1", "id": st_.stamp(None, {"type": "agent.heartbeat"})["id"],
                  "type": "control.cancel", "source": ev["source"], "agent": "codex",
                  "session": session, "time": ev["time"], "data": {}}
        elif mut == "type_int":
            ev["type"] = 5
        elif mut == "session_int":
            ev["session"] = 7
        elif mut in ("source_copy", "session_copy"):  # an equal str, not the stamper's own object
            key = mut.split("_")[0]
            ev[key] = "".join(list(ev[key]))
        pairs.append((ev, dumps(ev)))
    return pairs


def _hello() -> dict:
    return {"role": "emitter", "identity": {"agent": "codex", "instance": "h"},
            "capabilities": {"emits": ["x"], "control": {"accepts": [], "ack_window_ms": 1000}}}


async def _noop(cmd):
    return None


def _world(w: dict, subs: list, owns: dict | None):
    relay = Relay(buffer=w["depth"], max_sessions=w["max_sessions"], buffer_bytes=w["buffer_bytes"],
                  total_bytes=w["buffer_bytes"] * w["total_x"], queue_soft_bytes=w["soft"],
                  queue_hard_bytes=w["soft"] * 3)
    outlets = _runs._subscribe(relay, subs, w["pending"], FILTERS, CEILINGS)
    conn = relay.attach_emitter(_hello(), _noop)
    if owns is not None:  # another emitter sent under the second stamper's source
        other = relay.attach_emitter(_hello(), _noop)
        other.ingest_stamped(copy.deepcopy(owns), dumps(owns))
    if w["fault_at"]:
        real, calls = relay.buffers._trim, [0]

        def flaky(s):
            calls[0] += 1
            if calls[0] == w["fault_at"]:
                raise RuntimeError("trim broke")
            return real(s)
        relay.buffers._trim = flaky  # type: ignore[method-assign]
    return relay, outlets, conn


_item = _runs._item


def _seen(relay: Relay, outlets: list[Outlet], conn) -> tuple:
    b = relay.buffers
    held = [(key, s.entries[s.start:], s.keys[s.start:], sorted(s.ids.items()), s.bytes, s.dropped)
            for key, s in b._sessions.items()]
    return (dict(relay.counters), dict(b.counters), held, b.bytes, list(b._gone.items()),
            {k: list(v) for k, v in b._names.items() if v}, {k: list(v) for k, v in b._sources.items() if v},
            [(o.state, o.dropped, o.queued_bytes, [_item(i) for i in o.flat()], o.delivered)
             for o in outlets],
            list(conn.claims), list(conn.sources), relay._admitted, relay.fanout.pending,
            _runs._orders(b))


def _answer(conn, ev, raw, said: list) -> None:
    try:
        said.append("taken" if conn.ingest_stamped(ev, raw) else "not taken")
    except InvalidEvent as e:
        said.append(f"refused: {e}")
    except Exception as e:  # noqa: BLE001 -- a bad envelope's or an injected fault's own answer
        said.append(f"raised {type(e).__name__}")


def _by_runs(conn, pairs: list, cut: int, said: list) -> None:
    for lo, hi in ((0, cut), (cut, len(pairs))):  # the fleet hands runs of any length
        chunk = pairs[lo:hi]
        i = 0
        while i < len(chunk):
            try:
                j = conn.ingest_stamped_run(chunk, i)
            except RunFault as f:  # the pair before f.taken raised inside its admission
                assert i < f.taken <= len(chunk)
                said.extend(["taken"] * (f.taken - 1 - i))
                said.append(f"raised {type(f.__cause__).__name__}")
                i = f.taken
                continue
            assert i <= j <= len(chunk)
            said.extend(["taken"] * (j - i))
            if j < len(chunk):
                _answer(conn, *chunk[j], said)
                j += 1
            i = j


_world_st = st.fixed_dictionaries({
    "depth": st.sampled_from([1, 3, 1000]), "max_sessions": st.sampled_from([2, 10]),
    "buffer_bytes": st.sampled_from([3000, 9000, 1 << 20]), "total_x": st.sampled_from([1, 2, 64]),
    "soft": st.sampled_from([1500, 6000, 1 << 20]), "pending": st.booleans(),
    "fault_at": st.sampled_from([0, 0, 0, 1, 2, 5, 9])})
_subs = st.lists(st.tuples(st.sampled_from(["sse", "sse", "ws"]), st.integers(0, len(FILTERS) - 1),
                           st.integers(0, len(CEILINGS) - 1)), min_size=0, max_size=4)


@settings(max_examples=400, deadline=None)
@given(st.lists(_op, max_size=40), _world_st, _subs, st.booleans(), st.integers(0, 40))
def test_the_stretch_equals_the_one_event_path_and_the_run_without_it(script, w, subs, contested, cut):
    async def main():
        stampers = [Stamper("codex", host="h", epoch=1), Stamper("codex", host="k", epoch=1)]
        owns = stampers[1].stamp("s2", {"type": "x.codex.tool.seen"}) if contested else None
        pairs = _pairs(script, stampers)
        cut_at = min(cut, len(pairs))
        seen = []
        for way in ("one", "no stretch", "stretch"):
            relay, outlets, conn = _world(w, subs, owns)
            said: list[str] = []
            if way == "one":
                for ev, raw in copy.deepcopy(pairs):
                    _answer(conn, ev, raw, said)
            else:
                if way == "no stretch":
                    relay.buffers.append_stamped = (  # type: ignore[method-assign]
                        lambda key, pairs, start, n, *rest: (start, n, []))
                _by_runs(conn, copy.deepcopy(pairs), cut_at, said)
            seen.append((said, _seen(relay, outlets, conn)))
        assert seen[1] == seen[0]
        assert seen[2] == seen[0]

    trio.run(main)


def test_a_drain_of_one_session_is_one_stretch_fanned_out_from_held_tuples():
    """The common drain (one emitter session appending, one SSE stream on
    ``agent``) takes the stretch: one pair through ``_admit``, the rest
    appended in one call, fanned out as one run made from held tuples (no
    entry is made for it)."""
    relay = Relay(buffer=1000)
    outlet = relay.open_stream(Filter({"agent": "codex"}), None, plan_all=False, positions=None,
                               live=True)
    conn = relay.attach_emitter(_hello(), _noop)
    stamper = Stamper("codex", host="h")
    pairs = []
    for n in range(50):
        ev = stamper.stamp("s1", {"type": TYPES[n % 2], "data": {"n": n}})
        pairs.append((ev, dumps(ev)))
    admitted, stretched, offered = [], [], []
    real_admit, real_append, real_held = relay._admit, relay.buffers.append_stamped, relay.fanout.offer_held
    relay._admit = lambda e, c: (admitted.append(e), real_admit(e, c))[1]  # type: ignore[method-assign]
    relay.buffers.append_stamped = (  # type: ignore[method-assign]
        lambda *a: (stretched.append(a[2]), real_append(*a))[1])
    relay.fanout.offer_held = lambda held: (offered.append(len(held)), real_held(held))[1]  # type: ignore[method-assign]
    assert conn.ingest_stamped_run(pairs, 0) == 50
    assert len(admitted) == 1 and stretched == [1] and offered == [50]
    assert relay.counters["events"] == 50 and relay.buffers.held(("aep://h/agent/codex/session/s1", "s1")) == 50
    body = b"".join(i.payload for i in outlet.flat())
    assert body.count(b"\ndata: ") == 50 and b"id: s1:0:49\n\n" in body


def test_a_fault_in_a_stretch_names_the_pair_after_it_and_keeps_the_count():
    """A trim that raises inside the stretch: ``RunFault.taken`` is the
    index after the pair whose append raised; that pair is buffered and
    counted, not fanned out (as on the one-event path), and a drain handed
    on from there is admitted whole."""
    relay = Relay(buffer=2)
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    conn = relay.attach_emitter(_hello(), _noop)
    stamper = Stamper("codex", host="h")
    pairs = [(ev, dumps(ev)) for ev in (stamper.stamp("s1", {"type": TYPES[0]}) for _ in range(8))]
    real, calls = SessionBuffers._trim, [0]

    def flaky(self, s):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("trim broke")
        return real(self, s)
    relay.buffers._trim = flaky.__get__(relay.buffers)  # type: ignore[method-assign]
    try:
        conn.ingest_stamped_run(pairs, 0)
    except RunFault as f:
        taken = f.taken
    else:
        raise AssertionError("no RunFault")
    assert taken == 4  # pairs 0-3 admitted; the trim of pair 3's append raised
    assert relay.counters["events"] == 4 and relay._admitted == 4
    live = [i.payload for i in outlet.flat()]
    assert [b'"seq":%d' % n in p for n, p in zip(range(3), live, strict=True)] == [True] * 3 and len(live) == 3
    assert conn.ingest_stamped_run(pairs, taken) == 8
    assert relay.counters["events"] == 8 and len(outlet.flat()) == 7
    assert relay.buffers.counters["duplicates"] == 0


@settings(max_examples=400, deadline=None)
@given(specs=st.lists(_runs._event, max_size=24), subs=_runs._subs,
       soft=st.sampled_from([400, 1200, 5000, 1 << 20]), pending=st.booleans(),
       same_session=st.booleans(), uniform=st.booleans())
def test_offer_held_equals_offer_run_of_the_entries(specs, subs, soft, pending, same_session, uniform):
    """:meth:`Fanout.offer_held` (the run's SSE messages, filter verdicts
    and capture top read from the held tuples) against
    :meth:`Fanout.offer_run` of the entries they were made from: the
    events of one buffer or not, of one layout or several, every filter
    and ceiling of the POST path's test, WebSockets, small budgets and
    resume positions waiting; ``uniform``: all of one layout, so the
    verdicts are read by index (``True`` is not ``1`` there either)."""
    if uniform:  # every optional attribute present: one layout, the values still vary
        fill = {"severity": "info", "capture": "metadata", "epoch": 0, "region": 1}
        specs = [{k: fill[k] if v is None and k in fill else v for k, v in s.items()} for s in specs]
    envelopes = [_runs._envelope(dict(s, session="s1") if same_session else s, {})
                 for s in specs if s["session"] is not None or same_session]
    held = []
    for n, ev in enumerate(envelopes, 1):
        e = to_entry(copy.deepcopy(ev))
        e.n = n
        held.append(e.held())
    by_held, held_outlets = _runs._relay(soft, subs, pending)
    by_run, run_outlets = _runs._relay(soft, subs, pending)
    by_held.fanout.offer_held(held)
    by_run.fanout.offer_run([Entry.from_held(h) for h in held])
    assert [_runs._outlet_state(o) for o in held_outlets] == [_runs._outlet_state(o) for o in run_outlets]
    assert by_held.counters == by_run.counters
    assert by_held.fanout.pending == by_run.fanout.pending


def test_a_held_verdict_for_the_whole_run_needs_one_type_not_just_equal_values():
    """``True == 1`` in Python, not in attr-match: held tuples of one
    layout whose ``region`` is ``1`` and ``True`` are no constant run for a
    filter on it (each verdict its own), in either order."""
    base = {"session": "s1", "agent": "a1", "type": "tool.completed", "severity": "info",
            "capture": "metadata", "epoch": 0}
    for regions in ([1, True], [True, 1], [1, True, 1]):
        held = []
        for n, region in enumerate(regions):
            e = to_entry(_runs._envelope(dict(base, seq=n, id=n, region=region), {}))
            e.n = n + 1
            held.append(e.held())
        assert all(h[0] is held[0][0] for h in held)  # one layout: read by index
        for fi in (_runs.FILTERS.index({"region": 1}), 0):
            relay, outlets = _runs._relay(1 << 20, [("sse", fi, 0)], False)
            relay.fanout.offer_held(held)
            got = [i.payload for i in outlets[0].flat()]
            want = [p for p, r in zip(_held_sse(held), regions, strict=True)
                    if fi == 0 or type(r) is int]
            assert got == want


def _held_sse(held: list) -> list[bytes]:
    out = []
    for h in held:
        e = Entry.from_held(h)
        out.append(b"event: %s\ndata: %s\nid: %s:%d:%d\n\n" % (
            e.attrs["type"].encode(), e.raw, e.attrs["session"].encode(), *e.pos))
    return out


def test_a_stretch_after_a_redelivered_duplicate_makes_its_buffer_the_most_recent():
    """A duplicate is not a write (its buffer keeps its place in the
    recency order); the appends after it are: as one admission each, the
    stretch that follows it moves its buffer to the recent end."""
    stamper = Stamper("codex", host="h")
    s1 = [stamper.stamp("s1", {"type": TYPES[0]}) for _ in range(3)]
    s2 = [stamper.stamp("s2", {"type": TYPES[0]}) for _ in range(2)]
    drain = s1[:1] + s2 + [copy.deepcopy(s1[0])] + s1[1:]
    pairs = [(ev, dumps(ev)) for ev in drain]
    for way in ("one", "run"):
        relay = Relay()
        conn = relay.attach_emitter(_hello(), _noop)
        if way == "one":
            for ev, raw in pairs:
                conn.ingest_stamped(ev, raw)
        else:
            assert conn.ingest_stamped_run(pairs, 0) == len(pairs)
        assert [k[1] for k in relay.buffers.sessions()] == ["s2", "s1"]
        assert relay.buffers.counters["duplicates"] == 1 and relay.counters["events"] == 6
