"""A stub kap-server speaking the ``kimi web`` 2.1.0 protocol, for fault
injection and benchmarks (never instead of the real server, which the live
tests run).

REST under ``/api/v1`` with the ``{code, msg, data}`` envelope and the
bearer token (a wrong one: HTTP 401 ``{code: 40101}``, as 2.1.0 answers):
``GET /sessions`` (one page), ``GET /sessions/{sid}`` (40401 for an unknown
one), ``.../prompts``, ``.../approvals``, ``.../questions``; every ``POST`` is
recorded and answered from :attr:`StubKap.post_answers` (the first entry
whose key is in the path; default ``code: 0``).

``/api/v1/ws`` with the ``kimi-code.bearer.<token>`` subprotocol (a wrong
token: the upgrade is refused 403): ``server_hello`` (``heartbeat_ms`` from
:attr:`StubKap.heartbeat_ms`), then ``client_hello`` / ``subscribe`` are
acked like 2.1.0 (``accepted``, ``not_found``, ``resync_required``,
``cursors``), client frames are recorded, and the connection's script (one
list per connection in :attr:`StubKap.scripts`; the last one repeats) is
played after the first subscribe ack: a dict is sent as JSON, a ``str`` /
``bytes`` raw, ``("sleep", s)`` waits, ``("hang",)`` goes silent (no pings
either), ``("close",)`` closes, ``("ping",)`` sends a ping,
``("hold_acks",)`` keeps every later ``subscribe`` ack back (a loaded
server answering late) until ``("release_acks",)`` sends them, in order.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from bridges.core.asgi import headers as request_headers
from bridges.core.asgi import send_json
from tests.support.net import http_body, serve_loopback

EPOCH = "ep_stub"


def event(type_: str, sid: str, seq: int, epoch: str = EPOCH, volatile: bool = False,
          **payload: Any) -> dict[str, Any]:
    """One WS event envelope as 2.1.0 sends it."""
    f = {"type": type_, "seq": seq, "session_id": sid, "timestamp": "2026-12-01T09:00:00.000Z",
         "payload": {"type": type_, "agentId": "main", "sessionId": sid, **payload}, "epoch": epoch}
    if volatile:
        f["volatile"] = True
    return f


def session_item(sid: str, **kw: Any) -> dict[str, Any]:
    return {"id": sid, "workspace_id": "wd_stub_000000000000", "title": "", "busy": False,
            "main_turn_active": False, "pending_interaction": "none", "archived": False, **kw}


@dataclass
class StubKap:
    token: str = "stub-token-0123456789"
    sessions: list[dict[str, Any]] = field(default_factory=list)
    scripts: list[list[Any]] = field(default_factory=lambda: [[("hang",)]])
    heartbeat_ms: int = 10_000
    approvals: dict[str, list[dict]] = field(default_factory=dict)
    questions: dict[str, list[dict]] = field(default_factory=dict)
    prompts: dict[str, dict] = field(default_factory=dict)
    post_answers: dict[str, dict] = field(default_factory=dict)
    not_found: set[str] = field(default_factory=set)
    resync: set[str] = field(default_factory=set)
    #: sessions every subscribe ack also names as accepted (a buggy or
    #: hostile server answering for what was never asked)
    ack_also: list[str] = field(default_factory=list)
    rest: list[tuple[str, str, Any]] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    url: str = ""
    max_message: int = 64 * 1024 * 1024

    def posts(self) -> list[tuple[str, Any]]:
        return [(p, b) for m, p, b in self.rest if m == "POST"]

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            self.url = await n.start(partial(serve_loopback, self._app,
                                             websocket_max_message_size=self.max_message))
            task_status.started(self.url)

    async def _app(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":
            await self._ws(scope, receive, send)
            return
        body = await http_body(scope, receive, send)
        if body is None:
            return
        path = scope["path"]
        qs = scope.get("query_string", b"").decode()
        parsed = json.loads(body) if body else None
        self.rest.append((scope["method"], path + ("?" + qs if qs else ""), parsed))
        if request_headers(scope).get("authorization") != f"Bearer {self.token}":
            await send_json(send, 401, {"code": 40101, "msg": "Unauthorized", "data": None})
            return
        await send_json(send, 200, self._answer(scope["method"], path))

    def _answer(self, method: str, path: str) -> dict[str, Any]:
        ok = lambda data: {"code": 0, "msg": "success", "data": data, "request_id": "r"}  # noqa: E731
        if method == "POST":
            for key, answer in self.post_answers.items():
                if key in path:
                    return answer
            return ok({"resolved": True} if "/approvals/" in path else {"aborted": True})
        parts = path.removeprefix("/api/v1/").split("/")
        if parts == ["sessions"]:
            return ok({"items": self.sessions, "has_more": False})
        if len(parts) >= 2 and parts[0] == "sessions":
            sid = parts[1]
            item = next((s for s in self.sessions if s["id"] == sid), None)
            if item is None:
                return {"code": 40401, "msg": f"session {sid} does not exist", "data": None}
            if len(parts) == 2:
                return ok(item)
            tail = parts[2]
            if tail == "prompts":
                return ok(self.prompts.get(sid, {"active": None, "queued": []}))
            if tail == "approvals":
                return ok({"items": self.approvals.get(sid, [])})
            if tail == "questions":
                return ok({"items": self.questions.get(sid, [])})
        return {"code": 40001, "msg": "no such route", "data": None}

    async def _ws(self, scope, receive, send) -> None:
        msg = await receive()
        if msg["type"] != "websocket.connect":
            return
        protos = scope.get("subprotocols") or []
        if f"kimi-code.bearer.{self.token}" not in protos:
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
            return
        await send({"type": "websocket.accept", "subprotocol": f"kimi-code.bearer.{self.token}"})
        index = min(self.connections, len(self.scripts) - 1)
        self.connections += 1
        script = self.scripts[index]
        subscribed = trio.Event()
        closed = trio.Event()
        held: list[dict[str, Any]] | None = None  # subscribe acks kept back (``hold_acks``)

        async def out(obj: Any) -> None:
            if isinstance(obj, (dict, list)):
                obj = json.dumps(obj)
            key = "bytes" if isinstance(obj, bytes) else "text"
            await send({"type": "websocket.send", key: obj})

        async def reader() -> None:
            while True:
                m = await receive()
                if m["type"] == "websocket.disconnect":
                    closed.set()
                    return
                try:
                    f = json.loads(m.get("text") or m.get("bytes") or b"")
                except ValueError:
                    continue
                self.received.append(f)
                t, p = f.get("type"), f.get("payload") or {}
                if t == "client_hello":
                    await out({"type": "ack", "id": f.get("id"), "code": 0, "msg": "success",
                               "payload": {"accepted_subscriptions": [], "resync_required": [],
                                           "cursors": {}}})
                elif t == "subscribe":
                    ids = p.get("session_ids") or []
                    acc = [s for s in ids if s not in self.not_found] + self.ack_also
                    answer = {"type": "ack", "id": f.get("id"), "code": 0, "msg": "success",
                               "payload": {"accepted": acc,
                                           "not_found": [s for s in ids if s in self.not_found],
                                           "resync_required": [s for s in acc if s in self.resync],
                                           "cursors": {s: {"seq": 0, "epoch": EPOCH} for s in acc}}}
                    if held is not None:
                        held.append(answer)
                    else:
                        await out(answer)
                    subscribed.set()

        async with trio.open_nursery() as n:
            n.start_soon(reader)
            await out({"type": "server_hello", "timestamp": "2026-12-01T09:00:00.000Z",
                       "payload": {"ws_connection_id": f"conn_stub_{self.connections}",
                                   "protocol_version": 2, "heartbeat_ms": self.heartbeat_ms,
                                   "max_event_buffer_size": 1000,
                                   "capabilities": {"event_batching": False, "compression": False}}})
            with trio.move_on_after(10):
                await subscribed.wait()
            for step in script:
                if closed.is_set():
                    break
                if isinstance(step, tuple):
                    if step[0] == "sleep":
                        await trio.sleep(step[1])
                    elif step[0] == "hang":
                        await closed.wait()
                    elif step[0] == "close":
                        await send({"type": "websocket.close", "code": 1000})
                        break
                    elif step[0] == "hold_acks":
                        held = []
                    elif step[0] == "release_acks":
                        late, held = held or [], None
                        for answer in late:
                            await out(answer)
                    elif step[0] == "ping":
                        await out({"type": "ping", "timestamp": "2026-12-01T09:00:00.000Z",
                                   "payload": {"nonce": "n1"}})
                    continue
                await out(step)
            await closed.wait()
            n.cancel_scope.cancel()


def busy_stub(n: int) -> StubKap:
    """``n`` sessions; every connection sends each one finished turn (two
    persisted frames and a volatile one) after the subscription, then hangs."""
    sids = [f"session_bench_{i:05d}" for i in range(n)]
    script: list[Any] = []
    for sid in sids:
        script += [event("turn.started", sid, 1, turnId=0, promptId=f"msg_{sid}", origin={"kind": "user"}),
                   event("agent.status.updated", sid, 1, volatile=True),
                   event("turn.ended", sid, 2, turnId=0, reason="completed")]
    return StubKap(sessions=[session_item(s) for s in sids], scripts=[script + [("hang",)]])


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.kimi_stub --sessions N``: serve
    :func:`busy_stub` on loopback; prints ``<url> <token>`` then serves
    until killed (benchmarks run it as its own process)."""
    import argparse
    import sys
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10)
    args = ap.parse_args(argv)
    stub = busy_stub(args.sessions)

    async def run() -> None:
        async with trio.open_nursery() as n:
            url = await n.start(stub.serve)
            print(url, stub.token, flush=True)
            sys.stdout.flush()
    trio.run(run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
