"""The daemon's lifecycle: build the fleet from a :class:`Config`, serve the
embedded relay (or the bare health app when uplinking), signal readiness,
and on SIGTERM/SIGINT drain in order within a hard deadline.

Shutdown (DESIGN.md "The supervisor"): stop the bridges (no new input),
deliver what the relay channel holds, flush the session logs, close every
uplink with a ``closing`` frame, end SSE streams and close WebSockets with
1001, exit 0; if the drain outlives ``drain_deadline`` (5 s), exit 1."""
from __future__ import annotations

import importlib
import logging
import os
import signal
from typing import Any

import trio

from .config import Config
from .fleet import Fleet
from .http import health_app, serve_asgi
from .notify import Notifier

log = logging.getLogger("aep.daemon")

EXIT_OK, EXIT_DEADLINE, EXIT_CONFIG = 0, 1, 2


def build_bridges(cfg: Config, *, check_ports: bool = True) -> tuple[list[Any], list[str]]:
    """Instantiate every enabled bridge through its ``from_env`` factory and
    collect its ``preflight()`` problems. Returns ``(bridges, problems)``."""
    bridges: list[Any] = []
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
            listeners = getattr(b, "listeners", None)
            try:
                addrs = listeners().values() if callable(listeners) else ()
            except ValueError:
                continue  # the bridge's own preflight reports its bad address
            if any(a is not None and a[1] != 0 and a == cfg.listen for a in addrs):
                problems.append(f"AEP_LISTEN={cfg.listen[0]}:{cfg.listen[1]} is also a listener "
                                f"of {b.name}: use two ports")
    names = [b.name for b in bridges]
    for n in {n for n in names if names.count(n) > 1}:
        problems.append(f"two bridges share the name {n!r}")
    return bridges, problems


async def run_daemon(cfg: Config, bridges: list[Any], *, notifier: Notifier | None = None,
                     task_status=trio.TASK_STATUS_IGNORED) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit status."""
    notifier = notifier or Notifier(cfg.environ)
    relay = None
    if cfg.embedded_relay:
        from .relay.core import Relay
        relay = Relay(token=cfg.token, buffer=cfg.buffer, max_sessions=cfg.max_sessions,
                      max_body=cfg.max_body, max_batch=cfg.max_batch, max_from=cfg.max_from,
                      buffer_bytes=cfg.buffer_bytes, total_bytes=cfg.total_bytes,
                      cors_origins=cfg.cors_origins)
    fleet = Fleet(cfg, bridges, relay=relay)
    stop_http = trio.Event()
    status = EXIT_OK
    # The receiver below takes SIGTERM/SIGINT for the daemon's life; when it
    # closes it re-raises any still pending under the handlers it found, so a
    # second signal during the drain must find "ignore" there, not the
    # default action (which would turn a clean exit 0 into 143).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as root:
            if relay is not None:
                from .relay.app import make_app
                app = make_app(relay, healthz=fleet.healthz)
            else:
                from bridges.core.asgi import host_guard  # DNS-rebinding guard, as on the relay
                app = host_guard(health_app(cfg.token, fleet.healthz))
            host, port = cfg.listen
            bound = await root.start(serve_asgi, app, host, port, stop_http)
            await root.start(fleet.run)
            await notifier.notify("READY=1")
            root.start_soon(notifier.watchdog_loop)
            log.info("aep-bridges up: %s on %s; bridges: %s; epoch %d; %s",
                     "embedded relay" if relay else "health", ", ".join(bound),
                     ", ".join(fleet.members) or "none", fleet.epoch,
                     "control routing on (token set)" if cfg.token
                     else "watch-only (no AEP_TOKEN: commands refused)")
            task_status.started(bound)
            async for signum in signals:
                log.info("received %s: draining", signal.Signals(signum).name)
                break
            await notifier.notify("STOPPING=1")
            # Backstop: a send hypercorn shields from cancellation (a client
            # that stopped reading) can hold the nursery's teardown forever;
            # SIGALRM's default action ends the process regardless.
            signal.alarm(int(cfg.drain_deadline) + 3)
            with trio.move_on_after(cfg.drain_deadline) as deadline:
                await fleet.drain()
                if relay is not None:
                    await relay.close("shutdown")
                stop_http.set()
                await trio.sleep(0)
            if deadline.cancelled_caught:
                log.error("drain exceeded %.1fs; exiting at the hard deadline", cfg.drain_deadline)
                os._exit(EXIT_DEADLINE)  # the deadline is hard: nothing may hold the exit
            root.cancel_scope.cancel()
    log.info("aep-bridges stopped (status %d)", status)
    return status
