"""A real ACP client on the Python SDK (``agent-client-protocol==0.12.1``):
``spawn_agent_process`` runs the agent command (the agent itself, or the
tee in front of it), initializes, opens a session and prompts several
turns, answering each ``session/request_permission`` from a script.

:func:`drive` returns the client's whole view: every message it received
(notifications, the agent's requests and the responses to its own
requests), in arrival order, as JSON (the SDK's own models dumped by
alias), so a run direct and a run through the tee compare with ``==``.
The SDK's shutdown is the real one: close stdin, wait, then SIGTERM."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Sequence

from acp import PROTOCOL_VERSION, Client, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    Implementation,
    RequestPermissionResponse,
)


def dump(model: Any) -> Any:
    if model is None:
        return None
    if hasattr(model, "model_dump"):
        return model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return model


class ScriptedClient(Client):
    """Answers permissions with ``answers`` in order (``None`` = cancelled)."""

    def __init__(self, answers: Sequence[str | None], view: list[Any]) -> None:
        self.answers = list(answers)
        self.view = view

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.view.append(["request_permission", session_id, dump(tool_call),
                          [dump(o) for o in options]])
        answer = self.answers.pop(0) if self.answers else None
        outcome = (AllowedOutcome(outcome="selected", option_id=answer) if answer
                   else DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=outcome)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.view.append(["session_update", session_id, dump(update)])

    async def write_text_file(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    async def read_text_file(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


async def drive(command: Sequence[str], answers: Sequence[str | None], *,
                prompts: Sequence[str] = ("fix the failing build", "again", "once more"),
                env: dict[str, str] | None = None,
                between: Callable[[int], Any] | None = None) -> list[Any]:
    """Run one client session against ``command`` (see the module docstring).
    ``between(turn)`` runs (blocking) after each prompt turn: the tests kill
    and restart the daemon there."""
    view: list[Any] = []
    client = ScriptedClient(answers, view)
    # the SDK waits 2 s after closing the agent's stdin, then SIGTERMs it: on
    # a loaded machine (parallel tests) the tee and the agent could take
    # longer to leave, and the story ended "killed" instead of "normal"
    async with spawn_agent_process(client, command[0], *command[1:], env=env,
                                   transport_kwargs={"stderr": None, "shutdown_timeout": 30.0}
                                   ) as (conn, proc):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION,
                                     client_capabilities=ClientCapabilities(),
                                     client_info=Implementation(name="aep-test-client", version="1"))
        view.append(["initialize", dump(init)])
        session = await conn.new_session(cwd="/", mcp_servers=[])
        view.append(["session/new", dump(session)])
        for text in prompts:
            result = await conn.prompt(session_id=session.session_id, prompt=[text_block(text)])
            view.append(["session/prompt", dump(result)])
            if between is not None:
                between(len([v for v in view if v[0] == "session/prompt"]))
    view.append(["exit", proc.returncode])
    return view


def main(argv: list[str]) -> None:
    """``python py_client.py ANSWERS_JSON -- CMD...``: prints the view as JSON."""
    answers = json.loads(argv[0])
    cmd = argv[argv.index("--") + 1:]
    print(json.dumps(asyncio.run(drive(cmd, answers))))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
