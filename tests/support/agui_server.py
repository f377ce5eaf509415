"""A real AG-UI agent server for the tests: pydantic-ai's AG-UI adapter
(``pydantic_ai.ui.ag_ui.AGUIAdapter``, from ``pydantic-ai-slim[ag-ui]``)
serving an agent with two tools, on its ``TestModel`` (no LLM: it calls every
tool once, then answers with the tool results as JSON text), under hypercorn
(asyncio worker) on loopback. Run as a process so pydantic-ai's asyncio loop
stays out of the trio tests::

    python -m tests.support.agui_server PORT

``POST /`` runs the agent on the posted ``RunAgentInput`` and streams the
run's events (``text/event-stream``); ``GET /healthz`` answers ``ok``.
With ``AGUI_TAP_DIR`` set, the exact response body bytes of every run are
also written to ``$AGUI_TAP_DIR/<runId>.sse`` as they are sent (the
transparency test compares them with what the UI received)."""
from __future__ import annotations

import asyncio
import sys

from ag_ui.core import (
    ActivitySnapshotEvent,
    CustomEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
)
from pydantic_ai import Agent, ToolReturn
from pydantic_ai.models.test import TestModel
from pydantic_ai.ui.ag_ui import AGUIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route


def build_app():

    agent = Agent(TestModel(), instructions="Answer about the weather, briefly.")

    @agent.tool_plain(sequential=True)  # one at a time: a deterministic event order
    def lookup(city: str) -> str:
        """Look up the weather of a city."""
        return f"sunny in {city}"

    @agent.tool_plain(sequential=True)  # one at a time: a deterministic event order
    def plan(goal: str) -> ToolReturn:
        """Plan the answer; publishes the shared state, a step, an activity and
        a custom event the way pydantic-ai tools do (AG-UI events returned as
        the tool return's metadata are streamed verbatim)."""
        return ToolReturn(return_value=f"planned {goal}", metadata=[
            StepStartedEvent(step_name="planning"),
            StateSnapshotEvent(snapshot={"goal": goal, "steps": 2}),
            StateDeltaEvent(delta=[{"op": "replace", "path": "/steps", "value": 3}]),
            ActivitySnapshotEvent(message_id="activity-plan", activity_type="PLAN",
                                  content={"steps": ["look", "answer"]}),
            CustomEvent(name="demo.checkpoint", value={"at": "plan"}),
            StepFinishedEvent(step_name="planning"),
        ])

    async def run(request: Request):
        return await AGUIAdapter.dispatch_request(request, agent=agent)

    async def healthz(request: Request):
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/", run, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])


def tap(app, directory: str):
    """ASGI middleware: a copy of each POST's response body bytes, by runId."""
    import json
    import os

    async def tapped(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body = bytearray()
        messages = []
        while True:  # read the input to learn the runId, then replay it to the app
            msg = await receive()
            messages.append(msg)
            body += msg.get("body", b"")
            if msg["type"] != "http.request" or not msg.get("more_body"):
                break
        try:
            run_id = str(json.loads(body).get("runId") or "none")
        except ValueError:
            run_id = "none"
        out = open(os.path.join(directory, f"{run_id}.sse"), "wb")  # noqa: ASYNC230 -- a test tap

        async def replay():
            return messages.pop(0) if messages else await receive()

        async def send_tapped(msg):
            if msg["type"] == "http.response.body":
                out.write(msg.get("body", b""))
                out.flush()
            await send(msg)

        try:
            await app(scope, replay, send_tapped)
        finally:
            out.close()
    return tapped


def main() -> None:
    import os

    import hypercorn.asyncio
    import hypercorn.config

    cfg = hypercorn.config.Config()
    cfg.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    cfg.accesslog = None
    app = build_app()
    if os.environ.get("AGUI_TAP_DIR"):
        app = tap(app, os.environ["AGUI_TAP_DIR"])
    asyncio.run(hypercorn.asyncio.serve(app, cfg))


if __name__ == "__main__":
    main()
