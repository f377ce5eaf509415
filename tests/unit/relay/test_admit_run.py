"""The fleet's trusted admission of a drain in one call
(``LocalEmitter.ingest_stamped_run`` / ``Relay.admit_stamped_run``, issue
11) held equal to the path it skips: one ``ingest_stamped`` per envelope,
with the envelope a run stops at (a command, a redelivered duplicate, a
forged position, another emitter's source, another agent) answered by
``ingest_stamped`` itself. Compared: each answer, the relay's counters, what
its buffers hold, what a live SSE subscriber is offered, and the claims."""
from __future__ import annotations

import copy
import logging

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.aep import dumps
from bridges.core.envelope import Stamper
from supervisor.relay.attrmatch import Filter
from supervisor.relay.core import Relay
from supervisor.relay.envelope import InvalidEvent


def _hello(agent: str) -> dict:
    return {"role": "emitter", "identity": {"agent": agent, "instance": "h"},
            "capabilities": {"emits": ["x"], "control": {"accepts": [], "ack_window_ms": 1000}}}


async def _noop(cmd):
    return None


ops = st.lists(st.one_of(
    st.tuples(st.just("ev"), st.integers(0, 1), st.sampled_from(["s1", "s2", "s3"])),
    st.tuples(st.just("dup"), st.integers(0, 50)),
    st.tuples(st.just("forge"), st.integers(0, 50)),
    st.tuples(st.just("reid"), st.integers(0, 50)),
    # commands (core and vendor) and a control.* type that is not one
    st.tuples(st.just("cmd"), st.sampled_from(["s1", "s2"]),
              st.sampled_from(["control.cancel", "x.codex.control.stop", "control.interrupt"])),
    st.tuples(st.just("agent"), st.sampled_from(["s1", "s2"])),
), max_size=40)


def _pairs(script, stampers):
    pairs: list[tuple[dict, bytes]] = []
    for op in script:
        if op[0] == "ev":
            ev = stampers[op[1]].stamp(op[2], {"type": "x.codex.tool.seen", "data": {"n": len(pairs)}})
        elif op[0] in ("dup", "forge", "reid") and pairs:
            ev = copy.deepcopy(pairs[op[1] % len(pairs)][0])
            if op[0] == "forge":  # a different event at a taken position
                ev["id"] = stampers[0].stamp(None, {"type": "agent.heartbeat"})["id"]
            elif op[0] == "reid" and "seq" in ev:  # a taken id at another position
                ev["seq"] += 100
        elif op[0] == "cmd":
            ev = {"aep": "0.1", "id": stampers[0].stamp(None, {"type": "agent.heartbeat"})["id"],
                  "type": op[2], "source": "aep://x", "agent": "codex",
                  "session": op[1], "time": "2026-12-01T00:00:00Z", "data": {}}
        elif op[0] == "agent":
            ev = stampers[0].stamp(op[1], {"type": "x.codex.tool.seen"})
            ev["agent"] = "someone-else"
        else:
            continue
        pairs.append((ev, dumps(ev)))
    return pairs


def _world(other_owns: dict | None):
    relay = Relay(buffer=1000)
    outlet = relay.open_stream(Filter({}), None, plan_all=False, positions=None, live=True)
    # a second stream: another filter and a capture ceiling (down-leveled views)
    relay.open_stream(Filter({"session": "s1"}), "none", plan_all=False, positions=None, live=True)
    conn = relay.attach_emitter(_hello("codex"), _noop)
    if other_owns is not None:  # another emitter sent under the second stamper's source
        other = relay.attach_emitter(_hello("codex"), _noop)
        other.ingest_stamped(other_owns, dumps(other_owns))
    return relay, outlet, conn


def _answer(conn, ev, raw, said: list) -> None:
    try:
        if not conn.ingest_stamped(ev, raw):
            said.append("not taken")
        else:
            said.append("taken")
    except InvalidEvent as e:
        said.append(f"refused: {e}")


def _seen(relay, outlet, conn):
    held = {k: list(s.entries) for k, s in relay.buffers._sessions.items()}
    return (dict(relay.counters), held, [[repr(i) for i in o.flat()] for o in
                                         sorted(relay.outlets, key=lambda o: o is not outlet)],
            list(conn.claims), list(conn.sources), relay._admitted)


@settings(max_examples=200, deadline=None)
@given(ops, st.booleans(), st.integers(0, 3))
def test_a_run_equals_one_ingest_stamped_per_envelope(script, contested, split):
    logging.getLogger("supervisor.relay").setLevel(logging.ERROR)

    async def main():
        stampers = [Stamper("codex", host="h", epoch=1), Stamper("codex", host="k", epoch=1)]
        owns = stampers[1].stamp("s1", {"type": "x.codex.tool.seen"}) if contested else None
        pairs = _pairs(script, stampers)

        relay, outlet, conn = _world(owns)
        slow: list[str] = []
        for ev, raw in pairs:
            _answer(conn, ev, raw, slow)
        want = _seen(relay, outlet, conn)

        relay, outlet, conn = _world(owns)
        fast: list[str] = []
        cut = min(split, len(pairs))  # the fleet hands runs of any length
        for lo, hi in ((0, cut), (cut, len(pairs))):
            chunk = pairs[lo:hi]
            i = 0
            while i < len(chunk):
                j = conn.ingest_stamped_run(chunk, i)
                assert i <= j <= len(chunk)
                fast.extend(["taken"] * (j - i))
                if j < len(chunk):
                    _answer(conn, *chunk[j], fast)
                    j += 1
                i = j
        assert fast == slow
        assert _seen(relay, outlet, conn) == want

    trio.run(main)
