"""Issue 25 re-attack: the AG-UI proxy's request headers.

A UI request carrying both ``Content-Length`` and ``Transfer-Encoding:
chunked`` (h11 takes the chunked framing) had its ``Content-Length``
forwarded beside a body of another size: httpx refused to send it, the UI
got ``500`` and the daemon logged a 5 KB traceback per request, without
any authentication (one 150-byte request each). An intermediary removes
``Content-Length`` when ``Transfer-Encoding`` frames the body (RFC 9112
§6.3)."""
from __future__ import annotations

import pytest

from bridges.agui.proxy import forward_headers


@pytest.mark.parametrize("te", [b"chunked", b"Chunked", b"gzip, chunked"])
def test_content_length_is_dropped_when_transfer_encoding_frames_the_body(te):
    out = forward_headers([(b"Content-Length", b"4"), (b"Transfer-Encoding", te),
                           (b"X-Keep", b"1")], drop_host=True)
    assert [k.lower() for k, _ in out] == [b"x-keep"]


def test_content_length_alone_is_kept():
    out = forward_headers([(b"content-length", b"4")], drop_host=True)
    assert out == [(b"content-length", b"4")]
