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
hosts and segments are NFKC-folded with invisible characters dropped and
dashes unified (an ideographic full stop in a host is a dot), and a
non-ASCII character in a host or the agent's name stands for the letters
it is a known lookalike of (:func:`_lookalikes`: Unicode's UTS #39
confusables, a lookalike such as a Cyrillic ``е`` spelled ``%D0%B5``, a
ligature such as ``ꜷ`` for ``au``; a Latin letter with marks for its base
letter), and for nothing else (a tenth attack: any non-ASCII character
matched any one or two letters, so a local agent named ``小助手`` read as
``codex`` and a remote host ``开发服务器`` as this host; raw non-ASCII is no
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
with no authority, ``aep:/agent/...`` and ``aep:agent/...``). Not any host:
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
import unicodedata
from urllib.parse import unquote

from confusable_homoglyphs.utils import load as load_confusables

__all__ = ["FleetSources", "MAX_CACHED", "MAX_FOLD", "MAX_HOST", "MAX_SEGMENTS"]

#: the categories a decoded character is dropped for: controls, format
#: characters (bidi overrides, zero-width), separators (spaces)
_INVISIBLE = frozenset(("Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Me"))
#: blank letters (``Lo``) that render as nothing: the Hangul fillers, the
#: Braille blank (a seventh attack padded ``claude-co\u3164de`` with one)
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")
#: non-ASCII characters that render as nothing or as a box: private use,
#: unassigned, dropped like the invisible ones (a ninth attack inserted one
#: into ``claude-code``: longer, never matched); other symbols stay
#: (``codex🚀`` is another name: a tenth attack)
_NO_LETTER = frozenset(("Co", "Cn"))
#: the symbols (``So``) that render as nothing or as a box: a blank
#: notehead (U+1D159, the ninth attack's), the object replacement character,
#: the replacement character (an escaped byte that is no UTF-8)
_BLANK_SYMBOLS = frozenset("\U0001d159\ufffc\ufffd")
#: the full stops IDNA reads as ``.`` in a host (after NFKC: U+FF0E is ``.``,
#: U+FF61 is U+3002)
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


def _fold(text: str, limit: int) -> str | None:
    """A decoded host or segment as a person reads it: NFKC (fullwidth
    forms, compatibility characters), invisible characters dropped, every
    dash (``Pd``) and ``_`` a ``-``, casefolded; ``None`` once more than
    ``limit`` characters would remain (too long to be what it is compared
    with: the loop stops there, whatever NFKC made of the input)."""
    norm = unicodedata.normalize("NFKC", text)
    if norm.isascii():  # (what most are: no per-character loop)
        out = norm.replace("_", "-").translate(_ASCII_DROP).lower()
        return out if len(out) <= limit else None
    kept: list[str] = []
    for ch in norm:
        cat = unicodedata.category(ch)
        if cat in _INVISIBLE or cat in _NO_LETTER or ch in _BLANK or ch in _BLANK_SYMBOLS:
            continue
        kept.append("-" if cat == "Pd" or ch == "_" else ch)
        if len(kept) > limit:
            return None
    return "".join(kept).casefold()


#: the ASCII characters :func:`_fold` drops (controls, space)
_ASCII_DROP = str.maketrans("", "", "".join(map(chr, range(33))) + "\x7f")


class _Budget:
    """What is left of :data:`MAX_FOLD` for one source."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_FOLD

    def fold(self, raw: str, limit: int) -> str | None:
        """``raw`` percent-decoded and folded (:func:`_fold`), :data:`_LONG`
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
            if self.left >= 0 and _fold(unquote(head[:cut] if cut >= 0 else head,
                                                errors="ignore"), 3 * limit) is None:
                return _LONG
        if len(raw) > self.left:
            self.left = 0
            return None
        self.left -= len(raw)
        folded = _fold(unquote(raw, errors="replace"), limit)
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


