"""Pure helpers shared by the vendor mappers (no I/O, no clocks, no globals).

The mappers turn one flattened record (:mod:`bridges.otlp_in.flatten`) plus
the :class:`~bridges.core.posture.Posture` into a list of emissions shaped exactly like the pins'
``companion``/``primary`` objects: ``{"type", "data"?, "subject"?}``.

Capture (design record "Capture"; AEP-0003 §9): vendor ``x.*`` types have no
payload schema, so the stamper's field gate cannot prune them: the mapper
itself only puts fields allowed at the ceiling. Per known event an
:class:`EventSpec` lists the metadata-grade keys (scalars only, a string
through the redaction pipeline and cut: :func:`meta_str`), the ``redacted``-gated free-text keys (through
:func:`bridges.core.capture.redact_text` at ``redacted``, verbatim at
``full``) and the ``full``-gated keys. Any other attribute is dropped: an
allowlist, because the vendor adds attributes per version and capture honesty
is the emitter's obligation (AEP-0001 §8.2), not upstream's.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import cached_property, lru_cache
from typing import Any, Callable, NamedTuple

from bridges.core import capture as _capture
from bridges.core.bridge import Emission, Gating
from bridges.core.posture import Posture

MAX_META_STR = 512
"""Longest metadata-grade string forwarded; longer ones are cut (noted)."""

MAX_EVENT_NAME = 128

_EVENT_NAME_RE = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)+")
_SESSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_LEAF_RE = re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_]+)*")


@dataclass(frozen=True)
class EventSpec:
    """One known vendor event: its vendor-namespace leaf (``tool_result`` ->
    ``x.codex.otel.tool_result``) and which attributes its payload carries at
    which capture level."""

    leaf: str
    meta: tuple[str, ...] = ()
    redacted: tuple[str, ...] = ()
    full: tuple[str, ...] = ()

    @cached_property
    def grades(self) -> dict[str, int]:
        """Each payload key -> :data:`META`, :data:`REDACTED` or
        :data:`FULL` (a key listed twice takes its first grade, in that
        order): :func:`gated_payload`'s plan, built once per spec."""
        out: dict[str, int] = {}
        for grade, keys in ((META, self.meta), (REDACTED, self.redacted), (FULL, self.full)):
            for k in keys:
                out.setdefault(k, grade)
        return out

    @cached_property
    def content(self) -> bool:
        """The spec has ``redacted`` or ``full`` keys (its payload depends
        on the ceiling)."""
        return bool(self.redacted or self.full)


META, REDACTED, FULL = 0, 1, 2
"""The grades of :attr:`EventSpec.grades`."""


# --------------------------------------------------------------------------- values

def is_scalar(v: object) -> bool:
    return isinstance(v, (str, int, float, bool)) and v is not None


def to_int(v: object) -> int | None:
    """A non-negative whole number from an int, an integral float, or a
    decimal string (the vendors send both: ``"412"`` and ``412``)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, float):
        return int(v) if v.is_integer() and v >= 0 else None
    if isinstance(v, str):
        s = v.strip()
        if s.isascii() and s.isdigit() and len(s) <= 19:
            return int(s)
    return None


def to_bool(v: object) -> bool | None:
    """``True``/``False`` from a bool or the strings ``"true"``/``"false"``
    (any case; Codex sends its flags as strings)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        s = v.strip().lower()
        if s == "true":
            return True
        if s == "false":
            return False
    return None


def text_of(v: object) -> str | None:
    """Free text from a value: strings as-is, other JSON as compact JSON."""
    if v is None:
        return None
    if isinstance(v, str):
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def meta_str(v: str, notes: list[str], policy: _capture.CapturePolicy) -> str:
    """A vendor string carried at ``metadata``: through the AEP-0003 §9.4
    redaction of ``policy`` (its configured secrets hold ``AEP_TOKEN`` and
    the per-emitter credentials: a sixth outside attack on issue 25 had
    them written verbatim from a ``tool_name``), over a window of four
    times :data:`MAX_META_STR` (a secret across the cut is seen whole),
    then cut to :data:`MAX_META_STR` characters (noted), as the hook
    bridges bound theirs (``bridges/hooks_common/bounds.py`` ``meta``)."""
    if len(v) > MAX_META_STR:
        notes.append("otlp.value_truncated")
        return _capture.redact_text(v[:4 * MAX_META_STR], policy)[:MAX_META_STR]
    return _capture.redact_text(v, policy)


