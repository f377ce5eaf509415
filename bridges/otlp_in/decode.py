"""OTLP request bodies -> flattened records (pure: no sockets, no clocks).

:func:`decode_http_body` takes an OTLP/HTTP body with its ``Content-Type``
and ``Content-Encoding`` (OTLP spec "OTLP/HTTP": binary protobuf
``application/x-protobuf`` or JSON ``application/json``, identity or gzip);
:func:`decode_proto` takes a protobuf ``ExportLogsServiceRequest`` (the
OTLP/HTTP protobuf body, and the gRPC message grpcio has already
decompressed). Both yield :data:`~bridges.otlp_in.flatten.FlatRecord` s
(``None`` for an entry that is not a LogRecord) and append anomaly counter
names to ``notes``; a body that cannot be a request raises
:class:`~bridges.otlp_in.status.BadRequest` (:mod:`bridges.otlp_in.status`
maps it to 400/413/415 and the gRPC codes).

Size: the limit applies to the body as received AND to the inflated body:
gzip is inflated incrementally with a cap, so a gzip bomb costs at most
``limit + 1`` bytes of memory.
"""
from __future__ import annotations

import json
import zlib
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from bridges.core.aep import check_json

from . import flatten, rawattrs
from .flatten import FlatRecord, NotOtlp
from .status import BadRequest, Refusal

MAX_RECORDS = 65_536
"""Most LogRecords one export request may carry (the SDKs' batch processors
send at most 512 by default). Each costs a few microseconds of Python in a
decoding thread, whose hold of the GIL slows the event loop: 2,000,000
empty records in a 4 MB protobuf held it 1.3-1.6 s, 7 s with several at
once, and gated hooks failed open (a twelfth outside attack on issue 25).
Past it the request is refused whole (413, ``RESOURCE_EXHAUSTED``) before
any record is read; an OTLP/JSON body is bounded by
:func:`~bridges.core.aep.check_json` (131,072 values) before its parse."""


MAX_ITEMS = 262_144
"""Most ResourceLogs, ScopeLogs, LogRecords and attributes (a resource's and
a record's) one export request may carry in all: a request of 2,000,000
empty ResourceLogs carries no record, yet walking it took 5-7 s of a
decoding thread, and two such senders kept every legitimate export waiting
6-7.5 s (a thirteenth outside attack on issue 25); 400,000 attribute keys
in one record 2.7 s."""


def _check_size(request: Any) -> None:
    """413 (:class:`BadRequest`) when a parsed request carries over
    :data:`MAX_RECORDS` LogRecords or over :data:`MAX_ITEMS` items in all:
    counted by protobuf ``len`` alone, and never past the cap (the count
    stops there), before any record or attribute is read."""
    items = len(request.resource_logs)
    records = 0
    for rl in request.resource_logs:
        if items > MAX_ITEMS:
            break
        items += len(rl.scope_logs) + len(rl.resource.attributes)
        for sl in rl.scope_logs:
            n = len(sl.log_records)
            records += n
            items += n
            if items > MAX_ITEMS or records > MAX_RECORDS:
                break
            for lr in sl.log_records:
                items += len(lr.attributes)
                if items > MAX_ITEMS:
                    break
    if records > MAX_RECORDS:
        raise BadRequest(Refusal.TOO_LARGE, f"over {MAX_RECORDS} LogRecords in one export "
                         "request; export smaller batches", "otlp.too_many_records")
    if items > MAX_ITEMS:
        raise BadRequest(Refusal.TOO_LARGE, f"over {MAX_ITEMS} resources, scopes, records and "
                         "attributes in one export request; export smaller batches",
                         "otlp.too_many_records")


class Reads(NamedTuple):
    """Which attributes a decoder flattens: ``attributes`` (of each
    LogRecord) and ``resource``, each a set of keys or ``None`` for all,
    and ``fields``: the record fields beyond those two the profile reads
    (``None``: all; a protobuf record then leaves out ``severity_number``,
    ``severity_text`` and ``scope`` when ``fields`` names none of them). A
    run passes its vendor profile's (:attr:`Profile.reads
    <bridges.otlp_in.profiles.Profile.reads>`): the keys its mapper can
    look at; the rest of a protobuf request is never read (nor noted when
    malformed)."""

    attributes: frozenset[str] | None = None
    resource: frozenset[str] | None = None
    fields: frozenset[str] | None = None

    @property
    def extras(self) -> bool:
        """Whether a record keeps ``severity_number``, ``severity_text`` and
        ``scope`` (:data:`~bridges.otlp_in.flatten.EXTRA_FIELDS`)."""
        return self.fields is None or not self.fields.isdisjoint(flatten.EXTRA_FIELDS)


