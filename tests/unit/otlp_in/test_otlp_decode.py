"""Body decoding of the OTLP/HTTP receiver without sockets: content types,
content encodings, capped gzip inflation (bombs), undecodable payloads
(OTLP spec "OTLP/HTTP": 400 / 413 / 415)."""
from __future__ import annotations

import gzip
import json
import zlib

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from bridges.otlp_in.decode import decode_http_body, gunzip_capped
from bridges.otlp_in.status import Accepted, BadRequest, response_message

LIMIT = 64 * 1024


def _bomb(size: int) -> bytes:
    # zeros compress ~1000:1: a 4 MiB target is a ~4 KiB body
    co = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\x00" * (1 << 20)
    out = bytearray()
    for _ in range(size >> 20):
        out += co.compress(chunk)
    return bytes(out + co.flush())


def test_gunzip_roundtrip_and_multi_member():
    assert gunzip_capped(gzip.compress(b"abc"), LIMIT) == b"abc"
    assert gunzip_capped(gzip.compress(b"ab") + gzip.compress(b"cd"), LIMIT) == b"abcd"


def test_gzip_bomb_is_refused_without_inflating_it_all():
    bomb = _bomb(1 << 28)  # 256 MiB of zeros
    assert len(bomb) < 2 * 1024 * 1024
    with pytest.raises(BadRequest) as e:
        gunzip_capped(bomb, LIMIT)
    assert e.value.status == 413 and e.value.counter == "otlp.too_large"


def test_gzip_bomb_spread_over_members_is_refused():
    member = gzip.compress(b"\x00" * (LIMIT // 2 + 1))
    with pytest.raises(BadRequest) as e:
        gunzip_capped(member + member, LIMIT)
    assert e.value.status == 413


# mtime=0: the bodies (and so the test ids) the same in every process (pytest-xdist)
@pytest.mark.parametrize("body", [b"\x1f\x8b\x08\x00garbage", gzip.compress(b"x" * 100, mtime=0)[:-9],
                                  b"plain, not gzip", gzip.compress(b"ok", mtime=0) + b"junk"])
def test_corrupt_or_truncated_gzip_is_400(body):
    with pytest.raises(BadRequest) as e:
        gunzip_capped(body, LIMIT)
    assert e.value.status == 400


@pytest.mark.parametrize("ctype,status", [
    (None, 415), ("text/plain", 415), ("application/grpc", 415), ("application/xml", 415),
    ("multipart/form-data; boundary=x", 415),
])
def test_unsupported_content_types(ctype, status):
    with pytest.raises(BadRequest) as e:
        decode_http_body(ctype, None, b"{}", LIMIT, [])
    assert e.value.status == status and e.value.counter == "otlp.unsupported_media_type"


@pytest.mark.parametrize("enc", ["br", "deflate", "zstd", "gzip, br"])
def test_unsupported_content_encodings(enc):
    with pytest.raises(BadRequest) as e:
        decode_http_body("application/json", enc, b"{}", LIMIT, [])
    assert e.value.status == 415 and e.value.counter == "otlp.unsupported_encoding"


def test_accepted_media_types_and_parameters():
    assert decode_http_body("application/json; charset=utf-8", None, b"{}", LIMIT, []) == (True, [])
    assert decode_http_body("Application/X-Protobuf", "identity", b"", LIMIT, []) == (False, [])
    assert decode_http_body("application/protobuf", "GZIP", gzip.compress(b""), LIMIT, []) == \
        (False, [])


@pytest.mark.parametrize("ctype,body", [
    ("application/x-protobuf", b"garbage bytes \x00\xff\xfe"),
    ("application/x-protobuf", b"\x0a\xff"),  # a length prefix running past the end
    ("application/json", b"{not json"),
    ("application/json", b"\xff\xfe\x00"),
    ("application/json", b"[" * 100_000),  # recursion bomb for the JSON parser
    ("application/json", b'["a", "list"]'),
    ("application/json", b'{"resourceLogs": {"not": "a list"}}'),
])
def test_undecodable_payloads_are_400(ctype, body):
    with pytest.raises(BadRequest) as e:
        decode_http_body(ctype, None, body, LIMIT, [])
    assert e.value.status == 400 and e.value.counter == "otlp.undecodable"


def test_truncated_protobuf_is_400():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    req = ExportLogsServiceRequest()
    lr = req.resource_logs.add().scope_logs.add().log_records.add()
    lr.attributes.append(KeyValue(key="event.name", value=AnyValue(string_value="codex.x" * 20)))
    raw = req.SerializeToString()
    assert decode_http_body("application/x-protobuf", None, raw, LIMIT, [])[1]
    with pytest.raises(BadRequest) as e:
        decode_http_body("application/x-protobuf", None, raw[:-7], LIMIT, [])
    assert e.value.status == 400


def test_inflated_size_limit_applies_to_gzip_bodies():
    body = json.dumps({"pad": "x" * LIMIT}).encode()
    with pytest.raises(BadRequest) as e:
        decode_http_body("application/json", "gzip", gzip.compress(body), LIMIT, [])
    assert e.value.status == 413


def test_response_message_partial_success():
    assert response_message(Accepted()).SerializeToString() == b""
    resp = response_message(Accepted(2, "2 LogRecords rejected: no session key"))
    assert resp.partial_success.rejected_log_records == 2
    assert resp.partial_success.error_message == "2 LogRecords rejected: no session key"


def _empty_records(n: int) -> bytes:
    """An export request of ``n`` empty LogRecords (2 bytes each on the wire)."""
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
        log_records=[LogRecord() for _ in range(n)])])]).SerializeToString()