def short_str(v: object, notes: list[str], policy: _capture.CapturePolicy) -> str | None:
    """A metadata-grade identifier (tool name, model id): a non-empty
    string, :func:`meta_str`."""
    if not isinstance(v, str) or not v:
        if v is not None:
            notes.append("otlp.value_unexpected")
        return None
    return meta_str(v, notes, policy)


# --------------------------------------------------------------------------- record view

def event_name(rec: dict[str, Any], notes: list[str]) -> str | None:
    """The record's event name, wherever the exporter put it: the
    ``event.name`` attribute (the pins, Codex's tracing bridge), else the
    LogRecord's own ``event_name`` field (OTLP proto >= 1.5, the OTel Events
    model) when it is a dotted name, else a body that is exactly a dotted
    name (older event APIs).
    ``None`` when none holds a usable name (noted ``otlp.no_event_name``)."""
    attrs = rec.get("attributes")
    a = attrs.get("event.name") if isinstance(attrs, dict) else None
    if isinstance(a, str) and a:
        return a[:MAX_EVENT_NAME]
    if a is not None:
        notes.append("otlp.value_unexpected")
    # Codex 0.171 fills event_name with its tracing callsite ("event
    # otel/src/events/session_telemetry.rs:737"): only a dotted name counts.
    e = rec.get("event_name")
    if isinstance(e, str) and len(e) <= MAX_EVENT_NAME and _EVENT_NAME_RE.fullmatch(e):
        return e
    b = rec.get("body")
    if isinstance(b, str) and len(b) <= MAX_EVENT_NAME and _EVENT_NAME_RE.fullmatch(b):
        return b
    notes.append("otlp.no_event_name")
    return None


def attrs(rec: dict[str, Any]) -> dict[str, Any]:
    a = rec.get("attributes")
    return a if isinstance(a, dict) else {}


def resource(rec: dict[str, Any]) -> dict[str, Any]:
    r = rec.get("resource")
    return r if isinstance(r, dict) else {}


def session_id(raw: object, notes: list[str]) -> str | None:
    """A vendor session id as an AEP ``session``. Ids within the interop
    grammar ``[A-Za-z0-9][A-Za-z0-9._-]*`` (AEP-0003 §9 item 6; Codex thread
    ids and VS Code session ids are UUIDs) pass unchanged; anything else is
    mapped deterministically to a safe id (sanitized prefix + digest, noted
    ``otlp.session_id_sanitized``), so it stays stable and usable in the
    ``source`` URI and the log path. ``None`` for a missing/empty id."""
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, (int, float)):
        raw = str(raw)
    if not isinstance(raw, str) or not raw:
        return None
    if _SESSION_RE.fullmatch(raw):
        return raw
    notes.append("otlp.session_id_sanitized")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:48].lstrip("._-")
    tag = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{safe}-{tag}" if safe else f"s-{tag}"


def record_time(rec: dict[str, Any], now: datetime | None = None,
                notes: list[str] | None = None) -> datetime | None:
    """See :func:`record_moment` (this is it, always as a ``datetime``)."""
    t = record_moment(rec, now, notes)
    return datetime.fromisoformat(t.replace("Z", "+00:00")) if isinstance(t, str) else t


