"""The OTLP inbound bridge: one vendor profile (``codex`` or ``vscode``) on
its own listeners, its own emitter identity (``otlp_in.<vendor>``).

Design record: ``shared/aep/docs/bridge-otlp-inbound-design.md``; beyond the
reference (which takes only OTLP/JSON over HTTP and needs a Collector for
protobuf), this bridge serves OTLP/gRPC ``LogsService/Export`` and OTLP/HTTP
``POST /v1/logs`` with protobuf and JSON bodies, gzip accepted
(:mod:`bridges.otlp_in.receiver`). Mapping is the profile's pure mapper
(:mod:`bridges.otlp_in.codex`, :mod:`bridges.otlp_in.vscode`).

Delivery (AEP-0003 §8.4: never a silent drop at ``notice``+): a request
arriving while the relay channel is full waits up to ``emit_grace`` seconds
for room, and only then is refused retryably (503 / ``UNAVAILABLE`` with
``Retry-After``), before anything is emitted, so the exporter's retry cannot
duplicate. The wait comes first because the real Codex exporter (0.171,
OTel Rust SDK 0.31) never retries: its one export at exit carries the whole
run, and a 503 loses it (``tests/fixtures/codex_otel_real/README.md``,
"Delivery"). Once a request is admitted its emissions go out in order; if
the channel fills mid-request the bridge again waits up to ``emit_grace``,
and records still unsent then are reported to the sender in
``partial_success`` (rejected, counted, logged), not dropped silently.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import trio
from hypercorn.config import Config as HypercornConfig

from bridges.core import capture as _capture
from bridges.core.bridge import BridgeContext, Saturated
from bridges.core.capture import CapturePolicy
from bridges.core.settings import Address, bindable, parse_hostport

from .common import Posture, record_time, session_id
from .flatten import FlatRecord
from .profiles import PROFILES, Profile
from .receiver import DEFAULT_MAX_BODY, Accepted, GrpcReceiver, HttpReceiver, Unavailable


DEFAULT_GRPC_LISTEN = "127.0.0.1:4317"
DEFAULT_HTTP_LISTEN = "127.0.0.1:4318"
OFF = ("off", "none", "disabled", "0")



def parse_listen(value: str | None) -> Address | None:
    """``host:port`` / ``[v6]:port`` -> ``(host, port)``; ``None``/``off``
    -> ``None`` (listener disabled). Raises ``ValueError`` otherwise."""
    if value is None or value.strip().lower() in OFF:
        return None
    try:
        return parse_hostport(value)
    except ValueError:
        raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:4317) or off") from None


class OtlpInBridge:
    """One OTLP inbound emitter identity (``Bridge`` protocol,
    :mod:`bridges.core.bridge`).

    ``vendor``: profile key, ``codex`` or ``vscode`` (an unknown one is
    reported by :meth:`preflight`); ``grpc_listen`` / ``http_listen``:
    ``host:port`` (port 0 picks a free port; the bound address is then in
    :attr:`grpc_address` / :attr:`http_address`) or ``None``/``"off"``;
    ``primary``: core-type mapping (``AEP_OTLP_PRIMARY=1``), companion
    otherwise; ``policy``: the capture posture (used for ``capabilities``;
    mapping uses the stamper's policy, the one that gates the envelopes);
    ``max_body``: request size limit in bytes, compressed and inflated;
    ``emit_grace``: seconds a request may wait for room on the relay
    channel, before admission (then 503) and again mid-request (then
    ``partial_success``); ``retry_after``: seconds suggested on 503/UNAVAILABLE;
    ``grpc_workers``: grpcio handler threads; ``settings``: the names of the
    settings behind ``grpc_listen``/``http_listen``/``vendor``/``max_body``
    for :meth:`preflight` lines."""

    def __init__(self, vendor: str = "codex", *, grpc_listen: str | None = DEFAULT_GRPC_LISTEN,
                 http_listen: str | None = DEFAULT_HTTP_LISTEN, primary: bool = False,
                 policy: CapturePolicy | None = None, max_body: int = DEFAULT_MAX_BODY,
                 emit_grace: float = 3.0, retry_after: int = 1, grpc_workers: int = 4,
                 settings: dict[str, str] | None = None,
                 problems: list[str] | None = None) -> None:
        self.vendor = vendor
        self._env_problems = list(problems or [])
        self.profile: Profile | None = PROFILES.get(vendor)
        self.name = f"otlp_in.{vendor}"
        self.agent = self.profile.agent if self.profile else vendor
        self.grpc_listen = grpc_listen
        self.http_listen = http_listen
        self.primary = primary
        self.policy = policy or CapturePolicy()
        self.max_body = max_body
        self.emit_grace = emit_grace
        self.retry_after = retry_after
        self.grpc_workers = grpc_workers
        self.settings = {"grpc": "AEP_OTLP_GRPC_LISTEN", "http": "AEP_OTLP_HTTP_LISTEN",
                         "vendor": "AEP_OTLP_VENDOR", "max_body": "AEP_OTLP_MAX_BODY",
                         **(settings or {})}
        self.peers: Sequence[OtlpInBridge] = ()
        """Sibling OTLP bridges of the same daemon (set by ``from_env``), so
        :meth:`preflight` can refuse two profiles on one address."""
        self.grpc_address: Address | None = None
        self.http_address: Address | None = None
        self._ctx: BridgeContext | None = None
        self._posture: Posture | None = None
        self._closing = False

    # ------------------------------------------------------------------ contract

    def capabilities(self) -> dict[str, Any]:
        """The ``hello`` capability block (AEP-0003 §4): no ``control`` (this
        channel accepts no commands)."""
        ns = self.profile.namespace if self.profile else f"x.{self.vendor}.otel"
        emits = sorted({t.split(".")[0] for t in self.profile.primary_types}) if (
            self.primary and self.profile) else []
        return {"emits": emits + [ns],
                "capture": list(_capture.LEVELS[:_capture.rank(self.policy.ceiling) + 1])}

    def listeners(self) -> dict[str, Address | None]:
        """The configured listeners (``ValueError`` if unparsable)."""
        return {"grpc": parse_listen(self.grpc_listen), "http": parse_listen(self.http_listen)}

    def preflight(self, *, check_ports: bool = True) -> list[str]:
        """One line per problem, checked before anything binds: unknown
        vendor, unparsable address, both listeners off, an address used twice
        (within this bridge or by a sibling profile), port in use, a bad size
        limit."""
        problems: list[str] = list(self._env_problems)
        if self.profile is None:
            problems.append(f"{self.settings['vendor']}: unknown vendor {self.vendor!r} "
                            f"(known: {', '.join(sorted(PROFILES))})")
        addrs: dict[str, Address] = {}
        for kind in ("grpc", "http"):
            raw = self.grpc_listen if kind == "grpc" else self.http_listen
            if raw == "":
                problems.append(f"{self.settings[kind]}: not set; every OTLP vendor after the "
                                "first needs its own listeners (host:port or off)")
                continue
            try:
                addr = parse_listen(raw)
            except ValueError as e:
                problems.append(f"{self.settings[kind]}={raw!r}: {e}")
                continue
            if addr is not None:
                addrs[kind] = addr
        if not addrs and not any(p.startswith(self.settings["grpc"]) or
                                 p.startswith(self.settings["http"]) for p in problems):
            problems.append(f"{self.settings['grpc']} and {self.settings['http']} are both off: "
                            f"the {self.vendor} profile would receive nothing")
        if "grpc" in addrs and addrs.get("grpc") == addrs.get("http") and addrs["grpc"][1] != 0:
            problems.append(f"{self.settings['grpc']} and {self.settings['http']} are both "
                            f"{addrs['grpc'][0]}:{addrs['grpc'][1]}: use two ports")
        taken: dict[Address, str] = {}
        for peer in self.peers:
            if peer is self:
                continue
            try:
                for kind, addr in peer.listeners().items():
                    if addr is not None and addr[1] != 0:
                        taken[addr] = peer.settings[kind]
            except ValueError:
                pass  # the peer reports its own bad address
        for kind, addr in addrs.items():
            if addr in taken:
                problems.append(f"{self.settings[kind]}={addr[0]}:{addr[1]}: also used by "
                                f"{taken[addr]}; each OTLP vendor needs its own listeners")
            elif check_ports and not bindable(*addr):
                problems.append(f"{self.settings[kind]}={addr[0]}:{addr[1]}: address in use or "
                                "not bindable")
        if not isinstance(self.max_body, int) or self.max_body < 1024:
            problems.append(f"{self.settings['max_body']}={self.max_body!r}: must be a whole "
                            "number of bytes, at least 1024")
        return problems

    async def run(self, ctx: BridgeContext, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bind the listeners, call ``task_status.started()``, serve until
        cancelled. ``ctx.health.source`` is ``True`` while serving. On the
        way out the gRPC server stops accepting (``grpc`` stop with a 1 s
        grace, awaited in a worker thread under a shielded scope) and an
        export still waiting for room is answered at once: ``UNAVAILABLE``
        if nothing of it was emitted, else ``partial_success`` for the rest;
        the HTTP server closes with the nursery. Raises ``OSError`` (bare,
        not grouped) when a listener cannot bind, ``RuntimeError`` for an
        unknown vendor, ``ValueError`` for an unparsable address (all three
        are :meth:`preflight` lines first)."""
        if self.profile is None:
            raise RuntimeError(f"unknown OTLP vendor profile {self.vendor!r}")
        listen = self.listeners()
        self._ctx = ctx
        self._posture = Posture(primary=self.primary, policy=ctx.stamper.policy)
        self._closing = False
        token = trio.lowlevel.current_trio_token()
        grpc_rx: GrpcReceiver | None = None
        try:
            if listen["grpc"] is not None:
                host, port = listen["grpc"]
                grpc_rx = GrpcReceiver(self.export, token, max_body=self.max_body,
                                       on_problem=self._problem, workers=self.grpc_workers)
                self.grpc_address = (host, grpc_rx.start(host, port))
            try:
                async with trio.open_nursery() as nursery:
                    if listen["http"] is not None:
                        self.http_address = await nursery.start(self._serve_http,
                                                                *listen["http"])
                    ctx.health.source = True
                    ctx.health.detail = None
                    ctx.log.info("%s listening: %s", self.name, ", ".join(
                        f"{k} {a[0]}:{a[1]}" for k, a in (("grpc", self.grpc_address),
                                                           ("http", self.http_address)) if a))
                    task_status.started()
                    await trio.sleep_forever()
            except BaseExceptionGroup as eg:
                err = _bind_error(eg)
                if err is eg:
                    raise
                raise err from None
        finally:
            ctx.health.source = False
            self._closing = True
            if grpc_rx is not None and grpc_rx.server is not None:
                with trio.CancelScope(shield=True):
                    stopped = grpc_rx.stop(grace=1.0)
                    await trio.to_thread.run_sync(stopped.wait, 5.0)

    async def _serve_http(self, host: str, port: int, *,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve OTLP/HTTP on ``host:port`` until cancelled, through the
        relay's hardened :func:`~supervisor.relay.serve.serve_app` (a
        connection that makes hypercorn raise is closed, counted as
        ``otlp.connection_errors`` and logged once per kind, instead of
        ending the listener; hypercorn#225), behind the relay's DNS-rebinding
        guard (on a loopback bind, a request whose ``Host`` is not a
        loopback name/address is refused 403 and counted as
        ``otlp.refused_host``: rebinding would bypass any CORS rule).
        Raises ``OSError`` when the address cannot be bound."""
        from supervisor.relay.app import host_guard
        from supervisor.relay.serve import bind_socket, serve_app

        assert self._ctx is not None
        ctx = self._ctx
        cfg = HypercornConfig()
        cfg.accesslog = None
        cfg.errorlog = ctx.log.getChild("http")
        cfg.graceful_timeout = 1.0
        app = host_guard(HttpReceiver(self.export, max_body=self.max_body, on_problem=self._problem),
                         on_refuse=lambda: ctx.health.count("otlp.refused_host"))
        sock = bind_socket(host, port)

        class _Started:
            def started(self, addr: tuple[str, int]) -> None:
                task_status.started((host, addr[1]))

        await serve_app(app, sock, trio.Event(), config=cfg, task_status=_Started(),
                        on_fault=lambda kind: ctx.health.count("otlp.connection_errors"),
                        where=f"{self.name} OTLP/HTTP {host}:{sock.getsockname()[1]}")

    # ------------------------------------------------------------------ export

    def _problem(self, counter: str, line: str) -> None:
        if self._ctx is not None:
            self._ctx.health.count(counter)
            self._ctx.health.detail = line
            self._ctx.log.debug("%s refused a request: %s", self.name, line)

    async def export(self, records: list[FlatRecord | None], notes: list[str]) -> Accepted:
        """Map and emit one export request's records (trio side of both
        receivers). Returns the ``partial_success`` figures; raises
        :class:`Unavailable` when nothing can be admitted now."""
        ctx, posture, profile = self._ctx, self._posture, self.profile
        assert ctx is not None and posture is not None and profile is not None
        health = ctx.health
        health.count("otlp.requests")
        health.count("otlp.records", len(records))
        for n in notes:
            health.count(n)
        if not await self._room():
            if self._closing:
                raise Unavailable("receiver is stopping; retry later", self.retry_after)
            health.count("otlp.saturated")
            raise Unavailable("relay channel saturated; retry later", self.retry_after)

        reasons: Counter[str] = Counter()
        planned: list[tuple[int, str, dict[str, Any], Any]] = []
        for idx, rec in enumerate(records):
            if rec is None:
                reasons["not a LogRecord"] += 1
                continue
            rnotes: list[str] = []
            try:
                sess = session_id(profile.session_key(rec), rnotes)
                if sess is None:
                    rnotes.append("otlp.no_session")
                    reasons["no session key"] += 1
                    continue
                emissions = profile.map_record(rec, posture, rnotes)
                when = record_time(rec)
            except Exception:  # a mapper bug must not take the receiver down
                ctx.log.exception("%s: mapping a LogRecord failed", self.name)
                rnotes.append("otlp.mapping_error")
                reasons["mapping failed"] += 1
                continue
            finally:
                for n in rnotes:
                    health.count(n)
            planned.extend((idx, sess, profile.stampable(em), when) for em in emissions)

        emitted = 0
        for pos, (idx, sess, em, when) in enumerate(planned):
            if not await self._room():
                stopping = self._closing
                if emitted == 0:  # nothing admitted yet: a retry cannot duplicate
                    raise Unavailable("receiver is stopping; retry later" if stopping else
                                      "relay channel saturated; retry later", self.retry_after)
                lost = {i for i, *_ in planned[pos:]}
                why = "receiver stopping" if stopping else "relay channel saturated"
                reasons[why] += len(lost)
                health.count("otlp.rejected_stopping" if stopping else "otlp.rejected_saturated",
                             len(lost))
                ctx.log.warning("%s: %s; %d LogRecords rejected via partial_success",
                                self.name, why, len(lost))
                break
            try:
                ctx.emit_nowait(sess, em, time=when)
                emitted += 1
            except Saturated:  # only an unbuffered channel gets here after _room()
                reasons["relay channel saturated"] += 1
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise Unavailable("relay channel closed; retry later", self.retry_after) from None
            except ValueError as e:
                ctx.log.warning("%s: cannot stamp %s: %s", self.name, em.get("type"), e)
                health.count("otlp.stamp_error")
                reasons["stamping failed"] += 1
        health.count("otlp.emitted", emitted)
        rejected = sum(reasons.values())
        if rejected:
            health.count("otlp.rejected", rejected)
        msg = "; ".join(f"{n} LogRecord{'s' if n > 1 else ''} rejected: {why}"
                        for why, n in reasons.items())
        return Accepted(rejected=rejected, error_message=msg)

    async def _room(self) -> bool:
        """Wait (at most ``emit_grace`` s, and not past the bridge's stop)
        until the relay channel has room. Polls: the channel offers no
        "room available" event, and stamping before the wait would burn a
        ``seq`` on timeout."""
        ctx = self._ctx
        assert ctx is not None
        with trio.move_on_after(self.emit_grace):
            while ctx.saturated() and not self._closing:
                await trio.sleep(0.005)
        return not ctx.saturated() and not self._closing


def _bind_error(eg: BaseExceptionGroup) -> BaseException:
    """hypercorn binds inside its own nurseries: a bind failure arrives
    wrapped. Surface a lone ``OSError`` as itself (one clear log line for
    the supervisor); anything else stays the group it was."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(eg)
    if len(leaves) == 1 and isinstance(leaves[0], OSError):
        return leaves[0]
    return eg
