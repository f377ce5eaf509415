"""OTLP protobuf with raw attributes (pure: no I/O, no clocks; split from
:mod:`bridges.otlp_in.flatten` by issue 26): :data:`RawRequest` parses an
``ExportLogsServiceRequest`` whose ``LogRecord.attributes`` stay the
``KeyValue`` bytes as sent, :class:`AttributeReader` reads each one (a fast
path for the common scalar shapes, the real ``KeyValue`` otherwise; a memo
of repeated small attributes), and :func:`records_from_raw` yields the same
flattened records as :func:`bridges.otlp_in.flatten.records_from_proto`.
"""
from __future__ import annotations

import itertools
from typing import Any, Container

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from .flatten import (
    FlatRecord,
    _log_record,
    _scope,
    attrs_from_proto,
)


def _raw_request_class() -> Any:
    """``ExportLogsServiceRequest`` from a private descriptor pool in which
    ``LogRecord.attributes`` is ``repeated bytes`` (each element the
    ``KeyValue`` exactly as sent; the same wire type, so the same framing
    and every other field parsed and checked exactly as in the real
    schema). Iterating the attributes is then one C list of ``bytes``
    instead of a message wrapper per ``KeyValue``."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.logs.v1 import logs_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2

    pool = descriptor_pool.DescriptorPool()
    for mod in (common_pb2, resource_pb2, logs_pb2, logs_service_pb2):
        fdp = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fdp)
        if mod is logs_pb2:
            (record,) = [m for m in fdp.message_type if m.name == "LogRecord"]
            (attrs,) = [f for f in record.field if f.name == "attributes"]
            attrs.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            attrs.ClearField("type_name")
        pool.Add(fdp)
    name = ExportLogsServiceRequest.DESCRIPTOR.full_name
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


RawRequest = _raw_request_class()
"""The raw-attribute ``ExportLogsServiceRequest`` (:func:`_raw_request_class`):
``RawRequest.FromString(body)`` accepts and refuses what the real class
does, except that ``KeyValue`` contents are checked by
:class:`AttributeReader` instead."""

SKIP = object()
"""An :class:`AttributeReader` verdict: a key outside the reader's ``keys``."""


def _varint_len(b: bytes, i: int, n: int) -> tuple[int, int]:
    """A length prefix of at most two bytes at ``b[i]`` -> ``(length, next
    index)``; ``(-1, 0)`` for anything else (the slow path decides)."""
    if i >= n:
        return -1, 0
    x = b[i]
    if x < 0x80:
        return x, i + 1
    if i + 1 >= n or b[i + 1] >= 0x80 or b[i + 1] == 0:
        return -1, 0
    return (x & 0x7F) | (b[i + 1] << 7), i + 2


def _kv_fast(b: bytes) -> tuple[str, Any] | None:
    """The canonical encoding of a ``KeyValue`` whose value is a string, a
    bool or a non-negative int (``key`` field 1 then ``value`` field 2,
    each once, nothing else) -> ``(key, value)``; ``None`` for any other
    byte shape (the slow path then parses it with the real schema). Raises
    ``UnicodeDecodeError`` for text that is not UTF-8 (the slow path then
    gives protobuf's own answer)."""
    n = len(b)
    if n < 4 or b[0] != 0x0A:
        return None
    kl = b[1]
    if 0 < kl and kl + 6 <= n < 0x80 and n == kl + 4 + b[kl + 3] and b[kl + 2] == 0x12 \
            and b[kl + 4] == 0x0A and b[kl + 5] == n - kl - 6:
        # the common shape: a short string attribute, every length one byte
        return b[2:kl + 2].decode("utf-8"), b[kl + 6:].decode("utf-8")
    kl, i = _varint_len(b, 1, n)
    if kl <= 0 or i + kl + 2 > n or b[i + kl] != 0x12:
        return None
    key = b[i:i + kl].decode("utf-8")
    vl, j = _varint_len(b, i + kl + 1, n)
    if vl <= 1 or j + vl != n:
        return None
    tag = b[j]
    if tag == 0x0A:  # string_value
        sl, k = _varint_len(b, j + 1, n)
        if sl < 0 or k + sl != n:
            return None
        return key, b[k:].decode("utf-8")
    if tag == 0x10:  # bool_value, canonical 0/1
        if j + 2 != n or b[j + 1] > 1:
            return None
        return key, b[j + 1] == 1
    if tag == 0x18:  # int_value: a varint of at most 9 bytes (0 <= v < 2**63)
        v, shift, k = 0, 0, j + 1
        while k < n and k - j <= 9:
            x = b[k]
            v |= (x & 0x7F) << shift
            shift += 7
            k += 1
            if x < 0x80:
                return (key, v) if k == n else None
        return None
    return None


def _nest(field_tag: int, payload: bytes) -> bytes:
    """``payload`` as one length-delimited field ``field_tag`` (varint length)."""
    n, head = len(payload), bytearray((field_tag,))
    while n >= 0x80:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + payload


def _kv_slow(b: bytes) -> KeyValue:
    """``b`` parsed by the real schema at the depth it had in the request
    (wrapped in a request -> resource_logs -> scope_logs -> log_records ->
    attributes chain, so protobuf's nesting limit counts as it did).
    Raises what ``ExportLogsServiceRequest.FromString`` raises."""
    wrapped = _nest(0x0A, _nest(0x12, _nest(0x12, _nest(0x32, b))))
    req = ExportLogsServiceRequest.FromString(wrapped)
    return req.resource_logs[0].scope_logs[0].log_records[0].attributes[0]


