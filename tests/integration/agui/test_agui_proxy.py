"""The tee proxy on loopback sockets: the real bridge (``AguiBridge.run``
with a real ``BridgeContext``) in front of stub AG-UI upstreams speaking the
real streamed framing (the captured pydantic-ai bytes, or a fault), and
httpx as the byte-level UI. Stubs stand in for fault injection only; the
real server and client are in ``test_agui_real.py``.

Faults, one test each: upstream down (502), UI disconnect mid-stream
(upstream cancelled, run failed), malformed SSE event, an endless stream, a
20 MB event, many concurrent runs, the upstream breaking mid-stream."""
from __future__ import annotations

import hashlib
import json
import logging
import tracemalloc
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio

from bridges.agui.bridge import AguiBridge
from bridges.agui.config import AguiConfig
from bridges.core.bridge import BridgeContext, BridgeHealth, Outbound
from bridges.core.capture import CapturePolicy
from bridges.core.envelope import Stamper
from supervisor.fleet import run_bridge
from tests.support.agui import STORY
from tests.support.net import free_port, http_body, serve_loopback
from tests.support.schema import validate_event

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "agui_real"
CAPTURE = (REAL / "pydantic_ai_tool_run.sse").read_bytes()
SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


def frames(data: bytes) -> list[bytes]:
    """The capture split at event boundaries (each one chunk, as sent)."""
    return [p + b"\n\n" for p in data.split(b"\n\n") if p]


class Harness:
    """The bridge serving on a free port; ``events`` the stamped envelopes it
    put on the relay channel; ``health`` its counters."""

    def __init__(self, nursery: trio.Nursery, bridge: AguiBridge) -> None:
        self.nursery = nursery
        self.bridge = bridge
        self.health = BridgeHealth()
        self.events: list[dict[str, Any]] = []
        self.url = ""
        self.run: Any = None
        self.cmd: Any = None

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    async def settle(self, pred, timeout: float = 20.0) -> None:
        with trio.fail_after(timeout):
            while not pred(self):
                await trio.sleep(0.02)


@asynccontextmanager
async def proxy(upstream: str, *, policy: CapturePolicy | None = None, deltas: bool = False,
                max_event: int | None = None, **cfg_kw: Any) -> AsyncIterator[Harness]:
    policy = policy or CapturePolicy()
    cfg = AguiConfig(upstream=upstream.rstrip("/"), listen=("127.0.0.1", 0), deltas=deltas,
                     **({"max_event": max_event} if max_event else {}), **cfg_kw)
    bridge = AguiBridge(cfg, policy)
    send, recv = trio.open_memory_channel[Outbound](100_000)
    cmd_send, cmd_recv = trio.open_memory_channel[dict](10)
    async with trio.open_nursery() as nursery:
        h = Harness(nursery, bridge)
        h.cmd = cmd_send
        ctx = BridgeContext("agui", Stamper("agui", epoch=1, host="test", policy=policy), send,
                            cmd_recv, h.health, logging.getLogger("test.agui"))

        async def pump():
            async for item in recv:
                h.events.append(item.event)

        nursery.start_soon(pump)
        h.run = await nursery.start(run_bridge, bridge, ctx)  # as the fleet runs it
        host, port = h.run.address
        h.url = f"http://{host}:{port}"
        yield h
        nursery.cancel_scope.cancel()
    while True:  # what the bridge emitted on its way out
        try:
            h.events.append(recv.receive_nowait().event)
        except (trio.WouldBlock, trio.EndOfChannel):
            break


@asynccontextmanager
async def upstream(app) -> AsyncIterator[str]:
    async with trio.open_nursery() as n:
        url = await n.start(serve_loopback, app)
        yield url
        n.cancel_scope.cancel()


def replay(chunks: list[bytes], headers=SSE, status: int = 200):
    async def app(scope, receive, send):
        if await http_body(scope, receive, send) is None:
            return
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for c in chunks:
            await send({"type": "http.response.body", "body": c, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    return app


async def open_run(scope, receive, send) -> bool:
    """A stub upstream's start: the request read, 200 ``text/event-stream``,
    ``RUN_STARTED`` of thread ``t`` run ``r``. ``False``: no request to answer."""
    if await http_body(scope, receive, send) is None:
        return False
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "more_body": True, "body":
                b'data: {"type":"RUN_STARTED","threadId":"t","runId":"r"}\n\n'})
    return True


def started_then_hanging(disconnected: trio.Event):
    """An upstream that opens a run and then holds the stream open, setting
    ``disconnected`` once the proxy drops its request."""
    async def hang(scope, receive, send):
        if not await open_run(scope, receive, send):
            return
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected.set()
    return hang


