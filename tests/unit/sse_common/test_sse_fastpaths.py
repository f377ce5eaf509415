"""Issue 11: every shortcut of the SSE bridges' hot path held equal to the
slow path it skips (hypothesis).

- :class:`BusEvent` (a ``__slots__`` class now) and its once-per-event
  ``session`` against the pins' ``identity.session_from`` rule written out
  plainly, and :func:`parse_frame` against the frozen-dataclass parser it
  replaced (the reference below, verbatim but for the class);
- the memo of version-stripped sync types against the regex;
- the state file's compaction, joined from the entry texts it keeps,
  against the whole snapshot of the tracker it serialized before;
- the receiver's emission (``emit_nowait`` while the channel has room,
  ``emit`` when full) against the per-event ``await ctx.emit`` it replaced:
  the same envelopes in the same order, whatever the channel's size, and the
  tracker's counts forwarded to the health counters as the old
  copy-and-diff of every counter per frame did.
"""
from __future__ import annotations

import itertools
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.core import statefile as _state
from bridges.core.bridge import BridgeContext, BridgeHealth
from bridges.core.envelope import Stamper
from bridges.core.posture import Posture
from bridges.core.statefile import StateFile
from bridges.opencode_sse import PROFILE
from bridges.sse_common import frames as _frames
from bridges.sse_common.frames import BusEvent, FrameError, parse_frame, session_of, unversioned
from bridges.sse_common.receiver import ReceiverSettings, SseReceiver, StreamSilent
from bridges.sse_common.tracker import Tracker
from tests.support.opencode_fixtures import real_frames
from tests.unit.sse_common.test_sse_fuzz import frames as fuzz_frames
from tests.unit.sse_common.test_sse_fuzz import json_values, plausible

# ------------------------------------------------------------------ the slow paths


@dataclass(frozen=True)
class RefEvent:
    type: str
    properties: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    directory: str | None = None
    form: str = "bus"
    malformed: bool = False

    @property
    def session(self) -> str | None:
        p = self.properties
        sid = p.get("sessionID")
        if isinstance(sid, str) and sid:
            return sid
        info = p.get("info")
        if isinstance(info, dict):
            sid = info.get("sessionID")
            if isinstance(sid, str) and sid:
                return sid
            if self.type.startswith("session."):
                sid = info.get("id")
                if isinstance(sid, str) and sid:
                    return sid
        part = p.get("part")
        if isinstance(part, dict):
            sid = part.get("sessionID")
            if isinstance(sid, str) and sid:
                return sid
        return None


_VERSION = re.compile(r"\.\d+$")


def ref_parse(data: str, wrapped: bool) -> RefEvent:
    """The parser before issue 11 (frozen dataclass, regex per sync frame)."""
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise FrameError("not_object")
    directory = None
    payload: Any = obj
    if wrapped and isinstance(obj.get("payload"), dict):
        payload = obj["payload"]
        if isinstance(obj.get("directory"), str):
            directory = obj["directory"]
    if payload.get("type") == "sync" and isinstance(payload.get("syncEvent"), dict):
        sync = payload["syncEvent"]
        type_ = sync.get("type")
        if not isinstance(type_, str) or not type_:
            raise FrameError("no_type")
        props = sync.get("data")
        ident = sync.get("id")
        return RefEvent(_VERSION.sub("", type_), props if isinstance(props, dict) else {},
                        ident if isinstance(ident, str) and ident else None, directory, "sync",
                        not isinstance(props, dict))
    type_ = payload.get("type")
    if not isinstance(type_, str) or not type_:
        raise FrameError("no_type")
    props = payload.get("properties")
    ident = payload.get("id")
    return RefEvent(type_, props if isinstance(props, dict) else {},
                    ident if isinstance(ident, str) and ident else None, directory, "bus",
                    not isinstance(props, dict))


def fields(ev: Any) -> tuple[Any, ...]:
    return (ev.type, ev.properties, ev.id, ev.directory, ev.form, ev.malformed, ev.session)


sync_frames = st.builds(
    lambda t, props, ident, wrap: (lambda inner: {"directory": "/p", "payload": inner}
                                   if wrap else inner)(
        {"type": "sync", "syncEvent": {"type": t, "data": props, **({"id": ident} if ident
                                                                    else {})}}),
    st.one_of(st.sampled_from(["message.updated.1", "session.updated.12", "a.b", "x.1.2", ".3",
                               "1", ""]), st.text(max_size=12)),
    json_values, st.one_of(st.none(), st.text(max_size=6)), st.booleans())


