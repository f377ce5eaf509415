"""The :class:`~bridges.core.bridge.Bridge` for OpenCode-family servers.

One implementation, configured by a :class:`~bridges.sse_common.profile.SseProfile`
(``bridges/opencode_sse``, ``bridges/kilocode_sse``) and an
:class:`~bridges.sse_common.config.SseConfig`. Each :meth:`SseBridge.run`
builds a fresh :class:`SseRun` (tracker, state file, receiver, and the
:class:`~bridges.sse_common.control.ControlGate` when the gate is honored)
and hands it to the fleet, which serves the bridge's commands through it;
nothing of a run stays on the bridge object. Design record:
``shared/aep/docs/adapter-opencode-design.md`` (the SSE bridge section);
DESIGN.md (the operator's interface names).
In primary mode the open runs and pending asks are kept in a small state
file under ``AEP_STATE_DIR`` (:mod:`bridges.core.statefile`) so a daemon
restart continues them instead of leaving them dangling: that file is the
only thing one run passes to the next.

Control is honored only when ALL of: primary mode, ``AEP_TOKEN`` set, the
gate ``AEP_{VENDOR}_SSE_CONTROL=1`` (:attr:`SseBridge.control_honored`).
Otherwise ``capabilities()["control"]["accepts"]`` is ``[]``, no
:class:`~bridges.sse_common.control.ControlGate` exists, the run's handle
carries no controller and the fleet nacks every command ``unsupported``: the
code has no other path that writes to the vendor.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import httpx
import trio

from bridges.core import capture as _capture
from bridges.core.bridge import Bridge, BridgeContext, BridgeRun, Capabilities
from bridges.core.capture import CapturePolicy
from bridges.core.posture import Posture
from bridges.core.settings import Address
from bridges.core.statefile import StateFile, state_path

from . import config as _config
from .config import SseConfig
from .control import ACCEPTS, ACK_WINDOW_MS, ControlGate, ReadOnlyClient
from .profile import SseProfile
from .receiver import ReceiverSettings, SseReceiver
from .tracker import Tracker

log = logging.getLogger("aep.sse.bridge")

#: Core type families the primary mapping emits (``hello.capabilities.emits``).
PRIMARY_EMITS = ("session", "run", "tool", "attention", "progress", "control")


@dataclass(kw_only=True)
class SseRun(BridgeRun):
    """Everything one run of an :class:`SseBridge` owns (the per-run
    handle ``run()`` hands the fleet): the ``tracker`` (pure state), its
    ``state`` file, the ``receiver`` (stream, reconcile, watchdog), and the
    ``controller`` (a :class:`ControlGate`, or ``None`` gated off)."""

    tracker: Tracker
    state: StateFile
    receiver: SseReceiver | None = None

    def persist(self) -> None:
        """Save the tracker's persistent part if it changed: the changed
        sessions' entries only (:meth:`StateFile.save_changes`, a journal
        append; the whole snapshot only when the journal is compacted)."""
        if self.tracker.dirty:
            self.tracker.dirty = False
            if self.state.path is None:  # no persistence (companion, no state dir)
                self.tracker.touched.clear()
                return
            self.state.save_changes(self.tracker.changes())


class SseBridge:
    """One vendor server as an AEP emitter (see the module docstring).

    ``SseBridge(profile, config=None, *, policy, problems, receiver_settings,
    transport)``: construct with :meth:`from_env` (the supervisor's path) or
    directly in tests (``config`` defaults to the profile's defaults,
    :meth:`SseConfig.defaults`). ``problems``: configuration problems for
    :meth:`preflight` (default: the gate's combination rules for
    ``config``); ``receiver_settings`` tunes liveness/backoff (tests shorten
    it); ``transport`` replaces httpx's network transport (tests only)."""

    def __init__(self, profile: SseProfile, config: SseConfig | None = None, *,
                 policy: CapturePolicy | None = None,
                 problems: list[str] | None = None,
                 receiver_settings: ReceiverSettings | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.profile = profile
        self.name = profile.name
        self.agent = profile.agent
        self.config = config or SseConfig.defaults(profile)
        self.policy = policy or CapturePolicy()
        self.receiver_settings = receiver_settings or ReceiverSettings()
        self._problems = (list(problems) if problems is not None
                          else _config.gate_problems(profile, self.config))
        self._transport = transport  # tests inject a fault-injecting/recording transport

    # ------------------------------------------------------------ configuration
    @classmethod
    def from_env(cls, profile: SseProfile, environ: Mapping[str, str], *,
                 policy: CapturePolicy | None = None) -> "SseBridge":
        """The bridge from :func:`bridges.sse_common.config.from_env`. Never
        raises for bad values: each becomes one :meth:`preflight` line."""
        cfg, problems = _config.from_env(profile, environ)
        return cls(profile, cfg, policy=policy, problems=problems)

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def primary(self) -> bool:
        return self.config.primary

    @property
    def control_honored(self) -> bool:
        """The gate: primary mode AND ``AEP_TOKEN`` AND ``{env}_SSE_CONTROL=1``."""
        return self.config.control_honored

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        """One line per bad setting (the supervisor refuses to start on any)."""
        return list(self._problems)

    def listeners(self) -> dict[str, Address | None]:
        """None: the bridge only dials out (the vendor's SSE stream and REST)."""
        return {}

    def capabilities(self) -> Capabilities:
        """The ``hello`` block (AEP-0003 §4): ``control.accepts`` is the two
        verbs only when the gate is honored, else ``[]``."""
        ns = f"x.{self.agent}"
        emits = list(PRIMARY_EMITS) + [ns] if self.primary else ["control", ns]
        return {
            "emits": emits,
            "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1]),
            "control": {"accepts": list(ACCEPTS) if self.control_honored else [],
                        "ack_window_ms": ACK_WINDOW_MS},
        }

    def posture(self) -> Posture:
        return Posture(agent=self.agent, mode="primary" if self.primary else "companion",
                       policy=self.policy, answerable=self.control_honored)

    def _client(self) -> httpx.AsyncClient:
        c = self.config
        auth = (c.username, c.password) if c.password else None
        return httpx.AsyncClient(base_url=c.url, auth=auth, timeout=10.0,
                                 headers={"User-Agent": "aep-bridges"},
                                 transport=self._transport)

    # ------------------------------------------------------------ running
    def _new_run(self) -> SseRun:
        """A fresh run: a new tracker seeded only from the state file."""
        tracker = Tracker(self.posture())
        state = StateFile(state_path(self.config.state_dir, self.name, self.url)
                          if self.primary else None)
        restored = tracker.restore(state.load())
        if restored:
            log.info("%s: %d session(s) with open runs or asks restored from %s", self.name,
                     restored, state.path)
        return SseRun(tracker=tracker, state=state)

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[SseRun] = trio.TASK_STATUS_IGNORED) -> None:
        """Build this run's :class:`SseRun`, run its receiver until
        cancelled, and hand the run to the fleet once started."""
        run = self._new_run()
        async with self._client() as read_http, contextlib.AsyncExitStack() as stack:
            run.receiver = SseReceiver(self.profile, ReadOnlyClient(read_http), run.tracker, ctx,
                                       url=self.url, settings=self.receiver_settings,
                                       persist=run.persist)
            if self.control_honored:
                write_http = await stack.enter_async_context(self._client())
                run.controller = ControlGate(self.profile, write_http, run.tracker,
                                             guard_ms=self.config.guard_ms, persist=run.persist)
            async with trio.open_nursery() as nursery:
                if run.state.path is not None:
                    nursery.start_soon(run.state.compactor)  # compactions off the save path
                nursery.start_soon(run.receiver.run)
                task_status.started(run)


if TYPE_CHECKING:  # mypy holds the class to the fleet's contract
    _conforms: type[Bridge] = SseBridge