_CANONICAL_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
"""The stamper's own time form (``2026-11-30T13:05:16.466Z``, what
:func:`bridges.core.envelope.rfc3339` writes): a vendor time already in it
needs no formatting (Codex 0.171 writes ``event.timestamp`` so)."""
_DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")
_CANONICAL_SHAPE = b"0000-00-00T00:00:00.000Z"
"""An ASCII text is in :data:`_CANONICAL_TIME`'s form exactly when its
bytes, every digit spelled ``0``, are this (held equal to the regex by
``tests/unit/otlp_in/test_otlp_moment.py``)."""


def record_moment(rec: dict[str, Any], now: datetime | None = None,
                  notes: list[str] | None = None) -> datetime | str | None:
    """The moment a record describes: ``time_unix_nano``, else the vendor's
    ``event.timestamp`` attribute (RFC 3339; Codex stamps it while leaving
    the LogRecord timestamp unset), else ``observed_time_unix_nano``. ``None``
    when none is usable (the stamper then uses the receive time).

    With ``now`` (the receive time; pure: the caller reads the clock), a
    vendor time later than ``now`` + :data:`FUTURE_SLACK` or before
    :data:`EARLIEST` is out of range (``2**64-1`` ns is year 2554): it is
    skipped for the next candidate and ``otlp.time_out_of_range`` is noted
    once per record (issue 10 #13).

    An ``event.timestamp`` already in the stamper's form (UTC, milliseconds,
    ``Z``) is returned as that string, once validated: the stamper takes it
    as is, and ``rfc3339`` of the parsed time is the same text."""
    # (inline, no helper closure: this runs once per LogRecord)
    latest = None if now is None else now + FUTURE_SLACK
    out_of_range = False
    t = _from_nanos(rec.get("time_unix_nano"))
    if t is not None:
        if latest is None or EARLIEST <= t <= latest:
            return t
        out_of_range = True
    a = rec.get("attributes")
    ts = a.get("event.timestamp") if isinstance(a, dict) else None
    if isinstance(ts, str) and 10 <= len(ts) <= 40:
        try:
            t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            t = None
        if t is not None:
            if t.tzinfo is None:
                t = t.replace(tzinfo=timezone.utc)
            if 1971 <= t.year <= 9998:
                if latest is None or EARLIEST <= t <= latest:
                    if out_of_range and notes is not None:
                        notes.append("otlp.time_out_of_range")
                    # _CANONICAL_TIME.fullmatch(ts), without the regex (~0.3 us a record)
                    return ts if len(ts) == 24 and ts.isascii() and \
                        ts.encode("ascii").translate(_DIGITS_AS_0) == _CANONICAL_SHAPE else t
                out_of_range = True
    t = _from_nanos(rec.get("observed_time_unix_nano"))
    if t is not None and latest is not None and not EARLIEST <= t <= latest:
        t, out_of_range = None, True
    if out_of_range and notes is not None:
        notes.append("otlp.time_out_of_range")
    return t


EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
"""Vendor times before this are out of range (no exporter predates it)."""
FUTURE_SLACK = timedelta(days=1)
"""How far past the receive time a vendor time may be (clock skew)."""


def _canonical_text(t: datetime) -> str:
    """An aware ``t`` in :data:`_CANONICAL_TIME`'s form, cut to its millisecond."""
    t = t.astimezone(timezone.utc)
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:"
            f"{t.second:02d}.{t.microsecond // 1000:03d}Z")


_YEARS_LO, _YEARS_HI = "1971-01-01T00:00:00.000Z", "9998-12-31T23:59:59.999Z"
"""The years :func:`record_moment` takes (1971..9998), as canonical text."""


