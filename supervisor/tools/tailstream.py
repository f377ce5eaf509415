"""The SSE consumer behind ``aep-bridges tail``: ``GET {url}/stream``
(AEP-0003 §4) on ``httpx`` + ``httpx_sse`` in a thread, with what the SDK
consumer (``aep_sdk.subscribe``) does (``from=all`` on the first request
and a live-only fall-back when it is refused, ``(session, epoch, seq)``
resume positions, ``(source, id)`` dedupe, reconnect with backoff) and what
it did not (issue 25: an endpoint that sent ``data`` that is not an object
made the SDK raise inside its reader and reconnect, forever):

- an event whose data is not JSON, not an object, or not an AEP envelope
  (a string ``id`` and ``type``) is skipped and reported to ``on_error`` as
  :class:`BadEvent` (its ``kind``); the stream goes on;
- an answer that is not an event stream (``Content-Type`` other than
  ``text/event-stream``: a web page, a JSON API) or one event over
  :data:`MAX_EVENT` characters is reported as :class:`NotAnAepStream` and
  the subscription ends (the caller exits with the message);
- HTTP refusals and transport failures are ``aep_sdk.TransportError``
  (``http`` with ``status``, ``network``), as the SDK reports them.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterator, TextIO

import httpx
from aep_sdk import TransportError
from httpx_sse import EventSource, SSEError

from bridges.core.aep import loads
from bridges.core.rest import parse_json

from .gist import OUTCOMES, AskKey, _safe, ask_key

__all__ = ["subscribe", "settled", "held", "Stream", "BadEvent", "NotAnAepStream", "MAX_EVENT",
           "OUTCOMES", "SETTLED_MAX", "settle", "ELSEWHERE_HINT", "refused", "Signals",
           "held_sessions", "HEALTHZ_BYTES", "bounded_sse", "get_json"]

MAX_EVENT = 16 << 20
"""The largest SSE event (characters) read; a larger one ends the subscription."""
_SEEN = 50_000
SETTLED_MAX = 100_000
"""The most settled asks :func:`settled` remembers."""


ELSEWHERE_HINT = "is the daemon elsewhere? --url URL, or --config FILE"
"""Said once when nothing listens where a client command looked (``tail``,
``respond``, ...): the endpoint is most often a daemon started from a config
file on other ports."""


def refused(error: BaseException) -> bool:
    """``error`` (or what it was raised from) is a refused TCP connection:
    nothing listens there. The SDK and this module's reader carry the
    failure as text in a ``TransportError``, so its words count too."""
    seen: BaseException | None = error
    for _ in range(8):  # a bounded walk of the cause chain
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError) or "Connection refused" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class BadEvent(ValueError):
    """An SSE event that is no AEP event, skipped. ``kind``: ``not-json``,
    ``not-object`` or ``no-envelope``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class NotAnAepStream(ValueError):
    """The endpoint's answer is not an AEP event stream: the subscription ended."""


class _Overflow(Exception):
    pass


class _Late(Exception):
    """A read's deadline passed (checked at every chunk, comments included:
    a replay of nothing but ``: ping`` kept tail's catch-up waiting
    forever, a sixteenth outside attack on issue 25)."""


HEALTHZ_BYTES = 1 << 20
"""Most bytes of an endpoint's ``/healthz`` answer a client command reads
(an aep-bridges daemon's is a few KiB): an endless answer from a hostile
endpoint grew ``tail`` to 3.6 GB in 5 s (a sixteenth outside attack on
issue 25)."""


def bounded_sse(response: httpx.Response, deadline: float | None = None) -> Iterator[Any]:
    """``response``'s Server-Sent Events (``httpx_sse.ServerSentEvent``),
    none buffered past :data:`MAX_EVENT` characters (past it raises
    ``httpx.DecodingError``), read until ``deadline`` (``time.monotonic()``
    seconds; past it raises ``httpx.ReadTimeout``): both ``httpx.HTTPError``."""
    try:
        yield from EventSource(_Bounded(response, MAX_EVENT, deadline)).iter_sse()  # type: ignore[arg-type]
    except _Overflow:
        raise httpx.DecodingError(f"an event over {MAX_EVENT} characters") from None
    except _Late:
        raise httpx.ReadTimeout("the answer did not end in time") from None