ALL = Reads()
"""Flatten every attribute (the pins' full record shape)."""

PROTOBUF_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})
JSON_TYPES = frozenset({"application/json"})


MAX_GZIP_MEMBERS = 64
"""gzip members one body may hold (RFC 1952 allows many; exporters send
one). Every member restarts the inflater, so a body of empty members is
all overhead (issue 10 #4: 4 MB of them froze the daemon for ~25 s)."""

_GZ_CHUNK = 64 * 1024


def gunzip_capped(data: bytes, limit: int, max_members: int = MAX_GZIP_MEMBERS) -> bytes:
    """Inflate a gzip body (one or more members, RFC 1952) to at most
    ``limit`` bytes, in time linear in the input. Raises :class:`BadRequest`
    413 when the output would exceed ``limit`` (it stops inflating there: no
    bomb inflates unbounded), 400 for more than ``max_members`` members and
    for a corrupt or truncated stream."""
    out = bytearray()
    view = memoryview(data)
    pos, members = 0, 0
    while True:
        members += 1
        if members > max_members:
            raise BadRequest(Refusal.MALFORMED, f"gzip body has more than {max_members} members",
                             "otlp.bad_gzip")
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        step = 512
        while not d.eof:
            if pos >= len(view):
                raise BadRequest(Refusal.MALFORMED, "truncated gzip body", "otlp.bad_gzip")
            # bounded, growing input slices: the leftover zlib copies at a
            # member's end is at most one slice, small for small members, so
            # restarting per member never copies the rest of the body
            feed = view[pos:pos + step]
            step = min(step * 2, _GZ_CHUNK)
            try:
                chunk = d.decompress(feed, limit - len(out) + 1)
            except zlib.error as e:
                raise BadRequest(Refusal.MALFORMED, f"invalid gzip body: {e}",
                                 "otlp.bad_gzip") from None
            out += chunk
            if len(out) > limit or d.unconsumed_tail:
                raise BadRequest(Refusal.TOO_LARGE, f"inflated body exceeds {limit} bytes",
                                 "otlp.too_large")
            pos += len(feed) - len(d.unused_data)
        if pos >= len(view) or (view[pos] == 0 and not view[pos:].tobytes().strip(b"\x00")):
            return bytes(out)  # trailing zero padding is tolerated (gzip(1) does)


