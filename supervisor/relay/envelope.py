"""Relay-grade envelope validation and classification (AEP-0001 §5, §6;
AEP-0004 §2.2), written from the spec rules rather than run through
jsonschema at ingest: the relay checks every event on the hot path.

The rules mirror ``schemas/aep-event.schema.json`` exactly (the unit tests
compare verdicts against jsonschema on the fixture corpora and on fuzzed
envelopes), plus the two ``format`` assertions jsonschema skips by default:
``time`` is an RFC 3339 date-time and ``source`` an absolute URI.
Payloads (``data``) are never inspected beyond "is an object" (AEP-0001 §5:
relays MUST NOT require parsing ``data``)."""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable

# _OJ_DUMPS, _OJ_REFUSE, _plain_values: dumps's own parts (see _encode_formed)
from bridges.core.aep import (
    _OJ_DUMPS,
    _OJ_LOADS,
    _OJ_REFUSE,
    AEP_VERSION,
    CAPTURE_RANK,
    SEVERITY_RANK,
    _plain_values,
    dumps,
    is_command_type,
    is_foreign,
)

from .attrmatch import CORE_ATTRS
from .buffer import Entry
from .capcheck import exceeds as capture_exceeds

__all__ = ["InvalidEvent", "MAX_COUNT", "MAX_DATA_DEPTH", "MAX_TYPE", "MAX_ID", "MAX_NAME", "MAX_SOURCE", "MAX_TIME",
           "validate", "well_formed", "encode", "to_entry", "envelope_error",
           "has_duplicate_keys", "trusted_entry", "formed_entry", "AEP_VERSION", "is_command_type", "is_foreign"]

_TYPE = re.compile(
    r"(?:(?:agent|session|run|progress|tool|delegation|attention|resource|error|state"
    r"|assessment|message|control)(?:\.[a-z0-9_]+)+"
    r"|x\.[a-z0-9_-]+\.[a-z0-9_]+(?:\.[a-z0-9_]+)+)\Z")
_EXT_NAME = re.compile(r"[a-z0-9]{1,20}\Z")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.\d+)?"
    r"(?:[Zz]|[+-](\d{2}):(\d{2}))\Z")
#: an absolute URI (RFC 3986 §4.3): ASCII only, no space or control
#: character (sixth outside attack on issue 25: a raw U+202E, U+200B, a
#: Cyrillic or fullwidth lookalike passed; non-ASCII is an IRI, not the
#: schema's ``format: uri``, and is percent-encoded in a URI, as the fleet
#: and the SDK mint theirs)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[\x21-\x7e]*\Z")
_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_OPTIONAL_STRINGS = ("subject", "session", "run", "step", "cause")


