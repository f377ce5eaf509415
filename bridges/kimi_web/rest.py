"""The REST side of the Kimi web receiver and its state file (split from
:mod:`bridges.kimi_web.receiver` by issue 26): :class:`VendorRest`, the
receiver's base, makes the REST calls (one at a time against the current
endpoint, a 401 re-resolving a rotated token once), lists the sessions
(paged), checks a session the socket did not know and rebuilds one from
REST (:meth:`~bridges.kimi_web.tracker.Tracker.resync`), and loads and
writes the state file.

- **State** persists (atomic JSON) under
  ``{AEP_STATE_DIR}/kimi_web/<home-or-url hash>.json``: a restarted daemon
  resumes by cursor.
- **REST**: ``{code, msg, data}`` envelopes; a non-zero ``code`` (2.1.0
  answers HTTP 200 with e.g. 40401) is :class:`VendorError`; 401 is
  :class:`AuthRefused`; transport failures are :class:`Unreachable`.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import trio

from bridges.core.bridge import BridgeContext
from bridges.core.ledger import Unreachable
from bridges.core.paths import make_private_dirs
from bridges.core.rest import BadAnswer, fetch, parse_json

from . import discovery
from . import mapping as M
from .config import KimiWebConfig
from .tracker import Out, Tracker

MAX_PAGES = 50
MAX_SESSIONS = 10_000
FLUSH_EVERY = 1.0
class VendorError(Exception):
    """A ``{code, msg}`` envelope with a non-zero code (or a non-JSON
    answer: code ``0`` and the HTTP status in ``msg``)."""

    def __init__(self, code: int, msg: str, data: Any = None) -> None:
        super().__init__(f"{code}: {msg}")
        self.code, self.msg, self.data = code, msg, data


class AuthRefused(Exception):
    """The server refused the token (REST 401/403, WS upgrade 401/403)."""


def envelope(r: httpx.Response) -> Any:
    """The ``data`` of a kap-server answer. Raises :class:`AuthRefused`,
    :class:`VendorError` (also for a body over
    :func:`bridges.core.aep.check_json`'s caps, refused before the parse:
    :func:`bridges.core.rest.parse_json`)."""
    if r.status_code in (401, 403):
        raise AuthRefused(f"HTTP {r.status_code}")
    try:
        body = parse_json(r.content)
    except BadAnswer:
        raise VendorError(0, f"HTTP {r.status_code}: not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("code"), int):
        raise VendorError(0, f"HTTP {r.status_code}: not a {{code,msg,data}} envelope")
    if body["code"] != 0:
        msg = body.get("msg")
        raise VendorError(body["code"], msg[:300] if isinstance(msg, str) else "", body.get("data"))
    if r.status_code >= 300:
        raise VendorError(0, f"HTTP {r.status_code}")
    return body.get("data")


def state_path(config: KimiWebConfig) -> Path | None:
    if config.state_dir is None:
        return None
    key = config.url or str(Path(config.home).expanduser().resolve())
    h = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(config.state_dir) / "kimi_web" / f"{h}.json"


def working(session: Any) -> bool:
    """A REST session item that is busy or waits on an approval or a question."""
    return isinstance(session, dict) and (
        session.get("busy") is True or session.get("pending_interaction") not in (None, "none"))


def seg(vendor_id: str) -> str:
    """A vendor id (session, approval, prompt) as one URL path segment or
    query value: percent-quoted, ``/``, ``?``, ``#`` and ``..`` included, so
    an id can never reach another route."""
    return urllib.parse.quote(vendor_id, safe="")


class VendorRest:
    """The receiver's REST calls and state file
    (:class:`~bridges.kimi_web.receiver.Receiver` is the one subclass; it
    owns the attributes below and the callables)."""

    config: KimiWebConfig
    tracker: Tracker
    ctx: BridgeContext
    _client: httpx.AsyncClient | None
    endpoint: discovery.Endpoint | None
    subscribed: set[str]
    dormant: set[str]
    _no_cursor: set[str]
    _listed: set[str]
    #: sessions resubscribed after the server restarted: their next rebuild
    #: closes a run still open as cut off (:meth:`Tracker.resync` ``restarted``)
    _restarted: set[str]
    _state_path: Path | None
    #: the receiver's own (:class:`~bridges.kimi_web.receiver.Receiver`)
    _emit: Callable[[list[Out]], Awaitable[None]]
    _follows: Callable[[str], bool]
    subscribe: Callable[..., Awaitable[None]]

    # -- state file -------------------------------------------------------------
    def _restore(self) -> None:
        p = self._state_path
        if p is None or not p.is_file():
            return
        try:
            self.tracker.load(json.loads(p.read_text()))
        except (OSError, ValueError):
            self.ctx.health.count("state_read_errors")

    async def _flusher(self) -> None:
        while True:
            await trio.sleep(FLUSH_EVERY)
            self.flush_state()

    def flush_state(self) -> None:
        p = self._state_path
        if p is None or not self.tracker.dirty:
            return
        try:
            make_private_dirs(p.parent)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".kimi-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.tracker.dump(), f)
            os.replace(tmp, p)
            self.tracker.dirty = False
        except OSError:
            self.ctx.health.count("state_write_errors")

    # -- REST ------------------------------------------------------------------------
    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call against the current endpoint (``path`` under
        ``/api/v1``); the ``data``. A 401 re-resolves the token once (a
        rotation) and retries, on the same server only: a write refused by
        one kimi web is never resent to another (its sessions are its
        own). The answer is read to :data:`~bridges.core.rest.MAX_BODY`
        bytes at most, whole within :data:`~bridges.core.rest.DEADLINE`
        (:func:`bridges.core.rest.fetch`; past either a
        :class:`VendorError` of code ``0``). Raises :class:`VendorError`,
        :class:`AuthRefused`, :class:`bridges.core.ledger.Unreachable`."""
        assert self._client is not None
        for attempt in (0, 1):
            ep = self.endpoint
            if ep is None:
                raise Unreachable("kimi web is not attached")
            try:
                r = await fetch(self._client, method, ep.url + "/api/v1" + path, json=body,
                                headers={"authorization": f"Bearer {ep.token}"})
            except (httpx.TransportError, OSError):
                raise Unreachable("kimi web unreachable") from None
            except BadAnswer as e:  # over the cap or the deadline: a refusal still refuses
                if e.status not in (401, 403):
                    raise VendorError(0, str(e)) from None
                r = httpx.Response(e.status)
            try:
                return envelope(r)
            except AuthRefused:
                # compared with the token this request carried: a reattach may
                # have adopted the rotated one while the request was in flight;
                # and with its server: the run loop may have moved to another
                if attempt == 0:
                    self._refresh_endpoint()
                    if self._token_moved(ep):
                        continue
                raise

    def _token_moved(self, sent: discovery.Endpoint) -> bool:
        """The current endpoint is the same server as ``sent`` with another token."""
        now = self.endpoint
        return now is not None and now.key == sent.key and now.token != sent.token

    def _refresh_endpoint(self) -> None:
        """Re-resolve: a rotated token of the current server is adopted
        (another server is left to the run loop's reattach)."""
        try:
            ep = discovery.resolve(self.config)
        except discovery.NotFound:
            return
        if self.endpoint is None or ep.key == self.endpoint.key:
            self.endpoint = ep

    async def list_sessions(self) -> tuple[list[dict[str, Any]], bool]:
        """Every session (``GET /sessions``, paged by ``before_id``) and
        whether the listing is complete (not cut at :data:`MAX_PAGES` /
        :data:`MAX_SESSIONS`)."""
        items: list[dict[str, Any]] = []
        before = None
        complete = False
        for _ in range(MAX_PAGES):
            q = "?page_size=100" + (f"&before_id={seg(before)}" if before else "")
            data = await self.request("GET", "/sessions" + q)
            raw = M.obj(data).get("items")
            page = [i for i in raw if isinstance(i, dict) and isinstance(i.get("id"), str)] \
                if isinstance(raw, list) else []
            items += page
            if not (isinstance(data, dict) and data.get("has_more") is True and page):
                complete = True
                break
            if len(items) >= MAX_SESSIONS:
                break
            before = page[-1]["id"]
        if not complete:
            self.ctx.health.count("sessions_list_capped")
        return items[:MAX_SESSIONS], complete and len(items) <= MAX_SESSIONS

    async def _relist(self, recheck: set[str]) -> None:
        """The listing again, once the attach's subscribes are acked: the
        first listing is read before the socket opens, and what happened in
        between reached no socket of ours. ``recheck``: sessions listed idle
        and subscribed without a cursor (no replay); one busy or waiting on
        an interaction now is rebuilt from REST (its turn or ask started
        before the subscribe). A session missing from the first listing
        (made in between: its ``event.session.created`` went to no socket)
        is subscribed, and rebuilt after the ack when it is working. Counted
        ``sessions_moved_while_attaching`` and ``sessions_made_while_attaching``."""
        h = self.ctx.health
        try:
            sessions, _ = await self.list_sessions()
        except (VendorError, Unreachable, AuthRefused):
            h.count("rest_errors")
            return
        new: list[str] = []
        for s in sessions:
            sid = s["id"]
            if sid in recheck and sid in self.subscribed and working(s):
                h.count("sessions_moved_while_attaching")
                await self._resync(sid, None)
            elif sid not in self.subscribed and sid not in self.dormant and not self._follows(sid):
                h.count("sessions_made_while_attaching")
                self._listed.add(sid)
                if working(s):
                    self._no_cursor.add(sid)
                new.append(sid)
        await self.subscribe(new)

    async def _check_exists(self, sid: str) -> None:
        """A ``not_found`` at subscribe: gone (40401) closes the session's
        state; existing makes it dormant until a frame names it."""
        try:
            await self.request("GET", f"/sessions/{seg(sid)}")
        except VendorError as e:
            if e.code == 40401:
                await self._emit(self.tracker.gone(sid))
            return
        except (Unreachable, AuthRefused):
            return
        if sid in self.subscribed or not self._follows(sid):
            return  # subscribed again, or evicted, meanwhile
        if sid in self.tracker.sessions and self.tracker.sessions[sid].cursor is not None:
            # a session we were following (the server restarted): a REST read
            # of its prompts loads it on the server, then the subscription by
            # cursor replays, and a rebuild closes what the restart cut off
            try:
                await self.request("GET", f"/sessions/{seg(sid)}/prompts")
            except (VendorError, Unreachable, AuthRefused):
                self.ctx.health.count("rest_errors")
            else:
                self._no_cursor.add(sid)
                self._restarted.add(sid)
                await self.subscribe([sid])
                return
        self.dormant.add(sid)
        self.ctx.health.count("sessions_dormant")

    async def _resync(self, sid: str, cursor: Any) -> None:
        """Rebuild ``sid`` from REST (see :meth:`Tracker.resync`)."""
        snap: dict[str, Any] = {}
        try:
            snap["session"] = await self.request("GET", f"/sessions/{seg(sid)}")
            snap["prompts"] = await self.request("GET", f"/sessions/{seg(sid)}/prompts")
            a = await self.request("GET", f"/sessions/{seg(sid)}/approvals?status=pending")
            snap["approvals"] = M.obj(a).get("items")
            q = await self.request("GET", f"/sessions/{seg(sid)}/questions?status=pending")
            snap["questions"] = M.obj(q).get("items")
        except VendorError as e:
            if e.code == 40401:
                await self._emit(self.tracker.gone(sid))
                return
            self.ctx.health.count("rest_errors")
        except (Unreachable, AuthRefused):
            self.ctx.health.count("rest_errors")
            return
        if not self._follows(sid):
            return  # evicted while the rebuild read REST
        if isinstance(cursor, dict) and isinstance(cursor.get("seq"), int) and isinstance(cursor.get("epoch"), str):
            st = self.tracker.session(sid)
            st.epoch, st.seq = cursor["epoch"], cursor["seq"]
        restarted = sid in self._restarted
        self._restarted.discard(sid)
        await self._emit(self.tracker.resync(sid, snap, restarted=restarted))
