"""The fleet's reserved sources (issue 25, fifth outside attack: posts in
fresh sessions under ``aep://{host}/agent/claude-code``, the Claude Code
bridge's agent-scoped source, were accepted; the owned-source rule held
only a source a live emitter had already used).

Every source at or under a fleet bridge's ``aep://{host}/agent/{agent}``
(its agent-scoped source, the one of ``agent.idle``, and its per-session
ones under ``/session/``) is the fleet's from the moment the bridge is
attached (:meth:`Relay.attach_emitter <supervisor.relay.core.Relay.attach_emitter>`,
at the daemon's start), before its first event: refused to every other
party (:meth:`.ingest.Ingest.check_owner`, counted
``refused_owned_source``). docs/security.md "Integrity".

A source is compared in a normalized form (sixth outside attack: the base
was matched as a literal prefix, so ``aep://vm/agent/claude%2Dcode``,
``aep://vm/x/../agent/claude-code``, ``aep://u@vm:80/agent/claude-code``,
``...?x=1`` and the like were accepted), RFC 3986 §6.2.2 syntax-based
normalization and then some, so that every spelling that reads as the
bridge's is refused (:func:`_key`): scheme and host case, percent-decoding
(every octet, not only the unreserved ones), dot segments, empty segments,
userinfo, port, a host's trailing dot, ``;params``, query and fragment.
Decoded segments are NFKC-folded with invisible characters dropped and
dashes unified, and a non-ASCII character in the agent's name matches any
character (a lookalike such as a Cyrillic ``е`` spelled ``%D0%B5``; raw
non-ASCII is no URI and is refused ``invalid-event`` before this).

Hosts: the bridge's own (``socket.gethostname()``) and the loopback
aliases (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``::1``,
``0.0.0.0``, ``::``, in every form an IPv4 parser takes and IPv4-mapped;
an empty host). Only the first :data:`_MAX_READ` characters are read. Not any host: an uplinked daemon on another machine
sends its bridges' events under ``aep://{its host}/agent/{agent}``
(:mod:`supervisor.delivery.uplink`, over ``/socket``), and a relay that
runs a bridge of the same agent must keep taking them. A name of this
machine's that only DNS knows (its FQDN, another interface's address) is
not reserved (docs/security.md "Limits")."""
from __future__ import annotations

import ipaddress
import re
import socket
import unicodedata
from urllib.parse import unquote

__all__ = ["FleetSources"]

#: ``scheme:[//authority]path[?query][#fragment]`` (RFC 3986 Appendix B)
_PARTS = re.compile(r"([^:/?#]+):(?://([^/?#]*))?([^?#]*)")
#: the categories a decoded character is dropped for: controls, format
#: characters (bidi overrides, zero-width), separators (spaces)
_INVISIBLE = frozenset(("Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Me"))
#: blank letters (``Lo``) that render as nothing: the Hangul fillers, the
#: Braille blank (a seventh attack padded ``claude-co\u3164de`` with one)
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")
#: at most this many characters of a source's authority and path are read:
#: a reserved source reads as one within its first few dozen, and folding
#: 64 KiB of U+FDFA (NFKC: 18 characters each) cost 29 ms an event (a seventh
#: attack); a source whose reserved-looking prefix runs past it is refused
#: (owned) rather than read to its end
_MAX_READ = 2048
#: at most this many path segments are read (a reserved path has two)
_MAX_SEGMENTS = 64
#: sources whose verdict is kept (:attr:`FleetSources._seen`)
_MAX_SEEN = 4096


def _fold(text: str) -> str:
    """A decoded host or segment as a person reads it: NFKC (fullwidth
    forms, compatibility characters), invisible characters dropped, every
    dash (``Pd``) a ``-``, casefolded."""
    out = []
    for ch in unicodedata.normalize("NFKC", text):
        cat = unicodedata.category(ch)
        if cat in _INVISIBLE or ch in _BLANK:  # marks NFKC leaves alone included (U+034F, VS)
            continue
        out.append("-" if cat == "Pd" or ch == "_" else ch)
    return "".join(out).casefold()