class InvalidEvent(ValueError):
    """The envelope breaks an AEP-0001 rule. ``str(exc)`` is a one-line
    detail (safe to return to the emitter: names the attribute, never echoes
    a value beyond the offending ``type``)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _time_ok(s: str) -> bool:
    m = _RFC3339.match(s)
    if not m:
        return False
    y, mo, d, h, mi, sec = map(int, m.groups()[:6])
    if not (1 <= mo <= 12 and 1 <= d <= _DAYS[mo - 1] and h <= 23 and mi <= 59 and sec <= 60):
        return False
    if mo == 2 and d == 29 and not (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)):
        return False
    oh, om = m.group(7), m.group(8)
    return oh is None or (int(oh) <= 23 and int(om) <= 59)


MAX_DATA_DEPTH = 64
"""Nesting bound for ``data``: every later hop (down-leveling, capture
checks, digests) walks it recursively, and a ~1000-deep payload that
``json.loads`` still accepts would blow Python's stack there, once per
subscriber (break-it review). No AEP payload comes near 64."""


def _deeper_than(value: Any, limit: int) -> bool:
    """True when ``value`` nests containers more than ``limit`` deep
    (iterative: safe on any depth)."""
    if not isinstance(value, (dict, list)):
        return False
    stack = [(value, 1)]  # containers only
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        children: Iterable[Any] = v.values() if isinstance(v, dict) else v
        for c in children:
            if isinstance(c, (dict, list)):
                stack.append((c, depth + 1))
    return False


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


#: Largest ``seq`` and ``epoch``: 2**53 - 1, the largest integer every JSON
#: reader holds exactly (RFC 8259 §6; JavaScript's ``Number.MAX_SAFE_INTEGER``):
#: a ``seq`` of 10**400 was accepted and fanned out, and a JS consumer reads
#: it as ``Infinity`` (sixth outside attack on issue 25). A counter from 0
#: at a million events a second takes 285 years to reach it.
MAX_COUNT = 2**53 - 1


def _count(v: Any) -> bool:
    return _is_int(v) and 0 <= v <= MAX_COUNT


def _enum(values: dict[str, int]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in values


#: Longest ``type`` accepted (the fleet's own are at most 780 characters:
#: :data:`bridges.core.naming.MAX_SEGMENTS` segments of ``MAX_SEGMENT``).
MAX_TYPE = 1024

#: Longest ``id`` and ``cause`` (a ``cause`` names an ``id``). Ids are
#: ULIDs (26 characters, AEP-0001 §5.1 #2's recommendation; the fleet and
#: the SDK mint them) or UUIDs (36); a 4 MB id was accepted and then held in
#: buffers, session logs, ack tables and command ledgers (a fifth outside
#: attack on issue 25). A ``cause`` past it could name no event.
MAX_ID = 512

#: Longest ``agent``, ``session``, ``run``, ``step`` and ``subject``: they
#: key the relay's tables (sessions, bindings, routing) and its journal.
#: Vendor ids pass through verbatim with no length guarantee (AEP-0001
#: §12), so the bound is generous: a file path's (Linux ``PATH_MAX``).
MAX_NAME = 4096

#: Longest ``source``: a URI that spells ``agent`` and ``session``
#: (``aep://{host}/agent/{agent}/session/{session}``, each percent-encoded
#: where it must be: up to 12 characters a character), so room for a
#: :data:`MAX_NAME` session so spelled.
MAX_SOURCE = 65536

#: Longest ``time``: RFC 3339 with nanoseconds and an offset is 35
#: characters; the pattern's fraction (``\.\d+``) has no bound of its own.
MAX_TIME = 64

#: Required attributes, checked in this order: non-empty strings.
_REQUIRED = ("id", "type", "time", "source", "agent")

#: ``(attribute, test, detail)`` for the required attributes' formats, in order.
_FORMATS: tuple[tuple[str, Callable[[Any], Any], str], ...] = (
    # the length first: the pattern is linear, but a 15 MiB type held the
    # event loop 2 s on it (a fourth outside attack on issue 25)
    ("type", lambda v: len(v) <= MAX_TYPE, f"type longer than {MAX_TYPE} characters"),
    ("type", _TYPE.match, "bad type syntax (AEP-0001 §6)"),
    ("id", lambda v: len(v) <= MAX_ID, f"id longer than {MAX_ID} characters"),
    ("agent", lambda v: len(v) <= MAX_NAME, f"agent longer than {MAX_NAME} characters"),
    ("time", lambda v: len(v) <= MAX_TIME, f"time longer than {MAX_TIME} characters"),
    ("time", _time_ok, "time must be an RFC 3339 date-time"),
    ("source", lambda v: len(v) <= MAX_SOURCE, f"source longer than {MAX_SOURCE} characters"),
    ("source", _URI.match, "source must be an absolute URI"),
)

#: ``attribute -> longest`` for the optional strings (checked once each is
#: a non-empty string)
_OPTIONAL_MAX = {"subject": MAX_NAME, "session": MAX_NAME, "run": MAX_NAME, "step": MAX_NAME,
                 "cause": MAX_ID}

#: ``(attribute, test, detail)`` for optional attributes, checked in this
#: order when present: the first failing row is the answer.
_OPTIONAL: tuple[tuple[str, Callable[[Any], Any], str], ...] = (
    *((k, _nonempty_str, f"{k} must be a non-empty string when present")
      for k in _OPTIONAL_STRINGS),
    *((k, lambda v, n=_OPTIONAL_MAX[k]: len(v) <= n, f"{k} longer than {_OPTIONAL_MAX[k]} characters")
      for k in _OPTIONAL_STRINGS),
    ("seq", _count, f"seq must be an integer from 0 to {MAX_COUNT}"),
    ("epoch", _count, f"epoch must be an integer from 0 to {MAX_COUNT}"),
    ("traceparent", lambda v: isinstance(v, str) and _TRACEPARENT.match(v),
     "malformed traceparent"),
    ("severity", _enum(SEVERITY_RANK), "unknown severity"),
    ("capture", _enum(CAPTURE_RANK), "unknown capture level"),
    ("data", lambda v: isinstance(v, dict), "data must be an object"),
    ("data", lambda v: not _deeper_than(v, MAX_DATA_DEPTH),
     f"data nests deeper than {MAX_DATA_DEPTH} levels"),
)

_AGENT_SCOPED_OMIT = ("session", "run", "step", "seq")


def _check_extensions(ev: dict[str, Any]) -> None:
    """Extension attributes (AEP-0001 §5.4): ``[a-z0-9]{1,20}`` names, scalar values."""
    for k, v in ev.items():
        if k in CORE_ATTRS:
            continue
        if not isinstance(k, str) or not _EXT_NAME.match(k):
            raise InvalidEvent("extension attribute names must match [a-z0-9]{1,20} (AEP-0001 §5.4)")
        if not (isinstance(v, (str, bool)) or _is_int(v)):
            raise InvalidEvent(f"extension attribute {k} must be a string, integer or boolean")


def _check_scope(ev: dict[str, Any], t: str) -> None:
    """Session scoping (AEP-0001 §5.2, AEP-0004 §2.2)."""
    if t.startswith("agent."):
        for k in _AGENT_SCOPED_OMIT:
            if k in ev:
                raise InvalidEvent(f"agent-scoped events omit {k} (AEP-0001 §5.2)")
    elif is_foreign(t):
        if "session" not in ev:
            raise InvalidEvent("commands and attention.routed carry session (the target)")
        if "seq" in ev:
            raise InvalidEvent("commands and attention.routed omit seq (AEP-0004 §2.2)")
    elif "session" not in ev or "seq" not in ev:
        raise InvalidEvent("session-scoped events carry session and seq (AEP-0001 §5.2)")


def validate(ev: object) -> None:
    """Raise :class:`InvalidEvent` unless ``ev`` is a valid AEP 0.1 envelope.

    Covers: object shape; required ``aep``/``id``/``type``/``time``/
    ``source``/``agent``; attribute types and enums; the ``type`` grammar
    (AEP-0001 §6, closed category set); extension names ``[a-z0-9]{1,20}``
    with scalar values (§5.4); session scoping (§5.2): ``agent.*`` omits
    ``session``/``run``/``step``/``seq``, commands and ``attention.routed``
    carry ``session`` and omit ``seq`` (AEP-0004 §2.2), everything else
    carries ``session`` and ``seq``. The checks run in a fixed order (the
    tables above); the first that fails is the detail."""
    if not isinstance(ev, dict):
        raise InvalidEvent("event must be a JSON object")
    if ev.get("aep") != AEP_VERSION:
        raise InvalidEvent(f"aep must be \"{AEP_VERSION}\"")
    for k in _REQUIRED:
        if not _nonempty_str(ev.get(k)):
            raise InvalidEvent(f"{k} is required (non-empty string)")
    for k, test, detail in _FORMATS:
        if not test(ev[k]):
            raise InvalidEvent(detail)
    for k, test, detail in _OPTIONAL:
        if k in ev and not test(ev[k]):
            raise InvalidEvent(detail)
    _check_extensions(ev)
    _check_scope(ev, ev["type"])


# -- the hot path: a well-formed event in one pass ---------------------------------

#: ``time`` forms valid by construction: ASCII digits, a day every month
#: has (February 29 aside), hour 00-23, minute and second 00-59
#: (:func:`_time_ok` has the rest: February 29, leap seconds, Unicode digits).
_TIME_FAST = re.compile(
    r"[0-9]{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
    r"|(?:0[13578]|1[02])-31)[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?"
    r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])\Z")


#: the core attributes that are non-empty strings, each with its longest
#: and the counts (``seq``, ``epoch``)
_STR_ATTRS: dict[str, int] = {"id": MAX_ID, "type": MAX_TYPE, "time": MAX_TIME,
                              "source": MAX_SOURCE, "agent": MAX_NAME, **_OPTIONAL_MAX}
_COUNT_ATTRS = frozenset(("seq", "epoch"))
#: ``attribute -> test`` for the other core attributes but ``data`` (exact types)
_FAST: dict[str, Callable[[Any], bool]] = {
    "aep": lambda v: True,
    "severity": lambda v: type(v) is str and v in SEVERITY_RANK,
    "capture": lambda v: type(v) is str and v in CAPTURE_RANK,
    "traceparent": lambda v: type(v) is str and _TRACEPARENT.match(v) is not None,
}
_EXT_TYPES = (str, int, bool)

_AGENT, _SESSION, _FOREIGN = 1, 2, 3
#: ``type -> scope`` for the types seen (a type passing the grammar: agent-,
#: session-scoped, or foreign), memoized: an emitter repeats a handful of
#: types, and the grammar regex and the command rule cost more than the rest
#: of the check. Bounded: cleared when full.
_TYPE_SCOPE: dict[str, int] = {}
_MAX_TYPES = 4096


def _type_scope(t: str) -> int:
    """``0`` for a ``type`` the grammar refuses, else its scope (memoized)."""
    scope = _TYPE_SCOPE.get(t)
    if scope is None:
        if len(t) > MAX_TYPE or _TYPE.match(t) is None:
            return 0
        scope = _AGENT if t.startswith("agent.") else _FOREIGN if is_foreign(t) else _SESSION
        if len(_TYPE_SCOPE) >= _MAX_TYPES:
            _TYPE_SCOPE.clear()
        _TYPE_SCOPE[t] = scope
    return scope


#: ``source`` URIs that passed :data:`_URI` (an emitter repeats one per
#: session); bounded like :data:`_TYPE_SCOPE`, and in bytes: a source longer
#: than :data:`_MAX_MEMO_KEY` is checked every time, not kept (an eighth
#: outside attack: 4,096 distinct 60 KB sources held +256 MiB outside the
#: buffer budget)
_SOURCE_OK: dict[str, None] = {}
#: the longest string a memo of this package keeps as a key
_MAX_MEMO_KEY = 256


def _source_ok(src: str) -> bool:
    if src in _SOURCE_OK:
        return True
    if _URI.match(src) is None:
        return False
    if len(src) > _MAX_MEMO_KEY:
        return True
    if len(_SOURCE_OK) >= _MAX_TYPES:
        _SOURCE_OK.clear()
    _SOURCE_OK[src] = None
    return True


def _attrs_ok(ev: dict[str, Any], shallow: bool) -> bool:
    """Every attribute of ``ev`` in one pass (see :func:`well_formed`)."""
    for k, v in ev.items():
        longest = _STR_ATTRS.get(k)
        if longest is not None:
            if type(v) is not str or not v or len(v) > longest:
                return False
        elif k in _COUNT_ATTRS:
            if type(v) is not int or not 0 <= v <= MAX_COUNT:
                return False
        elif k == "data":
            if type(v) is not dict or (not shallow and _deeper_than(v, MAX_DATA_DEPTH)):
                return False
        else:
            test = _FAST.get(k)
            if test is not None:
                if not test(v):
                    return False
            elif type(k) is not str or _EXT_NAME.match(k) is None or type(v) not in _EXT_TYPES:
                return False
    return True


def well_formed(ev: object, shallow: bool = False) -> bool:
    """``True`` only when :func:`validate` passes ``ev``: one pass over the
    attributes with exact types (what ``json.loads`` builds), for the events
    emitters actually send. ``False`` means "ask :func:`validate`" (which
    raises the detail, or passes an event this pass is too strict for), so
    verdicts and details are :func:`validate`'s alone. ``shallow``: the
    caller knows ``data`` cannot nest past :data:`MAX_DATA_DEPTH` (its JSON
    text holds fewer brackets than that)."""
    if type(ev) is not dict or ev.get("aep") != AEP_VERSION:
        return False
    t, tm, src = ev.get("type"), ev.get("time"), ev.get("source")
    if type(t) is not str or type(tm) is not str or type(src) is not str or \
            "id" not in ev or "agent" not in ev:
        return False
    scope = _TYPE_SCOPE.get(t) or _type_scope(t)  # (the memo read here: the hot path)
    if not scope or _TIME_FAST.match(tm) is None or \
            (src not in _SOURCE_OK and not _source_ok(src)) or not _attrs_ok(ev, shallow):
        return False
    if scope == _AGENT:
        return not ("session" in ev or "run" in ev or "step" in ev or "seq" in ev)
    if "session" not in ev:
        return False
    return ("seq" not in ev) if scope == _FOREIGN else ("seq" in ev)


def encode(ev: object) -> bytes:
    """The event's wire form (:func:`bridges.core.aep.dumps`: what the relay
    buffers and forwards). Raises :class:`InvalidEvent` when it has none: a
    lone UTF-16 surrogate anywhere (``"\\ud800"`` is a legal JSON escape,
    but AEP-0001 §5 makes the envelope UTF-8 JSON, and an SSE ``id:`` line
    or a WS text frame could not carry it), or a value JSON cannot carry.
    Costs nothing extra: serializing is needed anyway and the UTF-8 encode
    is the check."""
    try:
        return dumps(ev)
    except UnicodeEncodeError:
        raise InvalidEvent("event contains a lone UTF-16 surrogate: not representable "
                           "in UTF-8 (AEP-0001 §5)") from None
    except (TypeError, ValueError, RecursionError):
        raise InvalidEvent("event is not representable as JSON") from None


def _encode_formed(ev: dict[str, Any]) -> bytes:
    """:func:`encode` of an event :func:`well_formed` passed, the same bytes
    or the same refusal for less: :func:`bridges.core.aep.dumps` takes
    orjson's bytes once every value is one orjson and the json module write
    alike (``_plain``), and of such an event only ``data`` can hold another
    (its other attributes are exact ``str``/``int``/``bool``, and orjson
    itself refuses subclasses), so only ``data`` is walked. Anything else
    (orjson refusing, a value in ``data`` the two write differently) takes
    :func:`encode`. Held equal to :func:`encode` by a property test
    (``tests/unit/relay/test_relay_runs.py``)."""
    try:
        out = _OJ_DUMPS(ev, None, _OJ_REFUSE)
        data = ev.get("data")
        if data is None or _plain_values(data.values()):
            # an exact-size copy, as dumps makes (orjson's keeps its write block)
            return memoryview(out).tobytes()
    except Exception:  # noqa: BLE001 -- a refusal (or a deep stack): encode's own answer
        pass
    return encode(ev)


_FULL = CAPTURE_RANK["full"]


def to_entry(ev: Any, text: str | None = None, *, owned: bool = False) -> Entry:
    """One event as the relay holds it (:class:`~.buffer.Entry`): the
    envelope validated (:func:`validate`), serialized once (:func:`encode`),
    and its ``data`` checked against its declared ``capture``
    (:mod:`.capcheck`, AEP-0001 §8.2(a)). A command is not refused for
    carrying more than it declares (it is forwarded verbatim to its target,
    AEP-0004 §4.4); its rank is what it carries, so observers get its audit
    copy down-leveled from there. ``text``: the JSON text ``ev`` was parsed
    from, when the caller has it (it bounds the nesting cheaply); ``owned``:
    the caller hands ``ev`` over (it becomes the entry's ``attrs``, ``data``
    popped, instead of being copied). Raises :class:`InvalidEvent`."""
    if well_formed(ev, text is not None and
                   text.count("{") + text.count("[") <= MAX_DATA_DEPTH):
        raw = _encode_formed(ev)
    else:
        validate(ev)
        raw = encode(ev)  # also refuses lone surrogates (no UTF-8 form)
    return _entry_of(ev, raw, owned)


def _entry_of(ev: dict[str, Any], raw: bytes, owned: bool) -> Entry:
    """:func:`to_entry` once ``ev`` is valid and ``raw`` its wire form: the
    capture check, then the entry (raises :class:`InvalidEvent`)."""
    declared = ev.get("capture", "metadata")
    cap = CAPTURE_RANK[declared]
    data = ev.get("data")
    if cap < _FULL and data is not None:
        shown = capture_exceeds(ev["type"], data, declared)
        if shown is not None:
            if not is_command_type(ev["type"]):
                raise InvalidEvent(f"data exceeds its declared capture {declared}: it carries "
                                   f"{shown}-level fields (AEP-0001 §8.2(a))")
            cap = CAPTURE_RANK[shown]
    if owned:
        attrs = ev
        attrs.pop("data", None)
    else:
        attrs = ev.copy()
        attrs.pop("data", None)
    seq = attrs.get("seq")
    pos = (attrs.get("epoch", 0), seq) if seq is not None else None
    return Entry(attrs, raw, pos, SEVERITY_RANK[attrs.get("severity", "info")], cap)


def _plain_within(values: Iterable[Any], depth: int) -> bool:
    """Whether every one of ``values`` is an exact ``str``, ``int``,
    ``bool`` or ``None``, or a ``dict``/``list`` of such values nesting at
    most ``depth`` more levels (itself included). No ``float`` anywhere."""
    for v in values:
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            continue
        if t is dict:
            if depth <= 0 or not _plain_within(v.values(), depth - 1):
                return False
        elif t is list:
            if depth <= 0 or not _plain_within(v, depth - 1):
                return False
        else:
            return False
    return True


def formed_entry(line: bytes) -> Entry | None:
    """``to_entry(loads(text), text, owned=True)`` for the UTF-8 JSON
    ``line`` (``text`` its ``str``), or ``None``: then the caller takes that
    path itself (its answer, its refusal). What it skips, for the events
    emitters send: :func:`bridges.core.aep.loads`'s text scans, the
    bracket count, and ``data``'s two walks (one here instead).

    Why the answer is the same: orjson read the bytes, the envelope is
    :func:`well_formed`, and ``data`` holds no ``float`` and nests at most
    :data:`MAX_DATA_DEPTH` levels. Then nothing in it is what orjson and
    the json module read apart (``loads``'s scans look for the text of an
    int past 64 bits, which orjson reads as a ``float``, and for nesting
    past what both read; a ``float`` alone can be read otherwise, so any
    one sends the event the long way), ``data`` is within the depth bound
    whatever its text's brackets, and orjson's bytes are :func:`encode`'s
    (``_encode_formed``: every value is plain). Held equal to that path by
    a property test (``tests/unit/relay/test_relay_ingest_fast.py``)."""
    try:
        ev = _OJ_LOADS(line)
    except Exception:  # noqa: BLE001 -- not JSON to orjson: the long way answers
        return None
    if not well_formed(ev, True):
        return None
    data = ev.get("data")
    if data is not None and not _plain_within(data.values(), MAX_DATA_DEPTH - 1):
        return None
    try:
        # an exact-size copy, as dumps makes (orjson's keeps its write block)
        raw = memoryview(_OJ_DUMPS(ev, None, _OJ_REFUSE)).tobytes()
    except Exception:  # noqa: BLE001 -- encode's refusal: the long way answers
        return None
    return _entry_of(ev, raw, True)


def trusted_entry(ev: dict[str, Any], raw: bytes) -> Entry:
    """:func:`to_entry` for an envelope this process's own stamper built
    (:class:`bridges.core.envelope.Stamper`) and already encoded (``raw``
    is :func:`bridges.core.aep.dumps` of ``ev``): no validation, no
    encoding, no capture check (the stamper's gate set ``capture`` from
    what it kept). The fleet's in-process path only; every other party
    goes through :func:`to_entry`. The tests hold the stamper's envelopes
    to the schema."""
    attrs = dict(ev)
    attrs.pop("data", None)
    seq = ev.get("seq")
    pos = (ev.get("epoch", 0), seq) if seq is not None else None
    return Entry(attrs, raw, pos, SEVERITY_RANK[ev.get("severity", "info")],
                 CAPTURE_RANK[ev.get("capture", "metadata")])


def _pairs_no_dup(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise KeyError("duplicate")
    return dict(pairs)


def has_duplicate_keys(raw: str) -> bool:
    """Whether the JSON text ``raw`` repeats a key in any object (a command
    is forwarded verbatim, so what the target parses must be what the relay
    routed on). False for text that is not JSON."""
    try:
        json.loads(raw, object_pairs_hook=_pairs_no_dup)
    except KeyError:
        return True
    except ValueError:
        return False
    return False


def envelope_error(ev: object) -> str | None:
    """``None`` when ``ev`` is valid, else the :class:`InvalidEvent` detail."""
    try:
        validate(ev)
    except InvalidEvent as e:
        return str(e)
    return None
