"""The JetStream sink (issue 14): every event the fleet's pump hands over,
published to ``S.ev.<agent>.<session>`` with JetStream acknowledgements,
held in a bounded outbox until the server has acknowledged it.

The outbox is :class:`supervisor.delivery.outbox.Outbox`, the uplink's, with its
AEP-0003 §8.4 policy unchanged: ``AEP_NATS_OUTBOX`` events at most; when
full, the oldest pending ``debug`` then ``info`` event is shed (counted per
severity), ``notice`` and above are never dropped: :meth:`Publisher.put`
waits for room instead (backpressure to the fleet's pump, so to the
bridges).

**Order per session** (the stream must hold a session's events in emission
order even across failures and retries). The sender works in rounds: a
round takes what is pending (up to the outbox window) in outbox order and
publishes it in one call into the asyncio loop, one *lane* per subject:
a lane publishes its events one after another, each only after the server
acknowledged the one before (:class:`AckInbox`: the PubAcks come back on
one inbox subscription, matched by reply subject), and stops at its first
failure. Lanes run concurrently (pipelining across
sessions). A round ends when every lane has; only then does the next start.
So an event is published only once every earlier event of its session is
known stored (acknowledged, stored or duplicate), and stream sequence
numbers are monotonic: the stream order of a session is its emission order.
A failed round confirms what was acknowledged, rewinds the rest to the
front of the outbox (acknowledged events are skipped on the resend and
are no longer sheddable: they are stored, so never counted as drops), waits
with the shared backoff and tries again. A resent event the server already
stored (the ack was lost) carries the same ``Nats-Msg-Id`` and is dropped by
the server's dedupe inside the stream's duplicate window
(``AEP_NATS_DUPLICATE_WINDOW``), counted ``duplicates``.

The cost of the order rule: one session's events go at one server round
trip each; many sessions go in parallel (``Past one machine`` has the
figures).

The stream is created when absent (:func:`ensure_stream`); an existing one
with other retention settings is updated to this daemon's and the change
logged, field by field.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import trio

from bridges.core.aep import NOTICE_RANK
from bridges.core.backoff import backoff_delay

from ..delivery import Entry, Outbox
from .config import NatsConfig
from .subjects import SEVERITY, event_headers, event_subject_of, events_wildcard

if TYPE_CHECKING:
    from .link import Link

log = logging.getLogger("aep.nats.publish")

PUBLISH_TIMEOUT_S = 3.0
"""How long one publish waits for its PubAck before the round fails."""
ROUND_MAX = 1024
"""Most events one round publishes (bounded further by the outbox window)."""
LEADER_WAIT_S = 30.0
RETRY_INITIAL_S = 0.1
RETRY_MAX_S = 5.0


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A publish result: the message exceeds the server's max payload or the
    stream's max message size, so no retry can store it."""

    why: str


def too_large(e: BaseException) -> bool:
    """Whether ``e`` says the message is too big to ever be stored
    (nats-py ``MaxPayloadError``; JetStream ``err_code`` 10054)."""
    return type(e).__name__ == "MaxPayloadError" or getattr(e, "err_code", None) == 10054


@dataclass(slots=True)
class Message:
    """One outbox item: the subject, the payload (the event's JSON bytes,
    the JSONL line without its newline) and the headers; ``acked`` once the
    server acknowledged it (a rewound, acknowledged message is not resent)."""

    subject: str
    payload: bytes
    headers: dict[str, str]
    acked: bool = False


def message_for(stream: str, event: dict[str, Any], raw: bytes, daemon: str) -> Message:
    """The :class:`Message` of one event (pure)."""
    return Message(event_subject_of(stream, event), raw, event_headers(event, daemon))


def _ack_of(msg: Any) -> dict[str, Any]:
    """The JetStream PubAck in a reply message (``{stream, seq,
    duplicate?}``). Raises ``nats.errors.NoRespondersError`` (a 503 status:
    no stream leader yet), ``nats.js.errors.APIError`` (the stream refused
    it: its ``err_code`` kept, so :func:`too_large` can tell 10054)."""
    import nats.errors
    import nats.js.errors
    status = (msg.headers or {}).get("Status") if msg.headers else None
    if status == "503":
        raise nats.errors.NoRespondersError
    try:
        ack = json.loads(msg.data or b"")
    except ValueError:
        raise nats.js.errors.APIError(description="unreadable publish ack") from None
    if not isinstance(ack, dict) or status is not None:
        raise nats.js.errors.APIError(description=f"publish answered {status or 'not JSON'}")
    err = ack.get("error")
    if err is not None:
        e = err if isinstance(err, dict) else {}
        raise nats.js.errors.APIError(code=e.get("code"), err_code=e.get("err_code"),
                                      description=str(e.get("description") or err)[:200])
    return ack


