"""A real ACP agent on the Python SDK (``agent-client-protocol==0.12.1``,
the library's ``Agent`` API over stdio with ``run_agent``). Scripted, no
model: each prompt turn streams a plan, a thought, message chunks and a
usage update, starts a tool call, asks ``session/request_permission``,
completes the tool when allowed (fails it when rejected or cancelled), and
ends the turn with ``end_turn`` (``cancelled`` when the permission was
cancelled). Deterministic ids, so two runs are comparable.

Run: ``python py_agent.py`` (stdio)."""
from __future__ import annotations

import asyncio
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    plan_entry,
    run_agent,
    start_tool_call,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    Implementation,
    PermissionOption,
    ToolCallUpdate,
    UsageUpdate,
)


class ScriptedAgent(Agent):
    _conn: Client

    def __init__(self) -> None:
        self.sessions = 0
        self.turns = 0

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities(),
                                  agent_info=Implementation(name="aep-test-agent", version="1.0"))

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        self.sessions += 1
        return NewSessionResponse(session_id=f"sess-{self.sessions}")

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        self.turns += 1
        n = self.turns
        say = self._conn.session_update
        await say(session_id, update_plan([plan_entry("read the failing test", priority="high"),
                                           plan_entry("fix it"),
                                           plan_entry("run the suite", priority="low")]))
        await say(session_id, update_agent_thought_text(f"turn {n}: thinking about it"))
        await say(session_id, update_agent_message_text("Looking at the build"))
        await say(session_id, update_agent_message_text(" \u2028 with a line separator."))
        await say(session_id, UsageUpdate(session_update="usage_update", used=1000 * n, size=200000))
        call = f"call-{n}"
        await say(session_id, start_tool_call(call, "run tests", kind="execute", status="pending",
                                              raw_input={"command": "pytest -q", "turn": n}))
        answer = await self._conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id=call, title="run tests", kind="execute"),
            options=[PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
                     PermissionOption(option_id="reject_once", name="Reject", kind="reject_once")])
        outcome = answer.outcome
        allowed = isinstance(outcome, AllowedOutcome) and outcome.option_id == "allow_once"
        if allowed:
            await say(session_id, update_tool_call(call, status="in_progress"))
            await say(session_id, update_tool_call(call, status="completed",
                                                   raw_output={"passed": 42, "turn": n}))
            await say(session_id, update_agent_message_text("All 42 tests pass."))
        else:
            await say(session_id, update_tool_call(call, status="failed"))
            await say(session_id, update_agent_message_text("Not running the tests."))
        cancelled = not isinstance(outcome, AllowedOutcome)
        return PromptResponse(stop_reason="cancelled" if cancelled else "end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(ScriptedAgent()))
