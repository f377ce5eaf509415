"""A mock OpenAI **Responses API** model provider for driving real vendor CLIs offline.

Codex (and other vendors configured with a custom OpenAI-compatible provider)
call ``POST {base_url}/responses`` with ``"stream": true`` and read an SSE
stream of Responses events. This mock plays a fixed two-turn script:

1. first request of a turn (no tool output in ``input`` yet): ONE shell tool
   call (``function_call`` item) running :data:`SHELL_COMMAND`;
2. the follow-up request that carries the ``function_call_output`` for that
   call: a final assistant ``message`` with :data:`FINAL_TEXT`.

The event stream follows what codex-rs' ``codex-api/src/sse/responses.rs``
parses: ``response.created`` (with a ``response`` object),
``response.output_item.added`` / ``response.output_text.delta`` /
``response.output_item.done`` (the ``item`` is a Responses ``ResponseItem``),
and ``response.completed`` whose ``response`` has an ``id`` and ``usage``
(``input_tokens``, ``output_tokens``, ``total_tokens`` plus the ``*_details``).
A stream that ends without ``response.completed`` is an error for Codex, so we
always send it.

Which shell tool the call uses is read from the request's ``tools`` list (the
name and argument shape changed across Codex releases): ``shell_command``
(``{"command": "<string>"}``), ``exec_command`` (``{"cmd": "<string>"}``) or
``shell`` (``{"command": ["bash", "-lc", "<string>"]}``), in that order of
preference.

Anything else gets a small, valid answer or 404 and is recorded, so the test
can assert nothing unexpected was asked for: ``GET /models`` (a one-model
list), ``POST .../analytics/...`` (Codex 0.171 posts
``/analytics/codex/turn-costs`` to the provider base URL at turn end: 200
``{}``). When the vendor's proxy variables point here, ``CONNECT`` requests
(attempts to reach the internet) get 403 and are listed by :meth:`egress`.

The server is hypercorn (trio worker) on ``127.0.0.1`` with an OS-chosen port;
start it with ``await nursery.start(server.serve)``.
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

#: the command the mock asks the agent to run
SHELL_COMMAND = "echo hello"
#: the final assistant message after the tool output came back
FINAL_TEXT = "The command printed hello. Done."
#: the model slug answered (also listed by ``GET /models``)
MODEL = "mock-codex-model"

# tool name -> how to spell the arguments for SHELL_COMMAND
_SHELL_TOOLS = {
    "shell_command": lambda cmd: {"command": cmd},
    "exec_command": lambda cmd: {"cmd": cmd},
    "shell": lambda cmd: {"command": ["bash", "-lc", cmd]},
}


@dataclass
class RecordedRequest:
    """One HTTP request the mock received (body parsed as JSON when possible)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any = None