# ------------------------------------------------------------------ frames

@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fuzz_frames | plausible | sync_frames, st.booleans())
def test_parse_frame_equals_the_frozen_dataclass_parser(frame, wrapped):
    data = json.dumps(frame)
    try:
        want = ref_parse(data, wrapped)
    except FrameError as e:
        try:
            parse_frame(data, wrapped=wrapped)
        except FrameError as got:
            assert got.reason == e.reason
        else:
            raise AssertionError("the fast parser accepted what the reference refuses")
        return
    got = parse_frame(data, wrapped=wrapped)
    assert fields(got) == fields(want)
    assert got.session == want.session  # asked twice: the cached answer is the same


def test_every_real_frame_parses_as_before():
    n = 0
    for vendor in ("opencode", "kilocode"):
        for stream, data in real_frames(vendor):
            wrapped = stream.startswith("/global")
            assert fields(parse_frame(data, wrapped=wrapped)) == fields(ref_parse(data, wrapped))
            n += 1
    assert n > 500


@given(st.text(max_size=10), json_values)
def test_session_is_the_identity_rule(type_, props):
    props = props if isinstance(props, dict) else {"info": props}
    ev = BusEvent(type_, props)
    assert ev.session == session_of(type_, props) == RefEvent(type_, props).session


def test_bus_events_compare_by_their_fields():
    a = BusEvent("session.idle", {"sessionID": "s"}, "e", None, "bus")
    assert a == BusEvent("session.idle", {"sessionID": "s"}, "e")
    assert a.session == "s" and a == BusEvent("session.idle", {"sessionID": "s"}, "e")
    assert a != BusEvent("session.idle", {"sessionID": "s"}, "e", form="sync")
    assert a != BusEvent("session.idle", {"sessionID": "t"}, "e")
    assert "session.idle" in repr(a) and BusEvent("t").properties == {}


@given(st.lists(st.text(max_size=8) | st.sampled_from(["a.1", "a.12", "a.b.3", ".9", "9"]),
                max_size=40))
def test_unversioned_equals_the_regex_through_the_memo(types):
    for t in types:
        assert unversioned(t) == _VERSION.sub("", t)


def test_the_memo_starts_over_when_full(monkeypatch):
    monkeypatch.setattr(_frames, "_BARE_MAX", 4)
    monkeypatch.setattr(_frames, "_BARE", {})
    for i in range(20):
        assert unversioned(f"t{i}.{i}") == f"t{i}"
        assert len(_frames._BARE) <= 4
    assert unversioned("t19.19") == "t19"


# ------------------------------------------------------------------ the receiver

def _ctx(size: int) -> tuple[BridgeContext, trio.MemorySendChannel, trio.MemoryReceiveChannel]:
    send, recv = trio.open_memory_channel(size)
    _, cmd_r = trio.open_memory_channel(1)
    return (BridgeContext("opencode_sse", Stamper("opencode", epoch=1, host="t"), send, cmd_r,
                          BridgeHealth(), logging.getLogger("t")), send, recv)


