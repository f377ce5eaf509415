"""tests/conftest.py hands every default httpx client of a test process
one SSL context (issue 29: a new one per ``httpx.get`` parsed certifi's
bundle, ~23 ms of CPU, on every poll of a loopback daemon)."""
from __future__ import annotations

import ssl

import httpx


def _context(client: httpx.Client | httpx.AsyncClient) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[union-attr]


def test_default_clients_share_one_context_and_others_get_their_own():
    with httpx.Client() as a, httpx.Client() as b, httpx.Client(trust_env=False) as c, \
            httpx.Client(trust_env=False) as d:
        assert _context(a) is _context(b) and _context(c) is _context(d)
        assert _context(a).verify_mode == ssl.CERT_REQUIRED and _context(a).check_hostname
    unverified = httpx.Client(verify=False)
    assert _context(unverified) is not _context(a)
    assert _context(unverified).verify_mode == ssl.CERT_NONE
    own = ssl.create_default_context()
    assert _context(httpx.AsyncClient(verify=own)) is own
