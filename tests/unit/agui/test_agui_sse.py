"""The tee's incremental SSE parser against the WHATWG event-stream rules
(§9.2.6) and the bounds the tee needs (a 20 MB event, a line that never
ends), plus hypothesis: any split of any byte stream parses the same and
never raises."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.agui.sse import PEEK, SseEvent, SseParser


def parse(data: bytes, **kw) -> list[SseEvent]:
    p = SseParser(**kw)
    return p.feed(data)


def test_events_fields_and_line_endings():
    got = parse(b"data: a\n\ndata:b\r\ndata: c\r\n\r\nevent: x\rid: 7\rdata: d\r\r: comment\n\n")
    assert [(e.data, e.event, e.id) for e in got] == [("a", None, None), ("b\nc", None, None),
                                                     ("d", "x", "7")]


def test_no_data_dispatches_nothing_and_unknown_fields_are_ignored():
    assert parse(b"event: x\n\nretry: 5\nfoo: bar\n\n") == []


def test_a_crlf_split_across_chunks_is_one_line_break():
    p = SseParser()
    assert p.feed(b"data: a\r") == []
    assert [e.data for e in p.feed(b"\n\r\n")] == ["a"]


def test_leading_bom_is_ignored_once():
    assert [e.data for e in parse(b"\xef\xbb\xbfdata: a\n\n")] == ["a"]
    p = SseParser()
    assert p.feed(b"\xef") == [] and p.feed(b"\xbb\xbfdata: b\n\n")[0].data == "b"


def test_a_20_mb_event_is_reported_oversize_with_bounded_memory_and_parsing_resumes():
    cap = 1 << 20
    p = SseParser(max_event=cap)
    head = b'data: {"type":"STATE_SNAPSHOT","snapshot":{"blob":"'
    out = p.feed(head)
    piece = b"x" * 65536
    peak = 0
    for _ in range((20 << 20) // len(piece)):
        out += p.feed(piece)
        peak = max(peak, p.buffered)
    out += p.feed(b'"}}\n\ndata: {"type":"RUN_FINISHED"}\n\n')
    assert peak <= cap
    assert [e.oversize for e in out] == [True, False]
    assert out[0].size > 20 << 20 and len(out[0].data) <= PEEK
    assert out[0].data.startswith('{"type":"STATE_SNAPSHOT"')
    assert out[1].data == '{"type":"RUN_FINISHED"}'


def test_many_small_lines_over_the_cap_are_oversize_too():
    p = SseParser(max_event=1024)
    out = p.feed(b"data: xxxxxxxxxx\n" * 200 + b"\n" + b"data: ok\n\n")
    assert [(e.oversize, e.data if not e.oversize else None) for e in out] == [(True, None),
                                                                               (False, "ok")]


def test_pending_tells_an_unterminated_event():
    p = SseParser()
    p.feed(b"data: half")
    assert p.pending()
    p.feed(b"\n\n")
    assert not p.pending()


streams = st.lists(st.one_of(
    st.sampled_from([b"data: ", b"data:", b"event: e", b"id: 1", b": c", b"retry: 3", b"\n",
                     b"\r", b"\r\n", b"{\"type\":\"RUN_STARTED\"}", b"\xef\xbb\xbf", b"\xff\xfe"]),
    st.binary(max_size=40)), max_size=60).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(data=streams, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_any_split_parses_like_the_whole_and_never_raises(data, cuts):
    whole = SseParser(max_event=256).feed(data)
    p = SseParser(max_event=256)
    got: list[SseEvent] = []
    prev = 0
    for c in sorted(set(min(c, len(data)) for c in cuts)) + [len(data)]:
        got += p.feed(data[prev:c])
        prev = c
        assert p.buffered <= 2 * 256 + 64
    assert got == whole


# ------------------------------------------------------------------ the shared budget (issue 25)

def test_parsers_sharing_a_budget_hold_no_more_than_it_and_the_rest_is_over_budget():
    from bridges.agui.sse import Budget
    budget = Budget(3100)  # room for two ("data: " + 1500 bytes each)
    parsers = [SseParser(2000, budget) for _ in range(4)]
    for p in parsers:  # each holds an unfinished event of 1500 bytes
        assert p.feed(b"data: " + b"y" * 1500) == []
        assert budget.held <= budget.limit
    assert sum(p.buffered for p in parsers) <= 3100 and budget.refused >= 2
    ends = [p.feed(b"\n\n") for p in parsers]
    assert [e[0].over_budget for e in ends] == [False, False, True, True]
    assert [e[0].oversize for e in ends] == [False, False, True, True]
    assert ends[0][0].data == "y" * 1500 and ends[2][0].data.startswith("y")
    assert budget.held == 0  # dispatched events give their bytes back
    assert [e.data for e in parsers[3].feed(b"data: ok\n\n")] == ["ok"]  # room again: parsed


def test_release_gives_an_unfinished_event_back():
    from bridges.agui.sse import Budget
    budget = Budget(10_000)
    p = SseParser(8000, budget)
    p.feed(b"data: " + b"z" * 5000 + b"\ndata: more")
    assert budget.held == p.buffered > 5000
    p.release()
    p.release()
    assert budget.held == 0


@settings(max_examples=200)
@given(st.binary(max_size=3000), st.lists(st.integers(1, 200), max_size=30),
       st.integers(64, 4000))
def test_under_any_budget_held_bytes_never_pass_it_and_nothing_raises(data, cuts, limit):
    from bridges.agui.sse import Budget
    budget = Budget(limit)
    a, b = SseParser(1024, budget), SseParser(1024, budget)
    i = 0
    for n in cuts + [len(data)]:
        chunk, i = data[i:i + n], i + n
        a.feed(chunk)
        b.feed(chunk[::-1])
        assert a.buffered + b.buffered <= limit + 8 and budget.held <= limit
    a.release()
    b.release()
    assert budget.held == 0