def get_json(url: str, headers: dict[str, str], *, timeout: float,
             limit: int = HEALTHZ_BYTES) -> Any:
    """``GET url``'s JSON answer, read to ``limit`` bytes at most and whole
    within ``timeout`` seconds in all. Raises ``httpx.HTTPError`` (the
    transport, a read timeout) or ``ValueError`` (over ``limit``, past the
    deadline, not JSON within :func:`bridges.core.aep.check_json`'s caps)."""
    deadline = time.monotonic() + timeout
    data = bytearray()
    with httpx.stream("GET", url, headers=headers, timeout=timeout, trust_env=False) as r:
        for chunk in r.iter_bytes():
            data += chunk
            if len(data) > limit:
                raise ValueError(f"answer over {limit} bytes")
            if time.monotonic() > deadline:
                raise ValueError(f"answer not whole within {timeout:g}s")
    return parse_json(bytes(data))


class _Bounded:
    """A response view for :class:`httpx_sse.EventSource` that refuses to
    buffer one SSE event beyond ``limit`` characters (:class:`_Overflow`)
    nor read past ``deadline`` (``time.monotonic()`` seconds, :class:`_Late`)."""

    def __init__(self, response: httpx.Response, limit: int,
                 deadline: float | None = None) -> None:
        self._r = response
        self._limit = limit
        self._deadline = deadline
        self.headers = response.headers

    def iter_text(self) -> Iterator[str]:
        pending, tail = 0, ""
        for text in self._r.iter_text():
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise _Late()
            joined = tail + text
            cut = max(joined.rfind("\n\n"), joined.rfind("\r\r"), joined.rfind("\n\r\n"))
            pending = len(joined) - cut if cut >= 0 else pending + len(text)
            if pending > self._limit:
                raise _Overflow()
            tail = joined[-3:]
            yield text


class Stream:
    """One subscription (see the module docstring); :meth:`close` ends it.
    ``on_event(dict)`` gets each AEP event once; ``on_error(exc)`` gets
    :class:`BadEvent`, :class:`NotAnAepStream` or ``TransportError``."""

    def __init__(self, url: str, on_event: Callable[[dict[str, Any]], None], *,
                 filter: dict[str, Any] | None = None, token: str | None = None,
                 from_: str | list[dict[str, Any]] | None = None,
                 on_error: Callable[[Exception], None] | None = None,
                 on_comment: Callable[[str], None] | None = None,
                 backoff_initial_ms: int = 250, backoff_max_ms: int = 5000,
                 timeout_ms: int = 60_000) -> None:
        self.url = url.rstrip("/")
        self.on_event = on_event
        self.on_error = on_error or (lambda e: None)
        self.on_comment = on_comment or (lambda c: None)
        self.filter = filter or {}
        self.token = token
        self.pending_all = from_ == "all"
        self.positions: dict[str, dict[str, Any]] = {
            p["session"]: p for p in (from_ if isinstance(from_, list) else [])}
        self.backoff = (backoff_initial_ms / 1000, backoff_max_ms / 1000)
        self.timeout = timeout_ms / 1000
        self.seen: OrderedDict[tuple[Any, str], None] = OrderedDict()
        self._closed = threading.Event()
        self._opened = False
        self._thread = threading.Thread(target=self._loop, name="aep-tail", daemon=True)

    def start(self) -> "Stream":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -- the reader thread ---------------------------------------------------------
    def _loop(self) -> None:
        delay = self.backoff[0]
        headers = {"accept": "text/event-stream"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))
        with httpx.Client(timeout=timeout, headers=headers, follow_redirects=False) as client:
            while not self._closed.is_set():
                sent_all = self.pending_all and not self.positions
                self._opened = False
                try:
                    if self._once(client, sent_all):
                        return  # not an AEP stream: reported, nothing to retry
                except TransportError as e:
                    if self._closed.is_set():
                        return
                    self.on_error(e)
                    if e.status is not None and 400 <= e.status < 500 and (sent_all or self.positions):
                        # a refused from=all or resume: live-only (resume is an optimization)
                        self.pending_all = False
                        self.positions.clear()
                        self._closed.wait(0.15)
                        continue
                except (httpx.HTTPError, SSEError, OSError) as e:
                    if self._closed.is_set():
                        return
                    self.on_error(TransportError("network", str(e) or type(e).__name__))
                if self._opened:  # the stream was up: a fresh schedule
                    delay = self.backoff[0]
                self._closed.wait(delay)
                delay = min(delay * 2, self.backoff[1])

    def _once(self, client: httpx.Client, sent_all: bool) -> bool:
        """One request; ``True`` when the answer is not an AEP stream."""
        params: list[tuple[str, str]] = [("filter", json.dumps(self.filter))]
        if sent_all:
            params.append(("from", "all"))
        elif self.positions:
            params.append(("from", json.dumps(list(self.positions.values()))))
        with client.stream("GET", f"{self.url}/stream", params=tuple(params)) as res:
            if res.status_code != 200:
                raise TransportError("http", f"SSE HTTP {res.status_code}", status=res.status_code)
            ctype = res.headers.get("content-type", "").partition(";")[0].strip()
            if ctype != "text/event-stream":
                self.on_error(NotAnAepStream(
                    f"the answer is not an event stream (Content-Type: {ctype or 'none'!r})"))
                return True
            self.pending_all = False
            self._opened = True
            self.on_comment("connected")  # the stream is up (the SDK reader's connect comment)
            try:
                for sse in EventSource(_Bounded(res, MAX_EVENT)).iter_sse():  # type: ignore[arg-type]
                    if self._closed.is_set():
                        return False
                    if sse.data:
                        self._deliver(sse.data)
            except _Overflow:
                self.on_error(NotAnAepStream(f"an event over {MAX_EVENT} characters"))
                return True
        return False

    def _deliver(self, text: str) -> None:
        try:
            ev = loads(text)
        except ValueError:
            self.on_error(BadEvent("not-json", "skipped an event whose data is not JSON"))
            return
        if not isinstance(ev, dict):
            self.on_error(BadEvent("not-object", "skipped an event whose data is a JSON "
                                   f"{type(ev).__name__}, not an object"))
            return
        ev_id, type_ = ev.get("id"), ev.get("type")
        if not isinstance(ev_id, str) or not isinstance(type_, str):
            self.on_error(BadEvent("no-envelope", "skipped an event without an AEP envelope "
                                   "(a string id and type)"))
            return
        key = (ev.get("source"), ev_id)  # AEP-0001 §7.4
        if key in self.seen:
            return
        self.seen[key] = None
        if len(self.seen) > _SEEN:
            self.seen.popitem(last=False)
        session, seq, epoch = ev.get("session"), ev.get("seq"), ev.get("epoch", 0)
        if isinstance(session, str) and type(seq) is int:
            self.positions[session] = {"session": session, "seq": seq,
                                       "epoch": epoch if type(epoch) is int else 0}
        self.on_event(ev)


