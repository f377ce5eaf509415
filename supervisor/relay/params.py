"""Request parameters shared by the SSE and WebSocket bindings (AEP-0003
§3.3, §6.4, §6.5), and browser origins (AEP-0003 §8): parsed and refused
here, before anything reaches the relay. Pure: no I/O, no state.

Every refusal is :class:`~supervisor.relay.attrmatch.InvalidFilter` with a
one-line detail safe to send back (``invalid-filter``)."""
from __future__ import annotations

import re
import urllib.parse
from typing import Any, TypeGuard

from bridges.core.aep import CAPTURE_LEVELS, CAPTURE_RANK, loads

from .attrmatch import Filter, InvalidFilter
from .buffer import Position

__all__ = ["parse_capture", "parse_from", "parse_last_event_id", "normalize_origin",
           "parse_filter_json", "parse_from_json"]


def parse_capture(value: object) -> str | None:
    """A subscription's ``capture`` ceiling (AEP-0003 §6.4): ``None`` when
    absent, else one of the capture levels; raises :class:`InvalidFilter`."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in CAPTURE_RANK:
        raise InvalidFilter(f"capture must be one of {', '.join(CAPTURE_LEVELS)}")
    return value


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _count(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def parse_from(value: object) -> tuple[bool, list[tuple[str, Position | None]] | None]:
    """``from``: absent, ``"all"``, or ``[{session, epoch?, seq}]`` (AEP-0003
    §3.3, §6.5). Returns ``(replay_all, positions)``; raises
    :class:`InvalidFilter` for anything else (fail closed)."""
    if value is None:
        return False, None
    if value == "all":
        return True, None
    if not isinstance(value, list):
        raise InvalidFilter('from must be an array of resume positions or the string "all"')
    out: list[tuple[str, Position | None]] = []
    for p in value:
        if not isinstance(p, dict):
            raise InvalidFilter("from entries must be {session, epoch, seq} objects")
        session, epoch, seq = p.get("session"), p.get("epoch", 0), p.get("seq")
        if not isinstance(session, str) or not session:
            raise InvalidFilter("from entry needs a session (string)")
        if not _utf8(session):
            raise InvalidFilter("from entry session has no UTF-8 form (lone surrogate)")
        if not (_count(epoch) and _count(seq)):
            raise InvalidFilter("from entry epoch/seq must be integers >= 0")
        out.append((session, (epoch, seq)))
    return False, out


_DIGITS = re.compile(r"[0-9]+\Z")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def normalize_origin(value: str, *, strict: bool = False) -> str:
    """An origin (RFC 6454) in comparable form: ``scheme://host[:port]``,
    lower-cased, default port and trailing ``/`` dropped; ``null`` stays
    ``null``. ``strict`` (configuration): raises ``ValueError`` for
    anything that is not an origin (a path, a query, ``*``, no scheme);
    otherwise (a request's ``Origin`` header) returns the input lower-cased
    so it simply matches nothing."""
    v = value.strip()
    if v.lower() == "null":
        return "null"
    try:
        u = urllib.parse.urlsplit(v)
        port = u.port
    except ValueError:
        u, port = None, None
    if u is None or not u.scheme or not u.hostname or u.path not in ("", "/") \
            or u.query or u.fragment or u.username or u.password:
        if strict:
            raise ValueError(f"{value!r} is not an origin (scheme://host[:port], e.g. "
                             "https://dash.example:8443); '*' is not accepted")
        return v.lower()
    scheme, host = u.scheme.lower(), u.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}"


def parse_last_event_id(value: str) -> tuple[str, Position] | None:
    """``{session}:{epoch}:{seq}`` (session names may contain ``:``);
    ``None`` when malformed (browsers resend whatever they saw last): epoch
    and seq must be ASCII digits (``str.isdigit`` also passes ``"²"``) that
    ``int`` accepts (Python refuses more than 4300 digits)."""
    session, sep1, rest = value.rpartition(":")
    session, sep2, epoch = session.rpartition(":")
    if not (sep1 and sep2 and session and _DIGITS.match(epoch) and _DIGITS.match(rest)):
        return None
    try:
        return session, (int(epoch), int(rest))
    except ValueError:
        return None


def parse_filter_json(text: str | None, max_terms: int | None = None) -> Filter:
    """The SSE ``filter`` query parameter (JSON text; absent or empty: match
    all) compiled; raises :class:`InvalidFilter` (its subclass
    :class:`~.attrmatch.FilterTooLarge` past ``max_terms`` alternatives)."""
    try:
        return Filter(loads(text) if text else {}, max_terms=max_terms)
    except InvalidFilter:
        raise
    except ValueError:
        raise InvalidFilter("filter is not valid JSON") from None


def parse_from_json(text: str | None) -> tuple[bool, list[tuple[str, Position | None]] | None]:
    """The SSE ``from`` query parameter: absent/empty, ``all``, or a JSON
    array (see :func:`parse_from`); raises :class:`InvalidFilter`."""
    value: Any = text
    if text and text != "all":
        try:
            value = loads(text)
        except ValueError:
            raise InvalidFilter("from is not valid JSON") from None
    return parse_from(value or None)