_SCALARS = (str, int, float, bool, type(None))

MEMO_MAX_BYTES = 256
"""The longest ``KeyValue`` an :class:`AttributeReader` memoizes (ids,
names, kinds, flags; not prompts or tool output): its memo holds at most
``memo`` times this many bytes of keys."""


class AttributeReader:
    """One raw ``KeyValue`` (bytes, :data:`RawRequest`) -> ``(key, value,
    notes)`` exactly as :func:`attrs_from_proto` would flatten the parsed
    ``KeyValue`` with the same ``keys`` (``value`` is :data:`SKIP` for a
    key outside ``keys``: its value is still checked, never flattened, and
    notes nothing). Raises protobuf's ``DecodeError`` (or
    ``RecursionError``/``ValueError``) where parsing the real request
    would have.

    Scalar verdicts of short attributes (:data:`MEMO_MAX_BYTES`) are
    memoized by their bytes (most attributes of an exporter's records
    repeat: the event name, the session id, the kind): at most ``memo``
    entries, forgotten all at once when full. Safe to
    share between threads (dict operations under the GIL)."""

    def __init__(self, keys: Container[str] | None = None, memo: int = 4096) -> None:
        self.keys = keys
        self.memo = memo
        self._seen: dict[bytes, tuple[str, Any, tuple[str, ...]]] = {}
        # the memoized verdicts that noted nothing, as ``(key, value)`` pairs
        # (``(SKIP, None)`` for a key outside ``keys``): what dict() takes
        self._pairs: dict[bytes, tuple[Any, Any]] = {}
        #: ``remembered(b)``: the memoized verdict or ``None`` (the hot loop's first try)
        self.remembered = self._seen.get
        #: ``pair(b)``: the memoized verdict as a pair (:meth:`attributes`) or ``None``
        self.pair = self._pairs.get

    def __call__(self, b: bytes) -> tuple[str, Any, tuple[str, ...]]:
        return self._seen.get(b) or self.read(b)

    def read(self, b: bytes) -> tuple[str, Any, tuple[str, ...]]:
        """:meth:`__call__` without looking at the memo first (after
        :attr:`remembered` said ``None``)."""
        got = self._read(b)
        if len(b) <= MEMO_MAX_BYTES and (got[1] is SKIP or got[1].__class__ in _SCALARS):
            seen = self._seen
            if len(seen) >= self.memo:
                seen.clear()
                self._pairs.clear()
            seen[b] = got
            if not got[2]:
                self._pairs[b] = (SKIP, None) if got[1] is SKIP else (got[0], got[1])
        return got

    def attributes(self, raw: list[bytes], notes: list[str]) -> dict[str, Any]:
        """A LogRecord's raw ``KeyValue`` s -> its flattened attributes, as
        :func:`attrs_from_proto` gives them (notes in order): the slow half
        of :func:`records_from_raw` (some attribute not memoized)."""
        out: dict[str, Any] = {}
        remembered, read = self._seen.get, self.read
        for b in raw:
            key, value, said = remembered(b) or read(b)
            if value is not SKIP:
                out[key] = value
                if said:
                    notes.extend(said)
        return out

    def _read(self, b: bytes) -> tuple[str, Any, tuple[str, ...]]:
        keys = self.keys
        try:
            fast = _kv_fast(b)
        except UnicodeDecodeError:
            fast = None
        if fast is not None:
            key, value = fast
            return (key, SKIP, ()) if keys is not None and key not in keys else (key, value, ())
        kv = _kv_slow(b)
        key = kv.key
        if keys is not None and key not in keys:
            return key, SKIP, ()
        notes: list[str] = []
        value = attrs_from_proto((kv,), notes).get(key)
        return key, value, tuple(notes)


def records_from_raw(request: Any, notes: list[str], attribute: AttributeReader, *,
                     resource_keys: Container[str] | None = None,
                     extras: bool = True) -> list[FlatRecord]:
    """:func:`records_from_proto` over a :data:`RawRequest` message: the same
    records (and notes) as the real message gives with ``attribute.keys``,
    ``resource_keys`` and ``extras``. Raises what ``attribute`` raises.

    A record's attributes are ``dict(map(attribute.pair, raw, ...))``, in C,
    when the memo has every one of them (a miss is the pair ``(_MISS,
    None)``: then :meth:`AttributeReader.attributes` reads the record
    again; the ``(SKIP, None)`` pairs of unread keys are dropped: one key
    for all of them, so the others keep their order)."""
    out: list[FlatRecord] = []
    pair, slow = attribute.pair, attribute.attributes
    for rl in request.resource_logs:
        resource = attrs_from_proto(rl.resource.attributes, notes, 0, resource_keys)
        for sl in rl.scope_logs:
            scope = _scope(sl.scope.name, sl.scope.version)
            for lr in sl.log_records:
                raw = lr.attributes[:]
                attributes = dict(map(pair, raw, _MISSES))
                if _MISS in attributes:
                    attributes = slow(raw, notes)
                elif SKIP in attributes:
                    del attributes[SKIP]
                out.append(_log_record(lr, resource, attributes, scope, notes, extras))
    return out


_MISS = object()
"""The key of :data:`_MISSES`' pair: an attribute the memo does not have."""
_MISSES = itertools.repeat((_MISS, None))
"""``dict.get``'s default for every attribute (:func:`records_from_raw`)."""
