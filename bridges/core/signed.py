"""Signed hook requests: the command shim and the daemon prove to each other
that each holds ``AEP_TOKEN`` without the token crossing the socket (issue 25,
a fifth outside attack: while the daemon was down, any local process bound to
its port received ``Authorization: Bearer <AEP_TOKEN>`` from the shim and
answered decisions the agent obeyed).

The request (``bridges/hooks_common/shim.py`` makes it with its own copy of
HMAC-SHA256, being unable to import :mod:`hmac` on its fast path; a test pins
the two equal):

- ``X-AEP-Hook-Id: <id>`` (random, 32 hex digits, also the dedupe key),
  ``X-AEP-Hook-Digest: <sha256 of the body, hex>``,
- ``Authorization: AEP-HMAC-SHA256 <unix seconds>:<mac>``, where ``mac`` is
  ``HMAC-SHA256(token, "aep-hook-v1\\n{t}\\n{id}\\n{path}\\n{digest}")`` in hex.

The daemon (:func:`verify`) accepts it when the MAC matches, ``t`` is within
:data:`WINDOW_S` of its clock and the MAC was not seen before (a bounded
memory of :data:`SEEN_MAX` MACs, each kept for the window); the body is then
checked against the digest (:func:`body_matches`) before anything reads it.
The request must carry each of those headers once and no
``X-AEP-Hook-Spooled`` (the shim never sends one; a replay must not choose its
moment's time), with the MAC and digest as 64 lower-case hex digits and the
time as ASCII digits (a sixth outside attack: a MAC's upper-cased copy, a
second digest or hook id header, each read by a different check, made one
captured request into any number of moments with any bodies).

Its answers carry ``AEP-Proof: HMAC-SHA256(token, "aep-hook-daemon-v2\\n{id}\\n
{status}\\n{AEP-Hold-Ms or empty}")`` (:meth:`SignedAnswer.head`), which the
shim checks before it waits on a hold or reads a body, and a 200 body is
``<HMAC-SHA256(token, "aep-hook-answer-v1\\n{id}\\n" + decision), hex>\\n<decision>``
(:meth:`SignedAnswer.body`), checked before the decision is printed: a
listener that cannot prove itself gets nothing printed and the moment
spooled, and one between the shim and the daemon can neither change the
decision nor stretch the hold. A squatter sees a MAC of one moment, never the
token: it can neither answer as the daemon nor make another request the
daemon accepts.

Bearer tokens stay accepted on the hook paths (Claude Code's own ``http``
hooks send the configured header; that transport has no such proof)."""
from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from typing import Iterable

__all__ = ["SCHEME", "WINDOW_S", "SEEN_MAX", "DIGEST_HEADER", "PROOF_HEADER", "request_mac",
           "head_proof", "body_proof", "body_digest", "body_matches", "SignedRequests",
           "SignedAnswer", "SIGNED_KEY"]

#: the ``Authorization`` scheme of a signed request
SCHEME = "AEP-HMAC-SHA256"
#: seconds a signed request's time may differ from the daemon's clock
WINDOW_S = 120.0
#: MACs remembered to refuse a replay within the window
SEEN_MAX = 65536
DIGEST_HEADER = b"x-aep-hook-digest"
PROOF_HEADER = b"aep-proof"
#: the ASGI scope key under which the daemon's guard leaves a verified
#: request's ``(hook id, proof)`` for the hook endpoint
SIGNED_KEY = "aep.signed"


def _key(token: str) -> bytes:
    return token.encode("utf-8")


def request_mac(token: str, t: int, hook_id: str, path: str, digest: str) -> str:
    """The request's MAC (hex) over its time ``t`` (Unix seconds), hook id,
    request path and body digest (see the module docstring)."""
    msg = f"aep-hook-v1\n{t}\n{hook_id}\n{path}\n{digest}".encode("utf-8", "surrogateescape")
    return hmac.new(_key(token), msg, hashlib.sha256).hexdigest()


def head_proof(token: str, hook_id: str, status: int, hold_ms: str = "") -> str:
    """The daemon's ``AEP-Proof`` (hex) for its answer to ``hook_id``: the
    status and the ``AEP-Hold-Ms`` value it sends (``""`` without one)."""
    msg = f"aep-hook-daemon-v2\n{hook_id}\n{status}\n{hold_ms}".encode("utf-8", "surrogateescape")
    return hmac.new(_key(token), msg, hashlib.sha256).hexdigest()