class AckInbox:
    """JetStream publishes whose PubAcks come back on one wildcard inbox
    subscription (``<inbox>.<n>``, matched by the reply subject), the
    relay's technique (:class:`~supervisor.jetstream.ingest._Acks`) on the
    asyncio side: a publish is one ``nc.publish`` and one future, with no
    request future, per-publish timer or PubAck object of nats-py's
    ``js.publish`` (measured: ~90 us of CPU per event under trio-asyncio
    at 64 sessions). Runs on the trio-asyncio loop of :mod:`.link`.

    Timeouts are per round, not per publish (:meth:`expire`): a publish
    waits until its ack arrives or the round's watchdog fails every
    waiting one (no ack for ``ack_wait_s``). A late ack of an expired
    publish finds no waiter and is ignored; its resend is deduped by the
    server (``Nats-Msg-Id``)."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self.prefix = ""
        self._n = 0
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._sub: Any = None
        self.last_ack = 0.0  # loop time of the last ack

    async def open(self) -> None:
        """Subscribe ``<inbox>.*`` (asyncio side; once per connection: nats-py
        re-subscribes it after a reconnect)."""
        self.prefix = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self.prefix + ".*", cb=self._got)

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    async def _got(self, msg: Any) -> None:
        fut = self._waiting.pop(msg.subject.rpartition(".")[2], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)
            self.last_ack = asyncio.get_running_loop().time()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]
                      ) -> dict[str, Any]:
        """Publish and wait for the PubAck (:func:`_ack_of`'s shapes and
        errors); ``TimeoutError`` when :meth:`expire` ended the wait;
        nats-py's own errors from the publish (``MaxPayloadError``...)."""
        self._n += 1
        key = str(self._n)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[key] = fut
        try:
            await self.nc.publish(subject, payload, reply=f"{self.prefix}.{key}",
                                  headers=headers)
            msg = await fut
        finally:
            self._waiting.pop(key, None)
        return _ack_of(msg)

    def expire(self) -> int:
        """Fail every waiting publish with ``TimeoutError``; returns how many."""
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(TimeoutError("no publish acknowledgement"))
        return len(waiting)


async def _publish_lanes(sender: Any, msgs: Sequence[Message], ack_wait_s: float) -> list[object]:
    """asyncio side of one round: one lane per subject, in order, each
    publish awaited (``sender.publish(subject, payload, headers)``, an
    :class:`AckInbox`) before the next of its lane; while lanes run, a
    watchdog calls ``sender.expire()`` once no ack has come for
    ``ack_wait_s``. Returns, per message, its PubAck, the exception that
    ended its lane, or ``None`` (not attempted: an earlier event of its
    lane failed)."""
    results: list[object] = [None] * len(msgs)
    lanes: dict[str, list[int]] = {}
    for i, m in enumerate(msgs):
        lanes.setdefault(m.subject, []).append(i)

    async def lane(idx: list[int]) -> None:
        for i in idx:
            m = msgs[i]
            try:
                results[i] = await sender.publish(m.subject, m.payload, m.headers)
            except Exception as e:  # noqa: BLE001 -- the lane's failure is its result
                if too_large(e):  # can never be stored: settled (counted), the lane goes on
                    results[i] = TooLarge(type(e).__name__)
                    continue
                results[i] = e
                return

    loop = asyncio.get_running_loop()
    sender.last_ack = loop.time()
    work = asyncio.gather(*(lane(ix) for ix in lanes.values()))
    try:
        while True:
            done, _ = await asyncio.wait([work], timeout=ack_wait_s)
            if done:
                break
            if loop.time() - sender.last_ack >= ack_wait_s:  # stalled: no ack for ack_wait_s
                sender.expire()
        await work
    finally:
        if not work.done():  # cancelled (shutdown): the lanes end with the round
            work.cancel()
            sender.expire()
    return results


