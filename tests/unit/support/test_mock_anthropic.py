"""The Messages mock the live Claude Code tests rely on (tests/support/mock_anthropic.py):
its SSE stream rebuilds exactly the message its non-streaming answer gives, in the
event order the Messages API documents; the script is consumed only by agent
requests (those offering tools); an unoffered tool and a Fail step behave as
documented; what the client sent is readable back."""
from __future__ import annotations

import json

import httpx
import trio

from tests.support.mock_anthropic import FINAL_TEXT, Fail, MockAnthropicServer, Text, Tool

TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
BASH = Tool("Bash", {"command": "echo hi"}, text="Running it.")


def _sse(body: str) -> list[dict]:
    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        events.append(data)
    return events


def _rebuild(events: list[dict]) -> dict:
    msg = dict(events[0]["message"])
    blocks: list[dict] = []
    for ev in events[1:]:
        if ev["type"] == "content_block_start":
            blocks.append(dict(ev["content_block"]))
            blocks[-1]["_json"] = ""
        elif ev["type"] == "content_block_delta":
            d = ev["delta"]
            if d["type"] == "text_delta":
                blocks[ev["index"]]["text"] += d["text"]
            else:
                blocks[ev["index"]]["_json"] += d["partial_json"]
        elif ev["type"] == "message_delta":
            msg["stop_reason"] = ev["delta"]["stop_reason"]
    for b in blocks:
        raw = b.pop("_json")
        if b["type"] == "tool_use":
            b["input"] = json.loads(raw)
    msg["content"] = blocks
    return msg


async def _post(client: httpx.AsyncClient, url: str, **body) -> httpx.Response:
    return await client.post(url + "/v1/messages", json={"model": "m", "max_tokens": 10,
                                                         "messages": [], **body})


async def test_stream_and_plain_answers_agree_and_follow_the_api_order():
    mock = MockAnthropicServer(script=[BASH, BASH])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(mock.serve)
        async with httpx.AsyncClient() as client:
            streamed = await _post(client, url, stream=True, tools=TOOLS)
            plain = (await _post(client, url, tools=TOOLS)).json()
        nursery.cancel_scope.cancel()
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = _sse(streamed.text)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    rebuilt = _rebuild(events)
    assert rebuilt["content"] == [{"type": "text", "text": "Running it."},
                                  {"type": "tool_use", "id": rebuilt["content"][1]["id"],
                                   "name": "Bash", "input": {"command": "echo hi"}}]
    assert rebuilt["stop_reason"] == plain["stop_reason"] == "tool_use"
    assert [b["type"] for b in plain["content"]] == ["text", "tool_use"]
    assert [t[0] for t in mock.tool_uses] == [rebuilt["content"][1]["id"], plain["content"][1]["id"]]


async def test_side_calls_do_not_consume_the_script_and_failures_are_answered():
    mock = MockAnthropicServer(script=[Tool("Write", {}), Fail(400, "invalid_request_error", "no"),
                                       Text("after")])
    async with trio.open_nursery() as nursery:
        url = await nursery.start(mock.serve)
        async with httpx.AsyncClient() as client:
            side = (await _post(client, url)).json()  # no tools: a title-like side call
            unoffered = (await _post(client, url, tools=TOOLS)).json()
            failed = await _post(client, url, tools=TOOLS)
            after = (await _post(client, url, tools=TOOLS, messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": [{"type": "text", "text": "denied: X"}],
                                              "is_error": True}]}])).json()
            other = await client.get(url + "/api/hello")
        nursery.cancel_scope.cancel()
    assert side["content"] == [{"type": "text", "text": FINAL_TEXT}]
    assert unoffered["stop_reason"] == "end_turn" and mock.problems and "Write" in mock.problems[0]
    assert failed.status_code == 400 and failed.json()["error"]["message"] == "no"
    assert after["content"][0]["text"] == "after"
    assert mock.tool_results() == [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                    "content": [{"type": "text", "text": "denied: X"}],
                                    "text": "denied: X"}]
    assert "denied: X" in mock.texts_sent()
    assert other.status_code == 404 and len(mock.agent_requests()) == 3
    assert not mock.egress()