class Moments:
    """:func:`record_moment` for the records of one request (one receive
    time ``now``): ``moments(rec, notes)`` returns exactly ``record_moment(rec,
    now, notes)``, the common case without parsing a date. A record without
    ``time_unix_nano`` whose ``event.timestamp`` is already canonical text
    (what Codex 0.171 sends) is taken as that text when it is in range, by
    comparing text: fixed-width canonical UTC text sorts as time does, so
    ``lo <= ts <= hi`` (the range's ends as canonical text, the latest cut
    to its millisecond: a millisecond time is at most the latest exactly
    when it is at most that cut) is the range check; the calendar check is
    the hour, minute and second digits and, once per distinct day of the
    request, ``date.fromisoformat``. Anything else (no shape, a day the
    calendar refuses, out of range, a naive ``now``) is
    :func:`record_moment` itself. Held equal to it by
    ``tests/unit/otlp_in/test_otlp_moment.py``."""

    __slots__ = ("now", "lo", "hi", "days", "texts")

    def __init__(self, now: datetime | None) -> None:
        self.now = now
        self.lo: str = _YEARS_LO
        self.hi: str | None = _YEARS_HI
        # "YYYY-MM-DD" -> whether the calendar has it (a request spans a day or two)
        self.days: dict[str, bool] = {}
        #: each ``event.timestamp`` text looked at -> whether it is taken as
        #: is (exporters stamp bursts of records in one millisecond): the
        #: planning loop's first look (:func:`bridges.otlp_in.export.plan`)
        self.texts: dict[str, bool] = {}
        if now is not None:
            self.lo = max(self.lo, _canonical_text(EARLIEST))
            try:
                latest = None if now.utcoffset() is None else now + FUTURE_SLACK
                hi = None if latest is None else _canonical_text(latest)
            except Exception:  # noqa: BLE001 -- record_moment itself answers (or raises) then
                hi = None
            self.hi = None if hi is None else min(hi, _YEARS_HI)

    def __call__(self, rec: dict[str, Any], notes: list[str] | None = None
                 ) -> datetime | str | None:
        if self.hi is not None and rec.__class__ is dict and rec.get("time_unix_nano") is None:
            a = rec.get("attributes")
            ts = a.get("event.timestamp") if a.__class__ is dict else None
            if ts.__class__ is str:
                taken = self.texts.get(ts)
                if taken is None:
                    taken = self.takes(ts)
                if taken:
                    return ts
        return record_moment(rec, self.now, notes)

    def takes(self, ts: str) -> bool:
        """Whether ``ts``, the ``event.timestamp`` of a record without
        ``time_unix_nano``, is its moment as is (remembered in
        :attr:`texts`, at most 4,096 kept)."""
        hi = self.hi
        taken = False
        if hi is not None and len(ts) == 24 and self.lo <= ts <= hi \
                and ts[14] < "6" and ts[17] < "6" and ts[11:13] < "24" and ts.isascii() \
                and ts.encode("ascii").translate(_DIGITS_AS_0) == _CANONICAL_SHAPE:
            day = ts[:10]
            taken = self.days.get(day)  # type: ignore[assignment]
            if taken is None:
                taken = self.days[day] = _is_day(day)
        texts = self.texts
        if len(texts) >= 4096:
            texts.clear()
        texts[ts] = taken
        return taken


