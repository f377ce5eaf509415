"""The protocol's vocabulary, written once: every module that speaks AEP
(the stamper, the capture gate, the ledger, the relay, the uplink, the
session log) takes its constants and its wire encoding from here.

- :data:`AEP_VERSION` / :data:`SUPPORTED_VERSIONS`: the one version this
  code speaks (AEP-0001 §5 ``aep``; AEP-0003 §4 ``hello.versions``).
- :data:`SEVERITIES` / :data:`SEVERITY_RANK`: the total order of AEP-0001
  §8.1 (``schemas/registry/severity.json``), default ``info``.
- :data:`CAPTURE_LEVELS` / :data:`CAPTURE_RANK` / :func:`capture_rank`:
  ``none < metadata < redacted < full`` (AEP-0001 §8.2,
  ``schemas/registry/capture.json``), default ``metadata``.
- :func:`is_command_type`: the command rule. The command set is closed
  (AEP-0004 §5: "Additions to the core command set require the AEP
  process") plus the vendor namespace ``x.{vendor}.control.{verb}``; it is
  exactly the set ``schemas/aep-event.schema.json`` exempts from ``seq``.
  A ``control.*`` type outside it (an ack, or an unregistered verb) is an
  ordinary sequenced event, never routed.
- :data:`NACK_REASONS` (AEP-0004 §3, ``schemas/registry/nack-reasons.json``)
  and :data:`ACK_WINDOW_MS` (the §3 default ack window).
- :func:`dumps` / :func:`loads`: the wire JSON, the json module's answers
  (bytes, values, refusals) at orjson's speed where orjson's are the same
  (issue 11; see :func:`dumps`). One lone-surrogate rule:
  text with a lone UTF-16 surrogate has no UTF-8 form, so it has no AEP
  wire form (AEP-0001 §5: the envelope is UTF-8 JSON); :func:`dumps`
  raises ``UnicodeEncodeError`` for it and the caller decides (the relay
  refuses such an event, the fleet repairs vendor text with
  :func:`scrub_surrogates`).

Pure: constants and functions, no I/O."""
from __future__ import annotations

import json
import re
from typing import Any, Iterable

import orjson

__all__ = [
    "AEP_VERSION", "SUPPORTED_VERSIONS",
    "SEVERITIES", "SEVERITY_RANK", "DEFAULT_SEVERITY", "NOTICE_RANK",
    "CAPTURE_LEVELS", "CAPTURE_RANK", "DEFAULT_CAPTURE", "capture_rank",
    "CORE_COMMANDS", "ACK_TYPES", "is_command_type", "is_command", "is_foreign",
    "NACK_REASONS", "ACK_WINDOW_MS",
    "dumps", "loads", "scrub_surrogates", "MAX_CONTAINERS", "MAX_VALUES", "MAX_FLOATS", "MAX_DIGITS", "containers",
    "check_json",
]

AEP_VERSION = "0.1"
"""The protocol version this code speaks (envelope ``aep``, ``AEP-Version``)."""

SUPPORTED_VERSIONS: tuple[str, ...] = (AEP_VERSION,)
"""What a ``hello`` offers (AEP-0003 §4)."""

SEVERITIES = ("debug", "info", "notice", "warning", "error", "critical")
"""AEP-0001 §8.1, in rank order."""
SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
DEFAULT_SEVERITY = "info"
NOTICE_RANK = SEVERITY_RANK["notice"]
"""``notice`` and above are never dropped silently (AEP-0003 §8.4)."""

CAPTURE_LEVELS = ("none", "metadata", "redacted", "full")
"""AEP-0001 §8.2, in rank order."""
CAPTURE_RANK: dict[str, int] = {c: i for i, c in enumerate(CAPTURE_LEVELS)}
DEFAULT_CAPTURE = "metadata"


def capture_rank(level: str) -> int:
    """Position of ``level`` in ``none < metadata < redacted < full``.
    Raises ``ValueError`` for anything else."""
    try:
        return CAPTURE_RANK[level]
    except (KeyError, TypeError):
        raise ValueError(f"unknown capture level {level!r} "
                         f"(expected one of {', '.join(CAPTURE_LEVELS)})") from None


