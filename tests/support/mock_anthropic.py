"""A scripted **Anthropic Messages API** model for driving the real Claude Code offline.

Claude Code (``ANTHROPIC_BASE_URL=http://127.0.0.1:P``) calls ``POST /v1/messages``
(``"stream": true`` for the agent loop; side calls such as the session title may
not stream) and reads Anthropic's SSE: ``message_start``, then per content block
``content_block_start`` / ``content_block_delta`` (``text_delta`` or
``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (with
``stop_reason`` and ``usage``) and ``message_stop``. A non-streaming request gets
the same message as one JSON object.

The script, in the style of :mod:`tests.support.mock_chat`: one step per **agent
request** (a request that offers ``tools``), consumed from the front of
:attr:`MockAnthropicServer.script`:

- :class:`Tool` ``(name, input)``: ONE ``tool_use`` block (``stop_reason:
  "tool_use"``), preceded by a short text block when ``text`` is given. A tool
  the request does not offer is a script failure (recorded in
  :attr:`MockAnthropicServer.problems`, answered as text so the turn ends).
- :class:`Text` ``(text)``: a plain assistant message (``end_turn``).
- :class:`Fail` ``(status, kind, message)``: an API error response (a 4xx is
  not retried by Claude Code: the turn ends in ``StopFailure``).
- :class:`Hold` ``(step)``: ``step``, answered only after :meth:`release`.

Requests without ``tools`` (titles, topic checks) and agent requests once the
script is exhausted get :data:`FINAL_TEXT`. Every request is recorded
(:attr:`requests`); :meth:`tool_results` / :meth:`texts_sent` say what reached the
model (a hook's deny reason arrives as a ``tool_result`` with ``is_error``; a hook's
``additionalContext`` as text in a later request). Any other path is answered
``404`` (Claude Code's ``/api/...`` calls) and recorded; ``CONNECT`` and
absolute-form proxy requests (the vendor's proxy env points here as a tripwire)
are listed by :meth:`egress` and refused.

Hypercorn (trio worker) on ``127.0.0.1``, OS-chosen port: ``await
nursery.start(server.serve)`` reports the base URL (no ``/v1``: Claude Code adds it).
``python -m tests.support.mock_anthropic`` serves it for a manual ``claude``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Union

import trio

from bridges.core.asgi import headers as request_headers
from bridges.core.asgi import send_json
from tests.support.net import http_body, serve_loopback

#: the model id answered (Claude Code sends whatever ANTHROPIC_MODEL says; we echo it)
MODEL = "claude-mock-1"
#: the answer to side calls and to agent requests past the end of the script
FINAL_TEXT = "Done."


@dataclass(frozen=True)
class Tool:
    """Answer with one ``tool_use`` of ``name`` with ``input`` (optionally after ``text``)."""

    name: str
    input: dict[str, Any]
    text: str = ""


@dataclass(frozen=True)
class Text:
    """Answer with a plain assistant text (the turn ends)."""

    text: str


@dataclass(frozen=True)
class Fail:
    """Answer with an API error: HTTP ``status`` and an Anthropic error body
    (``{"type": "error", "error": {"type": kind, "message": message}}``)."""

    status: int = 400
    kind: str = "invalid_request_error"
    message: str = "mock: scripted failure"


@dataclass(frozen=True)
class Hold:
    """Answer ``step`` only after :meth:`MockAnthropicServer.release`."""

    step: Union[Tool, Text, Fail]


Step = Union[Tool, Text, Fail, Hold]


@dataclass
class RecordedRequest:
    """One HTTP request the mock received (``json``: the parsed body, or ``None``)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any = None

    @property
    def is_agent(self) -> bool:
        """A ``/v1/messages`` request offering tools (one step of the script)."""
        return (self.path.rstrip("/").endswith("/v1/messages")
                and bool((self.json or {}).get("tools")))


