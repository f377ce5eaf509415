"""The OTLP inbound bridge: one vendor profile (``codex`` or ``vscode``) on
its own listeners, its own emitter identity (``otlp_in.<vendor>``).

Design record: ``shared/aep/docs/bridge-otlp-inbound-design.md`` ("Design":
receiver, identity, modes; "Vendor profiles": one emitter per profile);
beyond the reference (which takes only OTLP/JSON over HTTP and needs a
Collector for protobuf), this bridge serves OTLP/gRPC ``LogsService/Export``
(:mod:`bridges.otlp_in.grpc`) and OTLP/HTTP ``POST /v1/logs``
(:mod:`bridges.otlp_in.http`) with protobuf and JSON bodies, gzip accepted,
both answering through one error -> status map
(:mod:`bridges.otlp_in.status`). Each request is planned (pure: the
profile's mapper, :mod:`bridges.otlp_in.codex` / :mod:`bridges.otlp_in.vscode`)
and admitted onto the relay channel with backpressure
(:mod:`bridges.otlp_in.export`, which states the delivery guarantees).

The bridge object holds only configuration (:class:`~bridges.otlp_in.config.OtlpConfig`);
everything a run owns (the context, the listeners, the admission state)
lives on the :class:`OtlpRun` that :meth:`OtlpInBridge.run` builds, so a
restart starts clean.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Sequence

import trio

from bridges.core import capture as _capture
from bridges.core.bridge import Bridge, BridgeContext, Capabilities
from bridges.core.capture import CapturePolicy
from bridges.core.errors import leaves
from bridges.core.posture import Posture
from bridges.core.settings import Address, bindable

from .config import OtlpConfig, check
from .decode import Reads
from .export import Admission
from .grpc import GrpcReceiver
from .http import GRACEFUL_S, HttpReceiver, serve_http
from .profiles import PROFILES, Profile


class OtlpInBridge:
    """One OTLP inbound emitter identity (``Bridge`` protocol,
    :mod:`bridges.core.bridge`).

    ``config``: the profile's :class:`~bridges.otlp_in.config.OtlpConfig`
    (an unknown vendor is a :meth:`preflight` line); ``policy``: the capture
    posture (used for ``capabilities``; mapping uses the stamper's policy,
    the one that gates the envelopes); ``problems``: the configuration's
    problem lines for :meth:`preflight` (``None``: check ``config`` alone,
    :func:`bridges.otlp_in.config.check`); ``emit_grace``: seconds a request
    may wait for room on the relay channel, before admission (then 503) and
    again mid-request (then ``partial_success``); ``retry_after``: seconds
    suggested on 503/UNAVAILABLE; ``grpc_workers``: grpcio handler threads, one per admitted call."""

    #: the receiver is unauthenticated and a ``conversation.id`` becomes the
    #: session verbatim: the relay keeps this bridge out of a session another
    #: agent's bridge claims (outside review of issue 25)
    open_sessions = True

    def __init__(self, config: OtlpConfig | None = None, *, policy: CapturePolicy | None = None,
                 problems: Sequence[str] | None = None, emit_grace: float = 3.0,
                 retry_after: int = 1, grpc_workers: int = 16) -> None:
        self.config = config or OtlpConfig()
        self.vendor = self.config.vendor
        self.profile: Profile | None = PROFILES.get(self.vendor)
        self.name = f"otlp_in.{self.vendor}"
        self.agent = self.profile.agent if self.profile else self.vendor
        self.primary = self.config.primary
        self.policy = policy or CapturePolicy()
        self.emit_grace = emit_grace
        self.retry_after = retry_after
        self.grpc_workers = grpc_workers
        self._problems = list(problems) if problems is not None else check([self.config])
        self._run: OtlpRun | None = None

    # ------------------------------------------------------------------ contract

    def capabilities(self) -> Capabilities:
        """The ``hello`` capability block (AEP-0003 §4): no ``control`` (this
        channel accepts no commands)."""
        ns = self.profile.namespace if self.profile else f"x.{self.vendor}.otel"
        emits = sorted({t.split(".")[0] for t in self.profile.primary_types}) if (
            self.primary and self.profile) else []
        return {"emits": emits + [ns],
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1])}

    def listeners(self) -> dict[str, Address | None]:
        """``{"grpc": (host, port) | None, "http": ...}``: the bound
        addresses while a run is serving (port 0 resolved), the configured
        ones otherwise; ``None`` for a listener that is off."""
        run = self._run
        if run is not None and run.serving:
            return dict(run.bound)
        return self.config.listeners()

    @property
    def grpc_address(self) -> Address | None:
        """The bound gRPC address of the serving run (``None`` otherwise)."""
        run = self._run
        return run.bound["grpc"] if run is not None else None

    @property
    def http_address(self) -> Address | None:
        """The bound HTTP address of the serving run (``None`` otherwise)."""
        run = self._run
        return run.bound["http"] if run is not None else None

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        """One line per problem, checked before anything binds: the
        configuration's (unknown vendor, unparsable address, both listeners
        off, an address used twice or by a sibling profile, a bad size
        limit) and, with ``check_ports``, each listener whose port is in use."""
        problems = list(self._problems)
        if check_ports:
            for kind, addr in self.config.listeners().items():
                if addr is not None and not bindable(*addr):
                    problems.append(f"{self.config.setting(kind)}={addr[0]}:{addr[1]}: address "
                                    "in use or not bindable")
        return problems

    async def run(self, ctx: BridgeContext, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Build a fresh :class:`OtlpRun` and serve it until cancelled (see
        :meth:`OtlpRun.serve`). Raises ``OSError`` (bare, not grouped) when a
        listener cannot bind, ``RuntimeError`` for an unknown vendor (both
        are :meth:`preflight` lines first)."""
        if self.profile is None:
            raise RuntimeError(f"unknown OTLP vendor profile {self.vendor!r}")
        run = OtlpRun(self.name, self.config, self.profile, ctx, emit_grace=self.emit_grace,
                      retry_after=self.retry_after, grpc_workers=self.grpc_workers)
        self._run = run
        try:
            await run.serve(task_status=task_status)
        finally:
            if self._run is run:
                self._run = None