CORE_COMMANDS = ("control.attention.respond", "control.cancel", "control.pause", "control.resume")
"""The commands defined in 0.1 (AEP-0004 §5)."""
ACK_TYPES = ("control.accepted", "control.rejected")
"""Acknowledgements (AEP-0004 §3): ordinary sequenced events, not commands."""

_COMMAND = re.compile(
    "(?:" + "|".join(re.escape(c) for c in CORE_COMMANDS) + r"|x\.[a-z0-9_-]+\.control\..+)\Z")


def is_command_type(type_: object) -> bool:
    """Whether ``type_`` names a command: one of :data:`CORE_COMMANDS` or
    ``x.{vendor}.control.*`` (AEP-0004 §2, §5; the schema's seq-less set).
    Commands are routed, never sequenced. False for a non-string."""
    return isinstance(type_, str) and _COMMAND.match(type_) is not None


def is_command(event: object) -> bool:
    """Whether the object ``event`` is a command Event (by its ``type``)."""
    return isinstance(event, dict) and is_command_type(event.get("type"))


def is_foreign(type_: str) -> bool:
    """Foreign-emitter session events (AEP-0001 §5.2 exception): commands and
    consumer-emitted ``attention.routed``; they carry ``session``, no ``seq``."""
    return type_ == "attention.routed" or is_command_type(type_)


NACK_REASONS = ("unsupported", "unauthorized", "busy", "refused", "invalid")
"""The closed ``control.rejected.reason`` set (``timeout`` is sender-side only
and never emitted)."""

