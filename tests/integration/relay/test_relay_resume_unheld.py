"""Resume against a relay that holds nothing of the session (AEP-0003 §3.3
item 3, §5), on a real listener: the relay restarted empty and the emitter
has not re-sent yet. The consumer resumes from ``S:2:5`` (SSE
``Last-Event-ID`` and ``from``, WS ``subscribe.from``, the SDK's
``from_``), then the emitter POSTs: a gap gets exactly one
``replay-exhausted`` whose ``earliest`` is the first event it gets, before
it; the exact next event gets none; replay-all never does. Counts and
frames only, no timings."""
from __future__ import annotations

import json
import queue
import threading

import aep_sdk
import httpx
import trio
from trio_websocket import open_websocket_url

from tests.support.relay_harness import TOKEN, auth, event, running_relay, wait_until

WAIT = 20
S = "ses-gap"
V = {"AEP-Version": "0.1", "content-type": "application/x-ndjson", **auth()}


async def post(c: httpx.AsyncClient, base: str, seqs, epoch: int = 2) -> None:
    body = "\n".join(json.dumps(event(s, session=S, epoch=epoch)) for s in seqs)
    r = await c.post(base + "/events", content=body, headers=V)
    assert r.status_code == 202, r.text


class Wire:
    """A raw SSE reader keeping comments and event ids in wire order."""

    def __init__(self) -> None:
        self.items: list[str] = []  # "# comment" or the event's id

    async def run(self, c: httpx.AsyncClient, url: str, headers=None, params=None, *,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with c.stream("GET", url, headers={**auth(), **(headers or {})}, params=params) as r:
            assert r.status_code == 200
            task_status.started(self)
            async for line in r.aiter_lines():
                if line.startswith(":") and not line.startswith((": ping", ": connected")):
                    self.items.append("#" + line[1:])
                elif line.startswith("id: "):
                    self.items.append(line[4:])

    def ids(self) -> list[str]:
        return [i for i in self.items if not i.startswith("#")]


async def sse_case(headers, params, seqs, epoch=2) -> list[str]:
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient(timeout=WAIT) as c:
        async with trio.open_nursery() as n:
            wire = await n.start(Wire().run, c, base + "/stream", headers, params)
            await wait_until(lambda: relay.stats()["subscribers"] == 1)
            await post(c, base, seqs, epoch)
            await wait_until(lambda: len(wire.ids()) == len(seqs))
            n.cancel_scope.cancel()
        return wire.items


FROM = {"from": json.dumps([{"session": S, "epoch": 2, "seq": 5}])}


async def test_sse_last_event_id_gap_one_marker_before_the_first_event():
    items = await sse_case({"last-event-id": f"{S}:2:5"}, None, [8, 9, 10])
    assert items == [f"# replay-exhausted {S} 2:8", f"{S}:2:8", f"{S}:2:9", f"{S}:2:10"]


async def test_sse_from_next_event_no_marker_later_epoch_marker():
    assert await sse_case(None, FROM, [6, 7, 9]) == [f"{S}:2:6", f"{S}:2:7", f"{S}:2:9"]
    assert await sse_case(None, FROM, [0, 1], epoch=3) == [
        f"# replay-exhausted {S} 3:0", f"{S}:3:0", f"{S}:3:1"]


async def test_sse_replay_all_no_marker():
    assert await sse_case(None, {"from": "all"}, [8, 9]) == [f"{S}:2:8", f"{S}:2:9"]


async def test_ws_subscribe_from_gap_next_and_replay_all():
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient(timeout=WAIT) as c:
        url = base.replace("http://", "ws://") + f"/socket?access_token={TOKEN}"
        async with open_websocket_url(url) as ws:
            await ws.send_message(json.dumps({"type": "hello", "versions": ["0.1"],
                                              "role": "consumer", "capabilities": {},
                                              "identity": {"agent": "t", "instance": "t/1"}}))
            frm = [{"session": S, "epoch": 2, "seq": 5}]
            subs = [{"type": "subscribe", "id": "gap", "from": frm},
                    {"type": "subscribe", "id": "next", "from": [{**frm[0], "seq": 7}]},
                    {"type": "subscribe", "id": "all", "from": "all"}]
            for m in subs:
                await ws.send_message(json.dumps(m))
            await wait_until(lambda: relay.stats()["subscribers"] == 3)
            await post(c, base, [8, 9])
            frames: list[dict] = []
            with trio.fail_after(WAIT):
                while sum(1 for f in frames if f.get("seq") is not None) < 6:
                    f = json.loads(await ws.get_message())
                    if f["type"] not in ("hello", "ping", "subscribed"):
                        frames.append(f)
        markers = [f for f in frames if f["type"] == "replay-exhausted"]
        assert markers == [{"type": "replay-exhausted", "sub": "gap", "session": S,
                            "earliest": {"epoch": 2, "seq": 8}}]
        # the marker precedes every event: the events of one ingest go out after it
        assert frames[0] == markers[0]
        assert sorted(f["seq"] for f in frames[1:]) == [8, 8, 8, 9, 9, 9]


async def test_the_sdk_consumer_hears_the_gap_it_resumed_into():
    """``aep_sdk.subscribe`` resuming by position: it is told, through its
    comment hook, that what it will get starts after a gap."""
    async with running_relay(token=TOKEN) as (relay, base), httpx.AsyncClient(timeout=WAIT) as c:
        got: queue.Queue = queue.Queue()
        comments: list[str] = []
        lock = threading.Lock()

        def on_comment(text: str) -> None:
            with lock:
                comments.append(text)

        sub = aep_sdk.subscribe(base, got.put, token=TOKEN,
                                from_=[{"session": S, "epoch": 2, "seq": 5}], on_comment=on_comment)
        try:
            await wait_until(lambda: relay.stats()["subscribers"] == 1)
            await post(c, base, [8, 9])
            seqs = [(await trio.to_thread.run_sync(lambda: got.get(timeout=WAIT)))["seq"]
                    for _ in range(2)]
        finally:
            sub.close()
        assert seqs == [8, 9]
        with lock:
            assert [x for x in comments if x.startswith("replay-exhausted")] == \
                [f"replay-exhausted {S} 2:8"]