class OtlpRun:
    """Everything one run of an :class:`OtlpInBridge` owns: its
    ``BridgeContext``, its :class:`~bridges.otlp_in.export.Admission` (with
    the capture posture of ``ctx``'s stamper), its gRPC server and its bound
    addresses (:attr:`bound`). Built by :meth:`OtlpInBridge.run`; never
    reused."""

    def __init__(self, name: str, config: OtlpConfig, profile: Profile, ctx: BridgeContext, *,
                 emit_grace: float, retry_after: int, grpc_workers: int) -> None:
        self.name = name
        self.config = config
        self.ctx = ctx
        self.grpc_workers = grpc_workers
        posture = Posture(agent=profile.agent, mode="primary" if config.primary else "companion",
                          policy=ctx.stamper.policy)
        self.admission = Admission(ctx, profile, posture, emit_grace=emit_grace,
                                   retry_after=retry_after,
                                   max_new_sessions=config.max_new_sessions,
                                   new_sessions_per_s=config.new_sessions_per_s)
        self.reads = Reads(profile.reads, profile.resource_reads, profile.fields)
        self.bound: dict[str, Address | None] = {"grpc": None, "http": None}
        self.serving = False
        # the HTTP server hears the run's stop as this event, not as a cancel,
        # so the exports in flight answer (a cancel dropped their connections)
        self._http_stop = trio.Event()
        self._http_scope = trio.CancelScope(shield=True)
        self._http_done = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Bind the listeners, call ``task_status.started()``, serve until
        cancelled. ``ctx.health.source`` is ``True`` while serving. On the
        way out an export still waiting for room is answered at once
        (``UNAVAILABLE`` / 503 if nothing of it was emitted, else
        ``partial_success`` for the rest), and both servers stop accepting
        and give the exports in flight a grace to answer: gRPC 1 s (awaited
        in a worker thread), HTTP :data:`~bridges.otlp_in.http.GRACEFUL_S`
        (its server runs shielded from the run's cancel and hears the stop
        as an event; cancelled after the grace), both under a shielded
        scope. Raises ``OSError`` (bare, not grouped) when a listener
        cannot bind."""
        grpc_rx: GrpcReceiver | None = None
        try:
            if self.config.grpc_listen is not None:
                grpc_rx = GrpcReceiver(self.admission.export, trio.lowlevel.current_trio_token(),
                                       max_body=self.config.max_body, on_problem=self.problem,
                                       workers=self.grpc_workers, reads=self.reads)
                self.bound["grpc"] = grpc_rx.start(self.config.grpc_listen)
                self.ctx.answers_in_thread = True  # grpcio's handler threads wait on verdicts
            try:
                async with trio.open_nursery() as nursery:
                    try:
                        if self.config.http_listen is not None:
                            # shielded like the server it starts (binding does not
                            # block): a cancel here must reach _stop_http below,
                            # not leave a server no cancel can end
                            with trio.CancelScope(shield=True):
                                self.bound["http"] = await nursery.start(
                                    self._serve_http, self.config.http_listen)
                        self._up()
                        task_status.started()
                        await trio.sleep_forever()
                    finally:
                        await self._stop_http()
            except BaseExceptionGroup as eg:
                err = _bind_error(eg)
                if err is eg:
                    raise
                raise err from None
        finally:
            self.serving = False
            self.ctx.health.source = False
            self.admission.closing = True
            if grpc_rx is not None:
                await grpc_rx.stop(grace=1.0)

    async def _stop_http(self) -> None:
        """The run's stop, for the HTTP server: what waits for room is
        answered, the server stops accepting and its exports in flight get
        their grace (they see the relay channel close under the fleet's
        drain: :meth:`~bridges.otlp_in.export.Admission.admit` answers
        ``partial_success`` then); a server still running after it is
        cancelled."""
        self.admission.closing = True
        self._http_stop.set()
        if self.config.http_listen is not None:
            with trio.CancelScope(shield=True) as grace:
                grace.deadline = trio.current_time() + GRACEFUL_S + 0.5
                await self._http_done.wait()
        self._http_scope.cancel()

    def _up(self) -> None:
        vendor = self.config.vendor
        # the mode, said once: the hook bridge's reason when it is the one
        if self.config.primary:
            self.ctx.log.info(
                "%s: primary mode (core types, and x.%s.otel.* for the rest); "
                "AEP_OTLP_PRIMARY=0 when another %s channel is the core-type authority",
                self.name, vendor, vendor)
        elif self.config.hook_channel:
            self.ctx.log.info("%s: companion mode (x.%s.otel.* only): the %s hook bridge (%s=1) is "
                              "the core-type authority for this agent", self.name,
                              vendor, vendor, self.config.hook_channel)
        else:
            self.ctx.log.info(
                "%s: companion mode (x.%s.otel.* only): AEP_OTLP_PRIMARY=0, or another %s "
                "channel is the core-type authority", self.name, vendor, vendor)
        self.serving = True
        self.ctx.health.source = True
        self.ctx.health.detail = None
        self.ctx.log.info("%s listening: %s", self.name, ", ".join(
            f"{k} {a[0]}:{a[1]}" for k, a in self.bound.items() if a))

    async def _serve_http(self, listen: Address, *,
                          task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
                          ) -> None:
        health = self.ctx.health
        app = HttpReceiver(self.admission.export, max_body=self.config.max_body,
                           on_problem=self.problem, body_timeout=self.config.body_timeout,
                           reads=self.reads)
        try:
            with self._http_scope:  # shielded: the stop arrives as _http_stop (_stop_http)
                await serve_http(app, listen, log=self.ctx.log.getChild("http"),
                                 on_refused_host=partial(health.count, "otlp.refused_host"),
                                 on_fault=lambda kind: health.count("otlp.connection_errors"),
                                 where=f"{self.name} OTLP/HTTP",
                                 max_connections=self.config.max_connections,
                                 shutdown=self._http_stop, task_status=task_status)
        finally:
            self._http_done.set()

    def problem(self, counter: str, line: str) -> None:
        """A transport refused a request: count it, keep the line as the
        health detail, log it at debug (never body content)."""
        self.ctx.health.count(counter)
        self.ctx.health.detail = line
        self.ctx.log.debug("%s refused a request: %s", self.name, line)


def _bind_error(eg: BaseExceptionGroup[BaseException]) -> BaseException:
    """hypercorn binds inside its own nurseries: a bind failure arrives
    wrapped. Surface a lone ``OSError`` as itself (one clear log line for
    the supervisor); anything else stays the group it was."""
    causes = leaves(eg)
    if len(causes) == 1 and isinstance(causes[0], OSError):
        return causes[0]
    return eg


if TYPE_CHECKING:  # mypy holds the class to the fleet's contract
    _conforms: type[Bridge] = OtlpInBridge
