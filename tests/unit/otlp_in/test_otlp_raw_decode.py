"""The receivers' protobuf decoder (:class:`~bridges.otlp_in.decode.ProtoDecoder`:
the raw-attribute schema, the hand-read canonical ``KeyValue`` shapes and
the memo) against the reference :func:`~bridges.otlp_in.decode.decode_proto`
over the real schema: the same records, the same notes, the same refusals,
on the real Codex captures, on generated requests (every ``AnyValue`` kind,
repeated keys, unread keys), on generated ``KeyValue`` bytes (canonical,
non-canonical and corrupt, invalid UTF-8), and with the memo warm, cold
and full."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from bridges.otlp_in import rawattrs
from bridges.otlp_in.decode import ALL, ProtoDecoder, Reads, decode_http_body, decode_proto
from bridges.otlp_in.profiles import PROFILES
from bridges.otlp_in.status import BadRequest

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "codex_otel_real"
CODEX = Reads(PROFILES["codex"].reads, PROFILES["codex"].resource_reads,
              PROFILES["codex"].fields)


def _outcome(decode, body: bytes):
    """``(records, notes)``, or the refusal's status and counter."""
    notes: list[str] = []
    try:
        return decode(body, notes), notes
    except BadRequest as e:
        return ("refused", e.status, e.counter)


def _same(body: bytes, reads: Reads, decoder: ProtoDecoder | None = None) -> object:
    want = _outcome(lambda b, n: decode_proto(b, n, reads), body)
    got = _outcome(decoder or ProtoDecoder(reads), body)
    assert got == want
    return want


@pytest.mark.parametrize("path", sorted(REAL.glob("*/export-*.pb")), ids=lambda p: p.parent.name)
@pytest.mark.parametrize("reads", [ALL, CODEX], ids=["all", "codex"])
def test_real_codex_exports_decode_the_same(path, reads):
    body = path.read_bytes()
    decoder = ProtoDecoder(reads)
    records, _ = _same(body, reads, decoder)
    assert records  # a real export has records
    _same(body, reads, decoder)  # again, from a warm memo


def test_http_bodies_use_the_decoder_given():
    body = next(REAL.glob("otlp-http-protobuf/export-*.pb")).read_bytes()
    calls = []

    class Counting(ProtoDecoder):
        def __call__(self, body, notes):
            calls.append(len(body))
            return super().__call__(body, notes)

    got = decode_http_body("application/x-protobuf", None, body, 1 << 24, [], CODEX,
                           decoder=Counting(CODEX))
    assert got == decode_http_body("application/x-protobuf", None, body, 1 << 24, [], CODEX)
    assert calls == [len(body)]


# --------------------------------------------------------------------------- generated requests