class Publisher:
    """The bounded outbox and its sender. :meth:`put` (from the fleet's
    pump) never drops ``notice``+; :meth:`run` (a task, given the
    :class:`~supervisor.jetstream.link.Link` once connected) publishes.

    ``counters``: ``offered``, ``published`` (publish attempts, resends
    included), ``acked`` (PubAcks, duplicates included), ``duplicates``
    (PubAcks saying the server already held it), ``publish_errors``,
    ``rounds_failed``, ``too_large`` (never storable: over the server's
    max payload; logged, in the JSONL log only), ``recovered`` and
    ``recovering`` (earlier runs' logged events the stream lacked,
    :mod:`.recover`: acknowledged, still to publish; both appear once the
    start's recovery is read), and the outbox's ``dropped_debug``, ``dropped_info``,
    ``dropped``, ``rewound``; :attr:`depth` is the outbox's live size."""

    def __init__(self, cfg: NatsConfig, daemon: str) -> None:
        self.cfg = cfg
        self.daemon = daemon
        self.outbox = Outbox(cfg.outbox)
        self.counters: dict[str, int] = {"offered": 0, "published": 0, "acked": 0,
                                         "duplicates": 0, "publish_errors": 0,
                                         "rounds_failed": 0, "too_large": 0}
        self._room = trio.lowlevel.ParkingLot()  # put() waiting for room (notice+, full)
        self._work = trio.Event()  # something was offered
        self._idle = trio.Event()  # the outbox is empty
        self._idle.set()
        self.link: Link | None = None
        self.last_error: str | None = None

    # -- the fleet's side ------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self.outbox)

    @property
    def connected(self) -> bool:
        return self.link is not None and self.link.connected

    def offer(self, event: dict[str, Any], raw: bytes) -> str:
        """Queue one event without waiting: the outbox's answer
        (``queued``, ``dropped``: it was itself shed, counted, or ``full``:
        nothing changed, the caller must wait; see :meth:`put`)."""
        return self._offer(message_for(self.cfg.stream, event, raw, self.daemon))

    def _offer(self, msg: Message) -> str:
        got = self.outbox.offer("", msg.headers[SEVERITY], msg)
        if got == "queued":
            self.counters["offered"] += 1
            if self._idle.is_set():
                self._idle = trio.Event()
            self._work.set()
        return got

    async def put(self, event: dict[str, Any], raw: bytes) -> None:
        """Queue one event; while the outbox is full of ``notice``+ events,
        wait for the sender to make room (never drops ``notice``+)."""
        msg = message_for(self.cfg.stream, event, raw, self.daemon)
        while self._offer(msg) == "full":
            await self._room.park()

    async def flush(self) -> bool:
        """Wait until the outbox is empty (every event acknowledged);
        ``True`` then. The caller bounds it (shutdown: the drain deadline)."""
        await self._idle.wait()
        return True

    def stats(self) -> dict[str, int]:
        """The counters plus ``outbox`` (depth) and the outbox's drops."""
        ob = self.outbox.counters
        return {**self.counters, "outbox": len(self.outbox),
                "dropped_debug": ob["dropped_debug"], "dropped_info": ob["dropped_info"],
                "dropped": ob["dropped"], "rewound": ob["rewound"],
                "connected": int(self.connected)}

    # -- the sender ----------------------------------------------------------------
    async def run(self, link: Link, first: Sequence[Message] = ()) -> None:
        """Publish until cancelled: rounds over ``link`` (see the module
        docstring). ``first``: messages published, all acknowledged, before
        anything in the outbox (a killed predecessor's, :mod:`.recover`:
        older than what this run queued, so sessions stay in order). Never
        raises for a NATS failure (it is counted, logged once per failing
        spell, and retried with the shared backoff)."""
        from .link import aio
        self.link = link
        publish_lanes = aio(_publish_lanes)
        inbox = AckInbox(link.nc)
        await aio(inbox.open)()
        try:
            await self._first(link, inbox, publish_lanes, list(first))
            await self._rounds(link, inbox, publish_lanes)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                try:
                    await aio(inbox.close)()
                except Exception as e:  # noqa: BLE001 -- closing a dead link
                    log.debug("nats: ack inbox close: %s", type(e).__name__)

    async def _first(self, link: Link, inbox: AckInbox, publish_lanes: Any,
                     todo: list[Message]) -> None:
        """Publish ``todo`` in rounds of :data:`ROUND_MAX` until every one
        is acknowledged (the lane rule: a lane stops at its first failure,
        the round's unacknowledged rest is resent after the backoff)."""
        attempt = 0
        self.counters["recovered"] = self.counters.get("recovered", 0)
        self.counters["recovering"] = len(todo)  # 0: the recovery is all acknowledged
        while todo:
            if not link.connected:
                await link.wait_connected()
            batch = todo[:ROUND_MAX]
            results = await publish_lanes(inbox, batch, PUBLISH_TIMEOUT_S)
            failure = self._settle_first(batch, results)
            todo = [m for m in todo if not m.acked]
            self.counters["recovering"] = len(todo)
            if failure is not None:
                self.counters["rounds_failed"] += 1
                await trio.sleep(backoff_delay(attempt, RETRY_INITIAL_S, RETRY_MAX_S))
                attempt += 1
            else:
                attempt = 0

    def _settle_first(self, batch: list[Message], results: list[object]) -> str | None:
        failure = None
        for msg, r in zip(batch, results, strict=True):
            if r is None:
                continue
            self.counters["published"] += 1
            if isinstance(r, TooLarge):
                msg.acked = True
                self.counters["too_large"] += 1
            elif isinstance(r, BaseException):
                self.counters["publish_errors"] += 1
                failure = failure or type(r).__name__
            else:
                msg.acked = True
                self.counters["acked"] += 1
                self.counters["recovered"] += 1
                if r.get("duplicate") if isinstance(r, dict) else getattr(r, "duplicate", False):
                    self.counters["duplicates"] += 1
        return failure

    async def _rounds(self, link: Link, inbox: AckInbox, publish_lanes: Any) -> None:
        attempt = 0
        while True:
            batch = self._take()
            if not batch:
                self._work = trio.Event()
                if len(self.outbox) == 0:
                    self._idle.set()
                    self._room.unpark_all()
                await self._work.wait()
                continue
            if not link.connected:
                self.outbox.rewind()
                await self._wait_connected(link)
                continue
            todo = [e.item for e in batch if not e.item.acked]
            results = await publish_lanes(inbox, todo, PUBLISH_TIMEOUT_S) if todo else []
            failure = self._settle(batch, todo, results)
            self._room.unpark_all()
            if failure is None:
                if attempt:
                    log.info("nats: publishing again (%d events waiting)", len(self.outbox))
                attempt = 0
                self.last_error = None
                continue
            self.counters["rounds_failed"] += 1
            for e in batch:
                if e.item.acked:  # stored already: resent as a no-op, never shed as a drop
                    e.rank = NOTICE_RANK
            self.outbox.rewind()
            delay = backoff_delay(attempt, RETRY_INITIAL_S, RETRY_MAX_S)
            if attempt == 0 or attempt % 20 == 0:
                log.warning("nats: publish failed (%s); %d events held, retrying in %.1fs",
                            failure, len(self.outbox), delay)
            self.last_error = failure
            attempt += 1
            await trio.sleep(delay)

    def _take(self) -> list[Entry]:
        """Up to a round of pending entries in outbox order, each marked
        sent with its own confirmation mark."""
        out: list[Entry] = []
        while len(out) < ROUND_MAX:
            e = self.outbox.peek()
            if e is None:
                break
            self.outbox.sent(e)
            self.outbox.ping()  # one mark per entry: confirmed one by one, in order
            out.append(e)
        return out

    def _settle(self, batch: list[Entry], todo: list[Message], results: list[object]
                ) -> str | None:
        """Record a round's results; confirm the acknowledged prefix of the
        outbox. Returns ``None`` when all was acknowledged, else the first
        failure's description (no credential: the exception type and the
        server's error text)."""
        failure: str | None = None
        for msg, r in zip(todo, results, strict=True):
            if r is None:
                continue
            self.counters["published"] += 1
            if isinstance(r, TooLarge):  # never storable: settled, counted, logged (never silent)
                msg.acked = True
                self.counters["too_large"] += 1
                log.error("nats: an event of %d bytes on %s is too large for the server (%s): "
                          "not published (it is in the JSONL log; counted too_large)",
                          len(msg.payload), msg.subject, r.why)
                continue
            if isinstance(r, BaseException):
                self.counters["publish_errors"] += 1
                if failure is None:
                    failure = f"{type(r).__name__}: {str(r)[:160]}".rstrip(": ")
                continue
            msg.acked = True
            self.counters["acked"] += 1
            if r.get("duplicate") if isinstance(r, dict) else getattr(r, "duplicate", False):
                self.counters["duplicates"] += 1
        mark = 0
        for e in batch:
            if not e.item.acked:
                break
            mark = e.mark
        if mark:
            self.outbox.confirm(mark)
        return failure

    async def _wait_connected(self, link: Link) -> None:
        while not link.connected:  # noqa: ASYNC110 -- nats-py's state, on the asyncio side
            await trio.sleep(0.1)


