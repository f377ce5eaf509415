"""A hostile vendor server on loopback (round 15 of issue 25, finding 2):
raw sockets under trio, so the answer's framing and pace are the test's
own, and every byte sent is counted.

Every request is answered ``200`` with a chunked JSON body shaped by
``mode`` (the attacker's ``hostile.py`` modes):

- ``huge``: ``{"items":[{"id": ...}, ...]}`` of ``size`` bytes, as fast as read;
- ``endless``: the same, never ending;
- ``deep``: 200,000 ``[`` (nesting past the parser's recursion limit);
- ``drip``: one space every ``drip_s`` seconds, forever (each read is well
  within a per-read timeout);
- ``pages``: a search page of ``page_items`` distinct valid ids (2.9 MB at
  65,000) with a fresh ``next_page_id``, every time;
- ``ok``: ``body`` (JSON), then the next request on the connection.

A path starting with ``sse_path`` is answered instead with an SSE stream
(``text/event-stream``) that sends ``sse_first`` and then stays open: the
OpenCode family reads its REST only while its event stream is up.
``answers`` records one :class:`Answer` per REST answer."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import trio

ITEM = b'{"id":"0199aaaabbbb7ccc8dddeeeeeeeeeeee","x":"' + b"y" * 400 + b'"},'
BLOCK = ITEM * 2500  # ~1 MB a chunk


@dataclass
class Answer:
    path: str
    sent: int = 0
    #: the client closed the connection before the answer ended
    cut: bool = False
    done: bool = False


@dataclass
class HostileVendor:
    mode: str
    size: int = 40_000_000
    drip_s: float = 0.05
    body: Any = None
    sse_path: str | None = None
    sse_first: bytes = b""
    page_items: int = 65_000
    answers: list[Answer] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sent(self) -> int:
        return sum(a.sent for a in self.answers)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as n:
            await n.start(trio.serve_listeners, self._connection, listeners)
            task_status.started()

    async def _connection(self, s: trio.SocketStream) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = await s.receive_some(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                path = head.split(b"\r\n")[0].split(b" ")[1].decode()
                if self.sse_path is not None and path.startswith(self.sse_path):
                    await s.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n")
                    if self.sse_first:
                        await s.send_all(b"%x\r\n%s\r\n" % (len(self.sse_first), self.sse_first))
                    await trio.sleep_forever()
                answer = Answer(path)
                self.answers.append(answer)
                await s.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
                try:
                    await self._body(s, answer)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    answer.cut = True
                    return
                answer.done = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    async def _body(self, s: trio.SocketStream, answer: Answer) -> None:
        async def chunk(data: bytes) -> None:
            await s.send_all(b"%x\r\n%s\r\n" % (len(data), data))
            answer.sent += len(data)

        if self.mode in ("huge", "endless"):
            await chunk(b'{"items":[')
            while self.mode == "endless" or answer.sent < self.size:
                await chunk(BLOCK)
            await chunk(ITEM[:-1] + b"]}")
        elif self.mode == "deep":
            await chunk(b"[" * 200_000)
        elif self.mode == "pages":
            base = len(self.answers) * self.page_items
            ids = ",".join(f'{{"id":"{base + i:032x}"}}' for i in range(self.page_items))
            await chunk(f'{{"items":[{ids}],"next_page_id":"p{len(self.answers)}"}}'.encode())
        elif self.mode == "drip":
            while True:
                await chunk(b" ")
                await trio.sleep(self.drip_s)
        else:
            await chunk(json.dumps(self.body).encode())
        await s.send_all(b"0\r\n\r\n")