@dataclass
class MockResponsesServer:
    """The scripted Responses provider; see the module docstring.

    Attributes:
        requests: every request received, in arrival order.
        tool_calls: ``(call_id, tool_name, arguments_dict)`` for each tool call sent.
        problems: script failures (e.g. no shell-like tool offered); the request
            got a ``response.failed`` event. Tests assert this stays empty.
        base_url: ``http://127.0.0.1:<port>/v1`` once :meth:`serve` has started.
    """

    command: str = SHELL_COMMAND
    final_text: str = FINAL_TEXT
    #: merged into the tool call's arguments (e.g. ``{"sandbox_permissions":
    #: "require_escalated", "justification": "..."}`` for an escalation request)
    extra_args: dict = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    tool_calls: list[tuple[str, str, dict]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    base_url: str | None = None
    port: int = 0
    _seq: int = 0

    # -- querying -------------------------------------------------------
    def responses_requests(self) -> list[RecordedRequest]:
        """The ``POST .../responses`` requests, in order."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/responses")]

    def egress(self) -> list[RecordedRequest]:
        """Requests that were really meant for another host: ``CONNECT`` tunnels and
        absolute-form proxy requests (the vendor's proxy env points here as a
        tripwire), i.e. attempts to leave the machine."""
        return [r for r in self.requests
                if r.method == "CONNECT"
                or not r.headers.get("host", "127.0.0.1").startswith(("127.0.0.1", "localhost"))]

    def tool_outputs(self) -> list[dict]:
        """Every ``function_call_output`` item Codex sent back (in request order)."""
        outs = []
        for r in self.responses_requests():
            for item in (r.json or {}).get("input", []) or []:
                if isinstance(item, dict) and item.get("type") in (
                        "function_call_output", "custom_tool_call_output"):
                    outs.append(item)
        return outs

    # -- serving --------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``127.0.0.1:<free port>`` until cancelled.

        ``task_status.started(base_url)`` reports ``http://127.0.0.1:<port>/v1``.
        """
        async with trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve_loopback, self._app, port=self.port,
                                              graceful_timeout=0.5))
            self.base_url = url + "/v1"
            task_status.started(self.base_url)

    def _next_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}_mock_{self._seq}"

    async def _app(self, scope, receive, send) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        headers = request_headers(scope)
        parsed = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        req = RecordedRequest(scope["method"], scope["path"], headers, body, parsed)
        self.requests.append(req)

        path = scope["path"].rstrip("/")
        if req in self.egress():
            await send_json(send, 403, {"error": {"message": "mock: offline test, no egress"}})
        elif scope["method"] == "POST" and path.endswith("/responses"):
            await self._responses(req, send)
        elif scope["method"] == "GET" and path.endswith("/models"):
            await send_json(send, 200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "mock"}]})
        elif scope["method"] == "POST" and "/analytics/" in path:
            # codex 0.171 posts turn-cost analytics to the provider's base URL
            await send_json(send, 200, {})
        else:
            await send_json(send, 404, {"error": {"message": f"mock: no route {path}",
                                                   "type": "not_found"}})

    async def _responses(self, req: RecordedRequest, send) -> None:
        payload = req.json if isinstance(req.json, dict) else {}
        answered = {o.get("call_id") for o in _items(payload, "function_call_output")}
        ours = {c[0] for c in self.tool_calls}
        resp_id = self._next_id("resp")
        if ours & answered or not _tool_names(payload):
            events = self._final_message_events(resp_id)
        else:
            events = self._tool_call_events(resp_id, payload)
        chunks = []
        for ev in events:
            chunks.append(f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode())
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for c in chunks:
            await send({"type": "http.response.body", "body": c, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _tool_call_events(self, resp_id: str, payload: dict) -> list[dict]:
        names = _tool_names(payload)
        name = next((n for n in _SHELL_TOOLS if n in names), None)
        if name is None:
            self.problems.append(f"no shell-like tool offered; tools={sorted(names)}")
            return [_created(resp_id), {"type": "response.failed", "response": {
                "id": resp_id, "status": "failed",
                "error": {"code": "mock_script", "message": self.problems[-1]}}}]
        args = {**_SHELL_TOOLS[name](self.command), **self.extra_args}
        call_id = self._next_id("call")
        self.tool_calls.append((call_id, name, args))
        item = {"type": "function_call", "id": self._next_id("fc"), "status": "completed",
                "name": name, "arguments": json.dumps(args), "call_id": call_id}
        return [
            _created(resp_id),
            {"type": "response.output_item.added", "output_index": 0,
             "item": {**item, "arguments": "", "status": "in_progress"}},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            _completed(resp_id, [item]),
        ]

    def _final_message_events(self, resp_id: str) -> list[dict]:
        msg_id = self._next_id("msg")
        done = {"type": "message", "id": msg_id, "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": self.final_text,
                             "annotations": []}]}
        return [
            _created(resp_id),
            {"type": "response.output_item.added", "output_index": 0,
             "item": {**done, "status": "in_progress", "content": []}},
            {"type": "response.output_text.delta", "item_id": msg_id, "output_index": 0,
             "content_index": 0, "delta": self.final_text},
            {"type": "response.output_item.done", "output_index": 0, "item": done},
            _completed(resp_id, [done]),
        ]


def _items(payload: dict, kind: str) -> list[dict]:
    return [i for i in payload.get("input", []) or []
            if isinstance(i, dict) and i.get("type") == kind]


def _tool_names(payload: dict) -> set[str]:
    names = set()
    for t in payload.get("tools", []) or []:
        if isinstance(t, dict):
            n = t.get("name") or (t.get("function") or {}).get("name")
            if n:
                names.add(n)
    return names


def _created(resp_id: str) -> dict:
    return {"type": "response.created",
            "response": {"id": resp_id, "object": "response", "status": "in_progress",
                         "model": MODEL, "output": []}}


def _completed(resp_id: str, output: list[dict]) -> dict:
    return {"type": "response.completed",
            "response": {"id": resp_id, "object": "response", "status": "completed",
                         "model": MODEL, "output": output,
                         "usage": {"input_tokens": 120,
                                   "input_tokens_details": {"cached_tokens": 0},
                                   "output_tokens": 12,
                                   "output_tokens_details": {"reasoning_tokens": 0},
                                   "total_tokens": 132}}}


async def _serve_forever(port: int) -> None:
    import sys
    mock = MockResponsesServer(port=port)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(mock.serve)
        print(f"mock Responses provider on {url} (model {MODEL!r}; every turn: one shell call "
              f"`{mock.command}`, then a final answer). In $CODEX_HOME/config.toml:\n\n"
              f'model = "{MODEL}"\nmodel_provider = "mock"\n\n[model_providers.mock]\n'
              f'name = "mock"\nbase_url = "{url}"\nenv_key = "AEP_MOCK_PROVIDER_KEY"\n'
              f'wire_api = "responses"\n\n(and export AEP_MOCK_PROVIDER_KEY=anything)',
              file=sys.stderr, flush=True)
        print(url, flush=True)


if __name__ == "__main__":
    # python -m tests.support.mock_responses [PORT]: the mock model for your own Codex
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.mock_responses",
        description="Serve the demo's mock OpenAI Responses model on loopback and print the"
                    " Codex config block to paste (stderr); the base URL alone goes to stdout.")
    parser.add_argument("port", nargs="?", type=int, default=0,
                        help="the port to listen on (default: any free one)")
    trio.run(_serve_forever, parser.parse_args().port)