# -- the stream ------------------------------------------------------------------------

def wanted_stream(cfg: NatsConfig) -> dict[str, Any]:
    """The stream settings this daemon asks for (``StreamConfig`` keyword
    arguments): file storage, limits retention, oldest discarded first."""
    return {"name": cfg.stream, "subjects": [events_wildcard(cfg.stream)],
            "max_age": cfg.max_age, "max_bytes": cfg.max_bytes, "num_replicas": cfg.replicas,
            "duplicate_window": min(cfg.duplicate_window, cfg.max_age)}


def stream_drift(have: Any, want: dict[str, Any]) -> list[str]:
    """``field: have -> want`` for each setting ``have`` (a
    ``StreamConfig``) differs in from ``want`` (:func:`wanted_stream`);
    the subjects differ when ``have``'s do not include ours."""
    out = []
    for k in ("max_age", "max_bytes", "num_replicas", "duplicate_window"):
        a, b = getattr(have, k, None), want[k]
        if a is None or abs(float(a) - float(b)) > 1e-3:
            out.append(f"{k}: {a} -> {b}")
    subjects = list(getattr(have, "subjects", None) or [])
    if want["subjects"][0] not in subjects:
        out.append(f"subjects: {subjects} -> {subjects + want['subjects']}")
    return out


