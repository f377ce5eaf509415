"""The daemon's lifecycle: build the fleet from a :class:`Config`, serve the
embedded relay (or the bare health app when uplinking), signal readiness,
and on SIGTERM/SIGINT drain in order within a hard deadline.

Shutdown (DESIGN.md "The supervisor"): stop the bridges (no new input),
deliver what the relay channel holds, flush the session logs, close every
uplink with a ``closing`` frame, end SSE streams and close WebSockets with
1001, exit 0; if the drain outlives ``drain_deadline`` (5 s), exit 1."""
from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from bridges.core.asgi import App
from bridges.core.bridge import Bridge

from .config import Config
from .fleet import Fleet
from .tools.notify import Notifier
from .web.http import health_app, serve_asgi

log = logging.getLogger("aep.daemon")

EXIT_OK, EXIT_DEADLINE, EXIT_CONFIG = 0, 1, 2


def build_bridges(cfg: Config, *, check_ports: bool = True) -> tuple[list[Bridge], list[str]]:
    """Instantiate every enabled bridge through its ``from_env`` factory
    (one :class:`~bridges.core.bridge.Bridge` or a list of them) and collect
    its ``preflight()`` problems. Returns ``(bridges, problems)``."""
    bridges: list[Bridge] = []
    problems: list[str] = []
    for spec in cfg.enabled:
        mod_name, _, fn_name = (spec.factory or "").partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            problems.append(f"{spec.flag}=1: the {spec.key} bridge cannot be loaded ({e})")
            continue
        try:
            made = factory(cfg.environ, policy=cfg.policy)
        except ValueError as e:
            problems.append(str(e))
            continue
        for b in made if isinstance(made, (list, tuple)) else [made]:
            problems.extend(b.preflight(check_ports=check_ports))
            bridges.append(b)
    if cfg.embedded_relay:
        for b in bridges:
            try:
                addrs = b.listeners().values()
            except ValueError:
                continue  # the bridge's own preflight reports its bad address
            if any(a is not None and a[1] != 0 and a == cfg.listen for a in addrs):
                problems.append(f"AEP_LISTEN={cfg.listen[0]}:{cfg.listen[1]} is also a listener "
                                f"of {b.name}: use two ports")
    names = [b.name for b in bridges]
    for n in {n for n in names if names.count(n) > 1}:
        problems.append(f"two bridges share the name {n!r}")
    return bridges, problems


_GC_THRESHOLD0 = 7000
"""Allocations between young collections (CPython's default 700): an event
allocates a few dozen objects, so the default collects every ~20 events."""


def _settle_gc() -> None:
    """Once everything is imported and started: move what exists into the
    permanent generation (``gc.freeze``: modules, classes, the bridges'
    tables are never garbage, and a full collection then no longer walks
    them: on a loaded daemon that walk was the tail of the vendor frame ->
    ``/stream`` latency), and collect young objects 10x less often (issue 11)."""
    gc.collect()
    gc.freeze()
    _, t1, t2 = gc.get_threshold()
    gc.set_threshold(_GC_THRESHOLD0, t1, t2)


GIL_SWITCH_S = 0.0005
"""How long a thread waiting for the GIL waits before it asks the holder to
drop it (``sys.setswitchinterval``; CPython's default 5 ms). The threads
libraries demand (grpcio's handlers, trio's worker threads decoding an
OTLP/HTTP body or scanning session logs) hand their work back to the event
loop: with 5 ms, a handler with an export's answer in hand waited up to
5 ms for a busy event loop before the exporter heard it, and the event
loop as long behind a decoding thread (issue 11)."""


BINDINGS_FILE = "relay-bindings.jsonl"
"""The embedded relay's session bindings journal in ``AEP_STATE_DIR``
(:mod:`supervisor.relay.bindings`)."""
REMOTE_WRITER = "relay"
"""The session log writer (:mod:`supervisor.sessionlog.writers`: retention's
fairness group) of remote emitters' posts: ``relay:{principal}``
(:meth:`supervisor.relay.core.Relay.principal`), bare when it names none."""


def _settle_gil() -> None:
    """Set the switch interval to :data:`GIL_SWITCH_S` (process-wide)."""
    sys.setswitchinterval(GIL_SWITCH_S)


