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

No I/O, no clocks, no globals (bar one bounded memo of version-stripped
type names, :func:`unversioned`).
"""
from __future__ import annotations

import json
import re
from typing import Any

from bridges.core import aep

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


_UNSET: Any = object()


class BusEvent:
    """One vendor bus event. ``id``: the vendor's event id (``None`` when the
    frame carried none: such frames are never deduped); ``properties``: always
    a dict (``{}`` when the frame had none or a non-object one: see
    ``malformed``); ``directory``: the instance directory from the global
    wrapper; ``form``: ``bus`` or ``sync``.

    Read-only by convention (nothing assigns to an event once built); a
    plain ``__slots__`` class rather than a frozen dataclass, whose
    ``__init__`` cost more than the rest of :func:`parse_frame` bar the JSON
    decode (issue 11). Equal when all six fields are; unhashable (its
    ``properties`` are a dict)."""

    __slots__ = ("type", "properties", "id", "directory", "form", "malformed", "_session")

    def __init__(self, type: str, properties: dict[str, Any] | None = None,
                 id: str | None = None, directory: str | None = None, form: str = "bus",
                 malformed: bool = False) -> None:
        self.type = type
        self.properties: dict[str, Any] = {} if properties is None else properties
        self.id = id
        self.directory = directory
        self.form = form
        self.malformed = malformed
        self._session: str | None = _UNSET

    def _fields(self) -> tuple[Any, ...]:
        return (self.type, self.properties, self.id, self.directory, self.form, self.malformed)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return ("BusEvent(type={!r}, properties={!r}, id={!r}, directory={!r}, form={!r}, "
                "malformed={!r})".format(*self._fields()))

    @property
    def session(self) -> str | None:
        """The vendor ``sessionID`` this event belongs to, per the pins'
        ``identity.session_from`` (:func:`session_of`; worked out once per
        event: the receiver and the tracker both ask)."""
        sid = self._session
        if sid is _UNSET:
            sid = self._session = session_of(self.type, self.properties)
        return sid


def session_of(type_: str, p: dict[str, Any]) -> str | None:
    """The vendor ``sessionID`` of a bus event ``type_`` with properties
    ``p``, per the pins' ``identity.session_from``: ``properties.sessionID``
    | ``properties.info.sessionID`` | ``properties.info.id`` (session
    events) | ``properties.part.sessionID``."""
    sid = p.get("sessionID")
    if isinstance(sid, str) and sid:
        return sid
    info = p.get("info")
    if isinstance(info, dict):
        sid = info.get("sessionID")
        if isinstance(sid, str) and sid:
            return sid
        if type_.startswith("session."):
            sid = info.get("id")
            if isinstance(sid, str) and sid:
                return sid
    part = p.get("part")
    if isinstance(part, dict):
        sid = part.get("sessionID")
        if isinstance(sid, str) and sid:
            return sid
    return None


_BARE: dict[str, str] = {}
_BARE_MAX = 1024


def unversioned(type_: str) -> str:
    """A sync event's type without its version suffix (``message.updated.1``
    -> ``message.updated``), memoized: a stream repeats a few dozen types
    (at most :data:`_BARE_MAX` kept; the memo starts over when full)."""
    bare = _BARE.get(type_)
    if bare is None:
        if len(_BARE) >= _BARE_MAX:
            _BARE.clear()
        bare = _BARE[type_] = _VERSION.sub("", type_)
    return bare


def parse_frame(data: str, *, wrapped: bool = False, max_frame: int = MAX_FRAME) -> BusEvent:
    """Parse one SSE ``data`` payload. ``wrapped``: the frame came from
    ``/global/event`` (an unwrapped frame there is tolerated). Raises
    :class:`FrameError` when there is nothing to map: ``not_json`` also
    for a payload over :func:`bridges.core.aep.check_json`'s caps (refused
    before the parse, which would hold the event loop for seconds)."""
    if len(data) > max_frame:
        raise FrameError("oversize")
    try:
        aep.check_json(data)
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
        return BusEvent(unversioned(type_), props if isinstance(props, dict) else {},
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
