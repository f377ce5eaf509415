"""A scripted OpenAI **Chat Completions** provider: the OpenCode tests' mock
(:class:`tests.support.opencode.MockChatProvider`: hypercorn on loopback,
streaming ``chat.completion.chunk`` SSE ended by ``[DONE]``, every request
recorded) playing a script the test hands it instead of reading directives
from the prompt, for vendors whose tool names differ (Kimi Code: ``Bash``,
``AskUserQuestion``).

One step per model request, consumed from the front of
:attr:`MockChatServer.script`:

- :class:`Tool` ``(name, args)``: ONE tool call (``finish_reason:
  "tool_calls"``). A name the request does not offer is a script failure
  (recorded in :attr:`MockChatServer.problems`, answered as a short text so
  the vendor's turn still ends).
- :class:`Text` ``(text)``: a plain assistant message.
- :class:`Hold` ``(step)``: ``step``, but only after
  :meth:`MockChatServer.release` (the headers go out at once), for
  "killed / restarted mid-turn" scenarios.

Requests without ``tools`` (side calls) and requests once the script is
exhausted get :data:`FINAL_TEXT`. What reached the model:
``tool_results()`` (the text of every ``role: tool`` message, e.g. a
rejection's feedback).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import trio

from tests.support.opencode import MockChatProvider

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
class MockChatServer(MockChatProvider):
    """See the module docstring. ``held`` is set while a :class:`Hold`
    response waits."""

    script: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    held: trio.Event = field(default_factory=trio.Event)
    _release: trio.Event = field(default_factory=trio.Event)

    def release(self) -> None:
        """Let a held response go."""
        self._release.set()

    async def _chat(self, body: dict, receive, send) -> None:
        tools = {((t.get("function") or {}).get("name")) for t in body.get("tools") or []
                 if isinstance(t, dict)}
        step: Step = self.script.pop(0) if self.script and tools else Text(FINAL_TEXT)
        hold = isinstance(step, Hold)
        if isinstance(step, Hold):
            step = step.step
        if isinstance(step, Tool) and step.name not in tools:
            self.problems.append(f"tool {step.name!r} not offered; tools={sorted(map(str, tools))}")
            step = Text("mock script problem: " + self.problems[-1])
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        cid = self._next_id("chatcmpl")
        if hold:
            self.held.set()
            await self._release.wait()
        if isinstance(step, Tool):
            await self._tool(send, cid, step.name, dict(step.args))
        else:
            await self._text(send, cid, [step.text])