def relay_options(cfg: Config) -> dict[str, Any]:
    """The :class:`~supervisor.relay.core.Relay` arguments ``cfg`` sets."""
    return dict(token=cfg.token, buffer=cfg.buffer, max_sessions=cfg.max_sessions,
                max_body=cfg.max_body, max_batch=cfg.max_batch, max_from=cfg.max_from,
                buffer_bytes=cfg.buffer_bytes, total_bytes=cfg.total_bytes,
                cors_origins=cfg.cors_origins, strict_identity=cfg.strict_identity,
                max_filter_terms=cfg.max_filter_terms, body_timeout_s=cfg.body_timeout,
                subscriber_bytes=cfg.subscriber_bytes,
                max_new_sessions=cfg.relay_max_new_sessions,
                new_sessions_per_s=cfg.relay_new_sessions_per_s,
                emitter_tokens=dict(cfg.emitter_tokens), claim_grace_s=cfg.claim_grace,
                max_bindings=cfg.max_bindings)


async def run_daemon(cfg: Config, bridges: list[Bridge], *, notifier: Notifier | None = None,
                     nats: Any = None, settings_from: list[str] | None = None,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit status. ``nats``
    (a :class:`~supervisor.jetstream.config.NatsConfig`, ``aep-bridges
    relay`` with ``AEP_NATS_URL``): the relay serves from JetStream
    (:class:`~supervisor.jetstream.relay.JetStreamRelay`). ``settings_from``:
    the files the settings were read from (``config file PATH``), named
    on the ``aep-bridges up`` line."""
    if nats is not None and cfg.embedded_relay:
        return await _run_jetstream_relay(cfg, bridges, nats, notifier=notifier,
                                          settings_from=settings_from, task_status=task_status)
    relay = None
    if cfg.embedded_relay:
        from .relay.core import Relay
        relay = Relay(**relay_options(cfg))
    return await _run_daemon(cfg, bridges, relay, notifier=notifier, task_status=task_status,
                             durable=relay is not None, settings_from=settings_from)


async def _make_durable(relay: Any, session_log: Any, state_dir: Path) -> None:
    """The embedded relay and the session log (issue 25 row 9): remote
    emitters' sequenced events (``POST /events``, ``/socket``) are written
    to the session log before they are admitted and answered, as the
    fleet's own are, and the logs' recent tail is re-admitted into the
    relay's buffers before anything is served
    (:func:`supervisor.relay.restore.restore_from_logs`)."""
    from .relay.restore import restore_from_logs

    def persist(entries: list[Any], principal: str | None) -> bool:
        # the sender's principal is its files' writer: retention's fairness
        # group, apart from every fleet bridge's and every other principal's
        writer = f"{REMOTE_WRITER}:{principal}" if principal else REMOTE_WRITER
        return all(session_log.write_raw_batch([(e.attrs, e.raw) for e in entries],
                                               [writer] * len(entries)))

    relay.persist = persist
    if session_log.writers is not None:  # posters name their sessions: open writers
        session_log.writers.open_writers.add(REMOTE_WRITER)
        session_log.writers.open_prefixes += (f"{REMOTE_WRITER}:",)
    # who owned which session survives the restart (issue 25: a squatter
    # after a restart is refused, the fleet's own sessions stay the fleet's)
    relay.bindings.open(state_dir / BINDINGS_FILE, time.monotonic())
    got = await restore_from_logs(relay, session_log.root)
    if got["restored"] or got["errors"]:
        log.info("relay: re-admitted %d events of %d sessions from the session logs in %.2f s "
                 "(%d lines skipped, %d files unreadable)", got["restored"], got["sessions"],
                 got["seconds"], got["skipped"], got["errors"])


async def _run_jetstream_relay(cfg: Config, bridges: list[Bridge], nats: Any, *,
                               notifier: Notifier | None, settings_from: list[str] | None,
                               task_status: trio.TaskStatus[list[str]]) -> int:
    """``aep-bridges relay`` over JetStream: connect (retrying until a
    server answers), then serve. SIGTERM/SIGINT while still connecting
    ends it at once with status 0 (nothing is served yet, so nothing to
    drain); once serving, :func:`_run_daemon`'s own handler takes over."""
    from .jetstream.link import open_link
    from .jetstream.relay import JetStreamRelay
    serving = False
    stopped: list[int] = []
    status = EXIT_OK
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as early:
        async with trio.open_nursery() as guard:
            async def stop_while_connecting() -> None:
                async for signum in early:
                    if not serving:
                        log.info("received %s while connecting to NATS: exiting",
                                 signal.Signals(signum).name)
                        stopped.append(signum)
                        guard.cancel_scope.cancel()
                        return
            guard.start_soon(stop_while_connecting)
            log.info("aep-bridges relay: connecting to NATS %s", ", ".join(nats.shown_servers))
            async with open_link(nats, name="aep-bridges relay") as link, \
                    trio.open_nursery() as outer:
                serving = True
                js_relay = JetStreamRelay(link, nats, **relay_options(cfg))
                await outer.start(js_relay.run)
                # the relay is the one NATS party here: the (bridgeless) fleet runs no sink
                status = await _run_daemon(replace(cfg, nats=None), bridges, js_relay,
                                           notifier=notifier, task_status=task_status,
                                           settings_from=settings_from)
                outer.cancel_scope.cancel()
            guard.cancel_scope.cancel()
    return status


async def _run_daemon(cfg: Config, bridges: list[Bridge], relay: Any, *,
                      notifier: Notifier | None,
                      task_status: trio.TaskStatus[list[str]], durable: bool = False,
                      settings_from: list[str] | None = None) -> int:
    notifier = notifier or Notifier(cfg.environ)
    from .web.mounts import Mounts
    mounts = Mounts(cfg.token)  # bridge-served paths on AEP_LISTEN (the ACP tees)
    fleet = Fleet(cfg, bridges, relay=relay, mounts=mounts)
    if durable:  # the embedded relay (not a JetStream one: the stream is its store)
        await _make_durable(relay, fleet.session_log, cfg.state_dir)
    stop_http = trio.Event()
    status = EXIT_OK
    # SIGTERM/SIGINT: our own handler, not trio.open_signal_receiver, so the
    # hard deadline is armed the moment the signal arrives (Python runs the
    # handler between bytecodes even while the loop is busy; issue 10 #3: it
    # must not wait for the loop to get round to it). A second signal during
    # the drain is ignored (a clean exit 0, never 143).
    token = trio.lowlevel.current_trio_token()
    got_signal = trio.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if received:
            return
        received.append(signum)
        # Backstop: a send hypercorn shields from cancellation (a client that
        # stopped reading), or a loop that never yields, cannot hold the exit:
        # SIGALRM's default action ends the process regardless.
        signal.alarm(int(cfg.drain_deadline) + 2)
        token.run_sync_soon(got_signal.set)  # safe from a signal handler

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        async with trio.open_nursery() as root:
            app: App
            if relay is not None:
                from .console import console_app  # the browser console at / (issue 28)
                from .relay.app import make_app
                inner: Any = console_app(make_app(relay, healthz=fleet.healthz,
                                                  metrics=fleet.metrics.render))
            else:
                from bridges.core.asgi import host_guard  # DNS-rebinding guard, as on the relay
                inner = host_guard(health_app(cfg.token, fleet.healthz, fleet.metrics.render))
            app = mounts.wrap(inner)
            host, port = cfg.listen
            bound = await root.start(partial(serve_asgi, app, host, port, stop_http,
                                             max_connections=cfg.max_connections))
            await root.start(fleet.run)
            await notifier.notify("READY=1")
            _settle_gc()
            _settle_gil()
            root.start_soon(notifier.watchdog_loop)
            log.info("aep-bridges up: %s on %s; bridges: %s; epoch %d; %s%s",
                     (getattr(relay, "mode", "embedded relay") if relay else "health"),
                     ", ".join(bound),
                     ", ".join(fleet.members) or "none", fleet.epoch,
                     "control routing on (token set)" if cfg.token
                     else "watch-only (no AEP_TOKEN: commands refused)",
                     f"; settings from {' and '.join(settings_from)}" if settings_from else "")
            task_status.started(bound)
            await got_signal.wait()
            log.info("received %s: draining", signal.Signals(received[0]).name)
            await notifier.notify("STOPPING=1")
            with trio.move_on_after(cfg.drain_deadline) as deadline:
                await fleet.drain()
                if relay is not None:
                    await relay.close("shutdown")
                stop_http.set()
                await trio.lowlevel.checkpoint()
            if deadline.cancelled_caught:
                log.error("drain exceeded %.1fs; exiting at the hard deadline", cfg.drain_deadline)
                os._exit(EXIT_DEADLINE)  # the deadline is hard: nothing may hold the exit
            root.cancel_scope.cancel()
    finally:
        for s, h in previous.items():
            signal.signal(s, signal.SIG_IGN if received else h)
    log.info("aep-bridges stopped (status %d)", status)
    return status
