"""Names as a person reads them: the Unicode fold and the lookalike reading
the fleet's reserved sources are compared with (:mod:`.fleetsources`,
docs/security.md "Integrity").

:func:`fold` is Unicode's compatibility caseless match (Unicode §3.13,
D146: NFKD, casefold, NFKD) with every mark and invisible character
dropped, before the casefold and after it, then NFKC; dashes read as
``-``. The order matters (an eleventh outside attack on issue 25: the old
fold was NFKC, drop, casefold, and casefold splits ``ẗ ẖ ẘ ẙ ǰ İ`` into a
letter and a combining mark it never dropped, so ``agenẗ`` was not
``agent``):

- NFKD first, not NFKC: every precomposed letter shows its marks, and they
  go (``é`` is ``e``, ``ẗ`` is ``t``);
- the marks are dropped before the casefold too: it makes a letter of one,
  U+0345 (combining ypogegrammeni, a mark under a letter) is ``ι``;
- NFKD again after the casefold: casefold leaves ``ẗ`` as ``t`` + U+0308
  and ``İ`` as ``i`` + U+0307, precomposed folds (``ΐ``) and compatibility
  characters (Unicode's D146 repeats NFKD for these);
- NFKC last, so Hangul jamo the drop brought together compose as they
  would have (a fold is its own fold: idempotent, a property test).

:func:`reads_as` compares a folded name with a folded ASCII one: an ASCII
character must be the one in the name, a non-ASCII character may stand for
any of its :func:`lookalikes`: its UTS #39 confusables (``confusable-
homoglyphs``' copy of confusables.txt), keyed by their fold, since the
casefold makes new characters of old ones (Greek ``Η``, which reads as
``H``, folds to ``η``, which reads as ``n``; Cyrillic ``Н`` to ``н``: the
table gives ``η`` and ``н`` both readings, an eleventh attack's
``localНost``). ASCII itself is read as written: ``c1aude-code`` is
another name (docs/security.md "Limits"), and so is a character whose
compatibility form is ASCII (``Ⅰ`` is ``i``, ``𝟎`` is ``0``)."""
from __future__ import annotations

import functools
import re
import unicodedata

from confusable_homoglyphs.utils import load as load_confusables

__all__ = ["fold", "lookalikes", "prepare", "reads_as", "readings", "spelling"]

#: the categories a character is dropped for: controls, format characters
#: (bidi overrides, zero-width), separators (spaces), marks (combining,
#: enclosing; a spacing mark, ``Mc``, is a visible letter part and stays),
#: private use and unassigned (render as a box: a ninth attack inserted one)
_GONE = frozenset(("Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Me", "Co", "Cn"))
#: blank letters (``Lo``) that render as nothing: the Hangul fillers, the
#: Braille blank (a seventh attack padded ``claude-co\u3164de`` with one)
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")
#: the symbols (``So``) that render as nothing or as a box: a blank
#: notehead (U+1D159, the ninth attack's), the object replacement character,
#: the replacement character (an escaped byte that is no UTF-8); other
#: symbols stay (``codex🚀`` is another name: a tenth attack)
_BLANK_SYMBOLS = frozenset("\U0001d159\ufffc\ufffd")
#: the ASCII characters :func:`fold` drops (controls, space)
_ASCII_DROP = str.maketrans("", "", "".join(map(chr, range(33))) + "\x7f")
#: what a lookalike's ASCII spelling may hold: a host name's letters and the
#: delimiters of a host (``:`` ``@`` ``[`` ``]``: :mod:`.fleetsources` reads
#: past a lookalike one)
_ASCII_NAME = re.compile(r"[a-z0-9.:@\[\]-]+\Z")


def _drop(text: str, cap: int) -> str | None:
    """``text`` without the characters :func:`fold` drops, every dash
    (``Pd``) and ``_`` a ``-``; ``None`` once more than ``cap`` remain."""
    kept: list[str] = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat in _GONE or ch in _BLANK or ch in _BLANK_SYMBOLS:
            continue
        kept.append("-" if cat == "Pd" or ch == "_" else ch)
        if len(kept) > cap:
            return None
    return "".join(kept)


def fold(text: str, limit: int) -> str | None:
    """``text`` (decoded) as a person reads it (the module docstring: NFKD,
    marks and invisible characters dropped, casefold, NFKD, dropped again,
    NFKC; dashes ``-``); ``None`` once more than ``limit`` characters would
    remain (too long to be what it is compared with: the per-character loop
    stops at three times ``limit``, as Hangul jamo compose at most three
    into one). ``fold(fold(s)) == fold(s)``."""
    norm = unicodedata.normalize("NFKD", text)
    if norm.isascii():  # (what most are: no per-character loop)
        out = norm.replace("_", "-").translate(_ASCII_DROP).lower()
        return out if len(out) <= limit else None
    kept = _drop(norm, 3 * limit)
    if kept is None:
        return None
    folded = unicodedata.normalize("NFKD", kept.casefold())
    if folded != kept:  # (casefold made a letter and a mark of one, or ß ss)
        kept = _drop(folded, 3 * limit)
        if kept is None:
            return None
    out = unicodedata.normalize("NFKC", kept)
    return out if len(out) <= limit else None