def media_type(content_type: str | None) -> str:
    """``"Application/JSON; charset=utf-8"`` -> ``"application/json"``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_json(content_type: str | None) -> bool:
    """True when the request (and so its answer) is OTLP/JSON."""
    return media_type(content_type) in JSON_TYPES


def inflate_http_body(content_type: str | None, content_encoding: str | None, body: bytes,
                      limit: int) -> bytes:
    """An OTLP/HTTP body as its decoder reads it: the media type checked,
    gzip inflated to ``limit`` bytes at most (:func:`gunzip_capped`).
    Raises :class:`BadRequest` (415 unsupported type/encoding, 413 too
    large, 400 a corrupt gzip stream). The receiver inflates before it
    queues for the decoding lane, whose turns go by the inflated size: a
    few KB of gzip inflating to 4 MB of slow records had passed as small
    (a sixteenth outside attack on issue 25)."""
    mt = media_type(content_type)
    if mt not in PROTOBUF_TYPES and mt not in JSON_TYPES:
        raise BadRequest(Refusal.UNSUPPORTED, f"unsupported Content-Type {mt or '(none)'!r}; "
                         "use application/x-protobuf or application/json",
                         "otlp.unsupported_media_type")
    enc = (content_encoding or "identity").strip().lower()
    if enc in ("gzip", "x-gzip"):
        return gunzip_capped(body, limit)
    if enc not in ("identity", ""):
        raise BadRequest(Refusal.UNSUPPORTED, f"unsupported Content-Encoding {enc!r}; use gzip "
                         "or none", "otlp.unsupported_encoding")
    return body


def decode_http_body(content_type: str | None, content_encoding: str | None, body: bytes,
                     limit: int, notes: list[str], reads: Reads = ALL,
                     decoder: ProtoDecoder | None = None
                     ) -> tuple[bool, list[FlatRecord | None]]:
    """An OTLP/HTTP logs body -> ``(is_json, records)``; ``reads``: the
    attributes to flatten from a protobuf body (see :class:`Reads`; a JSON
    body is flattened whole, :func:`decode_json`); ``decoder``: the
    protobuf decoder to use instead (its own ``reads``; a receiver's
    :class:`ProtoDecoder`). Raises :class:`BadRequest` (415 unsupported
    type/encoding, 413 too large, 400 undecodable or not an OTLP export
    request)."""
    body = inflate_http_body(content_type, content_encoding, body, limit)
    if media_type(content_type) in JSON_TYPES:
        return True, decode_json(body, notes)
    if decoder is not None:
        return False, decoder(body, notes)
    return False, decode_proto(body, notes, reads)


def decode_json(body: bytes, notes: list[str]) -> list[FlatRecord | None]:
    """OTLP/JSON ``ExportLogsServiceRequest`` bytes -> records, every
    attribute flattened (parsing the JSON is most of the cost, and each
    malformed value is counted, as the OTLP/JSON receiver always did); 400
    on invalid JSON or a document that is not an export request."""
    try:
        check_json(body)  # bounded before the parse: values, containers, numbers
    except ValueError as e:
        raise BadRequest(Refusal.MALFORMED, f"body refused before its parse: {e}",
                         "otlp.undecodable") from None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadRequest(Refusal.MALFORMED, f"body is not JSON: {type(e).__name__}",
                         "otlp.undecodable") from None
    try:
        return flatten.records_from_json(doc, notes)
    except NotOtlp as e:
        raise BadRequest(Refusal.MALFORMED, f"not an OTLP logs export request: {e}",
                         "otlp.undecodable") from None


def decode_proto(body: bytes, notes: list[str], reads: Reads = ALL) -> list[FlatRecord | None]:
    """Protobuf ``ExportLogsServiceRequest`` bytes -> records (``reads``:
    :class:`Reads`); 400 on a corrupt or truncated message."""
    try:
        req = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as e:
        raise BadRequest(Refusal.MALFORMED, f"undecodable protobuf: {str(e)[:200]}",
                         "otlp.undecodable") from None
    _check_size(req)
    return list(flatten.records_from_proto(req, notes, keys=reads.attributes,
                                           resource_keys=reads.resource, extras=reads.extras))


class ProtoDecoder:
    """:func:`decode_proto` for one receiver, the same records for less
    work (``decode(body, notes)``): the request is parsed with the
    raw-attribute schema (:data:`~bridges.otlp_in.rawattrs.RawRequest`) and
    each ``KeyValue`` read by one :class:`~bridges.otlp_in.rawattrs.AttributeReader`
    (the canonical string/bool/int shapes without a message wrapper, the
    rest by the real schema, repeats from its memo). Equal to
    :func:`decode_proto` with the same ``reads``, records, notes and
    refusals alike (``tests/unit/otlp_in/test_otlp_raw_decode.py``). Shared
    by a receiver's worker threads."""

    def __init__(self, reads: Reads = ALL, memo: int = 4096) -> None:
        self.reads = reads
        self._extras = reads.extras
        self._attribute = rawattrs.AttributeReader(reads.attributes, memo)

    def __call__(self, body: bytes, notes: list[str]) -> list[FlatRecord | None]:
        """Protobuf ``ExportLogsServiceRequest`` bytes -> records; 400
        (:class:`BadRequest`) on a corrupt or truncated message."""
        try:
            req = rawattrs.RawRequest.FromString(body)
            _check_size(req)
            return list(rawattrs.records_from_raw(req, notes, self._attribute,
                                                 resource_keys=self.reads.resource,
                                                 extras=self._extras))
        except (DecodeError, RecursionError, ValueError) as e:
            raise BadRequest(Refusal.MALFORMED, f"undecodable protobuf: {str(e)[:200]}",
                             "otlp.undecodable") from None
