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
Its 200 answers carry ``AEP-Proof: HMAC-SHA256(token, "aep-hook-daemon-v1\\n{id}")``
(:func:`proof`), which the shim checks before it waits on a hold or prints a
decision; a listener that cannot prove itself gets nothing printed and the
moment spooled. A squatter sees a MAC of one moment, never the token: it can
neither answer as the daemon nor make another request the daemon accepts.

Bearer tokens stay accepted on the hook paths (Claude Code's own ``http``
hooks send the configured header; that transport has no such proof)."""
from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from typing import Iterable

__all__ = ["SCHEME", "WINDOW_S", "SEEN_MAX", "DIGEST_HEADER", "PROOF_HEADER", "request_mac",
           "proof", "body_digest", "body_matches", "SignedRequests", "SIGNED_KEY"]

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


def proof(token: str, hook_id: str) -> str:
    """The daemon's answer proof (hex) for the request ``hook_id``."""
    msg = f"aep-hook-daemon-v1\n{hook_id}".encode("utf-8", "surrogateescape")
    return hmac.new(_key(token), msg, hashlib.sha256).hexdigest()


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
        fresh, unseen MAC over a well-formed request); else ``None``.
        Remembers the MAC (a replay within the window is refused)."""
        auth = hook_id = digest = None
        for k, v in headers:
            k = k.lower()
            if k == b"authorization":
                auth = v.decode("latin-1")
            elif k == b"x-aep-hook-id":
                hook_id = v.decode("latin-1")
            elif k == DIGEST_HEADER:
                digest = v.decode("latin-1")
        if auth is None or hook_id is None or digest is None:
            return None
        scheme, _, cred = auth.partition(" ")
        t_text, _, mac = cred.strip().partition(":")
        if scheme != SCHEME or not t_text.isdigit() or len(t_text) > 12 or len(mac) != 64:
            return None
        if len(hook_id) > 128 or len(digest) != 64:
            return None
        now, t = self._clock(), int(t_text)
        if abs(now - t) > self.window_s:
            return None
        want = request_mac(self._token, t, hook_id, path, digest)
        if not hmac.compare_digest(want, mac.lower()):
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

    def proof(self, hook_id: str) -> str:
        """:func:`proof` with this token."""
        return proof(self._token, hook_id)


def body_matches(headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bool:
    """Whether ``body`` is what ``X-AEP-Hook-Digest`` in ``headers`` names."""
    for k, v in headers:
        if k.lower() == DIGEST_HEADER:
            return hmac.compare_digest(v.decode("latin-1").lower(), body_digest(body))
    return False
