"""One write per whole response (``bridges/core/http.py``, issue 27):
``serve_app`` sends a response head announcing a ``Content-Length`` body
together with that body, in one ``send``; hypercorn alone writes them
apart, and on a loaded machine the client, woken by the head, waited for
the body until the server got the CPU back (the hook round trip's tail).
A streamed head (no length: SSE, a held hook's ``AEP-Hold-Ms``) still goes
out before its body exists. Real sockets on loopback; the server's writes
are read off ``trio.SocketStream.send_all``."""
from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import trio

from bridges.core import http
from bridges.core.asgi import respond

BIG = b"x" * (getattr(http, "JOIN_MAX", 64 * 1024) + 1)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/whole":
        await respond(send, 200, {"ok": True})
    elif path == "/big":
        await respond(send, 200, BIG)
    elif path == "/stream":  # a head the client must see before any body exists
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await scope["state"]["go"].wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n"})


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every non-empty ``send_all`` of a response (the server's side)."""
    got: list[bytes] = []
    orig = trio.SocketStream.send_all

    async def send_all(self: trio.SocketStream, data: Any) -> None:
        if data and not bytes(data).startswith((b"GET ", b"HEAD ")):  # not the client's
            got.append(bytes(data))
        await orig(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", send_all)
    return got


async def _serve(nursery: trio.Nursery, go: trio.Event) -> int:
    sock = http.bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    wrapped = app

    async def with_go(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, "state": {**scope.get("state", {}), "go": go}}
        await wrapped(scope, receive, send)

    await nursery.start(lambda task_status: http.serve_app(
        with_go, sock, trio.Event(), task_status=task_status))
    return port


async def _get(port: int, path: str, method: str = "GET") -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Connection: close\r\n\r\n".encode())
        out = b""
        while chunk := await stream.receive_some():
            out += chunk
        return out


async def test_a_whole_response_is_one_write(writes: list[bytes]) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            port = await _serve(n, trio.Event())
            got = await _get(port, "/whole")
            n.cancel_scope.cancel()
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b'{"ok": true}')
    assert len(writes) == 1 and writes[0] == got  # head and body in one send


async def test_a_head_request_gets_its_head_without_a_body(writes: list[bytes]) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            port = await _serve(n, trio.Event())
            got = await _get(port, "/whole", "HEAD")
            n.cancel_scope.cancel()
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"\r\n\r\n")
    assert b"content-length: 12" in got.lower() and writes == [got]


async def test_a_big_body_follows_its_head_uncopied(writes: list[bytes]) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            port = await _serve(n, trio.Event())
            got = await _get(port, "/big")
            n.cancel_scope.cancel()
    assert got.endswith(BIG)
    assert len(writes) == 2 and writes[0].endswith(b"\r\n\r\n") and writes[1] == BIG


async def test_a_streamed_head_goes_out_before_its_body_exists(writes: list[bytes]) -> None:
    go = trio.Event()
    with trio.fail_after(10):  # a held head would stall the read below: a failure, not a hang
        async with trio.open_nursery() as n:
            port = await _serve(n, go)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      b"Connection: close\r\n\r\n")
                head = b""
                while b"\r\n\r\n" not in head:
                    head += await stream.receive_some()
                assert head.startswith(b"HTTP/1.1 200") and b"data:" not in head
                go.set()  # only now does the body exist
                rest = b""
                while chunk := await stream.receive_some():
                    rest += chunk
            n.cancel_scope.cancel()
    assert b"data: 1" in rest


@pytest.mark.parametrize("head, held", [
    (b"HTTP/1.1 200 \r\ncontent-length: 12\r\n\r\n", True),
    (b"HTTP/1.1 200 \r\nContent-Length:007\r\n\r\n", True),
    (b"HTTP/1.1 204 \r\ncontent-length: 0\r\n\r\n", False),
    (b"HTTP/1.1 200 \r\ntransfer-encoding: chunked\r\n\r\n", False),
    (b"HTTP/1.1 100 \r\n\r\n", False),
    (b'{"x-content-length: 5"}', False),  # a body is never a head
])
def test_which_writes_wait_for_their_body(head: bytes, held: bool) -> None:
    assert http._sized_head(head) is held


async def _get_then_hang_up(port: int, path: str, idle: trio.Event) -> bytes:
    """A keep-alive request (no ``Connection: close``) read to its
    ``Content-Length``, then the client closes once the server holds the
    connection idle (``idle`` set: its keep-alive timer runs): what a
    vendor hook and the shim do (http.client), in the order that left
    the connection behind."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        out = b""
        while b"\r\n\r\n" not in out:
            out += await stream.receive_some()
        head, _, body = out.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            body += await stream.receive_some()
        await idle.wait()
        return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("hang_up", [False, True], ids=["connection-close", "client-hangs-up"])
async def test_an_ended_connection_is_freed_without_the_cyclic_collector(
        monkeypatch: pytest.MonkeyPatch, hang_up: bool) -> None:
    """Its handler, h11 state, task group and locks go when it ends, by
    reference counting: in a cycle (hypercorn's protocol holding the
    handler's bound ``protocol_send``, the abort handle holding the
    handler) they waited for the cyclic collector, and that garbage was
    part of every young collection a hook round trip could land in. A
    keep-alive connection the client closes after its answer ends then
    too: hypercorn kept it (socket in CLOSE-WAIT, tasks, state) until its
    keep-alive timer ran out (75 s)."""
    handlers: list[weakref.ref[Any]] = []
    init = http._AbortableTCPServer.__init__

    def spy(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        handlers.append(weakref.ref(self))

    monkeypatch.setattr(http._AbortableTCPServer, "__init__", spy)
    idled: list[trio.Event] = []
    went_idle = http._Phase.idle

    def idle(self: Any) -> None:
        went_idle(self)
        idled[-1].set()

    monkeypatch.setattr(http._Phase, "idle", idle)
    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                port = await _serve(n, trio.Event())
                for _ in range(3):
                    idled.append(trio.Event())
                    got = await (_get_then_hang_up(port, "/whole", idled[-1]) if hang_up
                                 else _get(port, "/whole"))
                    assert got.endswith(b'{"ok": true}')
                for _ in range(500):  # their tasks end once the client's close is read
                    if all(r() is None for r in handlers):
                        break
                    await trio.sleep(0.01)
                alive = sum(r() is not None for r in handlers)
                n.cancel_scope.cancel()
    finally:
        gc.enable()
    assert len(handlers) == 3 and alive == 0