async def post(url: str, body: bytes = b'{"threadId":"t-in","runId":"r-in"}',
               headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as c:
        return await c.post(url + "/", content=body, headers={
            "content-type": "application/json", "accept": "text/event-stream", **(headers or {})})


async def direct_and_proxied(app) -> tuple[bytes, bytes, Harness]:
    async with upstream(app) as up, proxy(up) as h:
        direct = (await post(up)).content
        proxied = (await post(h.url)).content
        await h.settle(lambda h: h.of("run.finished"))
        return direct, proxied, h


# --------------------------------------------------------------------------- transparency

async def test_bytes_through_the_proxy_are_the_bytes_direct_and_the_story_is_mapped():
    direct, proxied, h = await direct_and_proxied(replay(frames(CAPTURE)))
    assert direct == proxied == CAPTURE
    assert tuple(e["type"] for e in h.events) == STORY
    assert {(e["session"], e["run"]) for e in h.events} == {("thread-capture-1", "run-capture-1")}
    for e in h.events:
        validate_event(e)
    assert h.health.counters["agui.streams"] == 2 - 1  # the direct POST did not pass the proxy


async def test_odd_chunking_is_forwarded_as_is_and_parsed_the_same():
    chunks = [CAPTURE[i:i + 7] for i in range(0, len(CAPTURE), 7)]
    direct, proxied, h = await direct_and_proxied(replay(chunks))
    assert direct == proxied == CAPTURE
    assert len(h.of("tool.completed")) == 2


async def test_the_request_is_forwarded_verbatim():
    seen: dict[str, Any] = {}

    async def echo(scope, receive, send):
        body = await http_body(scope, receive, send)
        if body is None:
            return
        seen.update(method=scope["method"], path=scope["raw_path"], query=scope["query_string"],
                    headers=scope["headers"], body=body)
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), (b"x-agent", b"yes"),
                                (b"connection", b"keep-alive, x-hop"), (b"x-hop", b"1")]})
        await send({"type": "http.response.body", "body": b'{"ok":true}'})

    async with upstream(echo) as up, proxy(up + "/prefix") as h:
        body = bytes(range(256)) * 40
        sent = [("X-Trace", "one"), ("X-Trace", "two"), ("Authorization", "Bearer abc"),
                ("Connection", "keep-alive, X-Secret-Hop"), ("X-Secret-Hop", "drop me"),
                ("TE", "trailers"), ("Keep-Alive", "timeout=5"), ("Accept", "application/json"),
                ("Accept-Encoding", "identity")]
        async with httpx.AsyncClient(trust_env=False) as c:
            c.headers.clear()  # the UI sends exactly `sent` (+ Host, Content-Length)
            r = await c.request("PUT", h.url + "/agent/run%20x?b=2&a=1&a=3", content=body,
                                headers=sent)
    assert (r.status_code, r.content, r.headers["x-agent"]) == (201, b'{"ok":true}', "yes")
    assert "x-hop" not in r.headers  # named by the upstream's Connection: hop-by-hop
    assert seen["method"] == "PUT" and seen["body"] == body
    assert seen["path"] == b"/prefix/agent/run%20x" and seen["query"] == b"b=2&a=1&a=3"
    got = [(k.decode(), v.decode()) for k, v in seen["headers"]]
    hop = {"connection", "x-secret-hop", "te", "keep-alive"}
    want = [(k.lower(), v) for k, v in sent if k.lower() not in hop]
    assert [(k, v) for k, v in got if k not in ("host", "content-length")] == want
    assert dict(got)["host"] == up.split("//")[1]  # the upstream's, as a reverse proxy does
    assert dict(got)["content-length"] == str(len(body))
    assert h.health.counters["agui.unobserved"] == 1 and not h.events


async def test_non_event_stream_responses_pass_unobserved_and_counted():
    proto = [(b"content-type", b"application/vnd.ag-ui.event+proto")]
    body = [b"\x00\x00\x00\x05hello", b"\x00\x00\x00\x01!"]
    async with upstream(replay(body, headers=proto)) as up, proxy(up) as h:
        r = await post(h.url)
    assert r.content == b"".join(body) and r.headers["content-type"].endswith("+proto")
    assert h.health.counters["agui.unobserved_proto"] == 1 and not h.events


# --------------------------------------------------------------------------- faults

async def test_upstream_down_is_a_502_with_a_clear_body_and_counted():
    dead = f"http://127.0.0.1:{free_port()}"
    async with proxy(dead) as h:
        r = await post(h.url)
        await h.settle(lambda h: h.health.source is False)
    assert r.status_code == 502 and r.headers["content-type"].startswith("text/plain")
    assert dead in r.text and "did not answer (ConnectError)" in r.text
    assert h.health.counters["agui.upstream_unreachable"] == 1
    assert not h.events