def body_proof(token: str, hook_id: str, decision: bytes) -> str:
    """The proof (hex) the daemon puts on the line before ``decision``."""
    msg = f"aep-hook-answer-v1\n{hook_id}\n".encode("utf-8", "surrogateescape") + decision
    return hmac.new(_key(token), msg, hashlib.sha256).hexdigest()


class SignedAnswer:
    """How the daemon proves its answer to one signed request (the hook
    endpoint's view of it, left in the scope under :data:`SIGNED_KEY`)."""

    def __init__(self, token: str, hook_id: str) -> None:
        self._token = token
        self.hook_id = hook_id

    def head(self, status: int, hold_ms: str = "") -> tuple[bytes, bytes]:
        """The ``AEP-Proof`` header for a response start of ``status``."""
        return (PROOF_HEADER, head_proof(self._token, self.hook_id, status, hold_ms).encode())

    def body(self, decision: bytes) -> bytes:
        """``decision`` with its proof line in front (see the module docstring)."""
        return body_proof(self._token, self.hook_id, decision).encode() + b"\n" + decision


def body_digest(body: bytes) -> str:
    """SHA-256 of ``body``, hex (``X-AEP-Hook-Digest``)."""
    return hashlib.sha256(body).hexdigest()


class SignedRequests:
    """The daemon's check of signed requests for one token (see the module
    docstring). ``clock``: seconds since the epoch (tests pass their own)."""

    def __init__(self, token: str, *, clock=time.time, window_s: float = WINDOW_S,
                 seen_max: int = SEEN_MAX) -> None:
        self._token = token
        self._clock = clock
        self.window_s = window_s
        self.seen_max = seen_max
        self._seen: OrderedDict[str, float] = OrderedDict()

    def verify(self, headers: Iterable[tuple[bytes, bytes]], path: str) -> str | None:
        """The request's hook id when ``headers`` sign it for ``path`` (a
        fresh, unseen MAC over a well-formed request: each signed header
        once, no ``X-AEP-Hook-Spooled``); else ``None``. Remembers the MAC
        (a replay within the window is refused)."""
        seen: dict[bytes, list[str]] = {}
        for k, v in headers:
            k = k.lower()
            if k in _SIGNED_HEADERS:
                seen.setdefault(k, []).append(v.decode("latin-1"))
        if b"x-aep-hook-spooled" in seen or any(len(seen.get(k, ())) != 1 for k in _ONCE):
            return None
        (auth,), (hook_id,), (digest,) = (seen[k] for k in _ONCE)
        scheme, _, cred = auth.partition(" ")
        t_text, _, mac = cred.strip().partition(":")
        if scheme != SCHEME or not (t_text.isascii() and t_text.isdigit()) or len(t_text) > 12:
            return None
        if not (_hex64(mac) and _hex64(digest)) or not 0 < len(hook_id) <= 128:
            return None
        now, t = self._clock(), int(t_text)
        if abs(now - t) > self.window_s:
            return None
        want = request_mac(self._token, t, hook_id, path, digest)
        if not hmac.compare_digest(want, mac):
            return None
        self._forget(now)
        if mac in self._seen:
            return None
        self._seen[mac] = max(now, t) + self.window_s  # until the MAC itself expires
        while len(self._seen) > self.seen_max:
            self._seen.popitem(last=False)
        return hook_id

    def _forget(self, now: float) -> None:
        while self._seen:
            mac, until = next(iter(self._seen.items()))
            if until > now:
                return
            del self._seen[mac]

    def answer(self, hook_id: str) -> SignedAnswer:
        """The proofs of the daemon's answer to ``hook_id``."""
        return SignedAnswer(self._token, hook_id)


#: the signed request's headers, each taken once
_ONCE = (b"authorization", b"x-aep-hook-id", DIGEST_HEADER)
_SIGNED_HEADERS = frozenset((*_ONCE, b"x-aep-hook-spooled"))
_HEX = frozenset("0123456789abcdef")


def _hex64(text: str) -> bool:
    """64 lower-case hex digits (a SHA-256 in the one spelling that is signed)."""
    return len(text) == 64 and _HEX.issuperset(text)


def body_matches(headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bool:
    """Whether ``body`` is what the one ``X-AEP-Hook-Digest`` in ``headers``
    names (two of them: never)."""
    digests = [v.decode("latin-1") for k, v in headers if k.lower() == DIGEST_HEADER]
    return len(digests) == 1 and hmac.compare_digest(digests[0], body_digest(body))
