"""The :class:`~bridges.core.bridge.Bridge` for OpenCode-family servers.

One implementation, configured by a :class:`~bridges.sse_common.profile.SseProfile`
(``bridges/opencode_sse``, ``bridges/kilocode_sse``). Owns, in one nursery:
the receiver (stream, reconcile, watchdog) and the command ledger serving
``ctx.commands``. Design record: ``shared/aep/docs/adapter-opencode-design.md``
(the SSE bridge section); DESIGN.md (the operator's interface names).
In primary mode the open runs and pending asks are kept in a small state
file under ``AEP_STATE_DIR`` (:mod:`bridges.sse_common.state`) so a daemon
restart continues them instead of leaving them dangling.

Control is honored only when ALL of: primary mode, ``AEP_TOKEN`` set, the
gate ``AEP_{VENDOR}_SSE_CONTROL=1`` (:attr:`SseBridge.control_honored`).
Otherwise ``capabilities()["control"]["accepts"]`` is ``[]``, no
:class:`~bridges.sse_common.control.ControlGate` exists, the ledger gets no
``check``/``write`` and nacks every command ``unsupported``: the code has no
other path that writes to the vendor.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping

import httpx
import trio

from bridges.core import capture as _capture
from bridges.core.bridge import BridgeContext
from bridges.core.capture import CapturePolicy
from bridges.core.ledger import CommandLedger
from bridges.core.paths import state_dir as _state_dir
from bridges.core.settings import EnvReader

from .control import ACCEPTS, ACK_WINDOW_MS, ControlGate, ReadOnlyClient
from .mapping import Posture
from .profile import SseProfile
from .receiver import ReceiverSettings, SseReceiver
from .state import StateFile, state_path
from .tracker import Tracker

log = logging.getLogger("aep.sse.bridge")

DEFAULT_GUARD_MS = 8000

#: Core type families the primary mapping emits (``hello.capabilities.emits``).
PRIMARY_EMITS = ("session", "run", "tool", "attention", "progress", "control")


class SseBridge:
    """One vendor server as an AEP emitter (see the module docstring).

    Construct with :meth:`from_env` (the supervisor's path) or directly in
    tests. ``receiver_settings`` tunes liveness/backoff (tests shorten it);
    ``transport`` replaces httpx's network transport (tests only);
    ``state_dir``: where open runs and pending asks survive a daemon restart
    (:mod:`bridges.sse_common.state`; ``None``: not persisted)."""

    def __init__(self, profile: SseProfile, *, url: str | None = None,
                 username: str | None = None, password: str | None = None,
                 primary: bool = False, control: bool = False, token: str | None = None,
                 guard_ms: int = DEFAULT_GUARD_MS, policy: CapturePolicy | None = None,
                 receiver_settings: ReceiverSettings | None = None,
                 problems: list[str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 state_dir: Path | None = None) -> None:
        self.profile = profile
        self.name = profile.name
        self.agent = profile.agent
        self.url = (url or profile.default_url).rstrip("/")
        self.username = username or profile.default_user
        self._password = password or None
        self.primary = primary
        self.control_requested = control
        self._token_set = bool(token)
        self.guard_ms = guard_ms
        self.policy = policy or CapturePolicy()
        self.receiver_settings = receiver_settings or ReceiverSettings()
        self._problems = list(problems or [])
        self._transport = transport  # tests inject a fault-injecting/recording transport
        self.state_dir = state_dir
        self.receiver: SseReceiver | None = None
        self.tracker: Tracker | None = None

    # ------------------------------------------------------------ configuration
    @classmethod
    def from_env(cls, profile: SseProfile, environ: Mapping[str, str], *,
                 policy: CapturePolicy | None = None) -> "SseBridge":
        """Read the DESIGN.md names (``{env}_URL``, ``{env}_USERNAME``,
        ``{env}_PASSWORD``, ``{env}_SSE_PRIMARY``, ``{env}_SSE_CONTROL``,
        ``{env}_SSE_ACK_GUARD_MS``, ``AEP_TOKEN``). Never raises for bad
        values: each becomes one :meth:`preflight` line."""
        r = EnvReader(environ)
        e = profile.env
        url = r.url(f"{e}_URL", profile.default_url)
        guard = r.integer(f"{e}_SSE_ACK_GUARD_MS", DEFAULT_GUARD_MS, minimum=0,
                          maximum=ACK_WINDOW_MS - 1, unit="milliseconds inside the ack window")
        primary, control = r.flag(f"{e}_SSE_PRIMARY"), r.flag(f"{e}_SSE_CONTROL")
        return cls(profile, url=url, username=environ.get(f"{e}_USERNAME") or None,
                   password=environ.get(f"{e}_PASSWORD") or None,
                   primary=primary, control=control,
                   token=environ.get("AEP_TOKEN") or None, guard_ms=guard, policy=policy,
                   problems=r.problems, state_dir=_state_dir(environ))

    @property
    def control_honored(self) -> bool:
        """The gate: primary mode AND ``AEP_TOKEN`` AND ``{env}_SSE_CONTROL=1``."""
        return self.primary and self._token_set and self.control_requested

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        """One line per bad setting (the supervisor refuses to start on any)."""
        out = list(self._problems)
        e = self.profile.env
        if self.control_requested and not self.primary:
            out.append(f"{e}_SSE_CONTROL=1 is ignored in companion mode (control needs "
                       f"{e}_SSE_PRIMARY=1): set it, or unset the control gate")
        elif self.control_requested and not self._token_set:
            out.append(f"{e}_SSE_CONTROL=1 needs AEP_TOKEN (control is refused on an "
                       "unauthenticated binding): set AEP_TOKEN, or unset the control gate")
        return out

    def capabilities(self) -> dict[str, Any]:
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
        return Posture(self.agent, "primary" if self.primary else "companion", self.policy,
                       answerable=self.control_honored)

    def _client(self) -> httpx.AsyncClient:
        auth = (self.username, self._password) if self._password else None
        return httpx.AsyncClient(base_url=self.url, auth=auth, timeout=10.0,
                                 headers={"User-Agent": "aep-bridges"},
                                 transport=self._transport)

    # ------------------------------------------------------------ running
    async def run(self, ctx: BridgeContext, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the receiver and the command ledger until cancelled."""
        ctx.health.control = self.control_honored
        self.tracker = tracker = Tracker(self.posture())
        self._state = StateFile(state_path(self.state_dir, self.name, self.url)
                                if self.primary else None)
        restored = tracker.restore(self._state.load())
        if restored:
            log.info("%s: %d session(s) with open runs or asks restored from %s", self.name,
                     restored, self._state.path)
        async with self._client() as read_http:
            self.receiver = SseReceiver(self.profile, ReadOnlyClient(read_http), tracker, ctx,
                                        url=self.url, settings=self.receiver_settings,
                                        persist=self.persist)
            if self.control_honored:
                async with self._client() as write_http:
                    gate = ControlGate(self.profile, write_http, tracker)
                    await self._serve(ctx, gate, task_status)
            else:
                await self._serve(ctx, None, task_status)

    def persist(self) -> None:
        """Save the tracker's persistent part if it changed."""
        if self.tracker is not None and self.tracker.dirty:
            self.tracker.dirty = False
            self._state.save(self.tracker.snapshot())

    def _arm(self, gate: ControlGate) -> Callable[[dict[str, Any]], Callable[[], None] | None]:
        """``gate.arm`` with the note persisted on arm and on disarm."""
        def arm(cmd: dict[str, Any]) -> Callable[[], None] | None:
            undo = gate.arm(cmd)
            self.persist()

            def disarm() -> None:
                if undo is not None:
                    undo()
                self.persist()
            return disarm
        return arm

    async def _serve(self, ctx: BridgeContext, gate: ControlGate | None, task_status) -> None:
        accepts = gate.accepts if gate is not None else ()
        async with CommandLedger(ctx, accepts, ack_window_ms=ACK_WINDOW_MS,
                                 guard_ms=self.guard_ms) as ledger:
            async with trio.open_nursery() as nursery:
                assert self.receiver is not None
                nursery.start_soon(self.receiver.run)
                if gate is not None:
                    nursery.start_soon(lambda: ledger.serve(
                        ctx.commands, check=gate.check, write=gate.write, arm=self._arm(gate)))
                else:  # read-only: every command is nacked unsupported, nothing else runs
                    nursery.start_soon(lambda: ledger.serve(ctx.commands))
                task_status.started()
