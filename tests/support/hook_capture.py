"""A hook target for the live hook tests: records what a real agent POSTs to its
HTTP hooks, answers each with a decision the test chooses, and reads the files
its command hooks wrote.

:class:`HookCapture` is a hypercorn (trio) app on ``127.0.0.1``, OS-chosen port.
Point every HTTP hook at ``<url>/<EventName>``; each POST is recorded as a
:class:`Hooked` (event from the path, the parsed body, arrival order) and
answered ``200`` with:

- :attr:`HookCapture.answers` ``[event]`` when set: a dict (sent as JSON), or a
  callable ``(body) -> dict`` (sync), or an ``async`` callable (awaited: a test
  may hold the hook open, e.g. until it has checked the model has not yet seen
  the tool result);
- ``{}`` otherwise ("no decision": the vendor's own flow goes on).

Command hooks cannot reach it; :func:`command_capture` is the shell command that
writes the hook's stdin to ``<dir>/<ns clock>-<label>.json``, and
:func:`read_command_captures` reads them back in order.
"""
from __future__ import annotations

import inspect
import json
import shlex
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import trio

from bridges.core.asgi import send_json
from tests.support.net import http_body, serve_loopback


@dataclass
class Hooked:
    """One hook delivery: ``event`` (the URL's last segment or the file's label),
    ``body`` (parsed JSON, or the raw text when it was not JSON), ``at``
    (wall-clock ``time.time()`` on arrival, comparable with the command
    hooks' file stamps; only for ordering)."""

    event: str
    body: Any
    at: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class HookCapture:
    """The capture server; see the module docstring."""

    answers: dict[str, Any] = field(default_factory=dict)
    hooked: list[Hooked] = field(default_factory=list)
    url: str | None = None
    changed: trio.Event = field(default_factory=trio.Event)

    def events(self) -> list[str]:
        """The event names received, in arrival order."""
        return [h.event for h in self.hooked]

    def of(self, event: str) -> list[Any]:
        """The bodies received for ``event``."""
        return [h.body for h in self.hooked if h.event == event]

    async def wait_for(self, event: str, count: int = 1, timeout: float = 60) -> list[Any]:
        """Wait until ``count`` deliveries of ``event`` arrived; their bodies."""
        with trio.fail_after(timeout):
            while len(self.of(event)) < count:
                self.changed = trio.Event()
                await self.changed.wait()
        return self.of(event)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(url)`` (no trailing slash)."""
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(partial(serve_loopback, self._app))
            task_status.started(self.url)

    async def _app(self, scope, receive, send) -> None:
        body = await http_body(scope, receive, send)
        if body is None:
            return
        text = body.decode("utf-8", "replace")
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = text
        event = scope["path"].rstrip("/").rsplit("/", 1)[-1]
        hdrs = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.hooked.append(Hooked(event, parsed, time.time(), hdrs))
        self.changed.set()
        answer: Any = self.answers.get(event, {})
        if callable(answer):
            answer = answer(parsed)
            if inspect.isawaitable(answer):
                answer = await answer
        await send_json(send, 200, answer)


def command_capture(directory: Path, label: str, stdout: str = "") -> str:
    """A ``sh`` command line that writes its stdin to ``directory/<ns>-<label>.json``
    (and prints ``stdout``, e.g. a decision JSON, when given)."""
    target = shlex.quote(str(directory)) + "/$(date +%s%N)-" + shlex.quote(label) + ".json"
    cmd = f"cat > {target}"
    if stdout:
        cmd += f"; printf %s {shlex.quote(stdout)}"
    return cmd


def read_command_captures(directory: Path) -> list[Hooked]:
    """The payloads :func:`command_capture` wrote, oldest first."""
    out = []
    for p in sorted(Path(directory).glob("*.json")):
        stamp, _, label = p.stem.partition("-")
        text = p.read_text(errors="replace")
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        out.append(Hooked(label, body, int(stamp) / 1e9 if stamp.isdigit() else 0.0))
    return out


AnswerFn = Callable[[Any], Any]
