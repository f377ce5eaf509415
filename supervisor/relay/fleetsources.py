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
bridge's is refused: scheme and host case, percent-decoding (every octet,
not only the unreserved ones), dot segments, empty segments, userinfo,
port, a host's trailing dot, ``;params``, query and fragment. Decoded
hosts and segments are folded (:func:`.lookalike.fold`: Unicode's
compatibility caseless match with marks and invisible characters dropped
before and after the casefold, dashes unified; an ideographic full stop in
a host is a dot), and a non-ASCII character in a host or the agent's name
stands for the letters it is a known lookalike of
(:func:`.lookalike.reads_as`: Unicode's UTS #39 confusables, a lookalike
such as a Cyrillic ``е`` spelled ``%D0%B5``, a ligature such as ``ꜷ`` for
``au``; Greek ``Η``, which folds to ``η``, for ``h``), and for nothing else
(a tenth attack: any non-ASCII character matched any one or two letters,
so a local agent named ``小助手`` read as ``codex`` and a remote host
``开发服务器`` as this host; raw non-ASCII is no
URI and is refused ``invalid-event`` before this). A path is read twice, leniently as above and strictly as
RFC 3986 §5.2.4 (only ``.``, ``..`` and ``%2E`` spellings are dot segments,
an empty segment is one): a reserved path in either reading is the fleet's
(``aep://vm/agent/claude-code/..;x``, ``.../claude-code//..``).

Bounded work, failing closed (an eighth outside attack: 70 empty or ``./``
segments, ``x/..`` pairs or a 2,100-character userinfo pushed the
reserved path past the old read limits and were accepted; and folding a
6,000-event batch of distinct 2 KB sources of U+FDFA held the event loop
12 s). Only C-speed scans (splitting, a regex) run over the whole source;
the per-character work, percent-decoding and the Unicode fold, reads at
most :data:`MAX_FOLD` characters of a source in all, and at most
:data:`MAX_SEGMENTS` path segments are read one by one. A source under a
reserved or loopback host (or a host too long to read) that these bounds
stop before its verdict is known is the fleet's (:meth:`FleetSources.owns`
says ``True``): an ``aep:`` source of another host is never folded past
its host, so a long path under one is read for nothing.

