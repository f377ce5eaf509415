"""OpenHands discovery (split from :mod:`bridges.openhands.receiver` by
issue 26): :class:`Discovery`, the receiver's base, polls
``GET /api/conversations/search`` (paged, at most :data:`MAX_PAGES` pages a
poll) every ``poll`` seconds with backoff on failure, attaches what is new
(at most :data:`MAX_CONVERSATIONS`) and detaches what a complete listing no
longer has once ``GET /api/conversations/{id}`` confirms it gone (404).
"""
from __future__ import annotations

import logging
import re
from typing import Any, Awaitable, Callable

import httpx
import trio
import trio_websocket

from bridges.core.backoff import backoff_delay
from bridges.core.bridge import BridgeContext
from bridges.core.errors import leaves
from bridges.core.rest import parse_json

from .config import OpenHandsConfig
from .conversation import Conversation

log = logging.getLogger("aep.bridge.openhands")

MAX_PAGES = 100
"""Search pages read per poll (100 conversations each); a server that pages
beyond it is counted (``search_pages_capped``) and nothing is detached."""
PAGE_ITEMS = 100
"""Conversations asked for per search page (``limit``). A page of more is
refused whole (a ``ValueError``: ``search_errors``, backoff): a hostile or
port-squatting server answered 100 pages of 65,000 ids a poll, the daemon
walked 6.5 million ids on the event loop, grew to 1 GB, and 11-15 of 50
gated hooks failed open (a sixteenth outside attack on issue 25)."""
PAGE_BYTES = 4 * 1024 * 1024
"""Most bytes of one search page read (OpenHands 1.58 sends about 7 KB a
conversation: 100 of them are about 0.7 MB)."""
MAX_CONVERSATIONS = 10_000
ATTACH_PER_POLL = 100
"""New conversations attached per poll at most (each opens a socket and
reads the server); the rest wait for the next poll, counted
``conversations_deferred``."""
MAX_BACKOFF = 60.0


class AuthRefused(Exception):
    """The server refused the session API key (REST 401/403, socket 4001)."""


class Discovery:
    """The receiver's discovery loop (:class:`~bridges.openhands.receiver.Receiver`
    is the one subclass; it owns the attributes and callables below)."""

    settings: OpenHandsConfig
    ctx: BridgeContext
    rest: Any
    conversations: dict[str, Conversation]
    _nursery: trio.Nursery | None
    _rest_refused: bool
    _auth_logged: set[str]
    _socket_refused: set[str]
    _source: Callable[..., None]
    _auth_failed: Callable[..., None]
    _load: Callable[[str], Conversation]
    _conversation_task: Callable[[Conversation], Awaitable[None]]
    _detach: Callable[..., Awaitable[None]]

    async def _discover_loop(self) -> None:
        failures = 0
        while True:
            try:
                listed, complete = await self.search()
            except AuthRefused:
                self._auth_failed("REST API")
                failures += 1
            except (httpx.HTTPError, OSError, ValueError) as e:
                failures += 1
                self.ctx.health.count("search_errors")
                self._source(False if isinstance(e, (httpx.TransportError, OSError)) else "degraded",
                             f"conversation search failed: {type(e).__name__}")
                if failures == 1 or failures % 10 == 0:  # once per episode, then a reminder
                    log.warning("OpenHands conversation search at %s failed (%s); retrying with backoff"
                                " (%d failures)", self.settings.url, _why(e), failures)
            else:
                if failures:
                    log.info("OpenHands agent server at %s reachable", self.settings.url)
                failures = 0
                self._rest_refused = False
                self._auth_logged.discard("REST API")
                if not self._socket_refused:
                    self._source(True)
                    self.ctx.health.detail = None
                await self._reconcile(listed, complete)
            if failures:
                delay = backoff_delay(failures - 1, 1.0, MAX_BACKOFF)
            else:
                delay = self.settings.poll
            await trio.sleep(delay)

    async def search(self) -> tuple[list[str], bool]:
        """All conversation ids the server lists, and whether the listing is
        complete (``False`` when :data:`MAX_PAGES` was hit or a page id
        repeated). Raises :class:`AuthRefused`, ``httpx.HTTPError``,
        ``ValueError`` (an unparsable page, or one over
        :mod:`bridges.core.rest`'s bounds: ``BadAnswer``)."""
        ids: list[str] = []
        page_id: str | None = None
        seen_pages: set[str] = set()
        for _ in range(MAX_PAGES):
            params: dict[str, Any] = {"limit": PAGE_ITEMS}
            if page_id:
                params["page_id"] = page_id
            r = await self.rest.get("/api/conversations/search", params, max_bytes=PAGE_BYTES)
            if r.status_code in (401, 403):
                raise AuthRefused()
            r.raise_for_status()
            body = parse_json(r.content, r.status_code)
            if not isinstance(body, dict) or not isinstance(body.get("items"), list):
                raise ValueError("search page is not {items: [...]}")
            if len(body["items"]) > PAGE_ITEMS:
                raise ValueError(f"search page of {len(body['items'])} items; "
                                 f"asked for {PAGE_ITEMS}")
            for item in body["items"]:
                cid = item.get("id") if isinstance(item, dict) else None
                if isinstance(cid, str) and re.fullmatch(r"[0-9A-Fa-f-]{32,36}", cid):
                    ids.append(cid)
                else:
                    self.ctx.health.count("search_bad_items")
            nxt = body.get("next_page_id")
            if not isinstance(nxt, str) or not nxt:
                return ids, True
            if nxt in seen_pages:
                self.ctx.health.count("search_pages_capped")
                return ids, False
            seen_pages.add(nxt)
            page_id = nxt
        self.ctx.health.count("search_pages_capped")
        return ids, False

    async def _reconcile(self, listed: list[str], complete: bool) -> None:
        assert self._nursery is not None
        listed_set = set(listed)
        attached = 0
        for cid in listed:
            if cid in self.conversations:
                continue
            if len(self.conversations) >= MAX_CONVERSATIONS:
                self.ctx.health.count("conversations_capped")
                continue
            if attached >= ATTACH_PER_POLL:
                self.ctx.health.count("conversations_deferred")
                continue
            conv = self._load(cid)
            if conv.ended:
                continue
            attached += 1
            self.conversations[cid] = conv
            self.ctx.health.count("conversations_attached")
            self._nursery.start_soon(self._conversation_task, conv)
        if not complete:
            return
        for cid in [c for c in self.conversations if c not in listed_set]:
            if await self._confirmed_gone(cid):
                await self._detach(self.conversations[cid], vanished=True)

    async def _confirmed_gone(self, cid: str) -> bool:
        try:
            r = await self.rest.get(f"/api/conversations/{cid}")
        except (httpx.HTTPError, ValueError):  # ValueError: an answer past the bounds
            return False
        return r.status_code == 404


def _why(e: BaseException) -> str:
    """A short, secret-free description of a transport failure."""
    if isinstance(e, BaseExceptionGroup):
        return ", ".join(_why(x) for x in leaves(e))
    if isinstance(e, httpx.HTTPStatusError):
        return f"HTTP {e.response.status_code}"
    if isinstance(e, trio_websocket.ConnectionClosed):
        return f"closed {getattr(e.reason, 'code', '?')}"
    if isinstance(e, trio_websocket.ConnectionRejected):
        return f"rejected HTTP {e.status_code}"
    return type(e).__name__
