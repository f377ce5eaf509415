"""Pure parsing of one SSE ``data`` payload into a bus event.

Two frame forms arrive on the OpenCode/Kilo streams (verified against the
real servers, ``tests/fixtures/opencode_real/README.md``):

- the bus form ``{"id": "evt_...", "type": "session.idle", "properties":
  {...}}``; on ``/global/event`` wrapped as ``{"directory", "project",
  "payload": <bus form>}``;
- the sync form of the same event, sent right after it:
  ``{"type": "sync", "syncEvent": {"id": <same id>, "type":
  "message.updated.1", "seq": N, "aggregateID": <session>, "data":
  <properties>}}``, normalized here to the bus form (version suffix dropped)
  so the receiver's id dedupe collapses the pair whichever comes first.

No I/O, no clocks, no globals.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_FRAME = 8 * 1024 * 1024
"""Largest ``data`` payload parsed (characters). Bigger frames are skipped
and counted: the real servers truncate tool output long before this."""

_VERSION = re.compile(r"\.\d+$")


class FrameError(ValueError):
    """A frame that cannot become a bus event. ``reason`` is the counter
    name: ``oversize``, ``not_json``, ``not_object``, ``no_type``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class BusEvent:
    """One vendor bus event. ``id``: the vendor's event id (``None`` when the
    frame carried none: such frames are never deduped); ``properties``: always
    a dict (``{}`` when the frame had none or a non-object one: see
    ``malformed``); ``directory``: the instance directory from the global
    wrapper; ``form``: ``bus`` or ``sync``."""

    type: str
    properties: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    directory: str | None = None
    form: str = "bus"
    malformed: bool = False

    @property
    def session(self) -> str | None:
        """The vendor ``sessionID`` this event belongs to, per the pins'
        ``identity.session_from``: ``properties.sessionID`` |
        ``properties.info.sessionID`` | ``properties.info.id`` (session
        events) | ``properties.part.sessionID``."""
        p = self.properties
        sid = p.get("sessionID")
        if isinstance(sid, str) and sid:
            return sid
        info = p.get("info")
        if isinstance(info, dict):
            sid = info.get("sessionID")
            if isinstance(sid, str) and sid:
                return sid
            if self.type.startswith("session."):
                sid = info.get("id")
                if isinstance(sid, str) and sid:
                    return sid
        part = p.get("part")
        if isinstance(part, dict):
            sid = part.get("sessionID")
            if isinstance(sid, str) and sid:
                return sid
        return None


def parse_frame(data: str, *, wrapped: bool = False, max_frame: int = MAX_FRAME) -> BusEvent:
    """Parse one SSE ``data`` payload. ``wrapped``: the frame came from
    ``/global/event`` (an unwrapped frame there is tolerated). Raises
    :class:`FrameError` when there is nothing to map."""
    if len(data) > max_frame:
        raise FrameError("oversize")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise FrameError("not_json") from None
    if not isinstance(obj, dict):
        raise FrameError("not_object")
    directory = None
    payload: Any = obj
    if wrapped and isinstance(obj.get("payload"), dict):
        payload = obj["payload"]
        if isinstance(obj.get("directory"), str):
            directory = obj["directory"]
    if payload.get("type") == "sync" and isinstance(payload.get("syncEvent"), dict):
        sync = payload["syncEvent"]
        type_ = sync.get("type")
        if not isinstance(type_, str) or not type_:
            raise FrameError("no_type")
        props = sync.get("data")
        ident = sync.get("id")
        return BusEvent(_VERSION.sub("", type_), props if isinstance(props, dict) else {},
                        ident if isinstance(ident, str) and ident else None, directory, "sync",
                        not isinstance(props, dict))
    type_ = payload.get("type")
    if not isinstance(type_, str) or not type_:
        raise FrameError("no_type")
    props = payload.get("properties")
    ident = payload.get("id")
    return BusEvent(type_, props if isinstance(props, dict) else {},
                    ident if isinstance(ident, str) and ident else None, directory, "bus",
                    not isinstance(props, dict))