def _host(authority: str) -> str:
    """The authority's host, normalized: userinfo and port dropped,
    percent-decoded, folded, without a trailing dot or IPv6 brackets."""
    host = authority.rpartition("@")[2]
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    else:
        host = host.partition(":")[0]
    return _fold(unquote(host, errors="replace")).rstrip(".")


def _segments(path: str) -> list[str]:
    """The path's segments, normalized: ``;params`` dropped, each
    percent-decoded and folded, empty and ``.`` segments dropped, ``..``
    removing its parent (RFC 3986 §5.2.4); the first :data:`_MAX_SEGMENTS`."""
    out: list[str] = []
    for raw in path.split("/", _MAX_SEGMENTS)[:_MAX_SEGMENTS]:
        seg = _fold(unquote(raw.partition(";")[0], errors="replace"))
        if seg in ("", "."):
            continue
        if seg == "..":
            if out:
                out.pop()
            continue
        out.append(seg)
    return out


def _key(source: str) -> tuple[str, str, list[str]] | None:
    """``(scheme, host, segments)`` of ``source`` normalized, or ``None``
    when it has no authority (no ``aep://`` source then)."""
    # a backslash reads as a slash (as browsers read one in a URL)
    m = _PARTS.match(source[:_MAX_READ].replace("\\", "/"))
    if m is None or m.group(2) is None:
        return None
    return m.group(1).casefold(), _host(m.group(2)), _segments(m.group(3))


def _loopback(host: str) -> bool:
    """This machine by any spelling: a loopback name, an empty host, a
    loopback or unspecified address in any form an IPv4 parser takes
    (``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``0``: a
    seventh attack) or IPv4-mapped (``::ffff:127.0.0.1``)."""
    if host in ("", "localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        try:  # inet_aton's legacy forms (what a resolver would connect to)
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _same_name(seg: str, name: str) -> bool:
    """``seg`` spells ``name`` (both folded), a non-ASCII character of
    ``seg`` matching any one character (a lookalike)."""
    if seg == name:
        return True
    if len(seg) != len(name) or seg.isascii():
        return False
    return all(a == b or not a.isascii() for a, b in zip(seg, name, strict=True))


class FleetSources:
    """The reserved source bases (a handful: one per fleet bridge agent)."""

    def __init__(self) -> None:
        # every reserved agent under every reserved host: the fleet's bridges
        # share one host (the stamper's), so the product adds nothing real
        self._hosts: set[str] = set()  # normalized (_host)
        self._agents: set[str] = set()  # folded
        # source -> verdict: an emitter repeats one source per session, and
        # normalizing costs a parse and a Unicode fold; bounded, cleared when full
        self._seen: dict[str, bool] = {}

    def reserve(self, base: str) -> None:
        """Every source at or under ``base`` (``aep://{host}/agent/{agent}``,
        as :class:`bridges.core.envelope.Stamper` mints it) is the fleet's
        from now on, under the base's host and the loopback aliases.
        Raises ``ValueError`` for a base of another shape."""
        key = _key(base)
        if key is None or key[0] != "aep" or len(key[2]) != 2 or key[2][0] != "agent":
            raise ValueError(f"not an aep://{{host}}/agent/{{agent}} base: {base!r}")
        self._hosts.add(key[1])
        self._agents.add(key[2][1])
        self._seen.clear()

    def owns(self, source: str) -> bool:
        """Whether ``source``, normalized (see the module docstring), is at
        or under a reserved base: scheme ``aep``, a reserved host or a
        loopback alias, a path that starts ``agent/{a reserved agent}``."""
        if not self._agents or source[:4].casefold() != "aep:":  # a scheme has no escapes
            return False
        verdict = self._seen.get(source)
        if verdict is None:
            verdict = self._owns(source)
            if len(self._seen) >= _MAX_SEEN:
                self._seen.clear()
            self._seen[source] = verdict
        return verdict

    def _owns(self, source: str) -> bool:
        key = _key(source)
        if key is None:
            return False
        _, host, segs = key
        if len(segs) < 2 or not _same_name(segs[0], "agent"):
            return False
        if not (_loopback(host) or any(_same_name(host, h) for h in self._hosts)):
            return False
        return any(_same_name(segs[1], a) for a in self._agents)
