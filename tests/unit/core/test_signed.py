"""Signed hook requests (bridges/core/signed.py): the shim's own HMAC equals
the standard library's, and the daemon's check refuses what a squatter or a
replay could send (a fifth outside attack on issue 25)."""
from __future__ import annotations

import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.core import signed
from bridges.hooks_common import shim

TOKEN = "tok-" + "x" * 40
PATH = "/hooks/claude-code"
HOOK = "0123456789abcdef0123456789abcdef"


@settings(max_examples=300)
@given(st.text(min_size=1, max_size=200), st.text(max_size=300))
def test_the_shims_hmac_is_rfc_2104(token, msg):
    want = hmac.new(token.encode(), msg.encode("utf-8", "surrogateescape"),
                    hashlib.sha256).hexdigest()
    assert shim._hmac(token, msg) == want


def _headers(t: int, mac: str | None = None, *, token: str = TOKEN, body: bytes = b"{}",
             path: str = PATH, hook: str = HOOK) -> list[tuple[bytes, bytes]]:
    digest = signed.body_digest(body)
    mac = mac or signed.request_mac(token, t, hook, path, digest)
    return [(b"x-aep-hook-id", hook.encode()), (b"x-aep-hook-digest", digest.encode()),
            (b"authorization", f"AEP-HMAC-SHA256 {t}:{mac}".encode())]


def test_a_fresh_signed_request_is_taken_once():
    now = [1_000_000.0]
    check = signed.SignedRequests(TOKEN, clock=lambda: now[0])
    hs = _headers(1_000_000)
    assert check.verify(hs, PATH) == HOOK
    assert check.verify(hs, PATH) is None  # a replay within the window
    answer = check.answer(HOOK)
    assert answer.head(200, "5000") == (b"aep-proof", shim._hmac(
        TOKEN, f"aep-hook-daemon-v2\n{HOOK}\n200\n5000").encode())
    assert answer.head(200) != answer.head(400) != answer.head(200, "1")
    proof, _, decision = answer.body(b'{"a":1}').partition(b"\n")
    assert decision == b'{"a":1}'
    assert proof.decode() == shim._hmac(TOKEN, f"aep-hook-answer-v1\n{HOOK}\n".encode() + decision)
    assert signed.body_matches(hs, b"{}") and not signed.body_matches(hs, b'{"a":1}')


def test_what_is_refused():
    now = 1_000_000
    check = signed.SignedRequests(TOKEN, clock=lambda: float(now))
    assert check.verify(_headers(now, token="another"), PATH) is None  # not our token
    assert check.verify(_headers(now - 121), PATH) is None  # too old
    assert check.verify(_headers(now + 121), PATH) is None  # from the future
    assert check.verify(_headers(now, path="/hooks/codex"), PATH) is None  # another path
    assert check.verify(_headers(now, "0" * 64), PATH) is None  # a made-up MAC
    assert check.verify(_headers(now)[:2], PATH) is None  # no Authorization
    bearer = [(b"authorization", f"Bearer {TOKEN}".encode()), *_headers(now)[:2]]
    assert check.verify(bearer, PATH) is None  # bearer is the guard's other path, not this
    assert check.verify(_headers(now, hook="h" * 129), PATH) is None
    assert check.verify(_headers(now, hook=""), PATH) is None


def test_one_captured_request_makes_nothing_else():
    """A sixth outside attack: one signed request a squatter captured became any number
    of moments with any bodies: the MAC's upper-cased copies were fresh, a second digest
    header and a second hook id header were each read by a different check, a spooled
    mark chose the moment's time, a superscript digit in the time was a 500."""
    now = 1_000_000
    check = signed.SignedRequests(TOKEN, clock=lambda: float(now))
    good = _headers(now)
    auth = good[2][1].decode()
    upper = [*good[:2], (b"authorization", (auth[:-64] + auth[-64:].upper()).encode())]
    assert check.verify(upper, PATH) is None
    other_digest = (b"x-aep-hook-digest", signed.body_digest(b'{"evil":1}').encode())
    assert check.verify([other_digest, *good], PATH) is None
    assert not signed.body_matches([other_digest, *good], b'{"evil":1}')
    assert check.verify([(b"x-aep-hook-id", b"f" * 32), *good], PATH) is None
    assert check.verify([*good, good[2]], PATH) is None
    assert check.verify([*good, (b"x-aep-hook-spooled", b"1")], PATH) is None
    sup = [*good[:2], (b"authorization", b"AEP-HMAC-SHA256 \xb2:" + b"0" * 64)]  # latin-1 '²'
    assert "\xb2".isdigit()  # what the old check let through to int()
    assert check.verify(sup, PATH) is None  # refused, not an exception
    assert check.verify(good, PATH) == HOOK  # and the real one, once
    assert check.verify(good, PATH) is None
    assert check.verify(_headers(now - 120), PATH) == HOOK  # the window's edge


def test_the_replay_memory_is_bounded_and_forgets_what_expired():
    now = [0.0]
    check = signed.SignedRequests(TOKEN, clock=lambda: now[0], seen_max=4)
    for i in range(10):
        assert check.verify(_headers(0, hook=f"{i:032x}"), PATH) == f"{i:032x}"
    assert len(check._seen) == 4
    now[0] = 500.0
    assert check.verify(_headers(500, hook="f" * 32), PATH) == "f" * 32
    assert len(check._seen) == 1  # the expired ones went
