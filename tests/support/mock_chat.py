"""A mock OpenAI **Chat Completions** provider for driving real vendors offline.

Kimi Code (``[providers.x] type = "openai"``) calls ``POST
{base_url}/chat/completions`` with ``"stream": true`` and reads an SSE stream
of ``chat.completion.chunk`` objects ended by ``data: [DONE]``. This mock
plays a script the test hands it, one step per model request:

- :class:`Tool` ``(name, args)``: the response is ONE tool call (a
  ``delta.tool_calls`` chunk, then ``finish_reason: "tool_calls"``). The name
  must be one of the tools the request offers, or the step fails (recorded in
  :attr:`MockChatServer.problems`, answered as a short text so the vendor's
  turn still ends).
- :class:`Text` ``(text)``: a plain assistant message (``finish_reason:
  "stop"``).
- :class:`Hold` ``(step)``: like ``step`` but the response is held (headers
  sent, no chunk yet) until :meth:`MockChatServer.release` is called or the
  client goes away, for "killed mid-turn" scenarios.

When the script is exhausted every further request gets :data:`FINAL_TEXT`.
Requests that are not chat completions (``GET /models``) get a small valid
answer; everything is recorded in :attr:`MockChatServer.requests` so a test
can assert what reached the model, e.g. the tool result message carrying a
rejection's feedback text (:meth:`MockChatServer.tool_messages`).

The server is hypercorn (trio worker) on ``127.0.0.1``, an OS-chosen port;
start it with ``base_url = await nursery.start(server.serve)``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Union

import trio

from supervisor.asgi import send_json
from tests.support.mock_responses import RecordedRequest
from tests.support.net import http_body, serve_loopback

MODEL = "mock-chat-model"
FINAL_TEXT = "Done."


@dataclass(frozen=True)
class Tool:
    """Answer with one call of tool ``name`` with ``args`` (a JSON object)."""

    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Text:
    """Answer with the assistant text ``text``."""

    text: str


@dataclass(frozen=True)
class Hold:
    """Answer ``step`` only after :meth:`MockChatServer.release`."""

    step: Union[Tool, Text]


Step = Union[Tool, Text, Hold]


@dataclass
class MockChatServer:
    """The scripted provider; see the module docstring.

    Attributes:
        script: the steps still to play (consumed from the front).
        requests: every request received, in arrival order.
        tool_calls: ``(call_id, name, args)`` for each tool call sent.
        problems: script failures (a scripted tool the request did not offer).
        held: set while a :class:`Hold` response is waiting.
        base_url: ``http://127.0.0.1:<port>/v1`` once serving.
    """

    script: list[Step] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)
    tool_calls: list[tuple[str, str, dict]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    base_url: str | None = None
    held: trio.Event = field(default_factory=trio.Event)
    _release: trio.Event = field(default_factory=trio.Event)
    _seq: int = 0
    _changed: trio.Event = field(default_factory=trio.Event)

    # -- querying -------------------------------------------------------
    def chat_requests(self) -> list[RecordedRequest]:
        """The ``POST .../chat/completions`` requests, in order."""
        return [r for r in self.requests
                if r.method == "POST" and r.path.endswith("/chat/completions")]

    def tool_messages(self) -> list[dict]:
        """Every ``role: tool`` message the vendor sent back, over all requests
        (a message repeated in later requests is listed once per request)."""
        out = []
        for r in self.chat_requests():
            for m in (r.json or {}).get("messages", []) or []:
                if isinstance(m, dict) and m.get("role") == "tool":
                    out.append(m)
        return out

    def offered_tools(self) -> set[str]:
        """Tool names offered in the latest chat request."""
        reqs = self.chat_requests()
        return _tool_names(reqs[-1].json or {}) if reqs else set()

    async def wait_requests(self, n: int) -> None:
        """Wait until at least ``n`` chat requests arrived."""
        while len(self.chat_requests()) < n:
            await self._changed.wait()

    def release(self) -> None:
        """Let a held response go."""
        self._release.set()

    # -- serving --------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(base_url)``."""
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve_loopback, self._app, graceful_timeout=0.2))
            self.base_url = url + "/v1"
            task_status.started(self.base_url)

    def _next_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}_mock_{self._seq}"

    async def _app(self, scope, receive, send) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        from supervisor.asgi import headers as request_headers
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        req = RecordedRequest(scope["method"], scope["path"], request_headers(scope), body, parsed)
        self.requests.append(req)
        self._changed.set()
        self._changed = trio.Event()
        path = scope["path"].rstrip("/")
        if scope["method"] == "POST" and path.endswith("/chat/completions"):
            await self._chat(req, send)
        elif scope["method"] == "GET" and path.endswith("/models"):
            await send_json(send, 200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "mock"}]})
        else:
            await send_json(send, 404, {"error": {"message": f"mock: no route {path}"}})

    async def _chat(self, req: RecordedRequest, send) -> None:
        payload = req.json if isinstance(req.json, dict) else {}
        step: Step = self.script.pop(0) if self.script else Text(FINAL_TEXT)
        hold = isinstance(step, Hold)
        if isinstance(step, Hold):
            step = step.step
        if isinstance(step, Tool) and step.name not in _tool_names(payload):
            self.problems.append(f"tool {step.name!r} not offered; tools={sorted(_tool_names(payload))}")
            step = Text("mock script problem: " + self.problems[-1])
        cid = self._next_id("chatcmpl")
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        if hold:
            self.held.set()
            await self._release.wait()
        for chunk in self._chunks(cid, step):
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _chunks(self, cid: str, step: Tool | Text) -> list[dict]:
        def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> dict:
            c = {"id": cid, "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage is not None:
                c["usage"] = usage
            return c
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        if isinstance(step, Text):
            return [chunk({"role": "assistant", "content": ""}),
                    chunk({"content": step.text}),
                    chunk({}, "stop", usage)]
        call_id = self._next_id("call")
        self.tool_calls.append((call_id, step.name, dict(step.args)))
        return [chunk({"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": call_id, "type": "function",
                     "function": {"name": step.name, "arguments": ""}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(step.args)}}]}),
                chunk({}, "tool_calls", usage)]


def _tool_names(payload: dict) -> set[str]:
    names = set()
    for t in payload.get("tools", []) or []:
        if isinstance(t, dict):
            n = (t.get("function") or {}).get("name") or t.get("name")
            if n:
                names.add(n)
    return names
