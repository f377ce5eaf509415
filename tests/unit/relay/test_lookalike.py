"""The fold and the lookalike reading of the fleet's reserved sources
(:mod:`supervisor.relay.lookalike`), as properties (an eleventh outside
attack on issue 25, finding 4: ``agenẗ`` was not ``agent``, since the old
fold casefolded after it dropped the marks and casefold splits ``ẗ`` into
``t`` and U+0308; ``lоcalhost`` with a Cyrillic ``о`` was not a loopback
name, which was compared literally).

- The fold is idempotent: ``fold(fold(s)) == fold(s)``, for any text and,
  exhaustively, for every character that normalization, casefolding or
  the drop touches.
- A protected name (the fleet's agents, ``agent``, ``localhost``, a host
  name) spelled with letters replaced by their confusables from the
  package's own table (``confusable-homoglyphs``' confusables.txt, read
  here independently of the module's table), by a letter with combining
  marks, by a character whose casefold is a letter and a mark (``ẗ ẖ ẘ ẙ ǰ
  İ``), upper case, fullwidth, with invisible characters between, reads as
  that name; and as a source, ``aep://{host}/{agent}/{name}`` so spelled
  is the fleet's.

Left out of the substitutes, by design: a character whose compatibility
form is ASCII reads as that ASCII (``Ⅰ`` is ``i``, ``𝟎`` is ``0``: an
ASCII name is read as written, docs/security.md "Limits"), and a spacing
mark whose compatibility form is a space and a combining mark reads as
nothing (``˛``, ``ͺ``)."""
from __future__ import annotations

import re
import socket
import unicodedata
from collections import defaultdict
from functools import cache
from urllib.parse import quote

import pytest
from confusable_homoglyphs.utils import load as load_confusables
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.relay.fleetsources import FleetSources
from supervisor.relay.lookalike import fold, lookalikes, reads_as

AGENTS = ["claude-code", "codex", "kimi-code", "opencode", "kilocode", "openhands", "gemini", "jwy"]
HOST = fold(socket.gethostname(), 255) or "vm"
PROTECTED = [*AGENTS, "agent", "localhost", "dev-box", HOST]
_NAME = re.compile(r"[a-z0-9.-]+\Z")
_WIDE = 1 << 10


def _chars():
    for cp in range(0x110000):
        if not 0xD800 <= cp < 0xE000:
            yield chr(cp)


@cache
def _substitutes() -> dict[str, tuple[str, ...]]:
    """ASCII letters (one or more) -> the non-ASCII characters the
    package's table says look like them, the right-to-left marks it wraps
    some in removed; not those whose fold is ASCII or nothing (above)."""
    subs: dict[str, set[str]] = defaultdict(set)
    for ch, glyphs in load_confusables("confusables.json").items():
        folded = fold(ch, _WIDE)
        if ch.isascii() or not folded or folded.isascii():
            continue
        for glyph in glyphs:
            alt = glyph["c"].replace("\u200e", "").casefold()
            if _NAME.match(alt):
                subs[alt].add(ch)
    return {k: tuple(sorted(v)) for k, v in subs.items()}


@cache
def _casefold_splits() -> dict[str, tuple[str, ...]]:
    """A letter -> the characters whose casefold is that letter and
    combining marks (``ẗ`` is ``t`` U+0308, ``İ`` is ``i`` U+0307)."""
    out: dict[str, set[str]] = defaultdict(set)
    for ch in _chars():
        cf = ch.casefold()
        if cf != ch and len(cf) > 1 and cf[0].isascii() and all(unicodedata.combining(c) for c in cf[1:]):
            out[cf[0]].add(ch)
    return {k: tuple(sorted(v)) for k, v in out.items()}


#: combining and enclosing marks (U+0345, which casefolds to a letter, too)
MARKS = tuple(ch for ch in map(chr, range(0x300, 0x20F1)) if unicodedata.category(ch) in ("Mn", "Me"))
#: what renders as nothing: zero width, bidi, soft hyphen, CGJ, variation
#: selectors, a Hangul filler, private use, unassigned, U+FFFC
INVISIBLE = tuple("\u200b\u200c\u200d\u200e\u202e\u00ad\u034f\ufe0f\u180b\u3164\ue000\u0378\ufffc\u2060")
#: what reads as "-"
DASHES = tuple("\u2010\u2011\u2012\u2013\u2014\ufe58\uff0d_")


@st.composite
def spelled(draw: st.DrawFn, name: str) -> str:
    """``name`` with some letters replaced (the module docstring)."""
    subs, splits = _substitutes(), _casefold_splits()
    out: list[str] = []
    i = 0
    while i < len(name):
        spans = [(k, subs[name[i:i + k]]) for k in (1, 2, 3) if name[i:i + k] in subs]
        kinds = ["same", "confusable" if spans else "same", "marks"]
        if name[i].isalpha():
            kinds += ["upper", "fullwidth"]
        if name[i] in splits:
            kinds.append("split")
        if name[i] == "-":
            kinds.append("dash")
        kind = draw(st.sampled_from(kinds))
        step = 1
        if kind == "confusable":
            step, chars = draw(st.sampled_from(spans))
            out.append(draw(st.sampled_from(chars)))
        elif kind == "marks":
            out.append(name[i] + "".join(draw(st.lists(st.sampled_from(MARKS), min_size=1, max_size=3))))
        elif kind == "upper":
            out.append(name[i].upper())
        elif kind == "fullwidth":
            out.append(chr(ord(name[i]) - 0x61 + 0xFF41))
        elif kind == "split":
            out.append(draw(st.sampled_from(splits[name[i]])))
        elif kind == "dash":
            out.append(draw(st.sampled_from(DASHES)))
        else:
            out.append(name[i])
        if draw(st.integers(0, 4)) == 0:
            out.append(draw(st.sampled_from(INVISIBLE)))
        i += step
    return "".join(out)