Hosts: the bridge's own (``socket.gethostname()``) and the loopback
aliases (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``::1``,
``0.0.0.0``, ``::``, in every form an IPv4 parser takes, IPv4-mapped,
IPv4-compatible, IPv4-translated, NAT64, 6to4; an empty host, and a source
with no authority, ``aep:/agent/...`` and ``aep:agent/...``), each spelled
with lookalikes too (an eleventh attack: ``lоcalhost`` with a Cyrillic
``о`` was compared literally, as another host), and read past a delimiter
that surfaced in the fold (``localhost%3A80``, ``u%40localhost``,
fullwidth brackets). Not any host:
an uplinked daemon on another machine sends its bridges' events under
``aep://{its host}/agent/{agent}`` (:mod:`supervisor.delivery.uplink`,
over ``/socket``), and a relay that runs a bridge of the same agent must
keep taking them. A name of this machine's that only DNS knows (its FQDN,
another interface's address) is not reserved (docs/security.md
"Limits")."""
from __future__ import annotations

import functools
import ipaddress
import re
import socket
from urllib.parse import unquote

from .lookalike import fold, prepare, readings, reads_as, spelling

__all__ = ["FleetSources", "MAX_CACHED", "MAX_FOLD", "MAX_HOST", "MAX_SEGMENTS"]

#: the full stops IDNA reads as ``.`` in a host (after NFKD: U+FF61 is U+3002)
_STOPS = str.maketrans({"\u3002": "."})
#: at most this many characters of a source are percent-decoded and folded,
#: host and segments together (per-character work: a 2 KB host of U+FDFA
#: cost 1.5 ms); a plain ASCII host or segment costs none of it
MAX_FOLD = 256
#: at most this many path segments are read one by one (a reserved path is
#: decided by its first two; the rest only by whether one could climb)
MAX_SEGMENTS = 16
#: the longest host read (RFC 1035's 255 octets); longer cannot be ours
MAX_HOST = 255
#: sources longer than this are not kept in the verdict cache (an eighth
#: outside attack: 4,096 distinct 60 KB sources held +256 MiB); their
#: verdict is bounded work anyway
MAX_CACHED = 256
#: sources whose verdict is kept (:attr:`FleetSources._seen`)
_MAX_SEEN = 4096

#: a host or segment whose text is its own fold (printable ASCII but space,
#: ``%`` and ``;``): lower-cased, ``_`` read as ``-``, nothing else to do
_PLAIN = re.compile(r"[!-$&-:<-~]+\Z")
#: a segment that might be a dot or empty segment in some reading (only
#: dots, escapes, characters the fold drops, then ``;params``): one with a
#: literal visible ASCII character other than ``.`` before its ``;`` is not
_DOTLIKE = re.compile(r"(?:\.|%[0-9A-Fa-f]{2}|[^\x21-\x7e/])*(?:;[^/]*)?\Z")
#: a segment that might be ``..`` in some reading, searched for in an unread
#: rest of a path (an empty one or ``;x`` cannot climb)
_POP_IN = re.compile(r"(?:^|/)(?:\.|%[0-9A-Fa-f]{2}|[^\x21-\x7e/])+(?:;[^/]*)?(?=/|\Z)")
#: ``%2E`` in any case (RFC 3986 §2.3: an encoded unreserved dot is a dot)
_PCT_DOT = re.compile(r"%2[eE]")


class _Budget:
    """What is left of :data:`MAX_FOLD` for one source."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_FOLD

    def fold(self, raw: str, limit: int) -> str | None:
        """``raw`` percent-decoded and folded (:func:`.lookalike.fold`), :data:`_LONG`
        when that is longer than ``limit`` (no name, no dot), ``None`` when
        the budget does not reach its end."""
        if _PLAIN.match(raw):
            out = raw.replace("_", "-").lower()
            return out if len(out) <= limit else _LONG
        if len(raw) > _HEAD and limit <= _HEAD:  # its head may show it long (a long session id)
            head = raw[:_HEAD]
            cut = head.rfind("%", _HEAD - 2)
            self.left -= _HEAD
            # (a character cut short dropped; jamo compose at most three into one)
            if self.left >= 0 and fold(unquote(head[:cut] if cut >= 0 else head,
                                                errors="ignore"), 3 * limit) is None:
                return _LONG
        if len(raw) > self.left:
            self.left = 0
            return None
        self.left -= len(raw)
        folded = fold(unquote(raw, errors="replace"), limit)
        return _LONG if folded is None else folded


#: a folded host or segment longer than anything it is compared with
_LONG = "\0"
#: the head of a long escaped host or segment folded first (its budget share)
_HEAD = 64


def _split(source: str) -> tuple[str | None, str]:
    """``(authority, path)`` of an ``aep:`` source (``None``: it has no
    authority), ``\\`` read as ``/`` (as browsers read one in a URL), the
    query and fragment dropped. C-speed scans only."""
    rest = source[4:]
    if "\\" in rest:
        rest = rest.replace("\\", "/")
    end = len(rest)
    for stop in "?#":
        i = rest.find(stop, 0, end)
        if i >= 0:
            end = i
    rest = rest[:end]
    if not rest.startswith("//"):
        return None, rest
    slash = rest.find("/", 2)
    if slash < 0:
        return rest[2:], ""
    return rest[2:slash], rest[slash:]


def _host(authority: str | None, budget: _Budget) -> str | None:
    """The authority's host, normalized: userinfo and port dropped,
    percent-decoded, folded, an ideographic full stop a dot, without a
    trailing dot or IPv6 brackets; ``""`` without an authority; ``None``
    when too long to read (:data:`MAX_HOST`, :data:`MAX_FOLD`)."""
    if authority is None:
        return ""
    host = authority.rpartition("@")[2]
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    else:
        host = host.partition(":")[0]
    if len(host) > 3 * 4 * MAX_HOST:  # (an escaped character is at most 12)
        return None
    folded = budget.fold(host, MAX_HOST + 1)
    return None if folded is None or folded == _LONG else folded.translate(_STOPS).rstrip(".")