ACK_WINDOW_MS = 10_000
"""The default ack window (``hello.capabilities.control.ack_window_ms``, AEP-0004 §3)."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


# Built once: ``json.dumps``/``json.loads`` with arguments build a new
# encoder/decoder on every call (~1-1.5 us of a ~3 us encode on the hot path).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder(parse_constant=_no_constants)
_SCAN = getattr(_DECODER, "scan_once")  # noqa: B009 -- set in __init__, untyped
_NOT_FIRST = ("", " ", "\t", "\n", "\r", "\ufeff")  # text[:1] values the fast path leaves to decode


# The C encoder ``_ENCODER.encode`` builds on every call, built once (issue
# 11: ~0.7 us of a ~2.5 us event encode), without the circular-reference
# markers (a shared markers dict would keep stale ids after a failed
# encode): a cycle recurses until RecursionError, and that one case goes
# through ``_ENCODER`` for its own answer (ValueError for a cycle).
_C_MAKE = getattr(json.encoder, "c_make_encoder", None)  # CPython's _json (untyped)
_C_ENCODE = None if _C_MAKE is None else _C_MAKE(
    None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)


def _stdlib_dumps(obj: Any) -> bytes:
    """The json module's compact UTF-8 encoding of ``obj``: the reference
    :func:`dumps` answers as (every refusal is this one's)."""
    if _C_ENCODE is not None and obj.__class__ is dict:
        try:
            return "".join(_C_ENCODE(obj, 0)).encode("utf-8")
        except RecursionError:
            pass  # a cycle or absurd depth: _ENCODER's own answer
    try:
        return _ENCODER.encode(obj).encode("utf-8")
    except RecursionError:  # absurd nesting: one refusal for callers, not Python's
        raise ValueError("value nested too deeply for JSON") from None


def _stdlib_loads(text: str | bytes) -> Any:
    """The json module's strict decoding of ``text``: the reference
    :func:`loads` answers as (every refusal is this one's)."""
    try:
        if type(text) is str and text[:1] not in _NOT_FIRST:
            # the C scanner straight away (what ``decode`` runs after two
            # whitespace regexes): ~0.8 of ~2.1 us for an event (issue 11);
            # anything else (whitespace around it, an error) takes ``decode``
            try:
                obj, end = _SCAN(text, 0)
            except StopIteration:
                pass
            else:
                if end == len(text):
                    return obj
        if type(text) is str and not text.startswith("\ufeff"):
            return _DECODER.decode(text)
        return json.loads(text, parse_constant=_no_constants)  # bytes, a BOM: json's own answers
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


# orjson (issue 11) writes an event ~3.4x faster than the C encoder above
# (walk included) and reads bytes ~3x, str ~1.3x faster, but its answers are
# not the contract's everywhere. It is asked first; any refusal of it takes
# the stdlib path above for the stdlib's own answer (an int past 64 bits, a
# non-str key, a lone surrogate, deep nesting, a cycle); what it accepts and
# the stdlib would not, or writes or reads otherwise, is checked after it:
# ``_plain`` (dumps: Enum members, UUIDs, NaN, some floats) and ``_SCAN_MAP``
# (loads: ints past 64 bits, deep nesting). The PASSTHROUGH options (no
# ``default``) only make it refuse datetimes, dataclasses and subclasses of
# str/int/list/dict at once; ``_plain`` would refuse them too.
_OJ_DUMPS = orjson.dumps
_OJ_LOADS = orjson.loads
_OJ_REFUSE = (orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
              | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _same_float(x: float) -> bool:
    # NaN/Infinity are ``null`` to orjson (the contract: ValueError) and some
    # finite floats are written otherwise (``0.00001`` for ``1e-05``): the
    # bytes stay the stdlib's (``repr``), whatever orjson's version does
    return _OJ_DUMPS(x) == float.__repr__(x).encode()


def _plain_values(values: Iterable[Any]) -> bool:
    """:func:`_plain` for every one of ``values`` (a dict's values, a list's
    or a tuple's items)."""
    for v in values:
        t = type(v)
        if t is str or t is int:
            continue
        if t is dict:
            if not _plain_values(v.values()):
                return False
        elif t is list or t is tuple:
            if not _plain_values(v):
                return False
        elif t is float:
            if not _same_float(v):
                return False
        elif t is not bool and v is not None:
            return False
    return True


def _plain(obj: Any) -> bool:
    """Whether ``obj``, which orjson just encoded, is made only of values its
    bytes and the stdlib's agree on: exact str, int, bool, None, dict, list,
    tuple, and floats ``_same_float`` holds. Not so: an Enum member or a
    UUID (orjson writes its value or its text; the stdlib raises TypeError),
    an ``orjson.Fragment``, NaN/Infinity. orjson already refused the rest
    (its keys are exact str, its ints fit 64 bits, nothing is nested past
    its limit, there is no cycle)."""
    t = type(obj)
    if t is dict:
        return _plain_values(obj.values())
    if t is list or t is tuple:
        return _plain_values(obj)
    if t is float:
        return _same_float(obj)
    return t is str or t is int or t is bool or obj is None


def dumps(obj: Any) -> bytes:
    """The wire form of ``obj``: compact JSON (``,``/``:`` separators, no
    spaces), UTF-8, non-ASCII kept. Raises ``UnicodeEncodeError`` when a
    string (key or value, any depth) holds a lone UTF-16 surrogate (no
    UTF-8 form; see the module docstring), ``ValueError`` for ``NaN`` /
    ``Infinity`` (not JSON) or a cycle or absurd nesting, and ``TypeError``
    for a value JSON cannot carry.

    The bytes are the json module's compact encoding, byte for byte (floats
    as ``repr`` writes them: ``1e-05``, ``1e+16``), so one value always has
    one wire form. orjson writes them when it can (see ``_plain``), the
    json module otherwise."""
    try:
        out = _OJ_DUMPS(obj, None, _OJ_REFUSE)
    except Exception:
        pass  # any refusal: the stdlib's own answer below
    else:
        try:
            if _plain_values(obj.values()) if type(obj) is dict else _plain(obj):
                # orjson's bytes keep the block it wrote into (4 KiB at least:
                # a 450-byte event held 4,121 bytes of RSS); events are kept
                # (relay buffers, SSE queues), so an exact-size copy, ~0.12 us
                return memoryview(out).tobytes()
        except RecursionError:  # the caller's stack was already deep: the stdlib decides
            pass
    return _stdlib_dumps(obj)


# What orjson reads otherwise, found in one pass over the text (``_SCAN_MAP``:
# digits -> "0", "[" and "{" -> "[", every other byte -> " "):
# - an integer past 64 bits is a float to orjson (``18446744073709551616`` ->
#   ``1.8446744073709552e+19``), an int to the stdlib; such a token has at
#   least 19 digits in a row: text with 19 takes the stdlib (a ``[::4]``
#   sample first cost as much as it saved: events hold digit-rich ULIDs and
#   digests);
# - orjson reads up to 1,024 levels, the stdlib as deep as the caller's stack
#   lets it (the recursion limit), and the contract is the stdlib's refusal:
#   text that may nest deeper than _DEEP (more "[" and "{" than that, so
#   more than twice as long) takes the stdlib; up to _DEEP both read it.
_SCAN_MAP = bytes(0x30 if 0x30 <= b <= 0x39 else 0x5B if b in (0x5B, 0x7B) else 0x20
                  for b in range(256))
_RUN_19 = b"0" * 19
_DEEP = 255


def loads(text: str | bytes) -> Any:
    """Strict JSON: ``NaN``/``Infinity`` refused. Raises ``ValueError``
    (absurd nesting, Python's ``RecursionError``, re-raised as ``ValueError``).

    Answers as the json module does, value for value and error for error:
    orjson reads exact str and bytes first; what it refuses (a lone
    surrogate escape, a BOM, ``1e400``, deep nesting, anything not JSON)
    and text that may hold an int past 64 bits (19 digits in a row) or nest
    deeper than 255 levels take the json module, whose answer (or refusal)
    it is."""
    t = type(text)
    if t is str or t is bytes:
        try:
            raw = text if isinstance(text, bytes) else text.encode()  # a lone surrogate raises
            obj = _OJ_LOADS(raw)
        except Exception:
            pass  # any refusal: the stdlib's own answer below
        else:
            scan = raw.translate(_SCAN_MAP)  # see above
            if _RUN_19 not in scan and (len(raw) <= 2 * _DEEP or scan.count(b"[") <= _DEEP):
                return obj
    return _stdlib_loads(text)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_surrogates(value: Any) -> Any:
    """A copy of ``value`` with every lone surrogate (legal as a JSON
    ``\\ud800`` escape from a vendor, but not UTF-8, so not AEP) replaced
    by U+FFFD, in keys and strings at any depth: what :func:`dumps` can
    then encode."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    return value


MAX_CONTAINERS = 65_536
"""Most JSON arrays and objects one event, frame or hook body may open:
each becomes Python objects every later walk (capture gate, redaction,
size) visits, so 15 MiB of ``[[],[],...]`` (5 million of them) held the
event loop 2-3.4 s and a gated hook failed open meanwhile (a tenth outside
attack on issue 25). A big event of ordinary shape opens far fewer."""

MAX_VALUES = 131_072
"""Most JSON values (numbers, strings, literals, arrays and objects;
counted as its arrays and objects plus its commas plus one, outside
strings) one event, frame or hook body may hold: each is a Python object
the parse makes and every walk visits (some 0.3 us a member of an object
here). A big event of ordinary shape (prose, code, a file's text: strings)
holds far fewer."""

MAX_FLOATS = 65_536
"""Most JSON numbers with a fraction or an exponent (counted once for each:
``1.5e3`` is two) one event, frame or hook body may hold, outside strings:
each costs ~1 us (the exact re-encoding's ``repr`` check), so one 8 MB
line of two million (``[0.5,0.5,...]``, two containers) held the event loop
1.7-2.7 s; with :data:`MAX_VALUES` a line now costs at most ~0.15 s of CPU
here (found while fixing an eleventh outside attack on issue 25)."""

MAX_DIGITS = 256
"""Most digits in a row one JSON number may have, outside strings: reading
and writing an int of n digits costs n squared (Python's int), so one
16 MiB line of 3,800 ints of 4,299 digits (just under Python's own limit)
held the event loop 1.4 s and gated hooks failed open (a twelfth outside
attack on issue 25). At 256 a 16 MiB line of such numbers costs ~0.15 s;
no vendor or AEP number comes near it (an int64 has 19)."""

_DIGIT_MAP = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_RUN_LONG = b"0" * (MAX_DIGITS + 1)


def _long_number(text: str | bytes) -> bool:
    """Whether ``text`` holds a run of over :data:`MAX_DIGITS` digits
    (upper bound: strings are not skipped). One C-speed pass."""
    if len(text) <= MAX_DIGITS:
        return False
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return _RUN_LONG in raw.translate(_DIGIT_MAP)


# A string, or an unterminated one to the end: every match succeeds, so the
# scan is linear (one that must end in '"' restarted at every later quote:
# 130 KB of '\\"' held the loop 9 s, an eleventh outside attack on issue 25);
# possessive runs keep a long string at C speed.
_STRING_B = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\Z)', re.DOTALL)
_STRING_S = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\Z)', re.DOTALL)


def _counts(text: str | bytes) -> tuple[int, int]:
    """``(containers, values)``: every ``[`` and ``{``, and that plus every
    ``,`` plus one, of ``text`` (upper bounds: strings are not skipped)."""
    if isinstance(text, str):
        n = text.count("[") + text.count("{")
        return n, n + text.count(",") + 1
    n = text.count(b"[") + text.count(b"{")
    return n, n + text.count(b",") + 1


# digits -> "0", "." -> ".", "e" and "E" -> "e", every other byte -> " ": a
# number's fraction is a "0." and its exponent a "0e" (in true/false an "e"
# follows a letter)
_FLOAT_MAP = bytes(0x30 if 0x30 <= b <= 0x39 else b if b == 0x2E else 0x65 if b in (0x45, 0x65)
                   else 0x20 for b in range(256))


def _floats(text: str | bytes) -> int:
    """Fractions and exponents of the numbers of ``text`` (upper bound:
    strings are not skipped). Each needs two bytes: text shorter than
    ``2 * MAX_FLOATS`` is not scanned (0)."""
    if len(text) < 2 * MAX_FLOATS:
        return 0
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    scan = raw.translate(_FLOAT_MAP)
    return scan.count(b"0.") + scan.count(b"0e")


def _bare(text: str | bytes) -> str | bytes:
    """``text`` without its JSON strings (an unterminated one to the end)."""
    return _STRING_S.sub("", text) if isinstance(text, str) else _STRING_B.sub(b"", text)


def containers(text: str | bytes) -> int:
    """How many JSON arrays and objects ``text`` (JSON) opens, at C speed:
    every ``[`` and ``{``, and only when that passes :data:`MAX_CONTAINERS`
    those outside strings (code in a tool result is full of brackets)."""
    n = _counts(text)[0]
    return n if n <= MAX_CONTAINERS else _counts(_bare(text))[0]


def check_json(text: str | bytes) -> int:
    """Raise ``ValueError`` when ``text`` (JSON, before it is parsed) opens
    over :data:`MAX_CONTAINERS` arrays and objects (:func:`containers`),
    holds over :data:`MAX_VALUES` values, over :data:`MAX_FLOATS`
    fractions and exponents, or a number of over :data:`MAX_DIGITS`
    digits; else the containers it opens (an upper bound:
    brackets in strings count while under the cap), the work its parse
    will be (:mod:`bridges.core.pacing`). C-speed counts; strings are
    skipped (one linear pass) only when a count passes its cap."""
    n, v = _counts(text)
    f = 0 if n > MAX_CONTAINERS or v > MAX_VALUES else _floats(text)
    long = _long_number(text)
    if n > MAX_CONTAINERS or v > MAX_VALUES or f > MAX_FLOATS or long:
        bare = _bare(text)  # brackets, commas and digits in strings do not count
        n, v = _counts(bare)
        f = _floats(bare)
        long = _long_number(bare)
    if n > MAX_CONTAINERS:
        raise ValueError(f"over {MAX_CONTAINERS} JSON arrays and objects in one value")
    if v > MAX_VALUES:
        raise ValueError(f"over {MAX_VALUES} JSON values in one value")
    if f > MAX_FLOATS:
        raise ValueError(f"over {MAX_FLOATS} JSON fractions and exponents in one value")
    if long:
        raise ValueError(f"a JSON number of over {MAX_DIGITS} digits")
    return n