@pytest.mark.parametrize("path", ["protobuf", "raw protobuf", "json"])
def test_an_export_of_too_many_records_is_refused_before_any_is_read(path, monkeypatch):
    """A twelfth outside attack on issue 25: 2,000,000 empty LogRecords in one
    4 MB protobuf export were read one by one in a decoding thread whose GIL
    held the event loop 1.3-7 s, and gated hooks failed open. Past MAX_RECORDS
    the request is refused whole (413), before any record is read."""
    from bridges.otlp_in import decode, flatten, rawattrs
    from bridges.otlp_in.decode import MAX_RECORDS, ProtoDecoder
    read: list[int] = []
    for mod, name in ((flatten, "records_from_proto"), (rawattrs, "records_from_raw"),
                      (flatten, "records_from_json")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, **k: read.append(1) or _real(*a, **k))
    over = MAX_RECORDS + 1
    if path == "json":
        body = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{}] * (over * 2)}]}]})
        call = lambda: decode_http_body("application/json", None, body.encode(), 1 << 26, [])  # noqa: E731
    elif path == "protobuf":
        call = lambda: decode.decode_proto(_empty_records(over), [])  # noqa: E731
    else:
        call = lambda: ProtoDecoder()(_empty_records(over), [])  # noqa: E731
    with pytest.raises(BadRequest) as e:
        call()
    assert e.value.status == (400 if path == "json" else 413) and not read
    # at the cap: read, every record
    assert len(decode.decode_proto(_empty_records(MAX_RECORDS), [])) == MAX_RECORDS
    assert len(ProtoDecoder()(_empty_records(MAX_RECORDS), [])) == MAX_RECORDS


@pytest.mark.parametrize("shape", ["resources", "scopes", "attributes"])
@pytest.mark.parametrize("raw", [False, True], ids=["protobuf", "raw protobuf"])
def test_an_export_of_too_many_items_is_refused_before_any_is_read(shape, raw, monkeypatch):
    """A thirteenth outside attack: 2,000,000 empty ResourceLogs (no record, so
    the record cap never fired) took 5-7 s of a decoding thread, and two such
    senders kept every legitimate export waiting; 400,000 attribute keys in one
    record 2.7 s. Past MAX_ITEMS the request is refused (413) before the walk."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

    from bridges.otlp_in import flatten, rawattrs
    from bridges.otlp_in.decode import MAX_ITEMS, ProtoDecoder, decode_proto
    read: list[int] = []
    for mod, name in ((flatten, "records_from_proto"), (rawattrs, "records_from_raw")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, **k: read.append(1) or _real(*a, **k))
    over = MAX_ITEMS + 1
    if shape == "resources":
        req = ExportLogsServiceRequest(resource_logs=[ResourceLogs() for _ in range(over)])
    elif shape == "scopes":
        req = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
            scope_logs=[ScopeLogs() for _ in range(over)])])
    else:
        attrs = [KeyValue(key=f"k{i}", value=AnyValue(int_value=i)) for i in range(over)]
        req = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
            log_records=[LogRecord(attributes=attrs)])])])
    body = req.SerializeToString()
    with pytest.raises(BadRequest) as e:
        ProtoDecoder()(body, []) if raw else decode_proto(body, [])
    assert e.value.status == 413 and not read