def reads_as(seg: str, name: str) -> bool:
    """``seg`` (folded) spells ``name`` (folded ASCII), each non-ASCII
    character of ``seg`` matching one of its :func:`lookalikes` (a
    lookalike letter, a ligature's two letters), never any other
    character; an ASCII one matching itself only."""
    if seg == name:
        return True
    if seg.isascii() or len(seg) > len(name):  # (every character stands for one or more)
        return False
    reach = {0}  # how much of name the read part of seg can spell
    for ch in seg:
        if ch.isascii():
            reach = {i + 1 for i in reach if i < len(name) and name[i] == ch}
        else:
            reach = {i + len(alt) for i in reach for alt in lookalikes(ch)
                     if name.startswith(alt, i)}
        if not reach:
            return False
    return len(name) in reach


def readings(text: str, alphabet: frozenset[str], cap: int) -> list[str] | None:
    """Every ASCII string ``text`` (folded) reads as in ``alphabet`` alone,
    an ASCII character as itself, a non-ASCII one as any of its
    :func:`lookalikes` spelled in ``alphabet``; ``[]`` when some character
    reads as nothing in it, ``None`` when there are more than ``cap``."""
    out = [""]
    for ch in text:
        alts = (ch,) if ch.isascii() else lookalikes(ch)
        fits = [a for a in alts if all(c in alphabet for c in a)]
        if not fits:
            return []
        out = [o + a for o in out for a in fits]
        if len(out) > cap:
            return None
    return out


@functools.lru_cache(maxsize=1024)
def lookalikes(ch: str) -> tuple[str, ...]:
    """The ASCII spellings (lower case, ``[a-z0-9.:@[]-]``) a folded non-ASCII
    character reads as: the UTS #39 confusables of every character that
    folds to it (Cyrillic ``е`` is ``e``, ``ꜷ`` is ``au``, ``η`` is ``n``
    and, as Greek ``Η`` folds to it, ``h``) with the ASCII ones those are
    confusable with (``l`` and ``1``, ``rn`` and ``m``), and, for a letter
    with marks, its base letter; ``()`` for every other character (a CJK
    or kana letter, an emoji, a currency sign: they spell no Latin name)."""
    table = _confusables()
    alts = set(table.get(ch, ()))
    for alt in tuple(alts):
        alts.update(table.get(alt, ()))
    base = "".join(c for c in unicodedata.normalize("NFD", ch) if not unicodedata.combining(c))
    if base != ch and _ASCII_NAME.match(base.casefold()):
        alts.add(base.casefold())
    return tuple(sorted(alts))


@functools.lru_cache(maxsize=16)
def spelling(text: str) -> frozenset[str]:
    """Every folded non-ASCII character that reads as ``text`` (ASCII) by
    :func:`lookalikes`: one set lookup for a question asked of every
    character of a host (is it an ``@``?), where :func:`lookalikes` of a
    character met for the first time costs a normalization."""
    return frozenset(ch for ch in _confusables() if not ch.isascii() and text in lookalikes(ch))


def prepare() -> None:
    """Build the confusables table now (~670 entries of the package's
    9,600, ~0.1 s) rather than at the first non-ASCII name compared."""
    _confusables()


@functools.cache
def _confusables() -> dict[str, tuple[str, ...]]:
    """Every folded character of confusables.txt with an ASCII lookalike,
    and the ASCII spellings (folded) it reads as. A non-ASCII character is
    keyed by its fold when that is one non-ASCII character (the casefold
    gives ``Η`` and ``η`` one key: both readings are the key's), and is not
    kept when its fold is ASCII (``Ⅰ`` is ``i``: ASCII reads as written);
    an ASCII one by itself (``l`` reads as ``1`` too)."""
    table: dict[str, set[str]] = {}
    for ch, glyphs in load_confusables("confusables.json").items():
        # (right-to-left glyphs are stored wrapped in U+200E marks: the fold drops them)
        alts = {a for g in glyphs if (a := fold(g["c"], 64)) and _ASCII_NAME.match(a)}
        key = ch if ch.isascii() else fold(ch, 4)
        if alts and key and len(key) == 1 and (key == ch or not key.isascii()):
            table.setdefault(key, set()).update(alts)
    return {k: tuple(sorted(v)) for k, v in table.items()}