_text = st.text(max_size=20) | st.sampled_from(["", "codex.sse_event", "x" * 200, "é€😀"])
_leaf = st.one_of(
    _text.map(lambda s: AnyValue(string_value=s)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.integers(-2 ** 63, 2 ** 63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.floats().map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
    st.just(AnyValue()))


def _array(values: list[AnyValue]) -> AnyValue:
    v = AnyValue()
    v.array_value.values.extend(values)
    return v


def _kvlist(items: list[tuple[str, AnyValue]]) -> AnyValue:
    v = AnyValue()
    for k, x in items:
        v.kvlist_value.values.add(key=k).value.CopyFrom(x)
    return v


_any = st.recursive(_leaf, lambda c: st.lists(c, max_size=3).map(_array)
                    | st.lists(st.tuples(st.text(max_size=4), c), max_size=3).map(_kvlist),
                    max_leaves=8)
_key = st.sampled_from(sorted(CODEX.attributes) + ["app.version", "slug", ""]) | st.text(max_size=6)


@st.composite
def requests(draw) -> bytes:
    req = ExportLogsServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        rl = req.resource_logs.add()
        for k, v in draw(st.lists(st.tuples(_key, _any), max_size=3)):
            rl.resource.attributes.add(key=k).value.CopyFrom(v)
        for _ in range(draw(st.integers(0, 2))):
            sl = rl.scope_logs.add()
            sl.scope.name = draw(st.sampled_from(["", "codex_otel"]))
            for _ in range(draw(st.integers(0, 3))):
                lr = sl.log_records.add()
                for k, v in draw(st.lists(st.tuples(_key, _any), max_size=6)):
                    lr.attributes.add(key=k).value.CopyFrom(v)
                lr.event_name = draw(st.sampled_from(["", "codex.tool_result"]))
                lr.time_unix_nano = draw(st.sampled_from([0, 1_764_500_000_000_000_000]))
                lr.severity_number = draw(st.sampled_from([0, 9]))
                if draw(st.booleans()):
                    lr.body.CopyFrom(draw(_any))
    return req.SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=requests(), reads=st.sampled_from([ALL, CODEX]))
def test_generated_requests_decode_the_same(body, reads):
    decoder = ProtoDecoder(reads, memo=4)  # small: the memo fills and is forgotten mid-request
    _same(body, reads, decoder)
    _same(body, reads, decoder)


# --------------------------------------------------------------------------- KeyValue bytes

def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


def _in_request(kv: bytes, key2: bytes | None = None) -> bytes:
    """One LogRecord whose attributes are ``kv`` (raw bytes) and an event name."""
    record = _field(0x32, kv) + (_field(0x32, key2) if key2 else b"")
    return _field(0x0A, _field(0x12, _field(0x12, record)))


_utf8ish = st.one_of(st.text(max_size=140).map(str.encode), st.binary(max_size=12),
                     st.sampled_from([b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
                                      b"\xff", "é".encode()[:1]]))


@st.composite
def kv_bytes(draw) -> bytes:
    """KeyValue wire bytes: canonical shapes, their near misses and garbage."""
    key = draw(_utf8ish | st.sampled_from([b"event.name", b"conversation.id"]))
    kind = draw(st.sampled_from(["string", "bool", "int", "empty", "other", "raw"]))
    if kind == "string":
        value = _field(0x0A, draw(_utf8ish))
    elif kind == "bool":
        value = b"\x10" + draw(st.sampled_from([b"\x00", b"\x01", b"\x02", b"\x81\x00"]))
    elif kind == "int":
        value = b"\x18" + _varint(draw(st.integers(0, 2 ** 64 - 1)))
    elif kind == "empty":
        value = b""
    elif kind == "other":
        value = AnyValue(double_value=draw(st.floats())).SerializeToString()
    else:
        value = draw(st.binary(max_size=10))
    extra = draw(st.sampled_from([b"", b"", b"\x18\x05", b"\x0a\x01x"]))
    body = _field(0x0A, key) + _field(0x12, value + extra)
    if draw(st.booleans()):  # a non-canonical order or a repeated key
        body = draw(st.sampled_from([_field(0x12, value) + _field(0x0A, key),
                                     body + _field(0x0A, b"k2"), body[:-1], body + b"\x00"]))
    return body


@settings(max_examples=600, deadline=None)
@given(kv=kv_bytes(), reads=st.sampled_from([ALL, CODEX, Reads(frozenset({"k2"}), None)]))
def test_any_keyvalue_bytes_decode_the_same(kv, reads):
    body = _in_request(kv, kv)  # twice: the second from the memo
    decoder = ProtoDecoder(reads)
    _same(body, reads, decoder)
    _same(_in_request(kv), reads, decoder)


def test_the_canonical_shapes_take_the_fast_path():
    for value, want in ((AnyValue(string_value="codex.sse_event"), "codex.sse_event"),
                        (AnyValue(string_value="x" * 300), "x" * 300),
                        (AnyValue(string_value=""), ""),
                        (AnyValue(bool_value=True), True), (AnyValue(bool_value=False), False),
                        (AnyValue(int_value=412), 412), (AnyValue(int_value=2 ** 62), 2 ** 62)):
        kv = KeyValue(key="k", value=value).SerializeToString()
        assert rawattrs._kv_fast(kv) == ("k", want)
    # the rest is left to the real schema
    for value in (AnyValue(int_value=-1), AnyValue(double_value=1.5), AnyValue(),
                  AnyValue(bytes_value=b"x")):
        assert rawattrs._kv_fast(KeyValue(key="k", value=value).SerializeToString()) is None


def test_nesting_counts_as_deep_as_in_the_request():
    # protobuf's recursion limit: a value nested too deep for the request is
    # refused even though, parsed alone, its KeyValue would be deep enough
    outcomes = set()
    for depth in (30, 80, 92, 95, 96, 97, 98, 99, 100, 120):
        value = AnyValue(string_value="leaf").SerializeToString()
        for _ in range(depth):  # AnyValue.array_value (5) -> ArrayValue.values (1), as bytes
            value = _field(0x2A, _field(0x0A, value))
        kv = _field(0x0A, b"deep") + _field(0x12, value)
        outcomes.add(_same(_in_request(kv), ALL)[0] == "refused")
    assert outcomes == {True, False}  # both sides of the limit were crossed


def test_memo_keeps_only_scalars_and_stays_bounded():
    reader = rawattrs.AttributeReader(None, memo=3)
    nested = KeyValue(key="n", value=_array([AnyValue(string_value="a")])).SerializeToString()
    first = reader(nested)
    assert first[1] == ["a"] and reader.remembered(nested) is None  # mutable: not shared
    for i in range(10):
        kv = KeyValue(key=f"k{i}", value=AnyValue(string_value="v")).SerializeToString()
        assert reader(kv) == (f"k{i}", "v", ())
        assert reader.remembered(kv) == (f"k{i}", "v", ())
    assert len(reader._seen) <= 3  # noqa: SLF001 -- the bound is the point
    assert len(reader._pairs) <= 3  # noqa: SLF001 -- the pairs memo is bounded alike
    long = KeyValue(key="output", value=AnyValue(string_value="x" * rawattrs.MEMO_MAX_BYTES))
    assert reader(long.SerializeToString())[1] == "x" * rawattrs.MEMO_MAX_BYTES
    assert reader.remembered(long.SerializeToString()) is None  # long values are not kept


def test_a_memoized_verdict_that_notes_says_so_for_every_record():
    """An attribute whose value degrades with a note (a profiles-only
    ``string_value_strindex``: ``None``, noted) is noted for each record
    that carries it, the memo warm or cold: only verdicts that note nothing
    are taken as pairs (records_from_raw's dict(map(...)))."""
    deep = KeyValue(key="deep", value=AnyValue(string_value_strindex=3)).SerializeToString()
    plain = KeyValue(key="k", value=AnyValue(string_value="v")).SerializeToString()
    body = _field(0x0A, _field(0x12, _field(0x12, _field(0x32, plain) + _field(0x32, deep))
                               + _field(0x12, _field(0x32, deep) + _field(0x32, plain))))
    decoder = ProtoDecoder(ALL)
    for _ in range(3):
        records, notes = _same(body, ALL, decoder)
        assert notes == ["otlp.value_unexpected"] * 2
        assert records == [{"resource": {}, "attributes": {"k": "v", "deep": None}},
                           {"resource": {}, "attributes": {"deep": None, "k": "v"}}]