def _is_day(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _from_nanos(n: object) -> datetime | None:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return None
    try:
        t = datetime.fromtimestamp(n / 1e9, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return t if 1971 <= t.year <= 9998 else None


# --------------------------------------------------------------------------- payloads

@lru_cache(maxsize=1024)
def vendor_type(namespace: str, leaf: str) -> str:
    """``x.codex.otel`` + ``tool_result`` -> ``x.codex.otel.tool_result``.
    A leaf outside the AEP type grammar yields the ``unknown`` fallback."""
    if not _LEAF_RE.fullmatch(leaf):
        leaf = "unknown"
    return f"{namespace}.{leaf}"


def gated_payload(spec: EventSpec, a: dict[str, Any], type_: str, posture: Posture,
                  notes: list[str]) -> dict[str, Any]:
    """The vendor-namespace payload of a known event: the spec's metadata
    keys (scalars only; strings through :func:`meta_str`), the
    ``redacted`` keys through the redaction pipeline at ``redacted`` and
    verbatim at ``full``, the ``full`` keys only at ``full``. Attribute order
    is kept. The work is :func:`payload` with the type's ceiling looked up."""
    if spec.content:
        return payload(spec.grades, a, notes, posture.allows(type_, "redacted"),
                       posture.allows(type_, "full"), posture.policy)
    return payload(spec.grades, a, notes, False, False, posture.policy)


def payload(grades: dict[str, int], a: dict[str, Any], notes: list[str], red_ok: bool,
            full_ok: bool, policy: _capture.CapturePolicy) -> dict[str, Any]:
    """:func:`gated_payload` with the ceiling decided (``red_ok`` / ``full_ok``:
    the type's ceiling allows ``redacted`` / ``full`` content; ``grades``:
    :attr:`EventSpec.grades`): what a compiled plan
    (:class:`Recipe`) calls per record."""
    data: dict[str, Any] = {}
    for key, val in a.items():
        grade = grades.get(key)
        if grade is None:
            continue
        if grade == META:
            cls = val.__class__
            if cls is str:  # the common case first: no isinstance calls
                val = meta_str(val, notes, policy)
            elif cls is not int and cls is not float and cls is not bool:
                if not isinstance(val, (str, int, float)):  # bool is an int
                    if val is not None:
                        notes.append("otlp.value_unexpected")
                    continue
                if isinstance(val, str):
                    val = meta_str(val, notes, policy)
            data[key] = val
        elif grade == REDACTED:
            if red_ok and val is not None:
                data[key] = val if full_ok else _capture.redact_text(text_of(val) or "", policy)
        elif full_ok and val is not None:
            data[key] = val
    return data


class Plain(NamedTuple):
    """What a vendor mapper's plain events are, for its profile's compiled
    plan (:meth:`bridges.otlp_in.profiles.Profile.recipes`): ``mapper``
    and ``session_key``, the seams this describes (the plan uses it only
    while the profile's seams are these); ``events``: the mapper's
    :class:`EventSpec` per known event name; ``special``: the names whose
    companion mapping is more than :func:`gated_payload`; ``core``: the
    names with a primary-mode core mapping; ``session_attribute``: the
    LogRecord attribute ``session_key`` returns, when that is all it does
    (``None``: it reads something else)."""

    mapper: Mapper
    session_key: Callable[[dict[str, Any]], object]
    events: dict[str, EventSpec]
    special: frozenset[str] = frozenset()
    core: frozenset[str] = frozenset()
    session_attribute: str | None = None


Mapper = Callable[[dict[str, Any], Posture, list[str]], list[Emission]]
"""``map_record(rec, posture, notes)``: one flattened record -> its emissions."""


class Recipe(NamedTuple):
    """One event name's mapping at one posture, compiled
    (:meth:`bridges.otlp_in.profiles.Profile.recipes`), for an event whose
    mapping there is exactly its gated payload: the emission is
    ``{"type": type, "data": payload(grades, attributes, notes, red_ok,
    full_ok, policy), "gating": gating}``, what the mapper and the
    profile's hint give (``tests/unit/otlp_in/test_otlp_recipes.py``)."""

    type: str
    grades: dict[str, int]
    red_ok: bool
    full_ok: bool
    policy: _capture.CapturePolicy
    gating: Gating


def spec_levels(spec: EventSpec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The gate's ``levels`` hint for a vendor type (``x.*`` types have no
    schema): the content keys and their grade, so the stamper claims the
    level actually honored (``metadata`` when only metadata keys are kept)
    instead of the ceiling (AEP-0003 §9.5)."""
    lv = {k: "redacted" for k in spec.redacted}
    lv.update({k: "full" for k in spec.full})
    lv.update(extra or {})
    return lv


def unknown(namespace: str, name: str | None) -> Emission:
    """The fallback for foreign/future records (pins ``unknown``): only the
    event name travels, never the attributes (nothing is guessed at)."""
    em: Emission = {"type": f"{namespace}.unknown", "data": {}}
    if name:
        em["data"]["event.name"] = name
    return em

