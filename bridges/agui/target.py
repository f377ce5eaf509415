"""Where the tee proxy sends a request: the upstream is fixed by
configuration, the request target only supplies a path below its prefix.

Issue 25 row 1: appending the request target to ``AEP_AGUI_UPSTREAM`` as
text let ``@127.0.0.1:PORT/x`` become the URL's authority (another local
port, with the upstream's userinfo sent along as ``Authorization: Basic``),
and ``/../`` climb above the upstream's path prefix. Here:

- :class:`Upstream` splits ``AEP_AGUI_UPSTREAM`` once into the scheme, host
  and port (an ``httpx.URL`` without userinfo), the path prefix and the
  credentials (``httpx.BasicAuth``, sent only with requests built on that
  URL; redirects are never followed). Nothing of a request can change the
  first three; :attr:`Upstream.shown` is the URL without its userinfo, the
  only form logged, put in ``/healthz`` or told to the UI.
- :func:`forward_path` turns the request target's path into the path under
  the prefix: origin-form only (a target not starting with ``/``: the
  absolute form, ``*``, ``@host:port/x``, is refused), dot segments removed
  (RFC 3986 §5.2.4), a ``..`` that would climb above the prefix refused;
  ``%2e`` counts as ``.`` whatever its case, and a dot segment hidden behind
  an encoded separator (``..%2f``, ``..%5c``, ``..\\``) or a second
  encoding (``%252e%252e``) is refused outright: some servers decode those
  before routing. Every other segment is forwarded byte for byte.

Pure: no I/O. Errors: :class:`BadTarget` (the proxy answers ``400``).
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

import httpx

_SEPARATORS = re.compile(rb"[/\\]")
_DOTS = (b".", b"..")
_MAX_DECODES = 4


class BadTarget(ValueError):
    """A request target that cannot be forwarded below the upstream's prefix
    (the message names the rule, never the target's bytes)."""


def shown_url(url: str) -> str:
    """``url`` with any userinfo replaced by ``***`` (safe to log and to put
    in a problem line); the URL as given when it has none or cannot be
    parsed as one (``<unparsable url>`` for a parse error)."""
    try:
        p = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if "@" not in p.netloc:
        return url
    return urllib.parse.urlunsplit(p._replace(netloc="***@" + p.netloc.rpartition("@")[2]))


@dataclass(frozen=True)
class Upstream:
    """``AEP_AGUI_UPSTREAM`` split once. ``origin``: scheme, host and port
    (path ``/``, no userinfo); ``prefix``: the path without its trailing
    slash (``b""`` for none); ``auth``: the userinfo as Basic credentials
    (``None`` without); ``shown``: the URL without userinfo. Raises
    ``httpx.InvalidURL`` for a URL httpx cannot parse."""

    origin: httpx.URL
    prefix: bytes
    auth: httpx.BasicAuth | None
    shown: str

    @classmethod
    def parse(cls, url: str) -> "Upstream":
        u = httpx.URL(url.rstrip("/"))
        auth = None
        if u.userinfo:
            auth = httpx.BasicAuth(u.username, u.password)
        origin = u.copy_with(userinfo=b"", raw_path=b"/")
        return cls(origin, u.raw_path.split(b"?", 1)[0].rstrip(b"/"), auth, shown_url(url))

    def url(self, raw_path: bytes, query: bytes = b"") -> httpx.URL:
        """The upstream URL for a request target's path and query: the
        prefix, then :func:`forward_path` of ``raw_path``, then ``query``
        as sent. Raises :class:`BadTarget`, or ``httpx.InvalidURL`` for a
        query httpx refuses."""
        path = self.prefix + forward_path(raw_path)
        return self.origin.copy_with(raw_path=path + (b"?" + query if query else b""))

    def probe_url(self) -> httpx.URL:
        """The upstream's base (``prefix/``), for the reachability probe."""
        return self.origin.copy_with(raw_path=self.prefix + b"/")


def _decoded(segment: bytes) -> bytes:
    """``segment`` percent-decoded until it no longer changes (bounded)."""
    for _ in range(_MAX_DECODES):
        once = urllib.parse.unquote_to_bytes(segment)
        if once == segment:
            break
        segment = once
    return segment


def forward_path(raw_path: bytes) -> bytes:
    """The request target's path (``raw_path``, bytes before any ``?``)
    with its dot segments removed, as it goes below the upstream's prefix
    (always starting with ``/``). Raises :class:`BadTarget` for a target
    not in origin form, a ``..`` climbing above the prefix, or a dot
    segment behind an encoded separator or a second encoding."""
    if not raw_path.startswith(b"/"):
        raise BadTarget("the request target is not a path (origin form)")
    kept: list[bytes] = []
    segments = raw_path[1:].split(b"/")
    for i, seg in enumerate(segments):
        once = urllib.parse.unquote_to_bytes(seg)
        if once in _DOTS:
            if once == b"..":
                if not kept:
                    raise BadTarget("the path climbs above the upstream's path prefix")
                kept.pop()
            if i == len(segments) - 1:
                kept.append(b"")  # "/a/." and "/a/b/.." end with a slash (RFC 3986 §5.2.4)
            continue
        if any(p in _DOTS for p in _SEPARATORS.split(_decoded(seg))):
            raise BadTarget("a dot segment behind an encoded separator or a second encoding")
        kept.append(seg)
    return b"/" + b"/".join(kept)
