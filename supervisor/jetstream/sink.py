"""The fleet's JetStream side (issue 14): one :class:`JetStreamSink` per
daemon when ``AEP_NATS_URL`` is set, beside the JSONL log and the relay
sink. It owns the link (:func:`~supervisor.jetstream.link.open_link`), the
:class:`~supervisor.jetstream.publish.Publisher` and the
:class:`~supervisor.jetstream.presence.Presence`.

The daemon never waits for NATS: :meth:`JetStreamSink.run` connects in its
own task (retrying while no server answers); until then, and through any
outage, events wait in the publisher's outbox (the §8.4 policy), and the
fleet's pump is held only when that outbox is full of ``notice``+ events.
Once connected, what earlier runs logged and the stream lacks is
published first (:mod:`.recover`: every start reads the session logs
back; no marker decides whether to).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import trio

from bridges.core.backoff import backoff_delay

from .config import NatsConfig
from .presence import Presence
from .publish import Publisher, ensure_stream
from .recover import nats_since, recover

log = logging.getLogger("aep.nats")


class JetStreamSink:
    """See the module docstring. ``daemon``: this daemon's id; ``hellos``:
    bridge name -> emitter hello; ``hand(bridge, cmd) -> bool``: the
    fleet's command hand-off. ``stream_state``: ``None`` until the stream
    was ensured, then :func:`~supervisor.jetstream.publish.ensure_stream`'s
    outcome."""

    def __init__(self, cfg: NatsConfig, daemon: str, *, host: str, epoch: int,
                 hellos: Mapping[str, Mapping[str, Any]], max_sessions: int,
                 hand: Callable[[str, dict[str, Any]], bool],
                 state_dir: Path | None = None, claim_grace_s: float = 120.0) -> None:
        self.cfg = cfg
        #: where the JSONL logs are (``None``: no recovery of a killed run's outbox)
        self.state_dir = state_dir
        self.epoch = epoch
        #: the first start with ``AEP_NATS_URL`` (read or written here, before
        #: this run logs anything: earlier logs are not back-filled)
        self.nats_since = nats_since(state_dir, time.time()) if state_dir is not None else 0.0
        self.daemon = daemon
        self.host = host
        self.publisher = Publisher(cfg, daemon)
        self.presence = Presence(cfg, daemon, host=host, epoch=epoch, hellos=hellos,
                                 max_sessions=max_sessions, hand=hand,
                                 claim_grace_s=claim_grace_s)
        self.stream_state: str | None = None
        self.link: Any = None

    @property
    def connected(self) -> bool:
        return self.publisher.connected

    async def put(self, event: dict[str, Any], raw: bytes, bridge: str, *,
                  wait: bool = True) -> None:
        """One event from the pump (``raw``: its JSON bytes): noted for the
        claims, queued for publishing (waits only while the outbox is full
        of ``notice``+). ``wait=False`` (the shutdown drain, bounded by its
        deadline): never waits; an event that finds no room is counted
        ``unqueued_at_shutdown`` (it is in the JSONL log)."""
        self.presence.note(bridge, event)
        if wait:
            await self.publisher.put(event, raw)
        elif self.publisher.offer(event, raw) == "full":
            self.publisher.counters["unqueued_at_shutdown"] = \
                self.publisher.counters.get("unqueued_at_shutdown", 0) + 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, ensure the stream, then publish and serve claims and
        commands until cancelled. ``started()`` at once: nothing waits for
        NATS."""
        from .link import open_link
        task_status.started()
        async with open_link(self.cfg, name=f"aep-bridges {self.daemon}") as link:
            self.link = link
            attempt = 0
            while self.stream_state is None:
                try:
                    self.stream_state = await ensure_stream(link, self.cfg)
                except Exception as e:  # noqa: BLE001 -- JetStream not ready, or refused
                    delay = backoff_delay(attempt, 0.2, 10.0)
                    if attempt % 10 == 0:
                        log.warning("nats: cannot ensure stream %s (%s: %s); retrying",
                                    self.cfg.stream, type(e).__name__,
                                    (getattr(e, "description", None) or "")[:160])
                    attempt += 1
                    await trio.sleep(delay)
            first = await self._recovered(link)
            async with trio.open_nursery() as n:
                n.start_soon(self.publisher.run, link, first)
                n.start_soon(self.presence.run, link)

    async def _recovered(self, link: Any) -> list[Any]:
        """What earlier runs logged and the stream lacks (:mod:`.recover`),
        asked until the stream answers."""
        if self.state_dir is None:
            return []
        attempt = 0
        while True:
            try:
                return await recover(link, self.cfg, self.state_dir, self.daemon,
                                     since=self.nats_since, epoch=self.epoch,
                                     limit=self.presence.claims.max_sessions, host=self.host)
            except Exception as e:  # noqa: BLE001 -- the stream did not answer: retried
                if attempt % 10 == 0:
                    log.warning("nats: cannot check the stream for logged events it lacks "
                                "(%s); retrying", type(e).__name__)
                attempt += 1
                await trio.sleep(backoff_delay(attempt, 0.2, 10.0))

    def health(self, authorized: bool) -> dict[str, Any]:
        """``{connected}``, with every counter when ``authorized``."""
        body: dict[str, Any] = {"connected": self.connected}
        if authorized:
            body["daemon"] = self.daemon
            body["stream"] = self.cfg.stream
            body["stream_state"] = self.stream_state
            body["servers"] = list(self.cfg.shown_servers)
            body["publish"] = self.publisher.stats()
            body["presence"] = dict(self.presence.counters)
            if self.link is not None:
                body["link"] = dict(self.link.counters)
            if self.publisher.last_error:
                body["last_error"] = self.publisher.last_error
        return body


__all__: Sequence[str] = ("JetStreamSink",)
