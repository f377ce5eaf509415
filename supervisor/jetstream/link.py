"""The one NATS connection of a process (issue 14): nats-py, the official
client, is asyncio; the daemon is trio. trio-asyncio runs an asyncio loop
inside the trio run (no thread), owned by the nursery that opens
:func:`open_link`, and :func:`aio` calls an asyncio coroutine function from
trio. This module is the only place that touches asyncio.

Credentials (``user:password@`` in a URL, the ``.creds`` file, TLS keys)
go to nats-py and nowhere else: every log line here uses
:func:`~supervisor.jetstream.config.redact_url`, and nats-py's own error
callbacks are reduced to the exception's type and a redacted message.
"""
from __future__ import annotations

import logging
import ssl
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

import nats
import nats.errors
import nats.js.errors
import trio
import trio_asyncio
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from bridges.core.backoff import backoff_delay

from .config import NatsConfig, redact_url

log = logging.getLogger("aep.nats")

T = TypeVar("T")

CONNECT_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 3.0
RECONNECT_WAIT_S = 0.5
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 15.0

#: what a NATS call may raise (the JetStream relay's parts catch these)
_NATS_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, nats.js.errors.Error,
                                                 TimeoutError, OSError)


def aio(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """``fn`` (an asyncio coroutine function) callable from trio; needs an
    open :func:`open_link` (its trio-asyncio loop) in an enclosing nursery."""
    return trio_asyncio.aio_as_trio(fn)


def ssl_context(cfg: NatsConfig) -> ssl.SSLContext | None:
    """The TLS context for ``tls://`` servers or a CA/client certificate;
    ``None`` for plain ``nats://``. Raises ``OSError``/``ssl.SSLError`` for
    unreadable files (``check`` reports them first)."""
    if not cfg.tls:
        return None
    ctx = ssl.create_default_context(cafile=str(cfg.tls_ca) if cfg.tls_ca else None)
    if cfg.tls_cert is not None and cfg.tls_key is not None:
        ctx.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
    return ctx


def _scrub(text: str, cfg: NatsConfig) -> str:
    for raw, shown in zip(cfg.servers, cfg.shown_servers, strict=True):
        if raw != shown:
            text = text.replace(raw, shown)
            parts = raw.split("://", 1)[-1].split("@", 1)
            if len(parts) == 2:
                text = text.replace(parts[0], "***")
    return text


class Link:
    """A connected NATS client and its JetStream context. ``connected``:
    the client's view right now (it reconnects by itself after a loss);
    ``counters``: ``disconnects``, ``reconnects``, ``errors``."""

    def __init__(self, nc: NatsClient, cfg: NatsConfig) -> None:
        self.nc = nc
        self.cfg = cfg
        self.js: JetStreamContext = nc.jetstream()
        self.counters: dict[str, int] = {"disconnects": 0, "reconnects": 0, "errors": 0}

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def wait_connected(self) -> None:
        """Return once the client is connected (at once when it is)."""
        while not self.nc.is_connected:  # noqa: ASYNC110 -- nats-py's state, on the asyncio side
            await trio.sleep(0.1)


class Outage:
    """What a NATS user logs while the link is down: each ``kind`` of
    failure once as a warning (:meth:`failed`; the repeats of the same
    outage at debug), and the recovery once (:meth:`recovered`), so a retry
    loop running every few hundred milliseconds through an outage writes
    two lines, not hundreds (the publisher's and link's rule, DESIGN.md
    "Bad input gets a clear answer"). ``spells``: outages noted, by kind.
    Pure apart from the logger."""

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self._down: set[str] = set()
        self.spells: dict[str, int] = {}

    def down(self, kind: str) -> bool:
        """Whether an outage of ``kind`` is being noted now."""
        return kind in self._down

    def failed(self, kind: str, msg: str, *args: object) -> bool:
        """Note a failure of ``kind``: ``msg % args`` as a warning the
        first time in this outage (returns ``True``), else at debug."""
        first = kind not in self._down
        if first:
            self._down.add(kind)
            self.spells[kind] = self.spells.get(kind, 0) + 1
        self.log.log(logging.WARNING if first else logging.DEBUG, msg, *args)
        return first

    def recovered(self, kind: str, msg: str, *args: object) -> bool:
        """End the outage of ``kind``: ``msg % args`` at info when one was
        noted (returns ``True``), nothing otherwise."""
        if kind not in self._down:
            return False
        self._down.discard(kind)
        self.log.info(msg, *args)
        return True


def _reason(e: BaseException, cfg: NatsConfig) -> str:
    """``Type: message`` of a connection failure, credentials scrubbed."""
    text = _scrub(str(e), cfg)[:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _connect_options(cfg: NatsConfig, name: str, link_box: list[Link]) -> dict[str, Any]:
    failures = [0]
    kinds: set[str] = set()
    outage: set[str] = set()  # error kinds already logged since the last (re)connect

    async def error_cb(e: Exception) -> None:
        if not link_box:
            # a failed first connect: nats-py retries it by itself forever
            # (max_reconnect_attempts=-1), so this is the only place the
            # reason (refused credentials, a certificate that does not
            # verify) can reach the operator: each new kind of failure
            # once (a refusal often alternates with the reset after it),
            # then every 20th
            kind = f"{type(e).__name__}: {e}"
            new = kind not in kinds and len(kinds) < 8
            kinds.add(kind)
            lvl = logging.WARNING if new or failures[0] % 20 == 0 else logging.DEBUG
            failures[0] += 1
            log.log(lvl, "nats: cannot connect to %s (%s); retrying",
                    ", ".join(cfg.shown_servers), _reason(e, cfg))
            return
        link_box[0].counters["errors"] += 1
        # while reconnecting nats-py reports every failed attempt (every
        # 0.5 s): each kind once per outage, the rest at debug
        kind = type(e).__name__
        new = kind not in outage
        outage.add(kind)
        log.log(logging.WARNING if new else logging.DEBUG, "nats: %s", _reason(e, cfg))

    async def disconnected_cb() -> None:
        if link_box and link_box[0].nc.is_closed:
            return  # our own close (shutdown), not a loss
        if link_box:
            link_box[0].counters["disconnects"] += 1
        log.warning("nats: disconnected; reconnecting")

    async def reconnected_cb() -> None:
        outage.clear()
        if link_box:
            link_box[0].counters["reconnects"] += 1
            url = link_box[0].nc.connected_url
            log.info("nats: reconnected to %s", redact_url(url.geturl()) if url else "?")

    opts: dict[str, Any] = {
        "servers": list(cfg.servers), "name": name,
        "connect_timeout": CONNECT_TIMEOUT_S, "reconnect_time_wait": RECONNECT_WAIT_S,
        "max_reconnect_attempts": -1, "allow_reconnect": True,
        "error_cb": error_cb, "disconnected_cb": disconnected_cb,
        "reconnected_cb": reconnected_cb,
    }
    if cfg.creds is not None:
        opts["user_credentials"] = str(cfg.creds)
    tls = ssl_context(cfg)
    if tls is not None:
        opts["tls"] = tls
    return opts


@asynccontextmanager
async def open_link(cfg: NatsConfig, *, name: str = "aep-bridges",
                    task_status: Callable[[], None] | None = None) -> AsyncIterator[Link]:
    """Connect to ``cfg.servers`` (retrying with backoff until one answers:
    a daemon that starts while NATS is down keeps running and connects
    later) and yield the :class:`Link`; the connection is drained and
    closed on exit. The asyncio loop lives exactly as long as the block.
    While no server accepts the connection (down, credentials refused, a
    certificate that does not verify) each new reason is a redacted
    ``nats: cannot connect to ... (Type: message); retrying`` warning."""
    async with trio_asyncio.open_loop():
        box: list[Link] = []
        attempt = 0
        while True:
            try:
                nc = await aio(nats.connect)(**_connect_options(cfg, name, box))
                break
            except (OSError, nats.errors.Error, TimeoutError) as e:
                delay = backoff_delay(attempt, BACKOFF_INITIAL_S, BACKOFF_MAX_S)
                if attempt == 0 or attempt % 10 == 0:
                    log.warning("nats: no server of %s answers (%s); retrying in %.1fs",
                                ", ".join(cfg.shown_servers), type(e).__name__, delay)
                attempt += 1
                await trio.sleep(delay)
        link = Link(nc, cfg)
        box.append(link)
        log.info("nats: connected to %s", redact_url(nc.connected_url.geturl())
                 if nc.connected_url else "?")
        try:
            yield link
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                try:
                    await aio(nc.close)()
                except Exception as e:  # noqa: BLE001 -- closing a dead link is not an error
                    log.debug("nats: close: %s", type(e).__name__)


async def probe(cfg: NatsConfig) -> tuple[bool, list[str]]:
    """``aep-bridges check``'s question: does a server of ``cfg`` answer,
    with JetStream, and does the stream exist? One connection attempt per
    server, no retries. Returns ``(answered, lines)``; the lines never hold
    a credential."""
    import nats.js.errors as jerr
    errors: list[BaseException] = []

    async def remember(e: Exception) -> None:
        log.debug("nats probe: %s", type(e).__name__)
        errors.append(e)

    opts = _connect_options(cfg, "aep-bridges check", [])
    opts.update(allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=PROBE_TIMEOUT_S,
                error_cb=remember, disconnected_cb=_quiet_cb, reconnected_cb=_quiet_cb)
    shown = ", ".join(cfg.shown_servers)
    async with trio_asyncio.open_loop():
        try:
            with trio.fail_after(PROBE_TIMEOUT_S * (len(cfg.servers) + 1)):
                nc = await aio(nats.connect)(**opts)
        except Exception as e:  # noqa: BLE001 -- any failure to connect is the answer
            # the server's own reason (nats-py's error callback saw it) over
            # the generic one the connect raised at the end
            why = _reason(errors[-1] if errors else e, cfg)
            return False, [f"NATS: no server of {shown} answers ({why}); "
                           "`run` starts anyway and keeps retrying, events wait in its outbox"]
        try:
            url = redact_url(nc.connected_url.geturl()) if nc.connected_url else "?"
            js = nc.jetstream()
            try:
                await aio(js.account_info)()
            except (nats.errors.Error, TimeoutError) as e:
                return True, [f"NATS: {url} answers but JetStream does not ({type(e).__name__}): "
                              "enable it (`jetstream {}` in the server config)"]
            try:
                info = await aio(js.stream_info)(cfg.stream)
                state = f"stream {cfg.stream} holds {info.state.messages} events"
            except jerr.NotFoundError:
                state = f"stream {cfg.stream} absent (`run` creates it)"
            except (nats.errors.Error, TimeoutError) as e:
                state = f"stream {cfg.stream} unknown ({type(e).__name__})"
            return True, [f"NATS: {url} answers, JetStream on, {state}"]
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                try:
                    await aio(nc.close)()
                except Exception:  # noqa: BLE001 -- closing a probe
                    pass


async def _quiet_cb() -> None:
    return None


__all__: Sequence[str] = ("Link", "Outage", "aio", "open_link", "probe", "ssl_context")