async def test_ui_disconnect_cancels_the_upstream_request_and_fails_the_run():
    upstream_saw_disconnect = trio.Event()
    hang = started_then_hanging(upstream_saw_disconnect)

    async with upstream(hang) as up, proxy(up) as h:
        async with httpx.AsyncClient(trust_env=False) as c:
            async with c.stream("POST", h.url + "/", content=b"{}") as r:
                async for line in r.aiter_lines():
                    if "RUN_STARTED" in line:
                        break
        with trio.fail_after(10):
            await upstream_saw_disconnect.wait()
        await h.settle(lambda h: h.of("run.failed"))
    assert [e["type"] for e in h.events] == ["run.started", "run.failed"]
    assert h.of("run.failed")[0]["data"] == {"reason": "client_disconnected"}
    assert h.health.counters["agui.client_disconnects"] == 1


async def test_malformed_event_passes_through_counted_and_degraded():
    chunks = [b'data: {"type":"RUN_STARTED","threadId":"t","runId":"r"}\n\n',
              b"data: {not json\n\n", b'data: [1,2]\n\n', b'data: {"no":"type"}\n\n',
              b'data: {"type":"WHOLLY_NOVEL_SIGNAL"}\n\n',
              b'data: {"type":"RUN_FINISHED","threadId":"t","runId":"r"}\n\n']
    direct, proxied, h = await direct_and_proxied(replay(chunks))
    assert direct == proxied == b"".join(chunks)
    assert [e["type"] for e in h.events] == [
        "run.started", "x.agui.unknown.event", "x.agui.unknown.event", "x.agui.unknown.event",
        "x.agui.wholly_novel.signal", "run.finished"]
    assert [e["data"]["malformed"] for e in h.of("x.agui.unknown.event")] == [
        "not_json", "not_object", "no_type"]
    assert h.health.counters["agui.malformed"] == 3