@dataclass
class MockAnthropicServer:
    """The scripted Messages API; see the module docstring.

    Attributes:
        script: the steps still to play, one per agent request.
        requests: every request received, in arrival order.
        tool_uses: ``(tool_use_id, name, input)`` for every ``tool_use`` sent.
        problems: script failures; tests assert this stays empty.
        base_url: ``http://127.0.0.1:<port>`` once :meth:`serve` has started.
    """

    script: list[Step] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)
    tool_uses: list[tuple[str, str, dict]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    base_url: str | None = None
    port: int = 0
    _seq: int = 0
    _released: trio.Event = field(default_factory=trio.Event)

    # -- querying -------------------------------------------------------
    def messages_requests(self) -> list[RecordedRequest]:
        """The ``POST /v1/messages`` requests, in order."""
        return [r for r in self.requests
                if r.method == "POST" and r.path.rstrip("/").endswith("/v1/messages")]

    def agent_requests(self) -> list[RecordedRequest]:
        """The agent-loop requests (those offering tools), in order."""
        return [r for r in self.messages_requests() if r.is_agent]

    def tool_results(self) -> list[dict]:
        """Every distinct ``tool_result`` block sent back (first seen order), each
        with ``text`` added: its content flattened to one string."""
        seen: dict[str, dict] = {}
        for r in self.agent_requests():
            for block in _blocks(r.json, "user"):
                if block.get("type") == "tool_result" and block.get("tool_use_id") not in seen:
                    seen[block.get("tool_use_id")] = {**block, "text": _flatten(block.get("content"))}
        return list(seen.values())

    def texts_sent(self, request: RecordedRequest | None = None) -> str:
        """All text the client sent in ``request`` (default: the last agent request):
        the system prompt, every user text block and tool result, joined."""
        reqs = [request] if request else self.agent_requests()[-1:]
        parts: list[str] = []
        for r in reqs:
            payload = r.json or {}
            parts.append(_flatten(payload.get("system")))
            for msg in payload.get("messages", []) or []:
                parts.append(_flatten(msg.get("content")))
        return "\n".join(parts)

    def egress(self) -> list[RecordedRequest]:
        """Requests meant for another host: ``CONNECT`` tunnels and absolute-form or
        foreign-``Host`` requests (attempts to leave the machine)."""
        return [r for r in self.requests
                if r.method == "CONNECT"
                or not r.headers.get("host", "127.0.0.1").startswith(("127.0.0.1", "localhost"))]

    def release(self) -> None:
        """Let a :class:`Hold` step answer."""
        self._released.set()

    # -- serving --------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``127.0.0.1:<free port>`` until cancelled; reports the base URL."""
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve_loopback, self._app, port=self.port,
                                              graceful_timeout=0.5))
            self.base_url = url
            task_status.started(url)

    def _next_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}_mock{self._seq:04d}"

    async def _app(self, scope, receive, send) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        parsed = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        req = RecordedRequest(scope["method"], scope["path"], request_headers(scope), body, parsed)
        self.requests.append(req)
        path = scope["path"].rstrip("/")
        if req in self.egress():
            await send_json(send, 403, {"type": "error", "error": {
                "type": "permission_error", "message": "mock: offline test, no egress"}})
        elif scope["method"] == "POST" and path.endswith("/v1/messages"):
            await self._messages(req, send)
        elif scope["method"] == "POST" and path.endswith("/v1/messages/count_tokens"):
            await send_json(send, 200, {"input_tokens": 100})
        else:
            await send_json(send, 404, {"type": "error", "error": {
                "type": "not_found_error", "message": f"mock: no route {path}"}})

    async def _messages(self, req: RecordedRequest, send) -> None:
        payload = req.json if isinstance(req.json, dict) else {}
        step: Step = Text(FINAL_TEXT)
        if req.is_agent and self.script:
            step = self.script.pop(0)
        if isinstance(step, Hold):
            await self._released.wait()
            step = step.step
        if isinstance(step, Fail):
            await send_json(send, step.status, {"type": "error", "error": {
                "type": step.kind, "message": step.message}})
            return
        blocks, stop = self._blocks_for(step, payload)
        message = {"id": self._next_id("msg"), "type": "message", "role": "assistant",
                   "model": payload.get("model") or MODEL, "content": blocks,
                   "stop_reason": stop, "stop_sequence": None,
                   "usage": {"input_tokens": 120, "output_tokens": 12,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        if not payload.get("stream"):
            await send_json(send, 200, message)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for ev in _sse_events(message):
            chunk = f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _blocks_for(self, step: Union[Tool, Text], payload: dict) -> tuple[list[dict], str]:
        if isinstance(step, Text):
            return [{"type": "text", "text": step.text}], "end_turn"
        offered = {t.get("name") for t in payload.get("tools", []) or [] if isinstance(t, dict)}
        if step.name not in offered:
            self.problems.append(f"tool {step.name!r} not offered; tools={sorted(offered)}")
            return [{"type": "text", "text": f"(mock: no tool {step.name})"}], "end_turn"
        tool_id = self._next_id("toolu")
        self.tool_uses.append((tool_id, step.name, step.input))
        blocks = [{"type": "text", "text": step.text}] if step.text else []
        blocks.append({"type": "tool_use", "id": tool_id, "name": step.name, "input": step.input})
        return blocks, "tool_use"


def _sse_events(message: dict) -> list[dict]:
    """The Messages streaming events that rebuild ``message``."""
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**message["usage"], "output_tokens": 1}}
    events: list[dict] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append({"type": "content_block_start", "index": i,
                           "content_block": {"type": "text", "text": ""}})
            events.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "text_delta", "text": block["text"]}})
        else:
            events.append({"type": "content_block_start", "index": i,
                           "content_block": {**block, "input": {}}})
            events.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "input_json_delta",
                                     "partial_json": json.dumps(block["input"])}})
        events.append({"type": "content_block_stop", "index": i})
    events.append({"type": "message_delta",
                   "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                   "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    events.append({"type": "message_stop"})
    return events


def _blocks(payload: Any, role: str) -> list[dict]:
    out: list[dict] = []
    for msg in (payload or {}).get("messages", []) or []:
        if isinstance(msg, dict) and msg.get("role") == role and isinstance(msg.get("content"), list):
            out.extend(b for b in msg["content"] if isinstance(b, dict))
    return out


def _flatten(content: Any) -> str:
    """Text of a content value: a string, or a list of blocks (text, tool_result...)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for b in content:
            if isinstance(b, dict):
                if isinstance(b.get("text"), str):
                    parts.append(b["text"])
                elif "content" in b:
                    parts.append(_flatten(b["content"]))
            elif isinstance(b, str):
                parts.append(b)
        return "\n".join(parts)
    return str(content)


async def _serve_forever(port: int) -> None:
    import sys
    mock = MockAnthropicServer(port=port, script=[Tool("Bash", {"command": "echo hi",
                                                                "description": "say hi"})])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(mock.serve)
        print(f"mock Anthropic Messages API on {url}: the first agent request gets a Bash "
              f"`echo hi`, then {FINAL_TEXT!r}. export ANTHROPIC_BASE_URL={url} "
              "ANTHROPIC_API_KEY=dummy", file=sys.stderr, flush=True)
        print(url, flush=True)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(prog="python -m tests.support.mock_anthropic",
                                     description="Serve the scripted Anthropic Messages mock.")
    parser.add_argument("port", nargs="?", type=int, default=0)
    trio.run(_serve_forever, parser.parse_args().port)