async def ensure_stream(link: Link, cfg: NatsConfig) -> str:
    """Create the stream when absent; update one whose settings differ
    (logged, field by field: several daemons with different settings make
    the last one started win, so set them alike). Waits (up to 30 s) for
    the stream's leader so the first publishes do not meet an election.
    Returns ``created``, ``updated``, ``kept`` (an update the server
    refused: logged as an error, the existing stream used) or ``same``.
    Raises the nats-py error when the server cannot be asked at all."""
    import nats.js.errors as jerr
    from nats.js.api import StreamConfig

    from .link import aio
    want = wanted_stream(cfg)
    js = link.js
    try:
        info = await aio(js.stream_info)(cfg.stream)
    except jerr.NotFoundError:
        try:
            await aio(js.add_stream)(StreamConfig(**want))
            log.info("nats: stream %s created (%s)", cfg.stream,
                     ", ".join(f"{k}={v}" for k, v in want.items() if k != "name"))
            await await_leader(link, cfg.stream)
            return "created"
        except jerr.BadRequestError:
            info = await aio(js.stream_info)(cfg.stream)  # another daemon created it first
    drift = stream_drift(info.config, want)
    outcome = "same"
    if drift:
        merged = dict(want)
        merged["subjects"] = sorted(set(info.config.subjects or []) | set(want["subjects"]))
        try:
            await aio(js.update_stream)(StreamConfig(**merged))
            log.warning("nats: stream %s existed with other settings; updated (%s)",
                        cfg.stream, "; ".join(drift))
            outcome = "updated"
        except jerr.APIError as e:
            log.error("nats: stream %s differs from AEP_NATS_* (%s) and the server refused "
                      "the update (%s); publishing into it as it is", cfg.stream,
                      "; ".join(drift), getattr(e, "description", None) or type(e).__name__)
            outcome = "kept"
    await await_leader(link, cfg.stream)
    return outcome


async def await_leader(link: Link, stream: str) -> None:
    """Until the stream answers ``STREAM.INFO`` with a leader (a fresh R3
    stream elects one after ``add_stream`` returns: publishing before that
    meets "no responders", ``NoStreamResponseError``)."""
    from .link import aio
    with trio.move_on_after(LEADER_WAIT_S):
        while True:
            try:
                info = await aio(link.js.stream_info)(stream)
                cluster = getattr(info, "cluster", None)
                if cluster is None or getattr(cluster, "leader", None):
                    return
            except Exception as e:  # noqa: BLE001 -- an election in progress
                log.debug("nats: stream %s not ready: %s", stream, type(e).__name__)
            await trio.sleep(0.1)


__all__: Sequence[str] = ("AckInbox", "LEADER_WAIT_S", "Message", "PUBLISH_TIMEOUT_S", "Publisher",
                          "RETRY_INITIAL_S", "RETRY_MAX_S", "ROUND_MAX", "TooLarge", "await_leader",
                          "ensure_stream", "too_large", "message_for", "stream_drift",
                          "wanted_stream")