def held(url: str, token: str | None, flt: dict[str, Any], *,
         from_: str | list[dict[str, Any]] | None = "all",
         deadline: float) -> Iterator[dict[str, Any]]:
    """The events ``url`` holds that match ``flt`` after ``from_``, as one
    replay-only read (``GET /stream?from=...&live=0``, AEP-0003 §3.3, §5),
    until the replay ends or ``deadline`` (``time.monotonic()`` seconds)
    passes. A line that is no JSON object is skipped; a refusal, a failure
    or an answer that is no event stream ends it quietly (never raises)."""
    headers = {"accept": "text/event-stream"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    params = [("filter", json.dumps(flt)), ("live", "0"),
              ("from", from_ if isinstance(from_, str) else json.dumps(from_ or []))]
    left = deadline - time.monotonic()
    if left <= 0:
        return
    try:
        with httpx.Client(timeout=httpx.Timeout(left), headers=headers,
                          follow_redirects=False, trust_env=False) as client, \
                client.stream("GET", f"{url.rstrip('/')}/stream", params=tuple(params)) as res:
            ctype = res.headers.get("content-type", "").partition(";")[0].strip()
            if res.status_code != 200 or ctype != "text/event-stream":
                return
            for sse in EventSource(_Bounded(res, MAX_EVENT, deadline)).iter_sse():  # type: ignore[arg-type]
                try:
                    ev = loads(sse.data) if sse.data else None
                except ValueError:
                    continue
                if isinstance(ev, dict):
                    yield ev
    except (httpx.HTTPError, SSEError, OSError, _Overflow, _Late):
        return


def settled(url: str, *, token: str | None = None,
            from_: str | list[dict[str, Any]] | None = "all",
            timeout_s: float = 10.0) -> dict[AskKey, str]:
    """The asks already settled in what a replay from ``from_`` will show:
    the ask (:func:`ask_key`: source, session, id) -> how it ended (``answered``, the
    ``attention.resolved`` resolution, ``timed out``), read from one
    replay-only request (:func:`held`, filtered server-side to
    :data:`OUTCOMES`) before the live subscription, so ``tail`` does not
    mark a replayed ask ``PENDING`` whose outcome the same replay carries.
    Best effort: an endpoint that refuses or is slow (``timeout_s`` in all)
    gives what was read, never raises. At most :data:`SETTLED_MAX` asks."""
    out: dict[AskKey, str] = {}
    for ev in held(url, token, {"type": list(OUTCOMES)}, from_=from_,
                   deadline=time.monotonic() + timeout_s):
        settle(ev, out)
        if len(out) >= SETTLED_MAX:
            break
    return out


def settle(ev: Any, out: dict[AskKey, str]) -> None:
    """Note in ``out`` (:func:`ask_key` -> how it ended) what the event
    ``ev`` settles: an ``attention.timeout`` -> ``timed out``;
    ``attention.resolved`` -> its ``resolution`` (``resolved`` when none);
    ``attention.answered`` -> ``answered`` unless a later word is known.
    Anything else: nothing (AEP 0.1 attention lifecycle; shared by
    :func:`settled` and ``timeline``)."""
    key = ask_key(ev)
    if key is None or ev.get("type") == "attention.requested":
        return
    type_, data = ev.get("type"), ev.get("data")
    if type_ == "attention.timeout":
        out[key] = "timed out"
    elif type_ == "attention.resolved":
        res_ = data.get("resolution") if isinstance(data, dict) else None
        out[key] = res_ if isinstance(res_, str) and res_ else "resolved"
    else:
        out.setdefault(key, "answered")


def subscribe(url: str, on_event: Callable[[dict[str, Any]], None], **kw: Any) -> Stream:
    """Start a :class:`Stream` (keywords as its constructor's) and return it."""
    return Stream(url, on_event, **kw).start()


def held_sessions(url: str, token: str | None) -> int | None:
    """How many sessions the endpoint holds, when it tells (an aep-bridges
    relay's authorized ``/healthz``); ``None`` otherwise. Never raises."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        body = get_json(url.rstrip("/") + "/healthz", headers, timeout=2)
    except (httpx.HTTPError, ValueError):
        return None
    counts = body.get("relay_counts", body) if isinstance(body, dict) else {}
    n = counts.get("sessions") if isinstance(counts, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


class Signals:
    """What ``tail`` says on stderr besides events: the connect line,
    each retry with its reason, events that are not AEP (once per kind, the
    count at the end), and the refusals that end ``tail``."""

    def __init__(self, url: str, token: str | None, err: TextIO) -> None:
        self.url, self.token, self.err = url, token, err
        self.skipped: dict[str, int] = {}
        self.attempts = 0
        self.connected = False
        self.hinted = False

    def take(self, kind: str, item: Any) -> int | None:
        """Handle one ``comment`` or ``error`` item; an exit status ends ``tail``."""
        url, err = self.url, self.err
        if kind == "comment":
            if str(item).startswith("connected") and not self.connected:
                self.connected, self.attempts = True, 0
                n = held_sessions(url, self.token)
                held = f" ({n} session{'s' if n != 1 else ''})" if n is not None else ""
                print(_safe(f"aep-bridges tail: connected to {url}{held}"), file=err, flush=True)
            return None
        if isinstance(item, NotAnAepStream):
            print(_safe(f"aep-bridges tail: {url}: not an AEP event stream: {item} "
                        "(is this an AEP endpoint?)"), file=err)
            return 1
        if isinstance(item, BadEvent):
            self.skipped[item.kind] = self.skipped.get(item.kind, 0) + 1
            if self.skipped[item.kind] == 1:  # once per kind; the count comes on exit
                print(_safe(f"aep-bridges tail: {url}: {item} (not AEP; skipping such "
                            "events, the stream goes on)"), file=err, flush=True)
            return None
        status = getattr(item, "status", None)
        # 400: the reader falls back by itself (no `from=all` there, a
        # `from` too long), so only these end the tail
        if status in (401, 403, 404):
            hint = {401: " (pass --token or set AEP_TOKEN)",
                    404: " (is this an AEP endpoint?)"}.get(status, "")
            print(_safe(f"aep-bridges tail: {url} refused the stream: HTTP {status}{hint}"),
                  file=err)
            return 1
        # each retry is visible, with its reason (the endpoint's own words, a
        # status line, are its content: made safe)
        self.connected = False
        self.attempts += 1
        hint = ""
        if not self.hinted and refused(item):  # nothing listens there: said once
            self.hinted, hint = True, f"; {ELSEWHERE_HINT}"
        print(_safe(f"aep-bridges tail: {url}: {item} (retrying, attempt {self.attempts}{hint})"),
              file=err, flush=True)
        return None

    def close(self) -> None:
        if self.skipped:
            print(f"aep-bridges tail: skipped {sum(self.skipped.values())} event(s) that were not "
                  f"AEP ({', '.join(f'{k}: {n}' for k, n in sorted(self.skipped.items()))})",
                  file=self.err, flush=True)