def _path(path: str, budget: _Budget, width: int) -> tuple[list[str], list[str]] | None:
    """The first two segments of ``path`` normalized in two readings, fewer
    when it has fewer: the lenient one (``;params`` dropped, percent-decoded,
    folded, empty and ``.`` segments dropped, ``..`` removing its parent,
    RFC 3986 §5.2.4 after the fold) and the strict one (RFC 3986 §5.2.4
    itself: only ``.``, ``..`` and their ``%2E`` spellings are dot segments,
    an empty one is a segment); ``None`` when it cannot be read within the
    bounds (:data:`MAX_SEGMENTS`, :data:`MAX_FOLD`). ``width``: the longest
    name a segment is compared with."""
    parts = path.split("/", MAX_SEGMENTS + 1)
    rest = parts.pop() if len(parts) > MAX_SEGMENTS + 1 else None
    if parts and parts[0] == "":
        parts = parts[1:]  # (the root: a leading slash is no empty segment)
    # segments on each reading's stack; only the first two are kept
    ld = sd = 0
    lfirst: list[str] = []
    sfirst: list[str] = []
    for raw in parts:
        deep = ld >= 2 and sd >= 2
        if deep and not _DOTLIKE.match(raw):
            ld += 1  # a push in both past the first two: nothing to read
            sd += 1
            continue
        lenient = budget.fold(raw.partition(";")[0], 2 if deep else width)
        if lenient is None:
            return None  # past the budget: unread
        if lenient == "..":
            ld = max(0, ld - 1)
            del lfirst[ld:]
        elif lenient not in ("", "."):
            if ld < 2:
                lfirst.append(lenient)
            ld += 1
        strict = _PCT_DOT.sub(".", raw) if "%" in raw else raw
        if strict == "..":
            sd = max(0, sd - 1)
            del sfirst[sd:]
        elif strict != ".":
            if sd < 2:
                sfirst.append(lenient if lenient and ";" not in raw else _LONG)
            sd += 1
    if rest is not None and (ld < 2 or sd < 2 or _POP_IN.search(rest) is not None):
        return None  # unread: it could fill or climb past the first two
    return lfirst, sfirst


def _spellings(host: str) -> set[str]:
    """The hosts a folded host reads as: itself and, when a delimiter
    surfaced in the fold (escaped, ``localhost%3A80``, or a lookalike,
    ``u＠localhost``: RFC 3986 reads either as data, a person as the
    delimiter), what stands after its last ``@``, inside its ``[]``,
    before its ``:`` (unless it is an IPv6 address); each without trailing
    full stops, lookalike ones too (``localhostꓸ``). C-speed scans."""
    out = {host}
    seen = host.translate(_delimiters())  # (lookalike delimiters as ASCII ones, in place)
    if seen.endswith("."):
        out.add(host[:len(seen.rstrip("."))])
    if "@" not in seen and "[" not in seen and ":" not in seen:
        return out
    start = seen.rfind("@") + 1
    rest, seen = host[start:], seen[start:]
    if seen.startswith("["):
        end = seen.find("]") % (len(seen) + 1)  # (no "]": to the end)
        rest, seen = rest[1:end], seen[1:end]
    else:
        colon = seen.find(":")
        if colon >= 0 and not _ipv6(rest):
            rest, seen = rest[:colon], seen[:colon]
    out.add(rest[:len(seen.rstrip("."))])
    return out


@functools.cache
def _delimiters() -> dict[int, str]:
    """What :func:`_spellings` reads as a delimiter: each non-ASCII
    lookalike (:func:`.lookalike.spelling`) of ``@ [ ] : .``, as a
    ``str.translate`` table."""
    return {ord(ch): d for d in ".:]@[" for ch in spelling(d)}


def _ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


#: the loopback names (``*.localhost`` too)
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


def _loopback(host: str) -> bool:
    """This machine by any spelling: a loopback name, an empty host, a
    loopback or unspecified address in any form an IPv4 parser takes
    (``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``0``: a
    seventh attack) or embedded in IPv6 (IPv4-mapped ``::ffff:127.0.0.1``,
    -compatible ``::127.0.0.1``, -translated ``::ffff:0:127.0.0.1``,
    NAT64 ``64:ff9b::127.0.0.1``, 6to4: an eighth); a name or address
    spelled with lookalikes too (an eleventh: ``lоcalhost`` with a Cyrillic
    ``о`` was another host): a non-ASCII host reads as a loopback name
    (:func:`.lookalike.reads_as`) or as an address in one of its readings
    (:func:`.lookalike.readings`; more than 64 readings: ours, unread)."""
    if host in ("", *_LOOPBACK_NAMES) or host.endswith(".localhost"):
        return True
    if host.isascii():
        return _address(host)
    seen = host.translate(_delimiters())
    if any(reads_as(host, name) for name in _LOOPBACK_NAMES) or any(
            seen[i] == "." and reads_as(host[i:], ".localhost")
            for i in range(max(0, len(host) - 10), len(host))):
        return True
    texts = readings(host, _NUMERIC, 64)
    return texts is None or any(_address(t) for t in texts)