async def test_a_20_mb_event_passes_through_with_parse_capped_and_memory_bounded():
    size = 20 << 20
    piece = b"x" * (64 << 10)

    async def big(scope, receive, send):
        if not await open_run(scope, receive, send):
            return
        await send({"type": "http.response.body", "more_body": True, "body":
                    b'data: {"type":"STATE_SNAPSHOT","snapshot":{"blob":"'})
        for _ in range(size // len(piece)):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body":
                    b'"}}\n\ndata: {"type":"RUN_FINISHED","threadId":"t","runId":"r"}\n\n'})

    async with upstream(big) as up, proxy(up, max_event=1 << 20) as h:
        digest, n = hashlib.sha256(), 0
        tracemalloc.start()
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=60) as c:
                async with c.stream("POST", h.url + "/", content=b"{}") as r:
                    async for chunk in r.aiter_raw():
                        digest.update(chunk)
                        n += len(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await h.settle(lambda h: h.of("run.finished"))
    assert n > size
    assert peak < 8 << 20, f"peak traced memory {peak} bytes for a {size} byte event"
    assert [e["type"] for e in h.events] == ["run.started", "x.agui.unknown.event", "run.finished"]
    over = h.of("x.agui.unknown.event")[0]["data"]
    assert over["malformed"] == "oversize" and over["vendor_type"] == "STATE_SNAPSHOT"
    assert over["bytes"] > size
    assert h.health.counters["agui.oversize"] == 1


async def test_an_endless_stream_flows_until_the_ui_leaves():
    sent = 0
    gone = trio.Event()

    async def endless(scope, receive, send):
        nonlocal sent
        if not await open_run(scope, receive, send):
            return
        await send({"type": "http.response.body", "more_body": True, "body":
                    b'data: {"type":"TEXT_MESSAGE_START","messageId":"m"}\n\n'})
        async with trio.open_nursery() as n:
            async def until_disconnect():
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone.set()  # the proxy closed its upstream request
                n.cancel_scope.cancel()

            n.start_soon(until_disconnect)
            while True:
                await send({"type": "http.response.body", "more_body": True, "body":
                            b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"'
                            + b"y" * 1000 + b'"}\n\n'})
                sent += 1
                await trio.lowlevel.checkpoint()

    async with upstream(endless) as up, proxy(up, policy=CapturePolicy(ceiling="redacted")) as h:
        got = 0
        async with httpx.AsyncClient(trust_env=False) as c:
            async with c.stream("POST", h.url + "/", content=b"{}") as r:
                async for line in r.aiter_lines():
                    got += "TEXT_MESSAGE_CONTENT" in line
                    if got >= 3000:
                        break
        with trio.fail_after(10):
            await gone.wait()
        await h.settle(lambda h: h.of("run.failed"))
    assert got == 3000 and sent >= 3000
    assert [e["type"] for e in h.events] == ["run.started", "x.agui.text_message.start",
                                             "run.failed"]


async def test_many_concurrent_runs_each_get_their_own_bytes_and_story():
    async def per_run(scope, receive, send):
        body = await http_body(scope, receive, send)
        if body is None:
            return
        doc = json.loads(body)
        data = (CAPTURE.replace(b"thread-capture-1", doc["threadId"].encode())
                .replace(b"run-capture-1", doc["runId"].encode()))
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        for c in frames(data):
            await send({"type": "http.response.body", "body": c, "more_body": True})
            await trio.sleep(0.001)
        await send({"type": "http.response.body", "body": b""})

    n = 60
    results: dict[int, bytes] = {}
    async with upstream(per_run) as up, proxy(up) as h:
        async with httpx.AsyncClient(trust_env=False, timeout=60,
                                     limits=httpx.Limits(max_connections=None)) as c:
            async def one(i: int) -> None:
                body = json.dumps({"threadId": f"t{i}", "runId": f"r{i}"}).encode()
                results[i] = (await c.post(h.url + "/", content=body)).content

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(one, i)
        await h.settle(lambda h: len(h.of("run.finished")) == n)
    for i in range(n):
        assert results[i] == (CAPTURE.replace(b"thread-capture-1", f"t{i}".encode())
                              .replace(b"run-capture-1", f"r{i}".encode()))
        story = [e["type"] for e in h.events if e["session"] == f"t{i}"]
        assert tuple(story) == STORY
        assert {e["run"] for e in h.events if e["session"] == f"t{i}"} == {f"r{i}"}
    assert h.health.counters["agui.streams"] == n


async def test_new_sessions_past_the_budget_pass_through_unmapped_and_counted():
    """Issue 25, fifth outside attack: 1,500 unauthenticated runs, each
    with a new ``threadId``, made 1,500 session log files. Past
    ``AEP_AGUI_NEW_SESSIONS_PER_S`` (here 1 a second, bursts of 5) a new
    session's stream still reaches the UI byte for byte, but nothing of it
    is emitted; counted ``sessions_refused``. A session already mapped
    always passes."""
    async def per_run(scope, receive, send):
        body = await http_body(scope, receive, send)
        if body is None:
            return
        doc = json.loads(body)
        data = (CAPTURE.replace(b"thread-capture-1", doc["threadId"].encode())
                .replace(b"run-capture-1", doc["runId"].encode()))
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": data})

    n = 40  # far past the burst: the bucket refills 1 a second
    results: dict[int, bytes] = {}
    async with upstream(per_run) as up, proxy(up, new_sessions_per_s=1) as h:
        async with httpx.AsyncClient(trust_env=False, timeout=60,
                                     limits=httpx.Limits(max_connections=None)) as c:
            async def one(i: int, run: str = "r") -> None:
                body = json.dumps({"threadId": f"t{i}", "runId": f"{run}{i}"}).encode()
                results[i] = (await c.post(h.url + "/", content=body)).content

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(one, i)
            await h.settle(lambda h: len(h.of("run.finished"))
                           + h.health.counters["sessions_refused"] == n)
            mapped = {e["session"] for e in h.events}
            refused = h.health.counters["sessions_refused"]
            assert refused >= 1 and len(mapped) + refused == n, (mapped, refused)
            for i in range(n):  # the UI got every byte, mapped or not
                assert results[i] == (CAPTURE.replace(b"thread-capture-1", f"t{i}".encode())
                                      .replace(b"run-capture-1", f"r{i}".encode()))
            known = int(sorted(mapped)[0][1:])
            before = len(h.events)
            await one(known, run="again")  # a known session takes no token
            await h.settle(lambda h: len(h.of("run.finished")) == len(mapped) + 1)
            assert {e["session"] for e in h.events[before:]} == {f"t{known}"}
            assert h.health.counters["sessions_refused"] == refused


async def test_upstream_breaking_mid_stream_truncates_the_ui_stream_and_fails_the_run():
    async def broken(scope, receive, send):
        if not await open_run(scope, receive, send):
            return
        raise RuntimeError("agent crashed mid-run")  # hypercorn drops the connection

    async with upstream(broken) as up, proxy(up) as h:
        received = b""
        with pytest.raises(httpx.HTTPError):
            async with httpx.AsyncClient(trust_env=False) as c:
                async with c.stream("POST", h.url + "/", content=b"{}") as r:
                    async for chunk in r.aiter_raw():
                        received += chunk
        await h.settle(lambda h: h.of("run.failed"))
    assert received.startswith(b'data: {"type":"RUN_STARTED"')
    assert h.of("run.failed")[0]["data"] == {"reason": "upstream_error"}
    assert h.health.counters["agui.upstream_errors"] == 1


async def test_a_non_loopback_host_is_refused_on_a_loopback_bind():
    async with upstream(replay(frames(CAPTURE))) as up, proxy(up) as h:
        r = await post(h.url, headers={"host": "evil.example:8790"})
    assert r.status_code == 403 and h.health.counters["agui.refused_host"] == 1


async def test_run_state_is_per_run_not_on_the_bridge_and_a_restart_starts_clean():
    async with upstream(replay(frames(CAPTURE))) as up:
        async with proxy(up) as h:
            before = dict(vars(h.bridge))
            first = h.run
            await post(h.url)
            await h.settle(lambda h: h.of("run.finished"))
        assert vars(h.bridge) == before
        async with proxy(up) as h2:
            assert h2.run is not first and h2.run.client is not first.client
            assert h2.run.controller is None  # read-only: the fleet's ledger nacks everything


async def test_a_command_routed_here_is_nacked_unsupported_by_the_fleets_ledger():
    async with upstream(replay(frames(CAPTURE))) as up, proxy(up) as h:
        await h.cmd.send({"id": "01J0000000000000000000CMD1", "source": "aep://tester/laptop",
                          "session": "t", "type": "control.cancel", "data": {}})
        await h.settle(lambda h: h.of("control.rejected"))
    assert h.of("control.rejected")[0]["data"]["reason"] == "unsupported"


async def test_stopping_the_bridge_mid_stream_closes_the_run_and_the_upstream_request():
    upstream_saw_disconnect = trio.Event()
    hang = started_then_hanging(upstream_saw_disconnect)

    async with upstream(hang) as up:
        async with proxy(up) as h:
            async with httpx.AsyncClient(trust_env=False) as c:
                async with c.stream("POST", h.url + "/", content=b"{}") as r:
                    chunks = r.aiter_raw()  # kept open: the UI is still reading
                    assert b"RUN_STARTED" in await chunks.__anext__()
                    await h.settle(lambda h: h.of("run.started"))
                    h.nursery.cancel_scope.cancel()  # the supervisor stops the bridge
        with trio.fail_after(10):
            await upstream_saw_disconnect.wait()
    assert [e["type"] for e in h.events] == ["run.started", "run.failed"]
    assert h.of("run.failed")[0]["data"] == {"reason": "proxy_stopped"}


async def test_ui_leaving_during_the_upload_abandons_the_upstream_request():
    got_request = trio.Event()

    async def slow_reader(scope, receive, send):
        if scope["type"] == "lifespan":
            return await http_body(scope, receive, send)
        got_request.set()
        while (await receive())["type"] != "http.disconnect":
            pass

    async with upstream(slow_reader) as up, proxy(up) as h:
        host, port = h.url.removeprefix("http://").split(":")
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                              b"\r\nContent-Length: 100000\r\n\r\n" + b"{" * 100)
        with trio.fail_after(10):
            await got_request.wait()  # the proxy is streaming the body upstream
        await stream.aclose()
        await h.settle(lambda h: h.health.counters.get("agui.client_disconnects") == 1)
    assert "agui.upstream_unreachable" not in h.health.counters and not h.events


@pytest.mark.parametrize("request_line,extra", [("GET / HTTP/1.1", "Connection: close\r\n"),
                                                ("GET / HTTP/1.0", "")])
async def test_a_ui_that_asks_for_close_gets_its_connection_closed_after_the_response(
        request_line, extra):
    """The socket is closed as the response ends (the UI's watcher used to
    cancel hypercorn's close half way: the connection and its fd stayed
    open until the UI itself left), and that is no UI disconnect."""
    async with upstream(replay(frames(CAPTURE))) as up, proxy(up) as h:
        host, port = h.url.removeprefix("http://").split(":")
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(f"{request_line}\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode())
        got = b""
        with trio.move_on_after(10) as waited:
            while chunk := await stream.receive_some():
                got += chunk
        await stream.aclose()
        await h.settle(lambda h: h.of("run.finished"))
    assert not waited.cancelled_caught, "the proxy kept the connection open"
    assert got.startswith(b"HTTP/1.1 200 ") and b'"type":"RUN_FINISHED"' in got
    assert "agui.client_disconnects" not in h.health.counters