def _shape(envs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Envelopes without what differs between two stampings (id, time);
    a cause or subject naming an envelope names its position instead."""
    pos = {e["id"]: i for i, e in enumerate(envs)}
    out = []
    for e in envs:
        e = {k: v for k, v in e.items() if k not in ("id", "time")}
        for k in ("cause", "subject"):  # an attention's subject is its request's id
            if k in e:
                e[k] = pos.get(e[k], e[k])
        out.append(e)
    return out


async def _reference(seq: list[str], mode: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The receiver's path before issue 11: one ``await ctx.emit`` per
    event, counters forwarded by copying and diffing them per frame."""
    ctx, _, recv = _ctx(10_000)
    tr = Tracker(Posture(agent="opencode", mode=mode))
    for data in seq:
        ctx.health.count("frames")
        if not data:
            ctx.health.count("frames_empty")
            continue
        try:
            ev = parse_frame(data, wrapped=True)
        except FrameError as e:
            ctx.health.count(f"frames_{e.reason}")
            continue
        if ev.malformed:
            ctx.health.count("frames_no_properties")
        before = dict(tr.counters)
        try:
            outs = tr.feed(ev)
        except (RecursionError, ValueError, TypeError):
            ctx.health.count("frames_unmappable")
            continue
        for k, v in tr.counters.items():
            if v != before.get(k, 0):
                ctx.health.count(k, v - before.get(k, 0))
        for o in outs:
            o.envelope = await ctx.emit(o.session, o.emission, run=o.run,
                                        cause=o.resolved_cause())
            tr.touch(o.session)
            if o.envelope["type"] == "run.started":
                tr.bind_run(o.session, o.envelope)
    got = []
    while True:
        try:
            got.append(recv.receive_nowait().event)
        except trio.WouldBlock:
            return got, dict(ctx.health.counters)


async def _receiver(seq: list[str], mode: str, size: int
                    ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    ctx, send, recv = _ctx(size)
    rx = SseReceiver(PROFILE, None, Tracker(Posture(agent="opencode", mode=mode)), ctx,  # type: ignore[arg-type]
                     url="http://x", settings=ReceiverSettings())
    got: list[dict[str, Any]] = []

    async def drain():
        async for item in recv:
            got.append(item.event)

    async with trio.open_nursery() as n:
        n.start_soon(drain)
        for data in seq:  # as `_read` hands them over: no other sender, the room counted once
            await rx.handle_data(data, stream=True)
        await send.aclose()
    return got, dict(ctx.health.counters)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(plausible | fuzz_frames | sync_frames, min_size=1, max_size=14),
       st.sampled_from(["companion", "primary"]), st.integers(1, 6))
def test_the_receiver_emits_what_the_per_event_path_emitted(seq, mode, size):
    data = [json.dumps(f) for f in seq] + ["", "{nope"]

    async def both():
        return await _reference(data, mode), await _receiver(data, mode, size)

    (want, want_counts), (got, got_counts) = trio.run(both)
    assert _shape(got) == _shape(want)
    assert got_counts == want_counts


def test_the_real_captures_through_the_receiver_equal_the_per_event_path():
    data = [d for v in ("opencode", "kilocode") for _, d in real_frames(v, "/global")]

    async def both():
        return await _reference(data, "primary"), await _receiver(data, "primary", 3)

    (want, want_counts), (got, got_counts) = trio.run(both)
    assert len(got) > 100 and _shape(got) == _shape(want) and got_counts == want_counts


# ------------------------------------------------------------------ the state file

_examples = itertools.count()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(plausible | sync_frames, min_size=1, max_size=16), st.data())
def test_a_compaction_writes_what_the_whole_snapshot_would(tmp_path, seq, data):
    """The document a compaction joins from the remembered entry texts is,
    byte for byte, the whole-snapshot document the state file wrote before
    issue 11 (``_dumps`` of ``tracker.snapshot()``), at every save, across
    restarts and real compactions."""
    path = tmp_path / f"s{next(_examples)}.json"  # tmp_path is shared by the examples
    sf = StateFile(path)
    tr = Tracker(Posture(agent="opencode", mode="primary"))
    stamper = Stamper("opencode", epoch=1, host="t")
    for frame in seq:
        try:
            ev = parse_frame(json.dumps(frame), wrapped=True)
        except FrameError:
            continue
        for o in tr.feed(ev):
            o.envelope = stamper.stamp(o.session, o.emission, run=o.run, cause=o.resolved_cause())
            tr.touch(o.session)
            if o.envelope["type"] == "run.started":
                tr.bind_run(o.session, o.envelope)
        if tr.dirty:
            tr.dirty = False
            sf.save_changes(tr.changes())
            gen = data.draw(st.integers(0, 99))
            assert sf.compacted(gen) == _state._dumps(dict(tr.snapshot(), journal=gen))
            if data.draw(st.booleans()):  # compact now (as a full journal would)
                sf.save_changes({})
                sf._compact_due = True  # noqa: SLF001 (forcing the due compaction)
                sf.save_changes({})
                assert json.loads(path.read_text())["sessions"] == json.loads(
                    json.dumps(tr.snapshot()))["sessions"]
            if data.draw(st.booleans()):  # a restart reads it back
                sf = StateFile(path)
                sf.load()
                assert sf.compacted(1) == _state._dumps(dict(tr.snapshot(), journal=1))


# ------------------------------------------------------------------ the heartbeat deadline

class _Sse:
    def __init__(self, data: str) -> None:
        self.data = data