def _address(host: str) -> bool:
    """An ASCII host is a loopback or unspecified address (:func:`_loopback`)."""
    if len(host) > 64:  # an address padded with zeros (0x000...07f000001): ours, unread
        return all(c in _NUMERIC for c in host)
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        try:  # inet_aton's legacy forms (what a resolver would connect to)
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):
            return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_loopback or ip.is_unspecified:
            return True
        n = int(ip)
        if (n >> 32) in _V4_IN_V6 or (n >> 32) == 0:
            ip = ipaddress.IPv4Address(n & 0xFFFFFFFF)
        elif ip.sixtofour is not None:
            ip = ip.sixtofour
        else:
            return False
    return ip.is_loopback or ip.is_unspecified


#: what an IPv4 or IPv6 address in any form is written with
_NUMERIC = frozenset("0123456789abcdefABCDEFxX.:")

#: the high 96 bits of the IPv6 forms that carry an IPv4 address in their
#: low 32: mapped, translated, NAT64 (compatible, ``::/96``, is 0)
_V4_IN_V6 = frozenset((0xFFFF, 0xFFFF << 16, 0x64FF9B << 64))


class FleetSources:
    """The reserved source bases (a handful: one per fleet bridge agent)."""

    def __init__(self) -> None:
        # every reserved agent under every reserved host: the fleet's bridges
        # share one host (the stamper's), so the product adds nothing real
        self._hosts: set[str] = set()  # normalized (_host)
        self._agents: set[str] = set()  # folded
        self._width = len("agent")  # the longest of "agent" and the agents
        # source -> verdict: an emitter repeats one source per session, and
        # normalizing costs a parse and a Unicode fold; bounded (entries and
        # MAX_CACHED characters a key), cleared when full
        self._seen: dict[str, bool] = {}

    def reserve(self, base: str) -> None:
        """Every source at or under ``base`` (``aep://{host}/agent/{agent}``,
        as :class:`bridges.core.envelope.Stamper` mints it) is the fleet's
        from now on, under the base's host and the loopback aliases.
        Raises ``ValueError`` for a base of another shape."""
        authority, path = _split(base) if base[:4].casefold() == "aep:" else (None, "")
        host = _host(authority, _Budget()) if authority is not None else None
        segs = path.strip("/").split("/")
        names = [fold(unquote(s), 1 << 10) or "" for s in segs]
        if not host or len(names) != 2 or names[0] != "agent" or not names[1]:
            raise ValueError(f"not an aep://{{host}}/agent/{{agent}} base: {base!r}")
        prepare()  # (built at the daemon's start, not in the first event's turn)
        self._hosts.add(host)
        self._agents.add(names[1])
        self._width = max(self._width, len(names[1]))
        self._seen.clear()

    def owns(self, source: str) -> bool:
        """Whether ``source``, normalized (see the module docstring), is at
        or under a reserved base: scheme ``aep``, a reserved host or a
        loopback alias, a path that starts ``agent/{a reserved agent}``;
        ``True`` too for such a source too long or odd to read within the
        bounds (:data:`MAX_FOLD`, :data:`MAX_SEGMENTS`)."""
        if not self._agents or source[:4].casefold() != "aep:":  # a scheme has no escapes
            return False
        verdict = self._seen.get(source)
        if verdict is None:
            verdict = self._owns(source)
            if len(source) <= MAX_CACHED:
                if len(self._seen) >= _MAX_SEEN:
                    self._seen.clear()
                self._seen[source] = verdict
        return verdict

    def _owns(self, source: str) -> bool:
        budget = _Budget()
        authority, path = _split(source)
        host = _host(authority, budget)
        if host is not None and not any(_loopback(h) or any(reads_as(h, mine) for mine in self._hosts)
                                        for h in _spellings(host)):
            return False  # another machine's: its path is not read
        firsts = _path(path, budget, self._width)
        if firsts is None:
            return True  # ours or unreadable, and a path too long or odd to read: fail closed
        return any(len(first) == 2 and reads_as(first[0], "agent") and
                   any(reads_as(first[1], a) for a in self._agents) for first in firsts)