#: characters where the fold's order matters, for the text strategy
_TRICKY = st.sampled_from(sorted(
    {*MARKS[:64], *INVISIBLE, *DASHES, "\u0345", "\u1e97", "\u1e96", "\u1e98", "\u1e99", "\u01f0", "\u0130",
     "\u0397", "\u041d", "\u00df", "\ufb03", "\ufdfa", "\u1100", "\u1161", "\u11a8", "\uac00", "\u3164",
     "\U0001d165", "\u302e", "\u0390", "\u212a", "\u2126", "\u3392", "\uff21", "\u0415", "\u00e9"}))


@settings(max_examples=1000)
@given(st.text(st.one_of(_TRICKY, st.characters()), max_size=40))
def test_the_fold_is_idempotent(text):
    once = fold(text, _WIDE)
    assert once is not None and fold(once, _WIDE) == once


@pytest.mark.parametrize("text", [
    "\u1100\u200b\u1161",  # jamo a dropped character kept apart: NFKC last composes them
    "\u1100\u3164\u1161",  # (a Hangul filler NFKD makes a jamo filler, dropped)
    "agent\u0345",  # a mark casefold makes a letter of (ι): dropped before it
    "agen\u1e97", "\u0130", "\u0390", "\u1e9e", "\u3392",  # casefold splits; NFKD of ㎒ is upper case
])
def test_the_fold_is_idempotent_where_its_order_matters(text):
    once = fold(text, _WIDE)
    assert once is not None and fold(once, _WIDE) == once
    assert once.casefold() == once and unicodedata.normalize("NFKC", once) == once


def test_the_fold_is_idempotent_on_every_character_it_changes():
    """Exhaustive over every character NFKD, casefold or the drop changes
    (~20,000), alone and after an ``a``."""
    for ch in _chars():
        if unicodedata.normalize("NFKD", ch) == ch and ch.casefold() == ch and \
                unicodedata.category(ch) not in ("Mn", "Me", "Cf"):
            continue
        for text in (ch, "a" + ch):
            once = fold(text, _WIDE)
            assert once is not None and fold(once, _WIDE) == once, (hex(ord(ch)), once)


@pytest.mark.parametrize("name", PROTECTED)
@settings(max_examples=200)
@given(data=st.data())
def test_a_protected_name_spelled_with_lookalikes_reads_as_itself(name, data):
    text = data.draw(spelled(name))
    folded = fold(text, _WIDE)
    assert folded is not None and reads_as(folded, name), (text, folded)


def test_every_confusable_in_the_table_reads_as_its_letters():
    """Exhaustive over the package's table: a character whose fold is not
    ASCII reads as each ASCII spelling the table gives it, also when the
    casefold made another character of it (Greek ``Η`` folds to ``η``,
    which the table gives ``n``: it is ``h`` too)."""
    for alt, chars in _substitutes().items():
        for ch in chars:
            folded = fold(ch, _WIDE) or ""
            assert reads_as(folded, alt), (ch, alt, [lookalikes(c) for c in folded])


def test_what_the_substitutes_leave_out_is_ascii_or_a_spacing_mark():
    """(a key the package wraps in U+200E marks, right-to-left, is the one
    character between them)"""
    for ch, _glyphs in load_confusables("confusables.json").items():
        if ch.isascii() or fold(ch, _WIDE) != "":
            continue
        decomposed = unicodedata.normalize("NFKD", ch.replace("\u200e", ""))
        assert all(unicodedata.category(c) in ("Zs", "Mn") for c in decomposed), (ch, hex(ord(ch[0])))


@pytest.fixture(scope="module")
def fleet() -> FleetSources:
    f = FleetSources()
    for host in (HOST, "dev-box"):
        for agent in AGENTS:
            f.reserve(f"aep://{host}/agent/{agent}")
    return f


@pytest.mark.parametrize("host", ["localhost", "dev-box", HOST])
@settings(max_examples=200)
@given(data=st.data())
def test_a_spelled_source_is_the_fleets(fleet, host, data):
    agent = data.draw(st.sampled_from(AGENTS))
    parts = [data.draw(spelled(host)), data.draw(spelled("agent")), data.draw(spelled(agent))]
    source = "aep://{}/{}/{}/session/s".format(*(quote(p, safe="") for p in parts))
    assert fleet.owns(source), (parts, source)


@pytest.mark.parametrize("name", ["localhost", "claude-code", "agent"])
@settings(max_examples=100)
@given(data=st.data())
def test_a_changed_letter_is_another_name(name, data):
    """The other side: one ASCII letter replaced by another ASCII letter,
    or one added, is another name, however the rest is spelled."""
    text = data.draw(spelled(name))
    i = data.draw(st.integers(0, len(text)))
    other = data.draw(st.sampled_from("xyzq"))
    changed = text[:i] + other + text[i:]
    assert not reads_as(fold(changed, _WIDE) or "", name), changed