def _created(i: int) -> str:
    return json.dumps({"directory": "/p", "payload": {"type": "session.created", "properties": {
        "sessionID": f"ses_{i}", "info": {"id": f"ses_{i}"}}}})


async def _stream(gaps: list[float]):
    for i, gap in enumerate(gaps):
        await trio.sleep(gap)
        yield _Sse(_created(i))
    await trio.sleep_forever()


async def test_the_silence_watch_drops_a_stream_waiting_heartbeat_timeout(autojump_clock):
    """The watch task cancels the read once it has waited exactly
    ``heartbeat_timeout`` since the last frame was handled (virtual time),
    never while frames keep coming closer than that."""
    ctx, _, recv = _ctx(100)
    rx = SseReceiver(PROFILE, None, Tracker(Posture(agent="opencode")), ctx,  # type: ignore[arg-type]
                     url="http://x", settings=ReceiverSettings(heartbeat_timeout=1.0))
    async with trio.open_nursery() as n:
        n.start_soon(rx._silence_watch)  # noqa: SLF001
        t0 = trio.current_time()
        with pytest.raises(StreamSilent):
            await rx._read(_stream([0.9, 0.9, 0.9]).__aiter__())  # noqa: SLF001
        assert trio.current_time() - t0 == pytest.approx(2.7 + 1.0)
        assert ctx.health.counters["frames"] == 3
        n.cancel_scope.cancel()


async def test_time_spent_handling_a_frame_is_not_silence(autojump_clock):
    """A frame whose emit waits 5 s for room on the relay channel (longer
    than the 1 s heartbeat timeout) does not drop the stream: only waiting
    for the vendor counts."""
    ctx, _, recv = _ctx(1)
    rx = SseReceiver(PROFILE, None, Tracker(Posture(agent="opencode")), ctx,  # type: ignore[arg-type]
                     url="http://x", settings=ReceiverSettings(heartbeat_timeout=1.0))
    got = []

    async def late_reader():
        await trio.sleep(5)
        async for item in recv:
            got.append(item.event)

    async def stream():
        for i in range(3):
            await trio.sleep(0.5)
            yield _Sse(_created(i))

    async with trio.open_nursery() as n:
        n.start_soon(rx._silence_watch)  # noqa: SLF001
        n.start_soon(late_reader)
        await rx._read(stream().__aiter__())  # noqa: SLF001 (ends with the stream: no StreamSilent)
        await trio.testing.wait_all_tasks_blocked()
        assert [e["session"] for e in got] == ["ses_0", "ses_1", "ses_2"]
        n.cancel_scope.cancel()


async def test_the_room_counted_for_a_chunk_is_forgotten_at_the_next_read():
    """Another sender fills the relay channel while the stream waits for its
    next chunk: the frames of that chunk count the room afresh (they wait
    for it) instead of trusting what the previous chunk's frames counted,
    which would burn a ``seq`` on an envelope the channel refuses."""
    from httpx_sse import EventSource

    from bridges.sse_common.receiver import _Bounded

    ctx, send, recv = _ctx(4)
    rx = SseReceiver(PROFILE, None, Tracker(Posture(agent="opencode")), ctx,  # type: ignore[arg-type]
                     url="http://x", settings=ReceiverSettings())
    other = send.clone()
    got: list[dict[str, Any]] = []

    async def body():
        yield f"data: {_created(0)}\n\n".encode()
        await trio.sleep(0.01)
        for _ in range(3):  # the channel is full now (1 from the stream + 3)
            other.send_nowait(type("Item", (), {"event": {"filler": True}})())
        yield f"data: {_created(1)}\n\ndata: {_created(2)}\n\n".encode()

    async def reader():
        await trio.sleep(0.05)
        async for item in recv:
            got.append(item.event)

    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())
    async with trio.open_nursery() as n:
        n.start_soon(reader)
        events = EventSource(_Bounded(response, 1 << 20, rx._forget_room)).aiter_sse()  # type: ignore[arg-type]  # noqa: SLF001
        await rx._read(events)  # noqa: SLF001
        await other.aclose()
        await send.aclose()
    assert [e.get("session") for e in got if "filler" not in e] == ["ses_0", "ses_1", "ses_2"]
    assert [e["seq"] for e in got if "filler" not in e] == [0, 0, 0]  # no seq burnt (one each)
    assert ctx.health.counters.get("emit_errors") is None
