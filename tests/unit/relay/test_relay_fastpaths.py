"""The relay's hot-path shortcuts (issue 11) held equal to the slow paths
they skip: the SSE framing memo, :meth:`SessionBuffers.fresh` against the
position and identity checks it lets ``check_batch`` skip, the fan-out's
as-ingested view against :meth:`Fanout.render`."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core.aep import CAPTURE_RANK
from supervisor.relay.buffer import Entry, SessionBuffers
from supervisor.relay.fanout import View, sse_safe

SRC = "aep://h/agent/a"


def _reference_sse(e: Entry, raw: bytes) -> bytes:
    """The SSE message as AEP-0003 §3.3.2 frames it, written plainly."""
    parts = [b"event: ", e.attrs["type"].encode(), b"\ndata: ", raw, b"\n"]
    session = e.attrs.get("session")
    if e.pos is not None and isinstance(session, str) and sse_safe(session):
        parts.append(f"id: {session}:{e.pos[0]}:{e.pos[1]}\n".encode())
    parts.append(b"\n")
    return b"".join(parts)


@settings(max_examples=300, deadline=None)
@given(type_=st.sampled_from(["tool.completed", "agent.started", "x.v.thing.done"]),
       session=st.one_of(st.none(), st.text(max_size=6), st.sampled_from(["s1", "a\nb", "c\rd", "e\0"])),
       pos=st.one_of(st.none(), st.tuples(st.integers(0, 2**40), st.integers(0, 2**64))),
       raw=st.binary(max_size=30))
def test_sse_framing_equals_the_plain_rendering(type_, session, pos, raw):
    attrs = {"id": "i", "source": SRC, "type": type_}
    if session is not None:
        attrs["session"] = session
    if pos is not None and session is None:
        attrs["session"] = session = "s"
    e = Entry(attrs, raw, pos, 1, 1)
    assert View(e, raw).sse() == _reference_sse(e, raw)
    assert View(e, raw).sse() == _reference_sse(e, raw)  # memoized the second time


_ops = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 6)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(admitted=_ops, probe=st.tuples(st.integers(0, 2), st.integers(0, 14), st.integers(0, 8)),
       depth=st.integers(1, 6))
def test_fresh_implies_no_position_or_identity_refusal(admitted, probe, depth):
    b = SessionBuffers(depth, 2)

    def entry(epoch, seq, ident, raw=b"{}"):
        return Entry({"id": f"id{ident}", "source": SRC, "type": "tool.completed", "session": "s",
                      "seq": seq, "epoch": epoch}, raw, (epoch, seq), 1, 1)

    for epoch, seq, ident in admitted:
        e = entry(epoch, seq, ident)
        if not b.conflict(e) and not b.conflicting_duplicate(e):
            b.admit(e)
    p = entry(*probe, raw=b'{"other":1}')
    if b.fresh(p):
        assert not b.conflict(p) and not b.conflicting_duplicate(p)



_CEILINGS = st.sampled_from([None, "none", "metadata", "redacted", "full"])


@settings(max_examples=200, deadline=None)
@given(declared=st.sampled_from(["none", "metadata", "redacted", "full"]),
       ceilings=st.lists(_CEILINGS, min_size=1, max_size=6))
def test_fanout_views_equal_render_per_ceiling(declared, ceilings):
    """Fanout.offer's as-ingested view (no view() cache) and view()'s
    down-leveled ones queue what render() gives for each subscriber's
    ceiling, one shared item per effective ceiling."""
    from supervisor.relay.attrmatch import Filter
    from supervisor.relay.core import Relay
    from supervisor.relay.envelope import to_entry
    from supervisor.relay.outlet import Outlet, Subscriber

    relay = Relay()
    data = {"none": None, "metadata": {"status": "success", "duration_ms": 3},
            "redacted": {"status": "success", "result_redacted": "r***"},
            "full": {"status": "success", "result": "out", "result_redacted": "o**"}}[declared]
    ev = {"aep": "0.1", "id": "01J", "type": "tool.completed", "time": "2026-11-30T12:00:00.000Z",
          "source": SRC, "agent": "a", "session": "s", "seq": 1, "capture": declared}
    if data is not None:
        ev["data"] = data
    e = to_entry(ev)
    outlets = []
    for c in ceilings:
        o = Outlet(relay, "sse")
        relay.fanout.add(Subscriber(Filter({}), c, o))
        outlets.append(o)
    relay.fanout.offer(e)
    by_effective: dict[object, object] = {}
    for c, o in zip(ceilings, outlets, strict=True):
        (item,) = list(o._q)
        assert item.payload == relay.fanout.render(e, c).sse()
        eff = None if c is None or CAPTURE_RANK[c] >= e.cap else c
        assert by_effective.setdefault(eff, item) is item  # shared per effective ceiling