def _loopback(host: str) -> bool:
    """This machine by any spelling: a loopback name, an empty host, a
    loopback or unspecified address in any form an IPv4 parser takes
    (``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``0``: a
    seventh attack) or embedded in IPv6 (IPv4-mapped ``::ffff:127.0.0.1``,
    -compatible ``::127.0.0.1``, -translated ``::ffff:0:127.0.0.1``,
    NAT64 ``64:ff9b::127.0.0.1``, 6to4: an eighth)."""
    if host in ("", "localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    if not host.isascii():
        return False
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


def _same_name(seg: str, name: str) -> bool:
    """``seg`` spells ``name`` (both folded), a non-ASCII character of
    ``seg`` matching one of its :func:`_lookalikes` (a lookalike letter, a
    ligature's two letters), never any other character."""
    if seg == name:
        return True
    if seg.isascii() or len(seg) > len(name):  # (every character stands for one or more)
        return False
    reach = {0}  # how much of name the read part of seg can spell
    for ch in seg:
        if ch.isascii():
            reach = {i + 1 for i in reach if i < len(name) and name[i] == ch}
        else:
            reach = {i + len(alt) for i in reach for alt in _lookalikes(ch)
                     if name.startswith(alt, i)}
        if not reach:
            return False
    return len(name) in reach


@functools.lru_cache(maxsize=1024)
def _lookalikes(ch: str) -> tuple[str, ...]:
    """The ASCII spellings (lower case, ``[a-z0-9.-]``) a non-ASCII
    character reads as: its UTS #39 confusables (Unicode's confusables.txt
    through ``confusable-homoglyphs``: Cyrillic ``е`` is ``e``, ``ꜷ`` is
    ``au``, ``℮`` is ``e``) with the ASCII ones those are confusable with
    (``l`` and ``1``, ``rn`` and ``m``), and, for a letter with marks, its
    base letter (``é`` is ``e``); ``()`` for every other character (a CJK
    or kana letter, an emoji, a currency sign: they spell no Latin name)."""
    table = _confusables()
    alts = set(table.get(ch, ()))
    for alt in tuple(alts):
        alts.update(table.get(alt, ()))
    base = "".join(c for c in unicodedata.normalize("NFD", ch) if not unicodedata.combining(c))
    if base != ch and _ASCII_NAME.match(base.casefold()):
        alts.add(base.casefold())
    return tuple(sorted(alts))


#: what a lookalike's ASCII spelling may hold
_ASCII_NAME = re.compile(r"[a-z0-9.-]+\Z")


@functools.cache
def _confusables() -> dict[str, tuple[str, ...]]:
    """Every character of confusables.txt with an ASCII lookalike, and the
    ASCII spellings it reads as (built once, at the first non-ASCII name
    compared: ~1,500 entries of the package's 9,600, ~65 ms)."""
    table: dict[str, tuple[str, ...]] = {}
    for ch, glyphs in load_confusables("confusables.json").items():
        # (right-to-left glyphs are stored wrapped in U+200E marks)
        alts = {g["c"].replace("\u200e", "").casefold() for g in glyphs}
        ascii_alts = tuple(sorted(a for a in alts if _ASCII_NAME.match(a)))
        if ascii_alts:
            table[ch] = ascii_alts
    return table


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
        names = [_fold(unquote(s), 1 << 10) or "" for s in segs]
        if not host or len(names) != 2 or names[0] != "agent" or not names[1]:
            raise ValueError(f"not an aep://{{host}}/agent/{{agent}} base: {base!r}")
        _confusables()  # (built at the daemon's start, not in the first event's turn)
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
        if host is not None and not (_loopback(host) or any(_same_name(host, h)
                                                            for h in self._hosts)):
            return False  # another machine's: its path is not read
        firsts = _path(path, budget, self._width)
        if firsts is None:
            return True  # ours or unreadable, and a path too long or odd to read: fail closed
        return any(len(first) == 2 and _same_name(first[0], "agent") and
                   any(_same_name(first[1], a) for a in self._agents) for first in firsts)
