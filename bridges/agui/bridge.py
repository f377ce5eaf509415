"""The AG-UI bridge (``Bridge`` protocol, :mod:`bridges.core.bridge`): the
tee proxy on ``AEP_AGUI_LISTEN`` in front of ``AEP_AGUI_UPSTREAM``.

Design record: ``shared/aep/docs/bridge-agui-design.md``. Read-only channel
(the record: "no control claim"): ``control: {accepts: []}`` and no
controller, so the fleet's ledger nacks every command routed here
``unsupported``; the bridge has no write path. ``/healthz`` ``source`` is the upstream's reachability, known
lazily (a proxy has no standing upstream connection): probed at start and
while it is down, then kept by every proxied request.

Per-run state: :meth:`AguiBridge.run` builds an :class:`AguiRun` (the
upstream client, the proxy app, the probe) and hands it to the fleet;
nothing of a run is kept on the bridge object, so a restart starts clean.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
import trio

from bridges.core import capture as _capture
from bridges.core.aep import ACK_WINDOW_MS
from bridges.core.asgi import host_guard
from bridges.core.backoff import backoff_delay
from bridges.core.bridge import Bridge, BridgeContext, BridgeRun, Capabilities
from bridges.core.capture import CapturePolicy
from bridges.core.http import bind_socket, hyper_config, serve_app
from bridges.core.settings import Address, bindable

from .config import AguiConfig
from .mapping import Posture
from .proxy import TeeProxy, new_client
from .sse import Budget
from .tee import NewSessions, Tee, run_input_ids

EMITS = ("run", "tool", "state", "x.agui")
PROBE_INITIAL, PROBE_MAX = 1.0, 30.0


class AguiBridge:
    """One AG-UI agent server behind the tee proxy, as one AEP emitter
    (``name`` ``agui``, ``agent`` = ``config.agent``). ``problems``: the
    config's problem lines, reported by :meth:`preflight`."""

    name = "agui"

    #: the proxy is unauthenticated and the run input's ``threadId`` becomes
    #: the session: the relay keeps this bridge out of a session another
    #: agent's bridge claims and evicts its buffers before the fleet's
    #: authenticated bridges' (``supervisor/relay/pins.py``)
    open_sessions = True

    def __init__(self, config: AguiConfig, policy: CapturePolicy | None = None,
                 problems: list[str] | None = None) -> None:
        self.config = config
        self.agent = config.agent
        self.policy = policy or CapturePolicy()
        self._problems = list(problems or [])

    def capabilities(self) -> Capabilities:
        """The ``hello`` block (AEP-0003 §4): read-only, ``accepts: []``."""
        return {"emits": list(EMITS),
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1]),
                "control": {"accepts": [], "ack_window_ms": ACK_WINDOW_MS}}

    def listeners(self) -> dict[str, Address | None]:
        """The configured listener: ``{"http": (host, port)}``."""
        return {"http": self.config.listen}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        """The config's problems, then (``check_ports``) the listener probe."""
        problems = list(self._problems)
        host, port = self.config.listen
        if check_ports and not problems and not bindable(host, port):
            problems.append(f"AEP_AGUI_LISTEN={host}:{port}: address in use or not bindable")
        return problems

    def posture(self) -> Posture:
        return Posture(agent=self.agent, policy=self.policy, deltas=self.config.deltas)

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[BridgeRun | None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Build this run's :class:`AguiRun`, bind the listener, hand the run
        up through ``task_status.started`` (no controller: the fleet's
        ledger nacks every command ``unsupported``), proxy until cancelled.
        Raises ``OSError`` when the listener cannot bind, ``RuntimeError``
        without an upstream (both are :meth:`preflight` lines first)."""
        if not self.config.upstream:
            raise RuntimeError("AEP_AGUI_UPSTREAM is not set")
        async with new_client() as client:
            run = AguiRun(config=self.config,
                          posture=Posture(agent=self.agent, policy=ctx.stamper.policy, deltas=self.config.deltas),
                          ctx=ctx, client=client)
            await run.serve(task_status)


@dataclass
class AguiRun(BridgeRun):
    """Everything one run of the bridge owns (the fleet's handle on it):
    the upstream ``client``, the proxy ``app``, the bound ``address``, the
    ``budget`` of event bytes its tees hold together (``AEP_AGUI_MAX_BUFFERED``),
    the ``new_sessions`` budget (``AEP_AGUI_NEW_SESSIONS_PER_S``)."""

    config: AguiConfig = field(default_factory=AguiConfig)
    posture: Posture = field(default_factory=Posture)
    ctx: BridgeContext | None = None
    client: httpx.AsyncClient | None = None
    app: TeeProxy | None = None
    address: Address | None = None
    budget: Budget = field(default_factory=Budget)
    new_sessions: NewSessions | None = None

    def open_tee(self, body_peek: bytes) -> Tee:
        """A tee for one event stream, scoped by the POSTed run input's ids."""
        assert self.ctx is not None
        session, run = run_input_ids(body_peek)
        return Tee(self.ctx, self.posture, session_hint=session, run_hint=run,
                   max_event=self.config.max_event, budget=self.budget,
                   admit=self.new_sessions.admit if self.new_sessions is not None else None)

    async def serve(self, task_status: trio.TaskStatus[BridgeRun | None]) -> None:
        ctx, client = self.ctx, self.client
        assert ctx is not None and client is not None
        self.budget = Budget(self.config.max_buffered)
        self.new_sessions = NewSessions(ctx, self.config.new_sessions_per_s)
        self.app = TeeProxy(self.config.upstream, client, self.open_tee, ctx.health)
        async with trio.open_nursery() as nursery:
            self.address = await nursery.start(self._listen)
            nursery.start_soon(self._probe)
            ctx.log.info("agui proxy listening on %s:%d -> %s", self.address[0],
                         self.address[1], self.app.upstream.shown)  # never the userinfo
            task_status.started(self)

    async def _listen(self, *, task_status: trio.TaskStatus[Address]) -> None:
        """hypercorn through the shared serving loop
        (:func:`bridges.core.http.serve_app`: a faulting connection is closed
        and counted, HTTP/1.1 only), behind the
        DNS-rebinding guard on a loopback bind (``agui.refused_host``): the
        proxy sets ``Host`` to the upstream's, so without the guard a
        rebinding page would get past any Host check the agent has."""
        ctx = self.ctx
        assert ctx is not None and self.app is not None
        cfg = hyper_config(graceful_timeout=1.0, errorlog=ctx.log.getChild("http"))
        cfg.include_date_header = False    # the agent's own Date and Server go through
        cfg.include_server_header = False
        host, port = self.config.listen
        sock = bind_socket(host, port)
        app = host_guard(self.app, on_refuse=lambda: ctx.health.count("agui.refused_host"))

        class _Started(trio.TaskStatus[Address]):  # reports the configured host, the bound port
            def started(self, value: Address | None = None) -> None:
                assert value is not None
                task_status.started((host, value[1]))

        await serve_app(app, sock, trio.Event(), config=cfg, task_status=_Started(),
                        on_fault=lambda kind: ctx.health.count("agui.connection_errors"),
                        where=f"agui proxy {host}:{sock.getsockname()[1]}")

    async def _probe(self) -> None:
        """``source``: ``True`` once the upstream answers anything (any
        status; a ``GET`` of its base whose body is never read); re-probed
        with backoff while it does not."""
        ctx, client = self.ctx, self.client
        assert ctx is not None and client is not None
        health = ctx.health
        assert self.app is not None
        upstream = self.app.upstream
        attempt = 0
        while True:
            if health.source is True:
                attempt = 0
                await trio.sleep(PROBE_MAX / 6)
                continue
            try:
                # the status line is the answer: the body is never read
                async with client.stream("GET", upstream.probe_url(), auth=upstream.auth,
                                         timeout=5.0):
                    pass
                health.source = True
                health.detail = None
            except httpx.HTTPError as e:
                health.source = False
                health.detail = f"upstream unreachable ({type(e).__name__})"
                await trio.sleep(backoff_delay(attempt, PROBE_INITIAL, PROBE_MAX))
                attempt += 1


if TYPE_CHECKING:  # mypy holds the class to the fleet's contract
    _conforms: type[Bridge] = AguiBridge
